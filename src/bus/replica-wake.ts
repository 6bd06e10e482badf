// Wake on demand (docs/control.md, "An idle job"): a job whose config keeps the bus asleep (no hot
// reload, no detector) costs its engines nothing per step, and `wavebus dump` / `capture` still
// work on it. While something is armed on a replica, the coordinator's heartbeats on that
// replica's stream say so (proto Wake): HEADS, and the replica's head rank sends its wave heads;
// at the first head the coordinator arms nothing and says ON right after that head's vector, and
// it arms nothing at the heads that come within settleMs of that ON either. An engine reads its
// bits at every step, but one catching up (a burst of steps after a slow call) can be waves ahead
// of the bus: arming only at a head its engine sent well after every agent had the ON keeps every
// rank on the vector before anything is due for it, as a vector decided a wave ahead would be with
// the bus on. Once nothing is armed (served, failed, expired) it says OFF again.
// A replica whose engine sends no head within WAKE_GRACE_MS of the wake cannot be served: what is
// queued there is failed with the reason, at once, rather than left to the tool's --timeout. The
// grace counts only while the head rank's agent is live and its engine client said hello (the
// agent's heartbeats say how many did): an engine still loading its model has said none, and what
// is armed then waits for it (the tool's --timeout bounds the wait, and says what is waited for).
import { replicaHead } from '../layout';
import type { Coordinator } from './coordinator';

/** proto Wake. */
export const WAKE = { OFF: 0, HEADS: 1, ON: 2 } as const;
export type WakeState = (typeof WAKE)[keyof typeof WAKE];

/** How long a woken replica may take to send its first wave head before what waits there fails. */
export const WAKE_GRACE_MS = 5000;

export interface WakeDeps {
  dp: number;
  /** Something armed on `replica` still needs its waves (a dump asked for or not settled, a capture not done). */
  armed(replica: number): boolean;
  /** The config in force keeps the replica's ranks on the bus anyway (hot reload, a detector). */
  busActive(replica: number): boolean;
  /** Fail what is queued on `replica` and not taken by a head (nothing armed there). */
  failQueued(replica: number, why: string): void;
  /** The replica's head rank (named in the reason). */
  headRank(replica: number): number;
  /**
   * Why the replica's head rank cannot send heads yet: its agent is not live on the bus, or no
   * engine client said hello to it (an engine starting). Undefined when it can: the grace counts.
   */
  headWaiting(replica: number): string | undefined;
  /** Say the replica's state on its stream now (a heartbeat). */
  announce(replica: number): void;
  graceMs?: number;
  /** How long after the ON a head still arms nothing (the coordinator: two heartbeats). */
  settleMs: number;
  now?: () => number;
}

export class ReplicaWake {
  private readonly state: WakeState[];
  /** When each replica went to HEADS (its first head is awaited since). */
  private readonly wokeAt: number[];
  /** When each replica went ON (its arms wait for a head settleMs later). */
  private readonly onAt: number[];
  private readonly now: () => number;
  private readonly graceMs: number;
  /** Replicas woken, in all (status). */
  wakes = 0;

  constructor(private readonly d: WakeDeps) {
    this.state = Array.from({ length: d.dp }, () => WAKE.OFF);
    this.wokeAt = Array.from({ length: d.dp }, () => 0);
    this.onAt = Array.from({ length: d.dp }, () => 0);
    this.now = d.now ?? Date.now;
    this.graceMs = d.graceMs ?? WAKE_GRACE_MS;
  }

  /** What the replica's heartbeats and snapshots say. */
  of(replica: number): WakeState {
    return this.state[replica] ?? WAKE.OFF;
  }

  /**
   * Recompute every replica (after an arm, and on every heartbeat tick): wake one that has something
   * armed and is asleep; fail what waits on one woken for longer than the grace without a head; put
   * one with nothing armed back to sleep. Each change is announced at once.
   */
  refresh(): void {
    for (let r = 0; r < this.state.length; r++) {
      let s = this.state[r];
      if (s === WAKE.HEADS && this.d.headWaiting(r) !== undefined) this.wokeAt[r] = this.now();
      if (s === WAKE.HEADS && this.now() - this.wokeAt[r] > this.graceMs) {
        const why = `its engine sent no wave head within ${this.graceMs / 1000} s of the wake although its client said hello to rank ${this.d.headRank(r)}'s agent: is the engine stepping?`;
        this.d.failQueued(r, why);
      }
      const armed = this.d.armed(r);
      if (armed && s === WAKE.OFF && !this.d.busActive(r)) {
        s = WAKE.HEADS;
        this.wokeAt[r] = this.now();
        this.wakes++;
      } else if (!armed && s !== WAKE.OFF) s = WAKE.OFF;
      if (s !== this.state[r]) {
        this.state[r] = s;
        this.d.announce(r);
      }
    }
  }

  /**
   * A head of `replica` arrived, before its vector is decided. True when nothing may be armed at it
   * (the caller holds the arms): the replica's first head since the wake (it is ON once that
   * head's vector is out: afterHead), or one within settleMs of the ON.
   */
  holdAtHead(replica: number): boolean {
    const s = this.state[replica];
    return s === WAKE.HEADS || (s === WAKE.ON && this.now() - this.onAt[replica] < this.d.settleMs);
  }

  /** That head's vector is published: a replica at HEADS is ON now, said right after it on the stream. */
  afterHead(replica: number): void {
    if (this.state[replica] !== WAKE.HEADS) return;
    this.state[replica] = WAKE.ON;
    this.onAt[replica] = this.now();
    this.d.announce(replica);
  }

  /** What a woken replica waits for before its grace counts (undefined: nothing, or not woken). */
  waiting(replica: number): string | undefined {
    return this.state[replica] === WAKE.HEADS ? this.d.headWaiting(replica) : undefined;
  }

  statusJson(replica: number): string {
    return ['off', 'heads', 'on'][this.of(replica)];
  }
}

/** A coordinator's wake: what is armed by control or in its ledger, its config, its streams' heartbeats. */
export function coordinatorWake(c: Coordinator, running: () => boolean): ReplicaWake {
  return new ReplicaWake({
    dp: c.layout.dp,
    armed: (r) => c.control.armedOn(r) || c.ledger.unfinished(r),
    busActive: (r) => Boolean((c.policy ? c.policy.snapshotState(r).config : c.streams.stream(r).lastConfig.config)?.busActive),
    failQueued: (r, why) => c.control.failQueued(r, why),
    headRank: (r) => replicaHead(c.layout, r),
    headWaiting: (r) => {
      const g = replicaHead(c.layout, r);
      if (!c.liveRanks().includes(g)) return `rank ${g}'s agent is not live on the bus`;
      if (!(c.rankTable.get(g)?.engineClients ?? 0)) return `no engine client has said hello to rank ${g}'s agent yet (an engine says it at its first step after the wake; one still loading its model is waited for)`;
      return undefined;
    },
    announce: (r) => running() && c.streams.heartbeat(r),
    settleMs: 2 * c.heartbeatMs,
  });
}
