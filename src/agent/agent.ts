// One agent per engine rank. It joins the wave bus (last-PP ranks only), keeps the wave-vector
// mailbox its engine client reads, answers the client over ipc, copies device memory to host
// staging and writes bundles (KV dumps, input snapshots), and serves its files for aggregation.
import * as fs from 'fs';
import * as zmq from 'zeromq';
import type { ArtifactModes } from '../artifacts/artifact-mode';
import { AgentBus, type WaveEvent, type SnapshotReplyMsg } from '../bus/agent-bus';
import { DumpExecutor, type DumpFormat } from './dump-executor';
import { RegionTable } from './regions';
import { FileServer } from './file-server';
import { RootGate, type LocalRoots } from './roots';
import type { BusToken } from '../bus/auth';
import { itemSize, parseDType } from '../artifacts/dtype';
import { CaptureError, ConfigError, WavebusError } from '../errors';
import type { RankIdentity } from '../launch/identity';
import { createLogger, type Logger } from '../log';
import { MailboxWriter, MailboxFeature } from '../client/mailbox';
import type { DumpJob, DumpLane } from '../messages';
import { agentEndpoint, mailboxPath } from '../paths';
import { claimRunDir, staleSocketOrNothing } from '../launch/run-dir';
import { ClientReply, ClientRequest, encode, toPlain } from '../proto';
import { waveHeadBytes } from '../bus/wave-head-relay';
import { SnapshotCapturer } from '../snapshot/capture';
import { checkSnapshotGating, type SnapshotConfig } from '../snapshot/config';

export interface AgentOptions {
  identity: RankIdentity;
  runDir: string;
  /** Coordinator bus address; absent for ranks that are not on the bus. */
  coordinator?: { host: string; port: number };
  heartbeatMs?: number;
  /** How long end_of_wave may wait for a wave vector that has not arrived. */
  endOfWaveTimeoutMs?: number;
  stagingBytes?: number;
  /** Pinned chunk each CUDA region bounces device → host copies through (default 8 MiB). */
  cudaStagingBytes?: number;
  snapshot?: SnapshotConfig;
  /**
   * This host's roots (--dump-root, the snapshot cache root): the agent writes bundles and serves
   * files only under them. A dump root from the bus may only narrow `dumps` (agent/roots.ts).
   */
  roots?: LocalRoots;
  logger?: Logger;
  /** Test / fault-injection hook passed to the bus. */
  dropSeqs?: (seq: number) => boolean;
  /** CURVE client keys for the bus (see src/bus/curve.ts). */
  curve?: { serverPublicKey: string; publicKey: string; secretKey: string };
  /** The launcher's bus token (src/bus/auth.ts): coordinator messages without its MAC are dropped. */
  busToken?: BusToken;
  /** --artifact-mode: KV dumps and input snapshots (default: DEFAULT_ARTIFACT_MODES). */
  artifactModes?: ArtifactModes;
}

/** Runtime config fields the agent acts on (the guard's effective config, as JSON). */
interface RuntimeView {
  busActive: boolean;
  hotReload: boolean;
  detectors: Record<string, boolean>;
  itemSync: boolean;
  format: DumpFormat;
  freeHeadroomBytes: number;
  dumpRoot?: string;
}

const DEFAULT_VIEW: RuntimeView = { busActive: false, hotReload: false, detectors: {}, itemSync: false, format: 'pt', freeHeadroomBytes: 5 * 2 ** 30 };
const WAVE_HISTORY = 64;

/** Reads what the agent needs from the coordinator's config JSON; unknown shapes fall back to off. */
export function runtimeView(configJson: string): RuntimeView {
  if (!configJson) return { ...DEFAULT_VIEW };
  let doc: any;
  try {
    doc = JSON.parse(configJson);
  } catch {
    return { ...DEFAULT_VIEW };
  }
  const cfg = doc?.config ?? doc;
  const detectors: Record<string, boolean> = {};
  for (const [name, d] of Object.entries<any>(cfg?.detector ?? {})) detectors[name] = Boolean(d?.enabled);
  const anyDetector = Object.values(detectors).some(Boolean);
  const hotReload = Boolean(doc?.hot_reload);
  const manual = Number(cfg?.dump?.manual_dump ?? 0) > 0;
  return {
    busActive: hotReload || anyDetector || manual,
    hotReload,
    detectors,
    itemSync: Boolean(cfg?.detector?.logits_finite?.item_sync),
    format: (['pt', 'npy', 'safetensors'].includes(cfg?.dump?.format) ? cfg.dump.format : 'pt') as DumpFormat,
    freeHeadroomBytes: Number.isFinite(cfg?.dump?.free_headroom_bytes) ? Number(cfg.dump.free_headroom_bytes) : DEFAULT_VIEW.freeHeadroomBytes,
    dumpRoot: typeof cfg?.dump?.dump_dir === 'string' ? cfg.dump.dump_dir : undefined,
  };
}

