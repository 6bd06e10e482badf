// The TypeScript engine client: what an engine rank calls. Thin by design: with every feature off
// it sends nothing; per step it reads the wave vector from the agent's shared-memory mailbox and
// calls the agent only when this rank has work in that wave. The Python client mirrors it.
import * as zmq from 'zeromq';
import { ConfigError, CaptureError, WavebusError } from '../errors';
import { MailboxReader, MailboxFeature } from './mailbox';
import type { ForwardContext, NonFiniteRow, StepTelemetry } from '../messages';
import { agentEndpoint, mailboxPath } from '../paths';
import { ClientReply, ClientRequest, decode, encode, encodeTrusted } from '../proto';
import { checkSnapshotGating, type SnapshotConfig } from '../snapshot/config';
import { columnsToWire, TelemetryColumnizer } from './telemetry';

export interface ClientRegion {
  name: string;
  kind?: 'shm' | 'cuda';
  shmName?: string;
  offset?: number;
  nbytes: number;
  cudaIpcHandle?: Buffer;
  device?: number;
  dtype: string;
  shape: number[];
  role: 'kv_pool' | 'input';
  layer?: string;
  kv?: 'k' | 'v';
}

export interface ClientFeatures {
  tp0: boolean;
  bus: boolean;
  detectors: Record<string, boolean>;
  item_sync: boolean;
  snapshots: boolean;
  end_of_wave_timeout_ms: number;
}

export interface ConnectOptions {
  /** ipc:// endpoint of this rank's agent; default from WAVEBUS_RUN_DIR and LOCAL_RANK. */
  endpoint?: string;
  /** Path of the agent's mailbox; default from WAVEBUS_RUN_DIR and LOCAL_RANK. */
  mailbox?: string;
  env?: NodeJS.ProcessEnv;
  /** The engine schedules asynchronously (refused when snapshots are on). */
  asyncScheduling?: boolean;
  /**
   * Longest a per-step call (endOfWave, beforeForward until the agent answers) waits on the agent.
   * Default: the agent's end-of-wave bound (`--end-of-wave-timeout-ms`, 50 ms).
   */
  callTimeoutMs?: number;
  /** Longest hello and register() wait outside a step (default 1000 ms). */
  helloTimeoutMs?: number;
  /** Longest a capture the agent has begun may take to finish (default 120000 ms). */
  captureTimeoutMs?: number;
  /** While the agent is unavailable, how often a call sends it a probe (default 1000 ms). */
  probeIntervalMs?: number;
}

export interface BeforeForwardResult {
  captured: boolean;
  callDir?: string;
  /** The agent did not answer (dead or frozen): the forward goes on without a snapshot. */
  unavailable?: boolean;
}

export interface EndOfWaveResult {
  /** Set when the agent answered with an error; counted in stats.endOfWaveErrors, never thrown. */
  error?: string;
  /** Something was due for this rank in this wave and the agent handled it. */
  due: boolean;
  /** The wave vector did not arrive within the bound; the step went on without it. */
  timedOut: boolean;
}

interface Pending {
  resolve: (r: Record<string, any>) => void;
  reject: (e: Error) => void;
  /** before_forward's interim answer: the capture has begun. */
  capturing?: () => void;
}

const MARGIN_MS = 20;
const DEFAULT_HELLO_TIMEOUT_MS = 1000;
const DEFAULT_CAPTURE_TIMEOUT_MS = 120000;
const DEFAULT_PROBE_INTERVAL_MS = 1000;
/** Steps between re-sends of every request's binding and block table (a lost one heals by then). */
const RESEND_EVERY = 64;

