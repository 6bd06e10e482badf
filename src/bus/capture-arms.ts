// Input snapshots armed on a running job (`wavebus capture`, docs/control.md), on the coordinator.
// An arm waits for its replica's next wave head, which carries it (WaveHead.captures) with the
// vector's wave: every rank of the replica then selects from that same wave on, so every rank picks
// the same forward. While an arm is in force each vector of its waves says snapshot_due, which is
// what makes an engine offer its forward to its agent (nothing is offered otherwise). The agents
// say what they wrote and when their budget is spent (CaptureResult).
import { rankCoordinates, replicaDumpRanks, type WorldLayout } from '../layout';

/** proto CaptureArm, as encode() takes it. */
export interface CaptureArmMsg {
  id: string;
  replica: number;
  wave: number;
  untilWave: number;
  requestIds: string[];
  tokenTargets: number[];
  callIndices: number[];
  tpRanks: number[];
  format: number;
  maxCaptures: number;
  /** A flight recorder flush (`capture --flush-recorder`), not a selection. */
  flushRecorder?: boolean;
}

export interface CaptureSpec {
  requestIds: string[];
  tokenTargets: number[];
  callIndices: number[];
  next: boolean;
  tpRanks: number[];
  format: number;
  maxCaptures: number;
  replicas: number[];
  withinWaves: number;
  flushRecorder?: boolean;
}

export interface CaptureResultMsg {
  globalRank: number;
  armId: string;
  wave: number;
  callDir: string;
  error: string;
  done: boolean;
}

interface Entry {
  arm: CaptureArmMsg;
  /** false until a head has carried it (arm.wave is set then). */
  armed: boolean;
  ranks: number[];
  results: CaptureResultMsg[];
  done: Set<number>;
  expired: boolean;
  /** Waves after arm.wave it stays in force (--next: 0). */
  span: number;
  /** Why the replica could not take it (no head came after the wake); finished then. */
  unserved?: string;
}

/** The seed's budget default (MAX_CAPTURES). */
export const DEFAULT_ARM_CAPTURES = 4;
/** How many waves an arm stays in force unless the tool says otherwise. */
export const DEFAULT_WITHIN_WAVES = 10000;
/** Results kept per arm: a broad arm cannot grow the coordinator's memory without end. */
const MAX_RESULTS = 1024;
/** Arms kept for the tool to follow; the oldest finished ones go first. */
const KEPT = 64;

export class CaptureArms {
  private readonly entries = new Map<string, Entry[]>();
  private next = 1;
  /** Results for arms this coordinator does not know, or from ranks an arm does not name. */
  unknownResults = 0;

  constructor(private readonly layout: WorldLayout) {}

  /** Queue one arm per replica of `spec` for that replica's next head; returns the arm id. */
  queue(spec: CaptureSpec): string {
    const id = `capture-${this.next++}`;
    const list: Entry[] = spec.replicas.map((replica) => ({
      arm: {
        id,
        replica,
        wave: 0,
        untilWave: 0,
        requestIds: spec.requestIds,
        tokenTargets: spec.tokenTargets,
        callIndices: spec.next ? [0] : spec.callIndices,
        tpRanks: spec.tpRanks,
        format: spec.format,
        maxCaptures: spec.maxCaptures,
        flushRecorder: Boolean(spec.flushRecorder),
      },
      armed: false,
      // The ranks that capture: every stage's (every rank's agent follows its replica's stream), narrowed by tp rank.
      ranks: replicaDumpRanks(this.layout, replica, 'all').filter((g) => spec.tpRanks.length === 0 || spec.tpRanks.includes(rankCoordinates(g, this.layout).tpRank)),
      results: [],
      done: new Set(),
      expired: false,
      // --next: the one forward of the arm wave; else the arm stays for withinWaves waves.
      span: spec.next ? 0 : spec.withinWaves - 1,
    }));
    this.entries.set(id, list);
    if (this.entries.size > KEPT) {
      const old = [...this.entries.entries()].find(([, l]) => l.every((e) => this.finished(e)));
      if (old) this.entries.delete(old[0]);
    }
    return id;
  }

