// Input snapshots armed on a running job (`wavebus capture`, docs/control.md), on the agent. Each
// arm came with a wave head (or a snapshot) naming the wave it takes effect at, the same on every
// rank of the replica; the engine offers the forwards of the waves whose vector says snapshot_due.
// Each arm has a capturer of its own: the seed's selection rules, its own budget (max_captures),
// the tp-rank filter and format from the arm, and this host's snapshot root (never a path from the
// bus). A capture fails loudly as any other does (the engine aborts that forward).
import type { ArtifactModes } from '../artifacts/artifact-mode';
import { tensorFormatFromProto } from '../artifacts/tensor-format';
import { CaptureError } from '../errors';
import type { RankIdentity } from '../layout';
import type { Logger } from '../log';
import { CaptureBudget } from '../snapshot/budget';
import { liveCaptureRoot, SnapshotCapturer } from '../snapshot/capture';
import type { SnapshotConfig } from '../snapshot/config';
import type { CaptureArmMsg, CaptureResultMsg } from '../bus/capture-arms';
import { captureInputs, countedCallIndex, stagingError, type BeforeForwardRequest, type WaitingWord } from './input-capture';
import type { RegionTable } from './regions';

interface Live {
  arm: CaptureArmMsg;
  capturer: SnapshotCapturer;
  budget: CaptureBudget;
  done: boolean;
}

/** Arms kept at most (a coordinator keeps 64); the oldest finished go first. */
const MAX_ARMS = 64;

export class LiveCaptures {
  private readonly arms = new Map<string, Live>();
  /** The newest vector's wave (arms past their last wave are not in force, even if not done here). */
  private newest = 0;
  private reported = false;

  constructor(
    private readonly identity: RankIdentity,
    /** This host's snapshot root; none: arms are refused (logged). */
    private readonly snapshotRoot: string | undefined,
    private readonly log: Logger,
    private readonly send: (r: Omit<CaptureResultMsg, 'globalRank'>) => void,
    private readonly artifactModes?: ArtifactModes,
  ) {}

  /** Arms from a head or a snapshot; one already known keeps its capturer (its counts and budget). */
  add(arms: readonly Record<string, any>[] | undefined): void {
    for (const a of arms ?? []) {
      // A flight recorder flush is not a selection: the agent's recorder takes it (agent.ts).
      if (this.arms.has(a.id) || a.replica !== this.identity.dpRank || a.flushRecorder) continue;
      const arm = a as CaptureArmMsg;
      if (!this.snapshotRoot) {
        this.log.warn({ id: arm.id }, 'capture arm ignored: this agent has no snapshot root');
        continue;
      }
      let format;
      let root: string;
      try {
        format = tensorFormatFromProto(arm.format, 'CaptureArm.format');
        root = liveCaptureRoot(this.snapshotRoot, arm.id, Number(arm.wave));
      } catch (e) {
        this.log.warn({ id: arm.id, err: (e as Error).message }, 'capture arm refused');
        continue;
      }
      const max = arm.maxCaptures > 0 ? arm.maxCaptures : 4;
      const config: SnapshotConfig = {
        enabled: true,
        callRule: arm.callIndices.length > 0 ? { kind: 'indices', indices: new Set(arm.callIndices.map(Number)) } : { kind: 'never' },
        tokenTargets: new Set(arm.tokenTargets.map(Number)),
        requestIds: arm.requestIds,
        maxCaptures: max,
        ranks: arm.tpRanks.length > 0 ? new Set(arm.tpRanks) : null,
        format,
        snapshotRoot: root,
        rootSource: 'the agent\'s snapshot root',
      };
      const log = { info: (m: string) => this.log.info({ id: arm.id }, m), warn: (m: string) => this.log.warn({ id: arm.id }, m) };
      const budget = new CaptureBudget(max, (m) => this.log.info({ id: arm.id }, m));
      const { globalRank, tpRank, ppRank, dpRank, cpRank } = this.identity;
      const capturer = new SnapshotCapturer(config, { globalRank, tpRank, ppRank, dpRank, cpRank }, { budget, log, artifactModes: this.artifactModes });
      // A tp rank the arm does not name never captures, nor says anything of it.
      this.arms.set(arm.id, { arm, budget, capturer, done: !capturer.rankSelected });
      this.log.info({ id: arm.id, wave: arm.wave, untilWave: arm.untilWave }, 'input snapshot armed on the running job');
      if (this.arms.size > MAX_ARMS) {
        const old = [...this.arms.values()].find((l) => l.done);
        if (old) this.arms.delete(old.arm.id);
      }
    }
  }