export class WavebusClient {
  readonly stats = {
    sent: 0, endOfWaveTimeouts: 0, endOfWaveCalls: 0, dueWaves: 0, rejoins: 0, endOfWaveErrors: 0,
    /** Times the agent stopped answering (each starts a stretch of degraded mode). */
    agentLost: 0,
    /** Times it answered again afterwards. */
    agentBack: 0,
    /** Calls that returned at once, without the agent, because it was unavailable. */
    skippedUnavailable: 0,
    /** beforeForward calls that went on uncaptured because the agent was unavailable. */
    snapshotsSkipped: 0,
    probes: 0,
  };
  /** True while the agent is known not to answer: calls skip it until it answers again. */
  agentUnavailable = false;
  /** The last error a per-step call met and swallowed (the step went on). */
  lastError = '';
  private socket: zmq.Dealer | undefined;
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private features: ClientFeatures | undefined;
  private featureBits = -1;
  private readonly registered: ClientRegion[] = [];
  private readonly registeredSent = new Set<string>();
  private closed = false;
  private sendChain: Promise<void> = Promise.resolve();
  /** Request slots and last-sent block tables of the telemetry; null after a pause in sending. */
  private columnizer: TelemetryColumnizer | null = null;
  private telemetryEpoch = -1;
  private sinceResend = 0;
  /** A wave head built during the engine's call, encoded and sent once the engine yields. */
  private queuedHead: Record<string, unknown> | null = null;
  private headFlushScheduled = false;
  /** Monotonic ms of the agent's last answer (any answer proves it alive). */
  private lastAnswerAt = -Infinity;
  private lastProbeAt = -Infinity;
  private probing = false;
  private ping: Promise<unknown> | null = null;

  private constructor(
    private readonly endpoint: string,
    private readonly mailbox: MailboxReader,
    private readonly asyncScheduling: boolean,
    private readonly bounds: { call?: number; hello: number; capture: number; probe: number },
  ) {}

  /** Maps the mailbox; sends nothing. */
  static async connect(opts: ConnectOptions = {}): Promise<WavebusClient> {
    const env = opts.env ?? process.env;
    let endpoint = opts.endpoint;
    let mbox = opts.mailbox;
    if (!endpoint || !mbox) {
      const runDir = env.WAVEBUS_RUN_DIR;
      if (!runDir) throw new ConfigError('WAVEBUS_RUN_DIR is not set (start the job under `wavebus launch`, or pass endpoint and mailbox)');
      const lr = env.LOCAL_RANK;
      if (lr === undefined || !/^\d+$/.test(lr)) throw new ConfigError(`LOCAL_RANK='${lr ?? ''}' is not a non-negative integer`);
      endpoint = endpoint ?? agentEndpoint(runDir, Number(lr));
      mbox = mbox ?? mailboxPath(runDir, Number(lr));
    }
    const reader = MailboxReader.open(mbox);
    if (opts.asyncScheduling && (reader.features() & MailboxFeature.SNAPSHOTS) !== 0) {
      reader.close();
      // Refused at startup, not at the first forward: the agent says snapshots are on.
      checkSnapshotGating({ enabled: true } as SnapshotConfig, { asyncScheduling: true, backendHasMemoryAccess: true });
    }
    const bound = (v: number | undefined, name: string, def?: number): number | undefined => {
      if (v === undefined) return def;
      if (!Number.isSafeInteger(v) || v < 1) {
        reader.close();
        throw new ConfigError(`connect(): ${name} must be a positive integer (ms), got ${String(v)}`);
      }
      return v;
    };
    const bounds = {
      call: bound(opts.callTimeoutMs, 'callTimeoutMs'),
      hello: bound(opts.helloTimeoutMs, 'helloTimeoutMs', DEFAULT_HELLO_TIMEOUT_MS) as number,
      capture: bound(opts.captureTimeoutMs, 'captureTimeoutMs', DEFAULT_CAPTURE_TIMEOUT_MS) as number,
      probe: bound(opts.probeIntervalMs, 'probeIntervalMs', DEFAULT_PROBE_INTERVAL_MS) as number,
    };
    return new WavebusClient(endpoint, reader, opts.asyncScheduling ?? false, bounds);
  }

  /** Feature bits the agent publishes in the mailbox header; 0 means everything is off. */
  featureFlags(): number {
    return this.mailbox.features();
  }

  private active(): boolean {
    return this.mailbox.features() !== 0;
  }

  /** Register a device region (KV pool layer or input buffer). Sent only if some feature can use it. */
  async register(region: ClientRegion): Promise<void> {
    validateRegion(region);
    if (this.registered.some((r) => r.name === region.name)) {
      throw new ConfigError(`register(): region name '${region.name}' is already registered`);
    }
    this.registered.push(region);
    if (!this.active()) return;
    // Either way the region is kept and sent once the agent answers again; the caller may go on.
    const unavailable = (): WavebusError => new WavebusError('ERR_AGENT_UNAVAILABLE', `register('${region.name}'): the agent at ${this.endpoint} is not answering (${this.lastError})`);
    if (this.agentUnavailable) throw unavailable();
    try {
      await this.ensureHello(this.bounds.hello);
      await this.flushRegistrations(this.bounds.hello);
    } catch (e) {
      if (!this.lostOn(e, `register('${region.name}')`)) throw e;
      throw unavailable();
    }
  }

