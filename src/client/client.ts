// The TypeScript engine client: what an engine rank calls. Thin by design: with every feature off
// it sends nothing; per step it reads the wave vector from the agent's shared-memory mailbox and
// calls the agent only when this rank has work in that wave. The Python client mirrors it.
import { ConfigError, WavebusError } from '../errors';
import { MailboxReader, MailboxFeature } from './mailbox';
import { ClientDigests, type IntColumn } from './digest';
import { AgentAvailability } from './availability';
import { AgentHello } from './hello';
import { newClientStats, type ClientStats } from './client-stats';
import { validateRegion, type ClientRegion } from './region';
import { AgentTransport } from './transport';
import { waveError, WaveHeadSender, type WaveTelemetry } from './wave-head';
import { dueDumpsAsker, PendingDumps } from './pending-dumps';
import { VectorStall } from './vector-stall';
import { EndOfWaveCall } from './end-of-wave';
import { ForwardCapture, NOT_CAPTURED_R, type Context, type ForwardOptions, type Inputs } from './live-capture';

import type { TensorBatch, TensorBatchOptions } from './tensor-batch';
import { attachTensorBatch } from './tensor-batch-host';
import { decisionPathGate } from './digest-gate';
import { RingAtHello } from './telemetry-ring-writer';
import { clientFingerprint } from './fingerprint';
import { sendWeights, type WeightShard } from './weights';
import { openConnection, type BeforeForwardResult, type ClientFeatures, type ConnectOptions, type EndOfWaveResult } from './options';

export type { ClientRegion } from './region';
export type { WeightShard, HostWeight, SharedWeight } from './weights';
export type { BeforeForwardResult, ClientFeatures, ConnectOptions, EndOfWaveResult } from './options';
export type { TensorBatch, TensorBatchOptions, TensorStep } from './tensor-batch';

const MARGIN_MS = 20;

export class WavebusClient {
  /** What the client did and skipped, counted (client-stats.ts). */
  readonly stats: ClientStats = newClientStats();
  private readonly transport: AgentTransport;
  private readonly availability: AgentAvailability;
  private readonly head: WaveHeadSender;
  private readonly hello: AgentHello;
  /** beforeForward and the wave a forward belongs to (live-capture.ts). */
  private readonly forward: ForwardCapture;
  private readonly pending: PendingDumps;
  private readonly stall: VectorStall;
  /** endOfWave / endOfWaveNow (end-of-wave.ts). */
  private readonly eow: EndOfWaveCall;
  /** rank_divergence: the decision ring's writer (digest.ts). */
  private readonly digests: ClientDigests;
  /** The tensor hot path (tensorBatch()) and the telemetry ring its hello asked for. */
  private tensor: TensorBatch | null = null;
  private readonly ring: RingAtHello;

  private constructor(
    private readonly endpoint: string,
    private readonly mailbox: MailboxReader,
    asyncScheduling: boolean,
    private readonly bounds: { call?: number; hello: number; capture: number; probe: number },
    fingerprint: Record<string, unknown>,
  ) {
    this.transport = new AgentTransport(endpoint, this.stats, {
      heard: () => this.availability.heard(),
      beforeSend: () => this.head.flush(),
      oneWayFailed: (what, e) => {
        this.availability.lastError = `${what}: ${e.message}`;
        this.head.resendBindings(); // a wave head's bindings may have been in this one
        this.tensor?.resendAll();
      },
    });
    this.availability = new AgentAvailability(
      endpoint,
      this.stats,
      bounds.probe,
      (ms) => (this.transport.closed ? undefined : this.transport.request({ ping: {} }, ms)),
      () => this.hello.forget(), // it may be a new agent: introduce ourselves again
    );
    this.hello = new AgentHello(endpoint, this.transport, mailbox, asyncScheduling, this.stats, fingerprint);
    this.head = new WaveHeadSender(this.transport, (message) => {
      this.availability.lastError = message;
      this.tensor?.resendAll();
    });
    this.ring = new RingAtHello(this.hello, (message) => (this.availability.lastError = message));
    this.stall = new VectorStall(mailbox);
    this.digests = new ClientDigests(() => mailbox.features(), MailboxFeature.RANK_DIGEST, decisionPathGate(this.hello, this.availability, bounds.hello));
    this.forward = new ForwardCapture({
      mailbox, asyncScheduling, transport: this.transport, availability: this.availability, hello: this.hello, stats: this.stats,
      captureMs: bounds.capture, callBoundMs: () => this.callBoundMs(), marginMs: MARGIN_MS,
    });
    this.pending = new PendingDumps(
      mailbox,
      dueDumpsAsker({
        transport: this.transport,
        unavailable: () => this.agentUnavailable,
        boundMs: () => this.callBoundMs() + MARGIN_MS,
        hello: (ms) => this.hello.ensure(ms),
        failed: (e, where) => {
          if (!this.availability.lostOn(e, where)) this.noteError(`${where}: ${(e as Error).message}`);
        },
        coordinatorLost: () => this.onCoordinatorLost(),
      }),
      this.stall,
    );
    this.eow = new EndOfWaveCall({
      mailbox, transport: this.transport, availability: this.availability, hello: this.hello, stats: this.stats,
      pending: this.pending, stall: this.stall, forward: this.forward, callBound: bounds.call,
      callBoundMs: () => this.callBoundMs(), marginMs: MARGIN_MS,
      noteError: (message) => this.noteError(message), coordinatorLost: () => this.onCoordinatorLost(),
    });
  }

