// endOfWave's work for the TypeScript client (client.ts delegates endOfWave / endOfWaveNow here):
// the wave's due bits read from the mailbox, a late vector waited for on the mailbox within the
// bound, and the agent asked only when something is due or the vector never came.
import { ConfigError } from '../errors';
import { DUE_CONFIG, DUE_DUMP, MailboxReader, MailboxFeature, NOT_KNOWN } from './mailbox';
import type { AgentAvailability } from './availability';
import type { AgentHello } from './hello';
import type { ClientStats } from './client-stats';
import type { AgentTransport, Reply } from './transport';
import { isWaveNumber, waveError } from './wave-head';
import type { PendingDumps } from './pending-dumps';
import type { VectorStall } from './vector-stall';
import type { ForwardCapture } from './live-capture';
import type { ClientFeatures, EndOfWaveResult } from './options';

/** What endOfWave uses of its client. */
export interface EndOfWaveDeps {
  mailbox: MailboxReader;
  transport: AgentTransport;
  availability: AgentAvailability;
  hello: AgentHello;
  stats: ClientStats;
  pending: PendingDumps;
  stall: VectorStall;
  forward: ForwardCapture;
  /** The configured per-step bound, if any (connect()'s callTimeoutMs). */
  callBound: number | undefined;
  callBoundMs(): number;
  marginMs: number;
  noteError(message: string): void;
  coordinatorLost(): void;
}

export class EndOfWaveCall {
  private ping: Promise<unknown> | null = null;

  constructor(private readonly d: EndOfWaveDeps) {}

  /** endOfWave: the settled promises of the usual step are made once and returned again. */
  call(wave: number): Promise<EndOfWaveResult> {
    const bad = waveError(wave, 'endOfWave');
    if (bad) return bad;
    const r = this.now(wave);
    return r === NOTHING_DUE_R ? NOTHING_DUE : r === TIMED_OUT_R ? TIMED_OUT : r instanceof Promise ? r : Promise.resolve(r);
  }

  /** endOfWaveNow: the result when nothing is due, else the promise of the slow path. */
  now(wave: number): EndOfWaveResult | Promise<EndOfWaveResult> {
    if (!isWaveNumber(wave)) throw new ConfigError(`endOfWave(): wave ${wave} is not a non-negative integer`);
    this.d.forward.endedWave = wave;
    this.d.stats.endOfWaveCalls++;
    this.d.pending.ended(wave);
    const bits = this.d.mailbox.features();
    if (bits === 0 || (bits & MailboxFeature.BUS_ACTIVE) === 0) return NOTHING_DUE_R;
    const due = this.d.mailbox.dueBits(wave); // a few memory loads, no allocation
    const slot = due !== NOT_KNOWN;
    if (slot && (due & (DUE_CONFIG | DUE_DUMP)) === 0) return NOTHING_DUE_R;
    // Vectors stalled (one bound was spent on it), or a wave pendingDump gave up: no wait, no copy.
    if (slot ? (due & DUE_DUMP) !== 0 && wave <= this.d.pending.forfeitedTo : this.d.stall.active()) {
      this.d.stats.endOfWaveTimeouts++;
      this.d.stats.stalledSkips++;
      this.d.transport.oneWay({ endOfWave: { wave, missed: true } });
      return TIMED_OUT_R;
    }
    if (this.d.availability.unavailable) {
      // Its mailbox is not updated any more: no waiting, the step goes on (counted). A frozen
      // agent still learns of the miss when it resumes (one-way; dropped if its queue is full).
      this.d.stats.endOfWaveTimeouts++;
      this.d.stats.skippedUnavailable++;
      this.d.transport.oneWay({ endOfWave: { wave, missed: true } });
      this.d.availability.probe();
      return { due: false, timedOut: true };
    }
    // Late vector, agent known: sleep on the mailbox (woken by the agent's publish), not a round trip.
    const known = this.d.hello.current(bits);
    if (!slot && known) return this.awaitVector(wave, known.endOfWaveTimeoutMs);
    return this.endOfWaveWithAgent(wave);
  }