/**
 * A client request the agent takes without answering (id 0): a wave head (the engine never waits
 * at the head of a wave) or a missed-wave notice (the engine already went on).
 */
export function isOneWayRequest(req: { id?: unknown; body?: unknown }): boolean {
  return req.id === 0 && (req.body === 'waveHead' || req.body === 'endOfWave');
}

export class Agent {
  readonly identity: RankIdentity;
  readonly stats = {
    clientRequests: 0,
    badClientFrames: 0,
    /** Wave heads forwarded to the coordinator as the client's bytes, and re-encoded (rare frames). */
    waveHeadsRelayed: 0,
    waveHeadsReencoded: 0,
    endOfWaveTimeouts: 0,
    dumpsWritten: 0,
    dumpsFailed: 0,
    missedWaves: 0,
    snapshotsWritten: 0,
  };
  private readonly log: Logger;
  private readonly opts: AgentOptions;
  private readonly regions: RegionTable;
  private readonly dumps: DumpExecutor;
  private readonly gate: RootGate;
  /** The dumps root served now: the bus's dump.dump_dir when it narrows the local root, else the local root. */
  private servedDumps?: string;
  private readonly capturer?: SnapshotCapturer;
  private bus?: AgentBus;
  private router?: zmq.Router;
  private mailbox?: MailboxWriter;
  private files?: FileServer;
  private view: RuntimeView = { ...DEFAULT_VIEW };
  private pendingView?: RuntimeView;
  /** Dump lanes by wave, kept until that wave ends here. */
  private readonly dumpLanes = new Map<number, DumpLane>();
  private readonly configWaves = new Map<number, string>();
  /** Waves whose vector arrived, for end_of_wave waits. */
  private readonly arrived = new Set<number>();
  private readonly waiters = new Map<number, (() => void)[]>();
  private readonly ended = new Set<number>();
  private writes: Promise<void> = Promise.resolve();
  private stopped = false;

  constructor(opts: AgentOptions) {
    this.opts = opts;
    this.identity = opts.identity;
    this.log = opts.logger ?? createLogger(`wavebus-agent-rank${opts.identity.globalRank}`);
    this.gate = new RootGate(opts.identity.globalRank, opts.roots ?? {}, this.log);
    this.servedDumps = this.gate.local.dumps;
    this.regions = new RegionTable(opts.cudaStagingBytes);
    this.dumps = new DumpExecutor(opts.identity, this.regions, this.log, this.gate, opts.artifactModes);
    if (opts.snapshot?.enabled) {
      this.capturer = new SnapshotCapturer(opts.snapshot, {
        globalRank: opts.identity.globalRank,
        tpRank: opts.identity.tpRank,
        ppRank: opts.identity.ppRank,
        dpRank: opts.identity.dpRank,
        cpRank: opts.identity.cpRank,
      }, { log: { info: (m: string) => this.log.info(m), warn: (m: string) => this.log.warn(m) }, artifactModes: opts.artifactModes });
    }
  }

  /** Dump roots from the bus refused (outside the local dump root), in all. */
  get rootsRefused(): number {
    return this.gate.refused;
  }

  get endOfWaveTimeoutMs(): number {
    return this.opts.endOfWaveTimeoutMs ?? 50;
  }

