// pendingDump(reqId): is a dump of this request armed for a wave still to end on this rank?
// Vectors are published ahead (docs/architecture.md, "Waves"): with a lookahead of L a dump detected
// in wave N-1 is copied at the end of wave N+L, so a request can finish in between. An engine asks
// before giving a finished request's blocks back (after end_of_wave(W), before the next forward)
// and, while true, keeps them: the copy reads the request's own KV. The waves that matter are the
// decided ones not yet ended: W+1 up to the mailbox floor (L waves with the chain on time); a later
// wave's dumps are decided at a head still to come. Every rank has the same vectors, so every rank
// gives the same answer: a few memory loads (no system call) when none has dump_due; with dump_due
// a wave's req ids are asked of the agent once; W+1's vector not there yet is asked of the agent
// too, which waits for it within its bound.
//
// An unanswered question costs one bound once (vector-stall.ts): its answer ('all') is kept for
// that wave, so the wave's finished requests are kept until it ends and nobody asks again; after
// it, while no new vector arrives, a wave without a vector is not asked about but given up
// (forfeitedTo: its dumps are never copied on this rank, end_of_wave skips them), so no block is
// kept on account of an unanswered question beyond the end of the wave it was about.
import { DUE_DUMP, MAILBOX_LAYOUT, NOT_KNOWN, type MailboxReader } from './mailbox';
import type { AgentTransport } from './transport';
import type { VectorStall } from './vector-stall';

/** The agent could not say which requests are due: every request counts as pending until that wave ends. */
const ALL = 'all' as const;
type DueSet = Set<string> | typeof ALL;

export class PendingDumps {
  /** The last wave whose end_of_wave ran on this rank (-1: none yet). */
  private lastEnded = -1;
  private readonly due = new Map<number, DueSet | Promise<DueSet>>();
  /** The last wave given up without asking (vectors stalled): its dumps are never copied here. */
  forfeitedTo = -1;
  /** The floor, last ended wave and epoch of the last check that found every decided wave clear (no dump due). */
  private clearFloor = -1;
  private clearEnded = -1;
  private clearEpoch = -1;

  constructor(
    private readonly mailbox: MailboxReader,
    /** The req ids of `wave`'s dump jobs, from the agent; undefined when it did not answer. */
    private readonly ask: (wave: number) => Promise<string[] | undefined>,
    private readonly stall: VectorStall,
  ) {}

  /** end_of_wave(wave) ran: its dumps are copied (or failed); older answers are dropped. */
  ended(wave: number): void {
    this.lastEnded = wave;
    if (this.due.size === 0) return; // the usual step: nothing asked, no iterator made
    for (const w of this.due.keys()) if (w <= wave) this.due.delete(w);
  }

  /** False at once when no decided wave has dump_due (no promise); else the agent's answer, once per wave. */
  check(reqId: string): boolean | Promise<boolean> {
    const floor = this.mailbox.floor(); // first: a slot the floor covers was written before it
    const epoch = this.mailbox.epoch();
    // The step's other finished requests: the same decided waves, read clear already (a published
    // vector does not change within its epoch; the floor moving or a wave ending changes them).
    if (floor === this.clearFloor && this.lastEnded === this.clearEnded && epoch === this.clearEpoch) return false;
    const next = this.lastEnded + 1;
    // The decided waves: below the floor, never more than the ring holds (a stale floor).
    const decidedTo = Math.min(floor - 1, next + MAILBOX_LAYOUT.slots - 1);
    let sets: Promise<DueSet>[] | undefined;
    let clear = true;
    for (let w = next; w <= Math.max(next, decidedTo); w++) {
      const due = this.mailbox.dueBits(w);
      if (due !== NOT_KNOWN && (due & DUE_DUMP) === 0) continue;
      clear = false;
      if (due === NOT_KNOWN && !this.due.has(w) && this.stall.active()) {
        // No vector and none coming: not asked (a bound each), given up on this rank.
        if (w > this.forfeitedTo) this.forfeitedTo = w;
        continue;
      }
      (sets ??= []).push(this.setOf(w));
    }
    if (!sets) {
      // Every decided wave's vector there, none with dump_due: the step's answer, kept for its other requests.
      if (clear) {
        this.clearFloor = floor;
        this.clearEnded = this.lastEnded;
        this.clearEpoch = epoch;
      }
      return false;
    }
    return namesIt(sets, reqId);
  }

  private setOf(wave: number): Promise<DueSet> {
    const got = this.due.get(wave);
    if (got instanceof Promise) return got;
    if (got) return Promise.resolve(got);
    const p = this.ask(wave).then(
      (ids): DueSet => (ids ? new Set(ids) : ALL),
      (): DueSet => ALL,
    );
    this.due.set(wave, p);
    void p.then((s) => {
      // Cached unless the wave ended meanwhile, an unknown answer too (until its wave ends): asked
      // again, it would cost every finished request a bound.
      if (s === ALL) this.stall.begin();
      if (this.due.get(wave) === p) this.due.set(wave, s);
    });
    return p;
  }
}

/** Whether any of the waves' answers keeps `reqId` (apart from check(): its closure would cost every call an allocation). */
function namesIt(sets: Promise<DueSet>[], reqId: string): Promise<boolean> {
  return Promise.all(sets).then((all) => all.some((s) => s === ALL || s.has(reqId)));
}

export interface DueDumpsDeps {
  transport: AgentTransport;
  /** The agent is known not to answer: nothing is asked. */
  unavailable(): boolean;
  /** The bound of one ask (the client's call bound and its margin). */
  boundMs(): number;
  hello(timeoutMs: number): Promise<unknown>;
  /** An ask that failed (the agent lost, or an error the client notes). */
  failed(e: unknown, where: string): void;
  /** The agent answered without the vector: its coordinator is lost (ClientReply.coordinator_lost). */
  coordinatorLost(): void;
}

/**
 * The asker PendingDumps uses: ClientRequest.due_dumps after a hello, within the call bound;
 * undefined when the agent did not answer (every request then counts as pending).
 */
export function dueDumpsAsker(d: DueDumpsDeps): (wave: number) => Promise<string[] | undefined> {
  return async (wave) => {
    if (d.unavailable()) return undefined;
    try {
      await d.hello(d.boundMs());
      const reply = await d.transport.request({ dueDumps: { wave } }, d.boundMs());
      if (reply.coordinatorLost) d.coordinatorLost();
      return reply.ok ? ((reply.dueReqIds as string[]) ?? []) : undefined;
    } catch (e) {
      d.failed(e, `pendingDump(wave ${wave})`);
      return undefined;
    }
  };
}