  /**
   * Is a dump of `reqId` armed for a wave whose endOfWave has not run on this rank yet? An engine
   * asks before freeing a request's blocks and, when true, keeps them one more step (the copy then
   * reads the request's own KV). Settled at once, without a system call, when no vector in the
   * mailbox has dump_due; else the due wave's req ids are asked of the agent once per wave.
   */
  pendingDump(reqId: string): Promise<boolean> {
    const r = this.pendingDumpNow(reqId);
    return r === false ? FALSE : r === true ? TRUE : r;
  }

  /**
   * pendingDump without a promise when the answer is known now (the usual step: nothing due):
   * a boolean, else the promise pendingDump would return. The engine's hot loop takes it and awaits
   * only a promise (docs/typescript-client.md, "The per-step calls without a promise").
   */
  pendingDumpNow(reqId: string): boolean | Promise<boolean> {
    if ((this.mailbox.features() & MailboxFeature.BUS_ACTIVE) === 0) return false;
    return this.pending.check(reqId);
  }

  /**
   * The requests of `reqIds` that pendingDump says to keep, in their order: one call for the step's
   * finished requests instead of one each. Resolves the empty array (shared: do not change it) when
   * none is kept.
   */
  pendingDumps(reqIds: readonly string[]): Promise<readonly string[]> {
    let r: readonly string[] | Promise<readonly string[]>;
    try {
      r = this.pendingDumpsNow(reqIds);
    } catch (e) {
      return Promise.reject(e);
    }
    return r instanceof Promise ? r : Promise.resolve(r);
  }

  /** pendingDumps without a promise when every answer is known now (the usual step: nothing due). */
  pendingDumpsNow(reqIds: readonly string[]): readonly string[] | Promise<readonly string[]> {
    if (!Array.isArray(reqIds)) throw new ConfigError(`pendingDumps(): reqIds must be an array of request ids, got ${typeof reqIds}`);
    if (reqIds.length === 0 || (this.mailbox.features() & MailboxFeature.BUS_ACTIVE) === 0) return NO_IDS;
    let keep: string[] | undefined;
    for (let i = 0; i < reqIds.length; i++) {
      const k = this.pending.check(reqIds[i]);
      if (k instanceof Promise) return this.pendingDumpsFrom(reqIds, i, k, keep ?? []);
      if (k) (keep ??= []).push(reqIds[i]);
    }
    return keep ?? NO_IDS;
  }

  /** pendingDumpsNow's slow path from request `i`, whose answer is `first` (the agent is asked). */
  private async pendingDumpsFrom(reqIds: readonly string[], i: number, first: Promise<boolean>, keep: string[]): Promise<readonly string[]> {
    if (await first) keep.push(reqIds[i]);
    for (let j = i + 1; j < reqIds.length; j++) if (await this.pendingDump(reqIds[j])) keep.push(reqIds[j]);
    return keep.length > 0 ? keep : NO_IDS;
  }

  private onCoordinatorLost(): void {
    this.stats.coordinatorLost++;
    this.stall.begin();
  }

  /** True while the agent is known not to answer: calls skip it until it answers again. */
  get agentUnavailable(): boolean {
    return this.availability.unavailable;
  }

  /** The last error a per-step call met and swallowed (the step went on). */
  get lastError(): string {
    return this.availability.lastError;
  }

  /** Maps the mailbox once the agent has written its header (at most mailboxWaitMs); sends nothing. */
  static async connect(opts: ConnectOptions = {}): Promise<WavebusClient> {
    const c = await openConnection(opts);
    const fingerprint = clientFingerprint({ engineVersion: opts.engineVersion, deviceName: opts.deviceName, env: opts.env });
    return new WavebusClient(c.endpoint, c.mailbox, c.asyncScheduling, c.bounds, fingerprint);
  }