  /** The bound of a per-step call: the configured one, else the agent's end-of-wave bound. */
  callBoundMs(): number {
    return this.bounds.call ?? this.features?.end_of_wave_timeout_ms ?? this.bounds.hello;
  }

  /**
   * `e` (from a call to the agent) means the agent is not answering: no answer within the bound,
   * or the socket refused the message. Marks it unavailable (warned once per loss) and says so.
   */
  private lostOn(e: unknown, where: string): boolean {
    const code = (e as WavebusError)?.code;
    if (code === 'ERR_CLOSED' || (e instanceof WavebusError && code !== 'ERR_TIMEOUT' && code !== 'ERR_CAPTURE_TIMEOUT')) return false;
    this.markUnavailable(`${where}: ${(e as Error)?.message ?? String(e)}`);
    return true;
  }

  private markUnavailable(why: string): void {
    this.lastProbeAt = performance.now();
    if (this.agentUnavailable) return;
    this.agentUnavailable = true;
    this.stats.agentLost++;
    this.lastError = why;
    process.stderr.write(`wavebus: warning: the agent at ${this.endpoint} is not answering (${why}); engine calls skip it until it answers again\n`);
  }

  /** Any answer from the agent: it is alive. After a loss, hello and regions go again on the next call. */
  private heardFromAgent(): void {
    this.lastAnswerAt = performance.now();
    if (!this.agentUnavailable) return;
    this.agentUnavailable = false;
    this.stats.agentBack++;
    this.features = undefined; // it may be a new agent: introduce ourselves again
    this.registeredSent.clear();
    process.stderr.write(`wavebus: the agent at ${this.endpoint} answers again; engine calls use it again\n`);
  }

  /** While the agent is unavailable: at most one probe per interval, never waited for. */
  private probe(): void {
    if (!this.agentUnavailable || this.probing || this.closed || performance.now() - this.lastProbeAt < this.bounds.probe) return;
    this.probing = true;
    this.lastProbeAt = performance.now();
    this.stats.probes++;
    // The answer itself (in receiveLoop) ends the unavailability; a timeout leaves it as it is.
    this.send({ ping: {} }, this.bounds.probe)
      .catch(() => undefined)
      .finally(() => (this.probing = false));
  }

  private helloBody(): Record<string, unknown> {
    return { hello: { pid: process.pid, asyncScheduling: this.asyncScheduling, language: 'typescript' } };
  }

  // The per-step calls are plain functions with an async slow path: with everything off (or
  // nothing due) they return an already settled promise, allocating nothing.

  /** Head of `wave`, with the telemetry of the previous wave (TP0 of the last PP stage only). */
  waveHead(wave: number, telemetry?: Omit<StepTelemetry, 'wave'> & { wave?: number }): Promise<void> {
    const bad = waveError(wave, 'waveHead');
    if (bad) return bad;
    const bits = this.mailbox.features();
    if (bits === 0) {
      this.columnizer = null; // requests freed meanwhile go unseen: start over when sending again
      return SETTLED;
    }
    if (this.agentUnavailable) {
      // Nothing queues up for an agent that is gone; the bindings go again once it is back.
      this.columnizer = null;
      this.stats.skippedUnavailable++;
      this.probe();
      return SETTLED;
    }
    // Known features (the usual step): built now, sent when the engine yields; nothing to wait for.
    if (this.features && bits === this.featureBits) {
      try {
        this.sendWaveHead(this.features, wave, telemetry);
      } catch (e) {
        return Promise.reject(e);
      }
      return SETTLED;
    }
    return this.ensureHello(this.callBoundMs() + MARGIN_MS).then(
      (f) => this.sendWaveHead(f, wave, telemetry),
      (e) => {
        if (!this.lostOn(e, `waveHead(${wave})`)) throw e;
      },
    );
  }

