// beforeForward (input snapshots) and the live-capture wave logic: which wave a forward belongs to,
// and whether a capture armed on the running job covers it. Apart from client.ts because it is the
// one call that may wait a begun capture out, beyond the per-step bound.
import { ConfigError, CaptureError, WavebusError } from '../errors';
import type { ForwardContext } from '../messages';
import type { AgentAvailability } from './availability';
import type { AgentHello } from './hello';
import { DUE_SNAPSHOT, MailboxFeature, NOT_KNOWN, type MailboxReader } from './mailbox';
import type { BeforeForwardResult } from './options';
import type { AgentTransport, Reply } from './transport';
import { noteUncaught, RegionBytes, RingWriter } from './recorder';
import { CallCounter, SnapshotPrecheck } from './snapshot-precheck';

export type Context = Partial<ForwardContext> & { compilationHash: string; globalStep: number };
export type Inputs = { region: string; offset?: number; dtype: string; shape: number[] }[];
/** beforeForward's options: `stagingError`, the engine could not stage this forward's inputs (why). */
export type ForwardOptions = { stagingError?: string };

/** What a forward's capture needs of its client. */
export interface CaptureDeps {
  mailbox: MailboxReader;
  asyncScheduling: boolean;
  transport: AgentTransport;
  availability: AgentAvailability;
  hello: AgentHello;
  stats: { snapshotsSkipped: number; skippedUnavailable: number; recorded: number; notRecorded: number; forwardsNotOffered: number };
  /** How long a begun capture may take (ms). */
  captureMs: number;
  callBoundMs: () => number;
  marginMs: number;
}

/** The usual forward's answer (not offered): one frozen object, nothing allocated per forward. */
export const NOT_CAPTURED_R: BeforeForwardResult = Object.freeze({ captured: false });

export class ForwardCapture {
  /** The engine's last waveHead and endOfWave waves: which wave a forward belongs to (liveCaptureDue). */
  headWave = 0;
  endedWave = 0;

  /** The last before_forward ticket (docs/snapshots.md): random start, so a restarted client's differ. */
  private ticket = 1 + Math.floor(Math.random() * 2 ** 40);

  /** The flight recorder's ring, mapped at the hello that named it (hellos: which one). */
  private ring: RingWriter | undefined;
  private ringHello = -1;
  private readonly regionBytes = new RegionBytes();

  /** Snapshots on: the forwards counted per compilation hash, and the rules of the last hello. */
  private readonly calls = new CallCounter();
  private pre: SnapshotPrecheck | undefined;
  private preOf: unknown;

  constructor(private readonly d: CaptureDeps) {}

  /**
   * Before a forward: the agent decides whether this forward is selected for an input snapshot and,
   * if so, copies and writes the inputs before returning. A failed capture throws CaptureError:
   * the caller aborts the forward (fail loud). An agent that does not answer within the call bound
   * is not a failed capture: the result says `unavailable` (captured false) and the forward goes on.
   */
  beforeForwardNow(context: Context, inputs: Inputs, staging = ''): BeforeForwardResult | Promise<BeforeForwardResult> {
    if (typeof staging !== 'string') throw new ConfigError(`beforeForward(): stagingError must be a string, got ${typeof staging}`);
    const bits = this.d.mailbox.features();
    // Everything off: no recorder, no snapshots, and no capture can be in force either (the
    // Python client's before_forward says the same): one memory load, nothing else read.
    if (bits === 0) return NOT_CAPTURED_R;
    // Inputs not staged: nothing to record (the snapshot path still offers it, to fail loudly).
    if ((bits & MailboxFeature.RECORDER) !== 0 && staging === '') {
      // The flight recorder: one copy into the ring, no message (docs/recorder.md). The ring is
      // mapped once, after the hello that names it; the usual forward records synchronously.
      if (this.ringHello === this.d.hello.hellos && this.d.hello.current(bits)) {
        // Mapped at this hello (no ring: the agent named none, or it could not be mapped: lastError).
        if (this.ring) this.record(this.ring, context, inputs);
      } else {
        return this.recordThenOffer(context, inputs, bits, staging);
      }
    }
    return this.offerIfDue(context, inputs, bits, staging);
  }

  /** The slow path apart: a closure in beforeForwardNow would make V8 allocate its context on every call. */
  private recordThenOffer(context: Context, inputs: Inputs, bits: number, staging: string): Promise<BeforeForwardResult> {
    return this.recordAfterHello(context, inputs).then(() => this.offerIfDue(context, inputs, bits, staging));
  }