  async start(): Promise<void> {
    const { runDir, identity } = this.opts;
    if (!runDir) throw new ConfigError('--run-dir (WAVEBUS_RUN_DIR) is required for an agent');
    // Ours and 0700 (created so if missing): nobody else can plant a link or a file in it.
    claimRunDir(runDir, 'run dir (--run-dir / WAVEBUS_RUN_DIR)');
    this.mailbox = MailboxWriter.create(mailboxPath(runDir, identity.localRank));
    this.publishFeatures(); // what is known before the bus syncs (snapshots), so clients never see a stale 0
    this.router = new zmq.Router({ linger: 0, maxMessageSize: 16 * 2 ** 20 });
    const endpoint = agentEndpoint(runDir, identity.localRank);
    const sockPath = endpoint.slice('ipc://'.length);
    const there = staleSocketOrNothing(sockPath);
    if (there === 'stale') fs.unlinkSync(sockPath); // left by a killed agent of this rank
    else if (there !== 'none') throw new ConfigError(`agent socket ${sockPath}: something else is there (${there}); refusing to remove it`, 'ERR_RUN_DIR');
    await this.router.bind(endpoint);
    void this.serveClients(this.router);
    this.files = new FileServer(identity.globalRank, () => ({ snapshots: this.opts.roots?.snapshots, dumps: this.servedDumps }), this.log);
    if (identity.isLastPp && this.opts.coordinator) {
      this.bus = new AgentBus({
        coordinator: this.opts.coordinator,
        identity,
        heartbeatMs: this.opts.heartbeatMs,
        logger: this.log,
        dropSeqs: this.opts.dropSeqs,
        curve: this.opts.curve,
        busToken: this.opts.busToken,
      });
      if (!this.opts.curve && !this.opts.busToken) {
        this.log.warn(
          { rank: identity.globalRank, coordinator: this.opts.coordinator, roots: this.gate.local },
          'the coordinator is unauthenticated (no CURVE keys, no --bus-token-file): whoever holds its port can steer this agent, but it writes and serves only under its local roots (docs/security.md)',
        );
      }
      this.bus.on('snapshot', (s: SnapshotReplyMsg) => this.onSnapshot(s));
      this.bus.on('wave', (w: WaveEvent) => this.onWave(w));
      this.bus.onRequest((req) => this.files!.handle(req));
      await this.bus.start();
    } else if (!identity.isLastPp) {
      this.log.info({ rank: identity.globalRank, ppRank: identity.ppRank }, 'not a last-PP rank: does not join the wave bus (no KV dumps here; snapshots follow the environment)');
    } else {
      this.log.warn({ rank: identity.globalRank }, 'no coordinator address: not joining the wave bus (no KV dumps or detector traffic)');
    }
    this.publishFeatures();
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    await this.writes.catch(() => undefined);
    await this.bus?.stop();
    this.router?.close();
    // The file stays (the launcher owns the run dir): an engine that keeps running keeps a valid
    // mapping, sees everything off, and a successor agent takes the same file over.
    this.mailbox?.setFeatures(0);
    this.mailbox?.close();
    const sock = agentEndpoint(this.opts.runDir, this.identity.localRank).slice('ipc://'.length);
    fs.rmSync(sock, { force: true });
    this.regions.closeAll();
  }

  /** Waits for every bundle write started so far (tests, shutdown). */
  async drain(): Promise<void> {
    await this.writes;
  }

  private features(): number {
    let bits = 0;
    if (this.view.busActive && this.bus) bits |= MailboxFeature.BUS_ACTIVE;
    if (this.view.hotReload) bits |= MailboxFeature.HOT_RELOAD;
    if (Object.values(this.view.detectors).some(Boolean)) bits |= MailboxFeature.DETECTORS;
    if (this.capturer) bits |= MailboxFeature.SNAPSHOTS;
    return bits;
  }

  private publishFeatures(): void {
    this.mailbox?.setFeatures(this.features());
  }

  private setView(view: RuntimeView): void {
    // A new bus dump root is checked once here, not on every file request.
    if (view.dumpRoot !== this.view.dumpRoot) this.servedDumps = this.gate.servedDumps(view.dumpRoot);
    this.view = view;
  }

  private onSnapshot(s: SnapshotReplyMsg): void {
    this.log.debug({ epoch: s.epoch, seq: s.seq, wave: s.wave }, 'snapshot');
    this.setView(runtimeView(s.configJson));
    this.mailbox?.setEpoch(s.epoch);
    for (const lane of s.pending) this.dumpLanes.set(lane.wave, lane);
    this.publishFeatures();
    // The snapshot covers its own wave: that wave's frames will never be delivered on their own,
    // so its vector (with a pending dump lane, if any) is known now.
    if (s.wave > 0 && !this.arrived.has(s.wave)) this.arrive(s.wave, false, this.dumpLanes.has(s.wave));
  }