  /** Feature bits the agent publishes in the mailbox header; 0 means everything is off. */
  featureFlags(): number {
    return this.mailbox.features();
  }

  /** Register a device region (KV pool layer or input buffer). Sent only if some feature can use it. */
  async register(region: ClientRegion): Promise<void> {
    validateRegion(region);
    if (this.hello.registered.some((r) => r.name === region.name)) {
      throw new ConfigError(`register(): region name '${region.name}' is already registered`);
    }
    this.hello.registered.push(region);
    if (this.mailbox.features() === 0) return;
    // Either way the region is kept and sent once the agent answers again; the caller may go on.
    const unavailable = (): WavebusError => new WavebusError('ERR_AGENT_UNAVAILABLE', `register('${region.name}'): the agent at ${this.endpoint} is not answering (${this.lastError})`);
    if (this.agentUnavailable) throw unavailable();
    try {
      await this.hello.ensure(this.bounds.hello);
      await this.hello.flushRegistrations(this.bounds.hello);
    } catch (e) {
      if (!this.availability.lostOn(e, `register('${region.name}')`)) throw e;
      throw unavailable();
    }
  }

  /**
   * Weight checksums for this rank's fingerprint (docs/fingerprints.md): optional, once, after
   * loading and before serving. The agent reads each shard itself and adds its crc32c; the call
   * returns once every shard is checksummed and the fingerprint is on its way to the coordinator
   * (each shard bounded by captureTimeoutMs). Returns the shards the agent took (0 when everything is off).
   */
  registerWeights(weights: Record<string, WeightShard>): Promise<number> {
    return sendWeights(
      {
        enabled: () => this.mailbox.features() !== 0,
        unavailable: () => this.agentUnavailable,
        hello: () => this.hello.ensure(this.bounds.hello),
        request: (body) =>
          this.transport.request(body, this.bounds.capture).catch((e) => {
            if (this.availability.lostOn(e, 'registerWeights()')) return undefined;
            throw e;
          }),
        endpoint: this.endpoint,
      },
      weights,
    );
  }

  /** The bound of a per-step call: the configured one, else the agent's end-of-wave bound. */
  callBoundMs(): number {
    return this.bounds.call ?? this.hello.features?.endOfWaveTimeoutMs ?? this.bounds.hello;
  }

  // The per-step calls are plain functions with an async slow path: with everything off (or
  // nothing due) they return an already settled promise, allocating nothing.

  /** Head of `wave`, with the telemetry of the previous wave (TP0 of the last PP stage only). */
  waveHead(wave: number, telemetry?: WaveTelemetry): Promise<void> {
    const bad = waveError(wave, 'waveHead');
    if (bad) return bad;
    this.forward.headWave = wave;
    const bits = this.mailbox.features();
    if (bits === 0) {
      this.head.reset(); // requests freed meanwhile go unseen: start over when sending again
      return SETTLED;
    }
    if (this.agentUnavailable) {
      // Nothing queues up for an agent that is gone; the bindings go again once it is back.
      this.head.reset();
      this.stats.skippedUnavailable++;
      this.availability.probe();
      return SETTLED;
    }
    // Known features (the usual step): built now, sent when the engine yields; nothing to wait for.
    const known = this.hello.current(bits);
    if (known) {
      try {
        this.sendWaveHead(known, wave, telemetry);
      } catch (e) {
        return Promise.reject(e);
      }
      return SETTLED;
    }
    return this.headAfterHello(wave, telemetry);
  }

  /** waveHead's slow path apart: a closure in waveHead would make V8 allocate its context on every call. */
  private headAfterHello(wave: number, telemetry?: WaveTelemetry): Promise<void> {
    return this.hello.ensure(this.callBoundMs() + MARGIN_MS).then(
      (f) => this.sendWaveHead(f, wave, telemetry),
      (e) => {
        if (!this.availability.lostOn(e, `waveHead(${wave})`)) throw e;
      },
    );
  }

  /**
   * The tensor hot path (docs/typescript-client.md): a TensorBatch of `maxRows` stable rows whose
   * waveHead takes typed-array columns, copied into a telemetry ring the agent makes at the next hello.
   */
  tensorBatch(maxRows: number, opts: TensorBatchOptions = {}): TensorBatch {
    const { mailbox, hello, availability, head, ring, stats } = this;
    this.tensor = attachTensorBatch(
      { mailbox, hello, availability, head, ring, stats, helloBoundMs: () => this.callBoundMs() + MARGIN_MS, headWave: (w) => (this.forward.headWave = w) },
      maxRows,
      opts,
    );
    return this.tensor;
  }