  /** A vector arrived (the newest wave this agent knows). */
  seen(wave: number): void {
    if (wave > this.newest) this.newest = wave;
  }

  /** An arm is in force on this rank (the mailbox's LIVE_CAPTURES bit). */
  get inForce(): boolean {
    for (const l of this.arms.values()) if (!l.done && l.arm.untilWave + 1 >= this.newest) return true;
    return false;
  }

  /** Whether inForce changed since the last call (the agent then says so in its mailbox). */
  changed(): boolean {
    const now = this.inForce;
    const changed = now !== this.reported;
    this.reported = now;
    return changed;
  }

  /** Whether an arm not done on this rank covers `wave` (the vector's snapshot_due after a snapshot). */
  covers(wave: number): boolean {
    for (const l of this.arms.values()) if (!l.done && wave >= l.arm.wave && wave <= l.arm.untilWave) return true;
    return false;
  }

  /**
   * Offer one forward to every arm whose waves cover its global step. Returns the first bundle
   * written (a forward two arms select is written by each). Throws CaptureError (abort the forward).
   */
  async offer(regions: RegionTable, bf: BeforeForwardRequest, interim: () => void, written: () => void, waiting: WaitingWord): Promise<{ captured: boolean; callDir: string }> {
    // The forward's wave, as its client knows it (an older client sends none: its global step).
    const step = Number(bf.wave || bf.context?.globalStep || 0);
    let out = { captured: false, callDir: '' };
    for (const l of this.arms.values()) {
      const { arm } = l;
      if (l.done || step < arm.wave || step > arm.untilWave) continue;
      let r: Record<string, unknown>;
      try {
        r = await captureInputs(l.capturer, regions, bf, interim, written, waiting);
      } catch (e) {
        this.send({ armId: arm.id, wave: step, callDir: '', error: (e as Error).message, done: false });
        throw e instanceof CaptureError ? e : new CaptureError(String((e as Error)?.message ?? e), 'ERR_CAPTURE');
      }
      if (r.captured && !out.captured) out = { captured: true, callDir: String(r.callDir) };
      // Done on this rank: its budget is spent, or this was the arm's last wave.
      l.done = l.budget.remaining === 0 || step >= arm.untilWave;
      if (r.captured || l.done) this.send({ armId: arm.id, wave: step, callDir: r.captured ? String(r.callDir) : '', error: '', done: l.done });
    }
    return out;
  }

  /** A forward of `wave` its engine could not stage: logged, and each arm covering it fails with `why` here. */
  notStaged(wave: number, why: string): CaptureError {
    const text = `rank ${this.identity.globalRank}: the engine could not stage the inputs of its forward of wave ${wave}: ${why}`;
    const arms: string[] = [];
    for (const l of this.arms.values()) {
      const { arm } = l;
      if (l.done || wave < arm.wave || wave > arm.untilWave) continue;
      arms.push(arm.id);
      // The arm's last wave: done here (nothing more will be offered), so the tool's --wait ends now.
      l.done = wave >= arm.untilWave;
      this.send({ armId: arm.id, wave, callDir: '', error: text, done: l.done });
    }
    this.log.error({ wave, arms, err: why }, 'input snapshot failed: the engine could not stage the forward\'s inputs');
    return new CaptureError(text, 'ERR_SNAPSHOT_INPUT');
  }
}

/**
 * before_forward on the agent: the startup capturer (WAVEBUS_SNAPSHOT_*) when snapshots are on,
 * then the arms of the running job. The client hears "capturing" once at most.
 */
export async function offerForward(capturer: SnapshotCapturer | undefined, live: LiveCaptures, regions: RegionTable, bf: BeforeForwardRequest, interim: () => void, written: () => void, waiting: WaitingWord): Promise<Record<string, unknown>> {
  // The engine could not stage the inputs (BeforeForward.staging_error): nothing to copy; the arms
  // covering the forward fail with the cause, and so does the client's call.
  const why = stagingError(bf);
  if (why !== undefined) throw live.notStaged(Number(bf.wave || bf.context?.globalStep || 0), why);
  let told = false;
  const once = () => {
    if (!told) interim();
    told = true;
  };
  // The client's count is the startup rules' (snapshot-precheck); an arm counts the calls of its
  // own waves (all offered: their vectors say snapshot_due), so it never takes the client's.
  const own = capturer ? await captureInputs(capturer, regions, bf, once, written, waiting, countedCallIndex(bf)) : { captured: false, callDir: '' };
  const armed = await live.offer(regions, bf, once, written, waiting);
  return own.captured ? own : armed;
}