  private sendWaveHead(f: ClientFeatures, wave: number, telemetry?: Omit<StepTelemetry, 'wave'> & { wave?: number }): void {
    if (!f.tp0 || !f.bus) {
      this.columnizer = null;
      return;
    }
    const anyDetector = Object.values(f.detectors).some(Boolean);
    const body: Record<string, unknown> = { wave };
    if (telemetry) {
      const columnizer = this.columnizer ?? (this.columnizer = new TelemetryColumnizer());
      // A new coordinator (epoch) knows no bindings; a periodic re-send heals a lost message.
      const epoch = this.mailbox.epoch();
      if (epoch !== this.telemetryEpoch || ++this.sinceResend >= RESEND_EVERY) {
        this.telemetryEpoch = epoch;
        this.sinceResend = 0;
        columnizer.resend();
      }
      const telemetryWave = telemetry.wave ?? wave - 1;
      if (!isWaveNumber(telemetryWave)) throw new ConfigError(`waveHead(): telemetry.wave ${String(telemetry.wave)} is not a non-negative integer`);
      // Checked and copied now: the engine may reuse its objects once this call returns, and the
      // message is encoded later without protobufjs's own checks.
      const nonFinite = anyDetector ? (telemetry.nonFinite ?? []).map(nonFiniteRow) : [];
      let columns;
      try {
        // Without detectors only what a manual dump needs travels: requests, blocks, finish/free.
        columns = columnizer.columns(telemetry.requests ?? [], { tokens: anyDetector, where: 'waveHead(): telemetry' });
      } catch (e) {
        this.columnizer = null; // slots taken by the bad step were never sent: start over
        throw e;
      }
      body.telemetry = { wave: telemetryWave, columns: columnsToWire(columns), nonFinite };
    }
    this.queueWaveHead(body);
  }

  /**
   * One-way (id 0): the engine never waits for the agent or the coordinator at the head of a wave.
   * Encoding and the socket send (~50 µs of CPU when the process wakes cold) run when the engine
   * next yields to the event loop, typically while it awaits the forward on the device, instead of
   * inside its step. Anything else sent meanwhile flushes the head first, so order is kept.
   */
  private queueWaveHead(body: Record<string, unknown>): void {
    if (this.queuedHead) this.flushWaveHead(); // two heads without a yield between them
    this.queuedHead = body;
    if (!this.headFlushScheduled) {
      this.headFlushScheduled = true;
      setImmediate(() => {
        this.headFlushScheduled = false;
        this.flushWaveHead();
      });
    }
  }

  private flushWaveHead(): void {
    const body = this.queuedHead;
    if (!body || this.closed) return;
    this.queuedHead = null;
    try {
      // Built here from checked columns: encoded without protobufjs's verify/fromObject pass.
      this.pushOneWay(encodeTrusted(ClientRequest, { id: 0, waveHead: body }), 'waveHead');
    } catch (e) {
      // Runs outside the engine's call (setImmediate): never throw into its event loop.
      this.lastError = `waveHead: ${(e as Error).message}`;
      this.columnizer?.resend();
    }
  }

  /** End of `wave`: returns at once when nothing is due; never blocks longer than the configured bound. */
  endOfWave(wave: number): Promise<EndOfWaveResult> {
    const bad = waveError(wave, 'endOfWave');
    if (bad) return bad;
    this.stats.endOfWaveCalls++;
    const bits = this.mailbox.features();
    if (bits === 0 || (bits & MailboxFeature.BUS_ACTIVE) === 0) return NOTHING_DUE;
    const slot = this.mailbox.read(wave);
    if (slot && !slot.configDue && !slot.dumpDue) return NOTHING_DUE;
    if (this.agentUnavailable) {
      // Its mailbox is not updated any more: no waiting, the step goes on (counted). A frozen
      // agent still learns of the miss when it resumes (one-way; dropped if its queue is full).
      this.stats.endOfWaveTimeouts++;
      this.stats.skippedUnavailable++;
      this.sendOneWay({ endOfWave: { wave, missed: true } });
      this.probe();
      return Promise.resolve({ due: false, timedOut: true });
    }
    // Late vector, agent known: sleep on the mailbox (woken by the agent's publish), not a round trip.
    if (!slot && this.features && bits === this.featureBits) return this.awaitVector(wave, this.features.end_of_wave_timeout_ms);
    return this.endOfWaveWithAgent(wave);
  }