  private onWave(w: WaveEvent): void {
    const wave = w.head.wave;
    this.log.debug({ wave, seq: w.head.seq, config: w.config?.version, dumps: w.dump?.jobs.map((j) => j.jobId) }, 'wave');
    if (w.dump) this.dumpLanes.set(wave, w.dump);
    if (w.config) this.configWaves.set(wave, w.config.configJson);
    this.arrive(wave, w.head.configDue, w.head.dumpDue);
  }

  /** Wave `wave`'s vector is known: publish it to the engine and wake end_of_wave waiters. */
  private arrive(wave: number, configDue: boolean, dumpDue: boolean): void {
    this.mailbox?.publish({ wave, configDue, dumpDue });
    this.arrived.add(wave);
    for (const fn of this.waiters.get(wave) ?? []) fn();
    this.waiters.delete(wave);
    // Forget old waves so a long run keeps a bounded state.
    for (const m of [this.arrived, this.ended]) {
      if (m.size > WAVE_HISTORY) for (const k of [...m].sort((a, b) => a - b).slice(0, m.size - WAVE_HISTORY)) m.delete(k);
    }
    for (const k of this.dumpLanes.keys()) if (k < wave - WAVE_HISTORY) this.dumpLanes.delete(k);
  }

  private waitForWave(wave: number, ms: number): Promise<boolean> {
    if (this.arrived.has(wave)) return Promise.resolve(true);
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        const list = this.waiters.get(wave) ?? [];
        this.waiters.set(wave, list.filter((f) => f !== done));
        resolve(false);
      }, ms);
      const list = this.waiters.get(wave) ?? [];
      list.push(done);
      this.waiters.set(wave, list);
    });
  }

  private async serveClients(router: zmq.Router): Promise<void> {
    try {
      for await (const [peer, frame] of router) {
        if (!frame) {
          this.stats.badClientFrames++;
          continue;
        }
        let msg: ReturnType<typeof ClientRequest.decode> & { id?: unknown; waveHead?: { wave?: unknown } };
        try {
          msg = ClientRequest.decode(frame);
        } catch {
          this.stats.badClientFrames++;
          continue;
        }
        this.stats.clientRequests++;
        // The per-step one-way wave head: its bytes go on to the coordinator as they came.
        if (msg.waveHead && Number(msg.id ?? 0) === 0) {
          const raw = waveHeadBytes(frame);
          if (raw) {
            if (this.bus && this.identity.tpRank === 0) {
              this.bus.relayWaveHead(raw);
              this.stats.waveHeadsRelayed++;
            }
            continue;
          }
        }
        const req = toPlain<Record<string, any>>(ClientRequest, msg);
        if (isOneWayRequest(req)) {
          // Nothing is answered, and nothing here needs the client's regions: no hello is asked for.
          this.handle(req).catch((err: Error) => this.log.warn({ err: String(err?.message ?? err), body: req.body }, 'one-way message from the client failed'));
          continue;
        }
        // A selected capture tells the client it has begun (same id, capturing) before it copies.
        const interim = (): void => this.replyToClient(router, peer, () => encode(ClientReply, { id: req.id, ok: true, capturing: true }));
        void this.handleFrom(peer, req, interim).then(
          (reply) => this.replyToClient(router, peer, () => encode(ClientReply, { id: req.id, ok: true, ...reply })),
          (err: Error) =>
            this.replyToClient(router, peer, () =>
              encode(ClientReply, { id: req.id, ok: false, error: String(err?.message ?? err), errorCode: (err as WavebusError)?.code ?? 'ERR_AGENT' }),
            ),
        );
      }
    } catch (e) {
      if (!this.stopped) this.log.error({ err: e }, 'client socket failed');
    }
  }

  // zeromq allows one send in flight per socket (a second one throws EBUSY, synchronously):
  // replies to concurrent requests go out one at a time, in the order they were ready.
  private readonly clientReplies: Array<{ router: zmq.Router; parts: [Buffer, Buffer] }> = [];
  private replying = false;

  private replyToClient(router: zmq.Router, peer: Buffer, make: () => Buffer): void {
    let body: Buffer;
    try {
      body = make();
    } catch (e) {
      this.log.error({ err: String(e) }, 'cannot encode a client reply');
      return;
    }
    this.clientReplies.push({ router, parts: [peer, body] });
    if (!this.replying) void this.drainClientReplies();
  }

  private async drainClientReplies(): Promise<void> {
    this.replying = true;
    try {
      while (this.clientReplies.length > 0) {
        const { router, parts } = this.clientReplies.shift()!;
        if (router.closed) continue;
        try {
          await router.send(parts);
        } catch {
          /* the client went away; ROUTER drops replies to unknown peers anyway */
        }
      }
    } finally {
      this.replying = false;
    }
  }

  /** Clients (by routing id) that said hello to this agent incarnation. */
  private readonly greeted = new Set<string>();

  /**
   * Work that needs the client's regions is refused from a client this agent never greeted: after
   * an agent restart the engine's client reconnects with its regions unknown here. ERR_NO_HELLO
   * makes the client say hello and register again, then retry.
   */
  private async handleFrom(peer: Buffer, req: Record<string, any>, interim: () => void = () => undefined): Promise<Record<string, unknown>> {
    const key = peer.toString('hex');
    if (req.body === 'hello') this.greeted.add(key);
    else if ((req.body === 'endOfWave' || req.body === 'beforeForward' || req.body === 'register') && !this.greeted.has(key)) {
      throw new WavebusError('ERR_NO_HELLO', 'this agent has not met this client (the agent restarted?): say hello and register again');
    }
    return this.handle(req, interim);
  }

  private async handle(req: Record<string, any>, interim: () => void = () => undefined): Promise<Record<string, unknown>> {
    switch (req.body) {
      case 'hello':
        return this.onHello(req.hello);
      case 'register':
        this.regions.register(req.register);
        return {};
      case 'waveHead':
        if (this.bus && this.identity.tpRank === 0) {
          this.bus.sendWaveHead(req.waveHead.wave, req.waveHead.telemetry ?? null);
          this.stats.waveHeadsReencoded++;
        }
        return {};
      case 'endOfWave':
        if (req.id === 0) {
          // The client waited on the mailbox for the bound and went on without the vector.
          if (req.endOfWave.missed && this.bus && !this.ended.has(req.endOfWave.wave)) this.missedWave(req.endOfWave.wave);
          return {};
        }
        return this.endOfWave(req.endOfWave.wave);
      case 'beforeForward':
        return this.beforeForward(req.beforeForward, interim);
      case 'close':
      case 'ping':
        return {};
      default:
        throw new WavebusError('ERR_BAD_REQUEST', `unknown client request '${String(req.body)}'`);
    }
  }

  private onHello(hello: { pid: number; asyncScheduling: boolean }): Record<string, unknown> {
    if (this.opts.snapshot?.enabled) {
      checkSnapshotGating(this.opts.snapshot, { asyncScheduling: hello.asyncScheduling, backendHasMemoryAccess: true });
    }
    return {
      mailboxPath: mailboxPath(this.opts.runDir, this.identity.localRank),
      featuresJson: JSON.stringify({
        tp0: this.identity.tpRank === 0 && this.identity.isLastPp,
        bus: this.view.busActive && Boolean(this.bus),
        detectors: this.view.detectors,
        item_sync: this.view.itemSync,
        snapshots: Boolean(this.capturer),
        end_of_wave_timeout_ms: this.endOfWaveTimeoutMs,
      }),
    };
  }

  private async endOfWave(wave: number): Promise<Record<string, unknown>> {
    if (!this.bus) return {};
    if (!(await this.waitForWave(wave, this.endOfWaveTimeoutMs))) {
      this.missedWave(wave);
      return { timedOut: true };
    }
    if (this.ended.has(wave)) return {};
    this.ended.add(wave);
    const cfg = this.configWaves.get(wave);
    if (cfg !== undefined) {
      this.configWaves.delete(wave);
      this.setView(runtimeView(cfg));
      this.publishFeatures();
    }
    const lane = this.dumpLanes.get(wave);
    if (!lane || lane.jobs.length === 0) return {};
    this.dumpLanes.delete(wave);
    const { staged, refused } = await this.dumps.stage(lane.jobs, {
      format: this.view.format,
      freeHeadroomBytes: this.view.freeHeadroomBytes,
      stagingBytes: this.opts.stagingBytes ?? 1 << 30,
    });
    for (const r of refused) this.bus.sendDumpResult(r);
    // The engine is released now; files are written behind it.
    this.writes = this.writes.then(async () => {
      const results = await this.dumps.write(staged, this.view.format);
      for (const r of results) {
        if (r.error) this.stats.dumpsFailed++;
        else this.stats.dumpsWritten++;
        this.bus?.sendDumpResult(r);
      }
    });
    return { dumpsWritten: staged.length };
  }

  /** The engine ended `wave` without its vector (the bound ran out): counted, logged, its dumps failed. */
  private missedWave(wave: number): void {
    this.stats.endOfWaveTimeouts++;
    this.ended.add(wave);
    // Rate-limited: a dead coordinator would otherwise log once per engine step.
    if (this.stats.endOfWaveTimeouts === 1 || this.stats.endOfWaveTimeouts % 100 === 0) {
      this.log.warn({ wave, boundMs: this.endOfWaveTimeoutMs, total: this.stats.endOfWaveTimeouts }, 'wave vector did not arrive before end_of_wave; the step goes on');
    }
    this.reportMissed(wave);
  }

  /** A wave whose vector came too late: its dump jobs cannot be copied consistently any more. */
  private reportMissed(wave: number): void {
    this.stats.missedWaves++;
    const waitLate = (): void => {
      const lane = this.dumpLanes.get(wave);
      if (!lane) return;
      this.dumpLanes.delete(wave);
      for (const job of lane.jobs as DumpJob[]) {
        this.bus?.sendDumpResult(this.dumps.result(job, [], 0, `wave ${wave} vector arrived after end_of_wave (bound ${this.endOfWaveTimeoutMs} ms)`, 'd2h_failed'));
      }
    };
    void this.waitForWave(wave, 10 * this.endOfWaveTimeoutMs + 1000).then((ok) => ok && waitLate());
  }

  private async beforeForward(
    bf: { context: any; inputs: { region: string; offset: number; dtype: string; shape: number[] }[]; acceptByUnixMs?: number | string; finishByUnixMs?: number | string },
    interim: () => void,
  ): Promise<Record<string, unknown>> {
    if (!this.capturer) return { captured: false };
    const acceptBy = Number(bf.acceptByUnixMs ?? 0);
    const finishBy = Number(bf.finishByUnixMs ?? 0);
    // The engine gave up waiting if we are past its deadline (this agent was frozen): its inputs
    // may have changed since, so nothing is copied. Else it hears at once that we are alive and
    // waits for the decision and the capture (disk work may take longer than its call bound).
    if (acceptBy > 0 && Date.now() > acceptBy) throw new CaptureError(`the engine stopped waiting for this forward at ${new Date(acceptBy).toISOString()}; not captured`, 'ERR_CLIENT_GONE');
    interim();
    const inputs = bf.inputs.map((inp, i) => {
      const unreadable = this.regions.unreadable(inp.region);
      if (unreadable) return { dtype: inp.dtype, shape: inp.shape.map(Number), unreadable, read: async (): Promise<Buffer> => Buffer.alloc(0) };
      const r = this.regions.get(inp.region);
      if (!r) throw new ConfigError(`inputs[${i}].region '${inp.region}' is not registered`);
      return {
        dtype: inp.dtype,
        shape: inp.shape.map(Number),
        read: async (): Promise<Buffer> => {
          const numel = inp.shape.reduce((a, b) => a * Number(b), 1);
          const nbytes = numel * itemSize(parseDType(inp.dtype, `inputs[${i}].dtype`));
          const buf = Buffer.allocUnsafe(nbytes);
          await r.region.copyTo(buf, 0, inp.offset, nbytes);
          // Copied after the engine went on: the bytes may be the next forward's. Nothing is kept.
          if (finishBy > 0 && Date.now() > finishBy) throw new CaptureError(`inputs[${i}] copied after the engine stopped waiting; capture dropped`, 'ERR_CLIENT_GONE');
          return buf;
        },
      };
    });
    const res = await this.capturer.capture(bf.context, inputs);
    if (res.captured) this.stats.snapshotsWritten++;
    return { captured: res.captured, callDir: res.callDir ?? '' };
  }
}