  /** The first forward to record (or the first after a new hello): hello, map the ring, record. */
  private async recordAfterHello(context: Context, inputs: Inputs): Promise<void> {
    if (this.d.availability.unavailable) return;
    try {
      await this.d.hello.ensure(this.d.callBoundMs() + this.d.marginMs);
    } catch (e) {
      if (!this.d.availability.lostOn(e, 'beforeForward()')) throw e;
      return; // nothing is recorded while the agent does not answer; the forward goes on
    }
    if (this.ringHello !== this.d.hello.hellos) {
      this.ring = undefined;
      this.ringHello = this.d.hello.hellos;
      if (!this.d.hello.recorderPath) return; // the agent keeps no ring for us
      try {
        this.ring = RingWriter.open(this.d.hello.recorderPath);
      } catch (e) {
        // Debugging never takes the job down: the forward goes on unrecorded, the error is kept.
        this.d.availability.lastError = `beforeForward(): ${(e as Error).message}`;
        return;
      }
      noteUncaught(this.ring);
    }
    if (this.ring) this.record(this.ring, context, inputs);
  }

  /** Lets go of the ring and the input segments' mappings (unmapped once collected). */
  close(): void {
    this.ring = undefined;
    this.ringHello = -1;
    this.regionBytes.close();
  }

  private record(ring: RingWriter, context: Context, inputs: Inputs): void {
    const data: Uint8Array[] = [];
    for (const [i, inp] of inputs.entries()) {
      const where = `beforeForward(): inputs[${i}]`;
      const region = this.d.hello.registered.find((r) => r.name === inp.region);
      if (!region) throw new ConfigError(`${where}.region '${inp.region}' is not a registered region`);
      if (region.role !== 'input') throw new ConfigError(`${where}: region '${inp.region}' has role '${region.role}'; inputs must be in 'input' regions`);
      const got = this.regionBytes.bytesOf(inp, region, where);
      if (typeof got === 'string') {
        this.d.stats.notRecorded++;
        this.d.availability.lastError = `beforeForward(): not recorded: ${got}`;
        return;
      }
      data.push(got);
    }
    const entry = { context: contextMessage(context), inputs: inputs.map(inputMessage), inputBytes: data.map((d) => d.length), wave: this.forwardWave, unixMs: Date.now() };
    try {
      ring.record(entry, data);
    } catch (e) {
      // A context protobuf cannot encode (the agent names what is wrong in a snapshot): unrecorded, not fatal.
      this.d.stats.notRecorded++;
      this.d.availability.lastError = `beforeForward(): not recorded: ${(e as Error).message}`;
      return;
    }
    this.d.stats.recorded++;
  }

  private offerIfDue(context: Context, inputs: Inputs, bits: number, staging: string): BeforeForwardResult | Promise<BeforeForwardResult> {
    // Snapshots off at startup: a forward is offered only when its wave's vector says a capture
    // armed on the running job covers it (docs/control.md): a memory load, no system call.
    // Snapshots on: counted here whether offered or not, and offered when the agent's rules select
    // it (the hello names them) or, as above, a live capture covers its wave.
    let callIndex: number | null = null;
    if ((bits & MailboxFeature.SNAPSHOTS) !== 0) {
      // A region not registered is refused on every forward, offered or not (a name lookup per input).
      const bad = this.unregistered(inputs);
      if (bad) throw bad;
      const ctx = contextMessage(context) as unknown as ForwardContext;
      callIndex = this.calls.count(ctx);
      const pre = this.precheck();
      if (pre === undefined || pre.selects(ctx, callIndex)) return this.offer(context, inputs, callIndex, staging);
      this.d.stats.forwardsNotOffered++;
    }
    const due = this.liveCaptureDue(bits);
    if (due === false) return NOT_CAPTURED_R;
    if (due === undefined) return this.afterVector(context, inputs, callIndex, staging);
    return this.offer(context, inputs, callIndex, staging);
  }

  /** The selection rules of the hello in force (undefined before one, or when it named none). */
  private precheck(): SnapshotPrecheck | undefined {
    const f = this.d.hello.features;
    if (f !== this.preOf) {
      this.preOf = f;
      this.pre = SnapshotPrecheck.of(f);
    }
    return this.pre;
  }

  /** The forward's vector is late (a rank on the vector): wait for it within the bound, as endOfWave would, then offer if due. */
  private async afterVector(context: Context, inputs: Inputs, callIndex: number | null, staging: string): Promise<BeforeForwardResult> {
    const got = await this.d.mailbox.waitFor(this.forwardWave, this.d.callBoundMs()).catch(() => 'timeout' as const);
    if (typeof got === 'string' || !got.snapshotDue) return { captured: false };
    return this.offer(context, inputs, callIndex, staging);
  }

  /** The error for the first input whose region is not registered, if any. */
  private unregistered(inputs: Inputs): ConfigError | undefined {
    for (const [i, inp] of inputs.entries()) {
      if (!this.d.hello.registered.some((r) => r.name === inp.region)) return new ConfigError(`beforeForward(): inputs[${i}].region '${inp.region}' is not a registered region`);
    }
    return undefined;
  }

  private offer(context: Context, inputs: Inputs, callIndex: number | null, staging: string): Promise<BeforeForwardResult> {
    const bad = this.unregistered(inputs);
    if (bad) return Promise.reject(bad);
    if (this.d.availability.unavailable) return Promise.resolve(this.snapshotSkipped());
    return this.capture(context, inputs, callIndex, staging);
  }