  /**
   * The head of `replica` publishes the vector of `wave`: the arms it carries (taking effect at
   * `wave`) and whether any arm in force covers `wave`.
   */
  atHead(replica: number, headWave: number, wave: number, hold = false): { snapshotDue: boolean; captures: CaptureArmMsg[] } {
    const captures: CaptureArmMsg[] = [];
    let snapshotDue = false;
    for (const list of this.entries.values()) {
      for (const e of list) {
        if (e.arm.replica !== replica || e.unserved) continue;
        // hold: the first head after a wake arms nothing (src/bus/replica-wake.ts).
        if (!e.armed && hold) continue;
        if (!e.armed) {
          // In force from the wave after the vector that carries it: every agent then knows it (and
          // says so in its mailbox) a wave before its first forward, so a late vector is waited for.
          e.armed = true;
          e.arm.wave = wave + 1;
          e.arm.untilWave = e.arm.wave + e.span;
          captures.push(e.arm);
        }
        // The engine has begun headWave: every forward up to headWave - 1 has been offered.
        // A recorder flush is done when every rank answered (its engine may be idle past the wave
        // for a while: the tool's --timeout bounds the wait).
        if (!e.arm.flushRecorder && headWave > e.arm.untilWave + 1) e.expired = true;
        // A recorder flush selects nothing: its engines never offer a forward for it.
        if (!e.arm.flushRecorder && !this.finished(e) && wave >= e.arm.wave && wave <= e.arm.untilWave) snapshotDue = true;
      }
    }
    return { snapshotDue, captures };
  }

  /** The arms in force for `replica` (a (re)joining agent's snapshot carries them). */
  inForce(replica: number): CaptureArmMsg[] {
    const out: CaptureArmMsg[] = [];
    for (const list of this.entries.values()) for (const e of list) if (e.arm.replica === replica && e.armed && !this.finished(e)) out.push(e.arm);
    return out;
  }

  /** One rank's word on an arm; false when no arm of that id names the rank (counted). */
  onResult(r: CaptureResultMsg): boolean {
    const e = this.entries.get(r.armId)?.find((x) => x.ranks.includes(r.globalRank));
    if (!e) {
      this.unknownResults++;
      return false;
    }
    if (r.callDir || r.error) {
      if (e.results.length < MAX_RESULTS) e.results.push({ ...r });
    }
    if (r.done) e.done.add(r.globalRank);
    return true;
  }

  private finished(e: Entry): boolean {
    return e.expired || e.unserved !== undefined || (e.armed && e.ranks.every((g) => e.done.has(g)));
  }

  /** Whether an arm of `replica` waits for a head or is in force (its ranks need the waves). */
  open(replica: number): boolean {
    for (const list of this.entries.values()) for (const e of list) if (e.arm.replica === replica && !this.finished(e)) return true;
    return false;
  }

  /** Every arm of `replica` no head has carried yet gives it up: `why` is what the tool says. */
  fail(replica: number, why: string): void {
    for (const list of this.entries.values()) for (const e of list) if (e.arm.replica === replica && !e.armed && !e.unserved) e.unserved = why;
  }

  /** The CaptureProgress of each replica's arm of `id`, or undefined for an unknown id. */
  progress(id: string): Record<string, unknown>[] | undefined {
    const list = this.entries.get(id);
    if (!list) return undefined;
    return list.map((e) => ({ arm: e.arm, results: e.results, ranks: e.ranks, doneRanks: [...e.done].sort((a, b) => a - b), expired: e.expired, armed: e.armed, unserved: e.unserved ?? '' }));
  }

  /** For `wavebus status`: every arm kept, in force or finished. */
  statusJson(): Record<string, unknown>[] {
    const out: Record<string, unknown>[] = [];
    for (const list of this.entries.values()) {
      for (const e of list) {
        const state = e.unserved ? 'unserved' : !e.armed ? 'queued' : this.finished(e) ? (e.expired && !e.ranks.every((g) => e.done.has(g)) ? 'expired' : 'done') : 'armed';
        out.push({ id: e.arm.id, replica: e.arm.replica, state, wave: e.arm.wave, until_wave: e.arm.untilWave, ranks: e.ranks, done_ranks: [...e.done].sort((a, b) => a - b), bundles: e.results.filter((r) => r.callDir).length, errors: e.results.filter((r) => r.error).length });
      }
    }
    return out;
  }
}
