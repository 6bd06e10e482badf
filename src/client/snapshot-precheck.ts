// The client's pre-check of the input-snapshot rules (docs/snapshots.md, "Which forwards talk to
// the agent"): with snapshots on, a forward no rule selects costs no message. The agent's hello
// names the rules in force on its rank (Features.snapshotSelection, fixed at its start-up); the
// client counts every post-warmup forward of each compilation hash and runs the agent's own
// selector (src/snapshot/selector.ts) on the forward with that count, so it offers exactly the
// forwards the agent would select, each with its index (BeforeForward.callIndexPlus1). The agent
// still decides (and keeps the budget). The Python client runs a looser check of the same rules.
import type { ForwardContext } from '../messages';
import type { SnapshotConfig } from '../snapshot/config';
import { CaptureSelector } from '../snapshot/selector';

/** proto SnapshotSelection, as the hello's features carry it. */
export interface SnapshotSelectionMsg {
  callRule?: number | string;
  callIndices?: (number | string)[];
  tokenTargets?: (number | string)[];
  requestIds?: string[];
  rankSelected?: boolean;
}

const CALL_RULES = ['first', 'all', 'indices', 'never'] as const;

/** Post-warmup forwards per compilation hash, counted while snapshots are on (kept across hellos). */
export class CallCounter {
  private readonly calls = new Map<string, number>();

  /** This forward's call index; null for a warmup forward (neither counted nor captured). */
  count(ctx: ForwardContext): number | null {
    if (ctx.warmup === true) return null;
    const i = this.calls.get(ctx.compilationHash) ?? 0;
    this.calls.set(ctx.compilationHash, i + 1);
    return i;
  }
}

export class SnapshotPrecheck {
  private readonly selector: CaptureSelector;
  private readonly rankSelected: boolean;

  constructor(sel: SnapshotSelectionMsg) {
    const rule = typeof sel.callRule === 'string' ? sel.callRule.toLowerCase() : CALL_RULES[Number(sel.callRule ?? 0)] ?? 'first';
    const callRule: SnapshotConfig['callRule'] =
      rule === 'indices' ? { kind: 'indices', indices: new Set((sel.callIndices ?? []).map(Number)) } : { kind: rule as 'first' | 'all' | 'never' };
    // Only the selection fields are read by the selector; the rest is the agent's business.
    const config = { enabled: true, callRule, tokenTargets: new Set((sel.tokenTargets ?? []).map(Number)), requestIds: sel.requestIds ?? [] } as unknown as SnapshotConfig;
    this.selector = new CaptureSelector(config);
    this.rankSelected = sel.rankSelected === true;
  }

  /** None when the hello carried no selection (snapshots off, or an older agent): every forward is offered. */
  static of(features: { snapshotSelection?: SnapshotSelectionMsg | null } | undefined): SnapshotPrecheck | undefined {
    return features?.snapshotSelection ? new SnapshotPrecheck(features.snapshotSelection) : undefined;
  }

  /** Whether the agent would select this forward (a bad context: offered, so that the agent names the field). */
  selects(ctx: ForwardContext, callIndex: number | null): boolean {
    if (callIndex === null || !this.rankSelected) return false;
    try {
      return this.selector.evaluate(ctx, callIndex).selected;
    } catch {
      return true;
    }
  }
}