  /** The vector of `wave` is late: wait for it on the mailbox, within the bound. */
  private async awaitVector(wave: number, boundMs: number): Promise<EndOfWaveResult> {
    let got: Awaited<ReturnType<MailboxReader['waitFor']>>;
    // A late vector may mean a dead agent (nobody updates the mailbox): ask it, alongside the wait.
    const since = performance.now();
    if (!this.ping) {
      this.ping = this.send({ ping: {} }, boundMs + MARGIN_MS)
        .catch(() => undefined)
        .finally(() => (this.ping = null));
    }
    try {
      got = await this.mailbox.waitFor(wave, boundMs);
    } catch (e) {
      this.noteError(`endOfWave(${wave}): ${(e as Error).message}`);
      return this.endOfWaveWithAgent(wave); // the mailbox could not be read (closed?): the agent decides
    }
    if (got === 'timeout') {
      // The step goes on; the agent counts the miss and fails the wave's dumps if any arrive.
      this.stats.endOfWaveTimeouts++;
      if (this.lastAnswerAt < since) {
        // Not a word from the agent for the whole bound: the next calls do not wait for it.
        this.markUnavailable(`endOfWave(${wave}): no answer within ${boundMs} ms`);
      }
      this.sendOneWay({ endOfWave: { wave, missed: true } });
      return { due: false, timedOut: true };
    }
    if (got !== 'overwritten' && !got.configDue && !got.dumpDue) return { due: false, timedOut: false };
    return this.endOfWaveWithAgent(wave);
  }

  /** The vector has not arrived, or something is due: the agent does it, within the bound. */
  private async endOfWaveWithAgent(wave: number): Promise<EndOfWaveResult> {
    let f: ClientFeatures;
    try {
      // A (re-)hello here must fit the bound too: the engine never waits longer than that.
      f = await this.ensureHello(this.callBoundMs() + MARGIN_MS);
    } catch (e) {
      if (!this.lostOn(e, `endOfWave(${wave})`)) throw e;
      this.stats.endOfWaveTimeouts++;
      return { due: false, timedOut: true };
    }
    const bound = this.bounds.call ?? f.end_of_wave_timeout_ms;
    let reply: Record<string, any> | undefined;
    const deadline = Date.now() + bound + MARGIN_MS;
    try {
      reply = await this.send({ endOfWave: { wave } }, bound + MARGIN_MS);
      if (reply && !reply.ok && reply.errorCode === 'ERR_NO_HELLO') {
        // The agent restarted: introduce ourselves again (regions included) and retry, within the bound.
        reply = await this.rejoin({ endOfWave: { wave } }, Math.max(1, deadline - Date.now()));
      }
    } catch (e) {
      // Out of time (the agent, or a rejoin, was too slow), or the socket failed: the step goes on.
      reply = undefined;
      if (!this.lostOn(e, `endOfWave(${wave})`)) this.noteError(`endOfWave(${wave}): ${(e as Error).message}`);
    }
    if (!reply || reply.timedOut) {
      this.stats.endOfWaveTimeouts++;
      return { due: false, timedOut: true };
    }
    if (!reply.ok) {
      // A debugging sidecar never fails the engine's step: the error is counted and kept.
      this.noteError(`endOfWave(${wave}): ${reply.errorCode || 'ERR_AGENT'} ${reply.error}`);
      return { due: false, timedOut: false, error: this.lastError };
    }
    this.stats.dueWaves++;
    return { due: true, timedOut: false };
  }

  /**
   * Before a forward: the agent decides whether this forward is selected for an input snapshot and,
   * if so, copies and writes the inputs before returning. A failed capture throws CaptureError:
   * the caller aborts the forward (fail loud). An agent that does not answer within the call bound
   * is not a failed capture: the result says `unavailable` (captured false) and the forward goes on.
   */
  beforeForward(
    context: Partial<ForwardContext> & { compilationHash: string; globalStep: number },
    inputs: { region: string; offset?: number; dtype: string; shape: number[] }[],
  ): Promise<BeforeForwardResult> {
    if ((this.mailbox.features() & MailboxFeature.SNAPSHOTS) === 0) return NOT_CAPTURED;
    for (const [i, inp] of inputs.entries()) {
      if (!this.registered.some((r) => r.name === inp.region)) {
        return Promise.reject(new ConfigError(`beforeForward(): inputs[${i}].region '${inp.region}' is not a registered region`));
      }
    }
    if (this.agentUnavailable) return Promise.resolve(this.snapshotSkipped());
    return this.capture(context, inputs);
  }