  /** The vector of `wave` is late: wait for it on the mailbox, within the bound. */
  private async awaitVector(wave: number, boundMs: number): Promise<EndOfWaveResult> {
    let got: Awaited<ReturnType<MailboxReader['waitFor']>>;
    // A late vector may mean a dead agent (nobody updates the mailbox): ask it, alongside the wait.
    const since = performance.now();
    if (!this.ping) {
      this.ping = this.d.transport.request({ ping: {} }, boundMs + this.d.marginMs)
        .catch(() => undefined)
        .finally(() => (this.ping = null));
    }
    this.d.stats.vectorWaits++;
    try {
      got = await this.d.mailbox.waitFor(wave, boundMs);
    } catch (e) {
      this.d.noteError(`endOfWave(${wave}): ${(e as Error).message}`);
      return this.endOfWaveWithAgent(wave); // the mailbox could not be read (closed?): the agent decides
    }
    if (got === 'timeout') {
      // The step goes on; the agent counts the miss and fails the wave's dumps if any arrive.
      this.d.stats.endOfWaveTimeouts++;
      this.d.stall.begin();
      if (this.d.availability.lastAnswerAt < since) {
        // Not a word from the agent for the whole bound: the next calls do not wait for it.
        this.d.availability.markUnavailable(`endOfWave(${wave}): no answer within ${boundMs} ms`);
      }
      this.d.transport.oneWay({ endOfWave: { wave, missed: true } });
      return { due: false, timedOut: true };
    }
    if (got !== 'overwritten') {
      // Late but within the bound: the agent counts it (one-way, nothing waits for it).
      this.d.stats.lateVectors++;
      this.d.transport.oneWay({ endOfWave: { wave, late: true } });
    }
    if (got !== 'overwritten' && !got.configDue && !got.dumpDue) return { due: false, timedOut: false };
    return this.endOfWaveWithAgent(wave);
  }

  /** The vector has not arrived, or something is due: the agent does it, within the bound. */
  private async endOfWaveWithAgent(wave: number): Promise<EndOfWaveResult> {
    let f: ClientFeatures;
    try {
      // A (re-)hello here must fit the bound too: the engine never waits longer than that.
      f = await this.d.hello.ensure(this.d.callBoundMs() + this.d.marginMs);
    } catch (e) {
      if (!this.d.availability.lostOn(e, `endOfWave(${wave})`)) throw e;
      this.d.stats.endOfWaveTimeouts++;
      return { due: false, timedOut: true };
    }
    const bound = this.d.callBound ?? f.endOfWaveTimeoutMs;
    let reply: Reply | undefined;
    const deadline = Date.now() + bound + this.d.marginMs;
    try {
      reply = await this.d.transport.request({ endOfWave: { wave } }, bound + this.d.marginMs);
      if (reply && !reply.ok && reply.errorCode === 'ERR_NO_HELLO') {
        // The agent restarted: introduce ourselves again (regions included) and retry, within the bound.
        reply = await this.d.hello.rejoin({ endOfWave: { wave } }, Math.max(1, deadline - Date.now()));
      }
    } catch (e) {
      // Out of time (the agent, or a rejoin, was too slow), or the socket failed: the step goes on.
      reply = undefined;
      if (!this.d.availability.lostOn(e, `endOfWave(${wave})`)) this.d.noteError(`endOfWave(${wave}): ${(e as Error).message}`);
    }
    if (reply?.coordinatorLost) this.d.coordinatorLost();
    if (!reply || reply.timedOut) {
      this.d.stats.endOfWaveTimeouts++;
      if (reply) this.d.stall.begin(); // the agent waited the bound for the vector (or knows none is coming)
      return { due: false, timedOut: true };
    }
    if (!reply.ok) {
      // A debugging sidecar never fails the engine's step: the error is counted and kept.
      this.d.noteError(`endOfWave(${wave}): ${reply.errorCode || 'ERR_AGENT'} ${reply.error}`);
      return { due: false, timedOut: false, error: this.d.availability.lastError };
    }
    this.d.stats.dueWaves++;
    return { due: true, timedOut: false };
  }
}

const NOTHING_DUE_R: EndOfWaveResult = Object.freeze({ due: false, timedOut: false });
const TIMED_OUT_R: EndOfWaveResult = Object.freeze({ due: false, timedOut: true });
// The async call's answers on the usual step: settled once, returned again (nothing allocated).
const NOTHING_DUE: Promise<EndOfWaveResult> = Promise.resolve(NOTHING_DUE_R);
const TIMED_OUT: Promise<EndOfWaveResult> = Promise.resolve(TIMED_OUT_R);