  /** The wave a forward now belongs to: the last head's, or the one after the last ended. */
  private get forwardWave(): number {
    return Math.max(this.headWave, this.endedWave + 1);
  }

  /**
   * Whether the vector of the forward's wave says snapshot_due (never under async scheduling: the
   * seed's gating); undefined when it has not arrived while a capture is in force here (wait for it).
   */
  private liveCaptureDue(bits: number): boolean | undefined {
    if (this.d.asyncScheduling) return false;
    const due = this.d.mailbox.dueBits(this.forwardWave);
    if (due !== NOT_KNOWN) return (due & DUE_SNAPSHOT) !== 0;
    return (bits & MailboxFeature.LIVE_CAPTURES) !== 0 && !this.d.availability.unavailable ? undefined : false;
  }

  private snapshotSkipped(): BeforeForwardResult {
    this.d.stats.snapshotsSkipped++;
    this.d.stats.skippedUnavailable++;
    this.d.availability.probe();
    return { captured: false, unavailable: true };
  }

  private async capture(
    context: Context,
    inputs: Inputs,
    callIndex: number | null,
    staging: string,
  ): Promise<BeforeForwardResult> {
    const bound = this.d.callBoundMs() + this.d.marginMs;
    const started = Date.now();
    try {
      await this.d.hello.ensure(bound);
    } catch (e) {
      if (!this.d.availability.lostOn(e, 'beforeForward()')) throw e;
      return this.snapshotSkipped();
    }
    // The agent drops a capture it reaches after we stopped waiting (it was frozen meanwhile).
    const acceptBy = started + bound - this.d.marginMs;
    const request = {
      beforeForward: {
        context: contextMessage(context),
        inputs: inputs.map(inputMessage),
        acceptByUnixMs: acceptBy,
        finishByUnixMs: acceptBy + this.d.captureMs,
        wave: this.forwardWave,
        waitTicket: ++this.ticket,
        callIndexPlus1: callIndex === null ? 0 : callIndex + 1,
        // The engine could not stage the inputs: the agent fails the captures that take this forward with the cause (ERR_SNAPSHOT_INPUT).
        ...(staging !== '' ? { stagingError: staging } : {}),
      },
    };
    // The mailbox says which request we wait on until we stop, whatever stops us: the agent keeps
    // only a copy made while the word still held it (the engine had not touched the inputs).
    this.d.mailbox.setCaptureWaiting(this.ticket);
    try {
      return await this.request(request);
    } finally {
      this.d.mailbox.setCaptureWaiting(0);
    }
  }

  private async request(request: { beforeForward: { acceptByUnixMs: number } }): Promise<BeforeForwardResult> {
    const acceptBy = request.beforeForward.acceptByUnixMs;
    let reply: Reply;
    let begun = false;
    try {
      reply = await this.d.transport.request(request, Math.max(1, acceptBy + this.d.marginMs - Date.now()), this.d.captureMs, () => (begun = true));
      if (!reply.ok && reply.errorCode === 'ERR_NO_HELLO') reply = await this.d.hello.rejoin(request, Math.max(1, acceptBy + this.d.marginMs - Date.now()), this.d.captureMs);
    } catch (e) {
      if (!this.d.availability.lostOn(e, 'beforeForward()')) throw e;
      // Begun but not finished: a failed capture (fail loud), and the agent is not answering.
      if ((e as WavebusError).code === 'ERR_CAPTURE_TIMEOUT') throw new CaptureError(`input snapshot failed: ${(e as Error).message}`, 'ERR_CAPTURE_TIMEOUT');
      return this.snapshotSkipped();
    }
    if (!reply.ok && reply.errorCode === 'ERR_CLIENT_GONE' && !begun) {
      // The agent reached the request past acceptBy (the last margin of our wait, or later): it
      // copied nothing, as if it had not answered. A late agent is not a failed capture: this
      // forward is not captured, said (lastError) and counted, and the forward goes on. The agent
      // answered, so it is not taken for lost. (A begun capture that ends so is a failed one.)
      this.d.stats.snapshotsSkipped++;
      this.d.availability.lastError = `beforeForward(): the agent reached this forward after the engine's deadline; not captured: ${reply.error}`;
      return { captured: false };
    }
    if (!reply.ok) throw new CaptureError(`input snapshot failed: ${reply.error}`, reply.errorCode || 'ERR_CAPTURE');
    return { captured: reply.captured, callDir: reply.callDir || undefined };
  }
}

/** The wire form of a forward's context (proto ForwardContext). */
function contextMessage(context: Context): Record<string, unknown> {
  return {
    compilationHash: context.compilationHash,
    globalStep: context.globalStep,
    isPrompt: context.isPrompt ?? false,
    reqIds: context.reqIds ?? [],
    positions: context.positions ?? [],
    rowRequest: context.rowRequest ?? [],
    numSpeculativeTokens: context.numSpeculativeTokens ?? 0,
    warmup: context.warmup ?? false,
  };
}

function inputMessage(x: Inputs[number]): Record<string, unknown> {
  return { region: x.region, offset: x.offset ?? 0, dtype: x.dtype, shape: x.shape };
}