  private sendWaveHead(f: ClientFeatures, wave: number, telemetry?: WaveTelemetry): void {
    if (!f.tp0 || !f.bus) {
      this.head.reset();
      return;
    }
    this.head.build(wave, telemetry, { detectors: f.detectors.length > 0, epoch: this.mailbox.epoch() });
  }

  /** End of `wave`: returns at once when nothing is due; never blocks longer than the configured bound. */
  endOfWave(wave: number): Promise<EndOfWaveResult> {
    return this.eow.call(wave);
  }

  /**
   * endOfWave without a promise when nothing is due (the usual step): the result, else the promise
   * endOfWave would return. A wave that is not a non-negative integer throws ConfigError here.
   */
  endOfWaveNow(wave: number): EndOfWaveResult | Promise<EndOfWaveResult> {
    return this.eow.now(wave);
  }

  /**
   * Before a forward: the agent decides whether this forward is selected for an input snapshot and,
   * if so, copies and writes the inputs before returning. A failed capture throws CaptureError:
   * the caller aborts the forward (fail loud). An agent that does not answer within the call bound
   * is not a failed capture: the result says `unavailable` (captured false) and the forward goes on.
   * `opts.stagingError`: the engine could not stage this forward's inputs (why; `inputs` empty): a
   * forward a capture would take is offered without inputs and the agent fails those captures with
   * the cause (CaptureError ERR_SNAPSHOT_INPUT here, the error in `wavebus capture`), as the Python
   * client's before_forward(staging_error=...).
   */
  beforeForward(context: Context, inputs: Inputs, opts: ForwardOptions = {}): Promise<BeforeForwardResult> {
    let r: BeforeForwardResult | Promise<BeforeForwardResult>;
    try {
      r = this.forward.beforeForwardNow(context, inputs, opts.stagingError);
    } catch (e) {
      return Promise.reject(e);
    }
    return r === NOT_CAPTURED_R ? NOT_CAPTURED : r instanceof Promise ? r : Promise.resolve(r);
  }

  /**
   * beforeForward without a promise when the forward is not offered (the usual forward): the
   * result, else the promise beforeForward would return. Errors beforeForward would reject with
   * (an unregistered region, an input the recorder refuses) are thrown here.
   */
  beforeForwardNow(context: Context, inputs: Inputs, opts: ForwardOptions = {}): BeforeForwardResult | Promise<BeforeForwardResult> {
    return this.forward.beforeForwardNow(context, inputs, opts.stagingError);
  }

  /**
   * rank_divergence: this rank decided `column` (one token id per row, in the telemetry's row order)
   * in `wave`. Off (the mailbox's RANK_DIGEST bit clear): false at once. docs/runtime-guard.md.
   */
  decided(wave: number, column: IntColumn): Promise<boolean> {
    return this.digests.decided(wave, column);
  }

  /**
   * rank_divergence: the forward of `wave` takes these token ids and positions (before_forward);
   * with `rowStarts` (rows + 1 offsets into tokenIds) an inputs mismatch names its first row.
   */
  decidedInputs(wave: number, tokenIds: ArrayBufferView, positions?: ArrayBufferView, rowStarts?: IntColumn): Promise<boolean> {
    return this.digests.inputs(wave, tokenIds, positions, rowStarts);
  }

  async close(): Promise<void> {
    if (this.transport.closed) return;
    this.digests.close();
    this.head.flush(); // the last head still goes out
    await this.transport.close();
    this.mailbox.close();
    this.forward.close();
  }

  /** The features the agent reported; undefined until the first call that needed the agent. */
  reportedFeatures(): ClientFeatures | undefined {
    return this.hello.features;
  }

  private noteError(message: string): void {
    this.stats.endOfWaveErrors++;
    this.availability.lastError = message;
  }
}

const SETTLED: Promise<void> = Promise.resolve();
const FALSE: Promise<boolean> = Promise.resolve(false);
const TRUE: Promise<boolean> = Promise.resolve(true);
/** pendingDumps()'s answer when no request is kept (frozen: one array for every step). */
const NO_IDS: readonly string[] = Object.freeze([]);
// The async calls' answers on the usual step: settled once, returned again (nothing allocated).
const NOT_CAPTURED: Promise<BeforeForwardResult> = Promise.resolve(NOT_CAPTURED_R);

export { MailboxFeature };