  private snapshotSkipped(): BeforeForwardResult {
    this.stats.snapshotsSkipped++;
    this.stats.skippedUnavailable++;
    this.probe();
    return { captured: false, unavailable: true };
  }

  private async capture(
    context: Partial<ForwardContext> & { compilationHash: string; globalStep: number },
    inputs: { region: string; offset?: number; dtype: string; shape: number[] }[],
  ): Promise<BeforeForwardResult> {
    const bound = this.callBoundMs() + MARGIN_MS;
    const started = Date.now();
    try {
      await this.ensureHello(bound);
    } catch (e) {
      if (!this.lostOn(e, 'beforeForward()')) throw e;
      return this.snapshotSkipped();
    }
    // The agent drops a capture it reaches after we stopped waiting (it was frozen meanwhile).
    const acceptBy = started + bound - MARGIN_MS;
    const request = {
      beforeForward: {
        context: {
          compilationHash: context.compilationHash,
          globalStep: context.globalStep,
          isPrompt: context.isPrompt ?? false,
          reqIds: context.reqIds ?? [],
          positions: context.positions ?? [],
          rowRequest: context.rowRequest ?? [],
          numSpeculativeTokens: context.numSpeculativeTokens ?? 0,
          warmup: context.warmup ?? false,
        },
        inputs: inputs.map((x) => ({ region: x.region, offset: x.offset ?? 0, dtype: x.dtype, shape: x.shape })),
        acceptByUnixMs: acceptBy,
        finishByUnixMs: acceptBy + this.bounds.capture,
      },
    };
    let reply: Record<string, any>;
    try {
      reply = await this.send(request, Math.max(1, acceptBy + MARGIN_MS - Date.now()), this.bounds.capture);
      if (!reply.ok && reply.errorCode === 'ERR_NO_HELLO') reply = await this.rejoin(request, Math.max(1, acceptBy + MARGIN_MS - Date.now()), this.bounds.capture);
    } catch (e) {
      if (!this.lostOn(e, 'beforeForward()')) throw e;
      // Begun but not finished: a failed capture (fail loud), and the agent is not answering.
      if ((e as WavebusError).code === 'ERR_CAPTURE_TIMEOUT') throw new CaptureError(`input snapshot failed: ${(e as Error).message}`, 'ERR_CAPTURE_TIMEOUT');
      return this.snapshotSkipped();
    }
    if (!reply.ok) throw new CaptureError(`input snapshot failed: ${reply.error}`, reply.errorCode || 'ERR_CAPTURE');
    return { captured: reply.captured, callDir: reply.callDir || undefined };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.flushWaveHead(); // the last head still goes out
    this.closed = true;
    if (this.socket) {
      this.send({ close: {} }, 200).catch(() => undefined);
      await new Promise((r) => setTimeout(r, 5));
      this.socket.close();
    }
    for (const p of this.pending.values()) p.reject(new WavebusError('ERR_CLOSED', 'client closed'));
    this.pending.clear();
    this.mailbox.close();
  }

  /** The features the agent reported; undefined until the first call that needed the agent. */
  reportedFeatures(): ClientFeatures | undefined {
    return this.features;
  }

  private noteError(message: string): void {
    this.stats.endOfWaveErrors++;
    this.lastError = message;
  }

  /**
   * Forget what the agent knew of us and introduce ourselves again (after an agent restart), then
   * send `retry`. Hello, regions and the retried request go out back to back without waiting on
   * each other (the agent handles one client's requests in order), so it all fits in one bound.
   */
  private async rejoin(retry: Record<string, unknown>, timeoutMs: number, capturingMs?: number): Promise<Record<string, any>> {
    this.features = undefined;
    this.registeredSent.clear();
    this.stats.rejoins++;
    const hello = this.ensureHello(timeoutMs);
    const again = this.send(retry, timeoutMs, capturingMs);
    again.catch(() => undefined); // awaited below, unless the hello fails first
    await hello;
    return again;
  }

