// The three selection rules (call index, token, request), OR'd together, evaluated live per forward
// so that only the targeted forward is written. Budget and rank narrowing live in the capturer.
import { ProtocolError } from '../errors';
import type { ForwardContext } from '../messages';
import type { SnapshotConfig } from './config';

export type SelectionReason = 'call_index' | 'request' | 'token';

export interface SelectionMatch {
  /** The row of the forward's batch that matched. */
  batch_index: number;
  request_id: string;
  /** token rule: the targeted token position (p + offset); request rule: the row's own position. */
  position: number;
  reason: 'request' | 'token';
}

export interface Selection {
  selected: boolean;
  /** Sorted rule names: call_index, request, token. */
  selectedBy: SelectionReason[];
  matches: SelectionMatch[];
  /** This forward's 0-based post-warmup call index for its compiled graph; null for warmup. */
  callIndex: number | null;
}

function isInt(v: unknown): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v);
}

/**
 * Reject a forward context the rules cannot read consistently (it may come from a client over
 * the wire). The message names the field and the row.
 */
export function validateForwardContext(ctx: ForwardContext): void {
  const bad = (what: string) => new ProtocolError(`forward context: ${what}`, 'ERR_FORWARD_CONTEXT');
  if (typeof ctx.compilationHash !== 'string' || ctx.compilationHash === '') throw bad('compilationHash is empty');
  if (!Array.isArray(ctx.reqIds) || !ctx.reqIds.every((r) => typeof r === 'string')) throw bad('reqIds must be a list of strings');
  if (!Array.isArray(ctx.positions) || !Array.isArray(ctx.rowRequest)) throw bad('positions and rowRequest must be lists');
  if (ctx.positions.length !== ctx.rowRequest.length) {
    throw bad(`positions has ${ctx.positions.length} rows but rowRequest has ${ctx.rowRequest.length}`);
  }
  for (let r = 0; r < ctx.positions.length; r++) {
    if (!isInt(ctx.positions[r])) throw bad(`positions[${r}] = ${String(ctx.positions[r])} is not an integer`);
    const q = ctx.rowRequest[r];
    if (!isInt(q) || q < -1 || q >= ctx.reqIds.length) {
      throw bad(`rowRequest[${r}] = ${String(q)} is not -1 (padding) or an index into reqIds (${ctx.reqIds.length} ids)`);
    }
  }
  if (!isInt(ctx.numSpeculativeTokens) || ctx.numSpeculativeTokens < 0) {
    throw bad(`numSpeculativeTokens = ${String(ctx.numSpeculativeTokens)} must be a non-negative integer`);
  }
  if (!isInt(ctx.globalStep)) throw bad(`globalStep = ${String(ctx.globalStep)} is not an integer`);
}

/** The request rule: the caller's base id matches exactly or as the prefix of vLLM's `<id>-<suffix>`. */
export function requestMatches(id: string, target: string): boolean {
  return id === target || id.startsWith(target + '-');
}

export class CaptureSelector {
  /** Post-warmup calls seen so far, per compilation hash (each compiled graph counts its own). */
  private readonly calls = new Map<string, number>();

  constructor(private readonly config: SnapshotConfig) {}

  /** Calls counted so far for one compiled graph. */
  callsSeen(compilationHash: string): number {
    return this.calls.get(compilationHash) ?? 0;
  }

  evaluate(ctx: ForwardContext): Selection {
    validateForwardContext(ctx);
    // Warmup forwards are neither counted nor captured: call 0 is the first real call.
    if (ctx.warmup) return { selected: false, selectedBy: [], matches: [], callIndex: null };
    // Count before checking: this forward's index is the number of calls before it.
    const callIndex = this.callsSeen(ctx.compilationHash);
    this.calls.set(ctx.compilationHash, callIndex + 1);

    const selectedBy: SelectionReason[] = [];
    const matches: SelectionMatch[] = [];
    if (this.callRuleFires(callIndex)) selectedBy.push('call_index');
    const requestMatchesFound = this.requestRule(ctx);
    if (requestMatchesFound.length > 0) selectedBy.push('request');
    const tokenMatchesFound = this.tokenRule(ctx);
    if (tokenMatchesFound.length > 0) selectedBy.push('token');
    matches.push(...requestMatchesFound, ...tokenMatchesFound);
    matches.sort((a, b) => a.batch_index - b.batch_index || (a.reason < b.reason ? -1 : a.reason > b.reason ? 1 : 0));
    return { selected: selectedBy.length > 0, selectedBy, matches, callIndex };
  }

  private callRuleFires(callIndex: number): boolean {
    const rule = this.config.callRule;
    switch (rule.kind) {
      case 'first':
        return callIndex === 0;
      case 'all':
        return true;
      case 'indices':
        return rule.indices.has(callIndex);
      case 'never':
        return false;
    }
  }

  /**
   * Token rule, decode only: a row at position p generates tokens p+1 .. p+num_speculative_tokens+1;
   * the first offset whose position is a target fires, one match per row. Prefill is skipped,
   * where that relationship between a row's position and the generated token does not hold.
   */
  private tokenRule(ctx: ForwardContext): SelectionMatch[] {
    const targets = this.config.tokenTargets;
    if (ctx.isPrompt || targets.size === 0) return [];
    const out: SelectionMatch[] = [];
    const maxOffset = ctx.numSpeculativeTokens + 1;
    for (let row = 0; row < ctx.positions.length; row++) {
      const p = ctx.positions[row];
      const q = ctx.rowRequest[row];
      if (p < 0 || q < 0) continue; // padding
      for (let offset = 1; offset <= maxOffset; offset++) {
        if (targets.has(p + offset)) {
          out.push({ batch_index: row, request_id: ctx.reqIds[q], position: p + offset, reason: 'token' });
          break;
        }
      }
    }
    return out;
  }

  /**
   * Request rule, prefill and decode: one match per matched request, at its first real row (a
   * prefill may spread one request over many rows; one entry says it all).
   */
  private requestRule(ctx: ForwardContext): SelectionMatch[] {
    const targets = this.config.requestIds;
    if (targets.length === 0) return [];
    const out: SelectionMatch[] = [];
    const seen = new Set<number>();
    for (let row = 0; row < ctx.positions.length; row++) {
      const p = ctx.positions[row];
      const q = ctx.rowRequest[row];
      if (p < 0 || q < 0 || seen.has(q)) continue;
      seen.add(q);
      const id = ctx.reqIds[q];
      if (targets.some((t) => requestMatches(id, t))) out.push({ batch_index: row, request_id: id, position: p, reason: 'request' });
    }
    return out;
  }
}