  private async ensureHello(timeoutMs: number): Promise<ClientFeatures> {
    const bits = this.mailbox.features();
    if (this.features && bits === this.featureBits) return this.features;
    // A first hello, or the agent's features changed (it may be a new agent): regions go again.
    this.registeredSent.clear();
    // Hello and the regions go out back to back (the agent takes them in order), then both are checked.
    const hello = this.send(this.helloBody(), timeoutMs);
    const regions = this.flushRegistrations(timeoutMs);
    regions.catch(() => undefined); // checked below, after the hello's own verdict
    const reply = await hello;
    if (!reply.ok) throw new WavebusError(reply.errorCode || 'ERR_AGENT', `agent refused the client: ${reply.error}`);
    this.features = JSON.parse(reply.featuresJson) as ClientFeatures;
    this.featureBits = bits;
    await regions;
    return this.features;
  }

  private async flushRegistrations(timeoutMs: number): Promise<void> {
    // Sent back to back (the agent handles them in order), then the answers are checked.
    const todo = this.registered.filter((r) => !this.registeredSent.has(r.name));
    const replies = await Promise.all(todo.map((r) => this.send({ register: regionMessage(r) }, timeoutMs)));
    replies.forEach((reply, i) => {
      if (!reply.ok) throw new WavebusError(reply.errorCode || 'ERR_REGISTER', `register('${todo[i].name}'): ${reply.error}`);
      this.registeredSent.add(todo[i].name);
    });
  }

  private socketOrOpen(): zmq.Dealer {
    if (this.socket) return this.socket;
    // sendTimeout 0: a send to an agent that stopped reading fails at once instead of parking every later send.
    const s = new zmq.Dealer({ linger: 0, sendHighWaterMark: 1000, sendTimeout: 0 });
    s.connect(this.endpoint);
    this.socket = s;
    void this.receiveLoop(s);
    return s;
  }

  private async receiveLoop(s: zmq.Dealer): Promise<void> {
    try {
      for await (const [frame] of s) {
        let reply: Record<string, any>;
        try {
          reply = decode(ClientReply, frame);
        } catch {
          continue; // garbage from the agent socket is ignored
        }
        this.heardFromAgent();
        const p = this.pending.get(reply.id);
        if (p && reply.capturing) {
          p.capturing?.();
        } else if (p) {
          this.pending.delete(reply.id);
          p.resolve(reply);
        }
      }
    } catch {
      /* socket closed */
    }
  }

  /** A request the agent does not answer (after any queued wave head): no id, no timer, nothing pending. */
  private sendOneWay(body: Record<string, unknown>): void {
    if (this.closed) return;
    this.flushWaveHead();
    this.pushOneWay(encode(ClientRequest, { id: 0, ...body }), Object.keys(body)[0]);
  }

  private pushOneWay(frame: Buffer, what: string): void {
    const s = this.socketOrOpen();
    this.stats.sent++;
    this.sendChain = this.sendChain.then(() => s.send(frame)).catch((e: Error) => {
      this.lastError = `${what}: ${e.message}`;
      this.columnizer?.resend(); // a wave head's bindings may have been in this one
    });
  }

  /**
   * A request answered by the agent within `timeoutMs`. `capturingMs`: a before_forward whose
   * interim answer (capture begun) gives the agent that long again to finish (ERR_CAPTURE_TIMEOUT).
   */
  private send(body: Record<string, unknown>, timeoutMs: number, capturingMs?: number): Promise<Record<string, any>> {
    if (this.closed && !('close' in body)) return Promise.reject(new WavebusError('ERR_CLOSED', 'client closed'));
    this.flushWaveHead();
    const id = this.nextId++;
    const s = this.socketOrOpen();
    return new Promise((resolve, reject) => {
      let timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new WavebusError('ERR_TIMEOUT', `agent did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, {
        capturing:
          capturingMs === undefined
            ? undefined
            : () => {
                clearTimeout(timer);
                timer = setTimeout(() => {
                  this.pending.delete(id);
                  reject(new WavebusError('ERR_CAPTURE_TIMEOUT', `the agent began the capture but did not finish it within ${capturingMs} ms`));
                }, capturingMs);
              },
        resolve: (r) => {
          clearTimeout(timer);
          resolve(r);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      this.stats.sent++;
      const frame = encode(ClientRequest, { id, ...body });
      // zeromq allows one send in flight per socket; requests go out one at a time, in call order.
      this.sendChain = this.sendChain
        .then(() => s.send(frame))
        .catch((e: Error) => {
          clearTimeout(timer);
          this.pending.delete(id);
          // The agent's queue is full (it stopped reading): the same as no answer.
          reject(new WavebusError('ERR_TIMEOUT', `cannot send to the agent: ${e.message}`));
        });
    });
  }
}

/** The wire form of a registered region (proto Region). */
function regionMessage(r: ClientRegion): Record<string, unknown> {
  return {
    name: r.name,
    kind: r.kind === 'cuda' ? 1 : 0,
    shmName: r.shmName ?? '',
    offset: r.offset ?? 0,
    nbytes: r.nbytes,
    cudaIpcHandle: r.cudaIpcHandle ?? Buffer.alloc(0),
    device: r.device ?? 0,
    dtype: r.dtype,
    shape: r.shape,
    role: r.role === 'input' ? 1 : 0,
    layer: r.layer ?? '',
    kv: r.kv ?? '',
  };
}

/** A checked copy of one non-finite logits row for the wire. */
function nonFiniteRow(r: NonFiniteRow, i: number): NonFiniteRow {
  if (!Number.isInteger(r?.row) || r.row < 0 || r.row > 0xffffffff) throw new ConfigError(`waveHead(): telemetry.nonFinite[${i}].row ${String(r?.row)} is not a non-negative integer`);
  if (typeof r.reqId !== 'string') throw new ConfigError(`waveHead(): telemetry.nonFinite[${i}].reqId must be a string`);
  if (typeof r.kind !== 'string') throw new ConfigError(`waveHead(): telemetry.nonFinite[${i}].kind must be a string`);
  return { row: r.row, reqId: r.reqId, kind: r.kind };
}

const isWaveNumber = (n: unknown): boolean => Number.isSafeInteger(n) && (n as number) >= 0;

/** A rejected promise for a bad wave number (the per-step calls never throw synchronously). */
function waveError(wave: number, where: string): Promise<never> | undefined {
  if (isWaveNumber(wave)) return undefined;
  return Promise.reject(new ConfigError(`${where}(): wave ${wave} is not a non-negative integer`));
}

const SETTLED: Promise<void> = Promise.resolve();
const NOTHING_DUE: Promise<EndOfWaveResult> = Promise.resolve(Object.freeze({ due: false, timedOut: false }));
const NOT_CAPTURED: Promise<BeforeForwardResult> = Promise.resolve(Object.freeze({ captured: false }));

function validateRegion(r: ClientRegion): void {
  if (!r.name || typeof r.name !== 'string') throw new ConfigError('register(): region.name must be a non-empty string');
  const kind = r.kind ?? 'shm';
  if (kind !== 'shm' && kind !== 'cuda') throw new ConfigError(`register(): region.kind '${String(kind)}' must be 'shm' or 'cuda'`);
  if (kind === 'shm' && !r.shmName) throw new ConfigError(`register(): region '${r.name}' of kind shm needs shmName`);
  if (kind === 'cuda' && (!r.cudaIpcHandle || r.cudaIpcHandle.length !== 64)) {
    throw new ConfigError(`register(): region '${r.name}' of kind cuda needs a 64-byte cudaIpcHandle`);
  }
  if (!Number.isSafeInteger(r.nbytes) || r.nbytes < 0) throw new ConfigError(`register(): region '${r.name}'.nbytes ${r.nbytes} is not a non-negative integer`);
  if (r.offset !== undefined && (!Number.isSafeInteger(r.offset) || r.offset < 0)) {
    throw new ConfigError(`register(): region '${r.name}'.offset ${r.offset} is not a non-negative integer`);
  }
  r.shape.forEach((d, i) => {
    if (!Number.isSafeInteger(d) || d < 0) throw new ConfigError(`register(): region '${r.name}'.shape[${i}] = ${d} is not a non-negative integer`);
  });
  if (r.role !== 'kv_pool' && r.role !== 'input') throw new ConfigError(`register(): region '${r.name}'.role '${String(r.role)}' must be 'kv_pool' or 'input'`);
  if (r.role === 'kv_pool') {
    if (!r.layer) throw new ConfigError(`register(): KV region '${r.name}' needs layer`);
    if (r.kv !== 'k' && r.kv !== 'v') throw new ConfigError(`register(): KV region '${r.name}'.kv must be 'k' or 'v'`);
    if (r.shape.length !== 4) throw new ConfigError(`register(): KV region '${r.name}'.shape must be [num_blocks, block_size, num_kv_heads, head_dim]`);
  }
}

export { MailboxFeature };
