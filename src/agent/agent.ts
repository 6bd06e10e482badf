// One agent per engine rank. It joins its DP replica's wave stream, keeps the wave-vector
// mailbox its engine client reads (a non-last-PP rank's engine reads it only with dump.pp_stages
// "all", or while a config or a dump job is due for it), answers the client over ipc, copies device
// memory to host staging and writes bundles (KV dumps, input snapshots), and serves its files for
// aggregation. Every rank applies a config, and copies a dump, at the end of the wave its vector
// names (settle(): one path for every rank).
import * as fs from 'fs';
import * as zmq from 'zeromq';
import { AgentBus, type WaveEvent, type SnapshotReplyMsg } from '../bus/agent-bus';
import { DumpExecutor } from './dump-executor';
import { WaveBook } from './wave-book';
import { WaveArrivals } from './wave-arrivals';
import { agentDutyHooks, jobsFor, WaveDuties } from './wave-duties';
import { RegionTable } from './regions';
import { FingerprintKeeper } from './fingerprint-keeper';
import { RegionRole } from '../client/protocol';
import { FileServer } from './file-server';
import { agentDirectFiles, fileRequestHandler, type DirectFiles } from './direct-files';
import { RootGate } from './roots';
import { ReplayServer } from './replay-server';
import { decideAheadWaves } from '../bus/constants';
import { ConfigError, WavebusError } from '../errors';
import type { RankIdentity } from '../layout';
import { createLogger, type Logger } from '../log';
import type { AgentConfig } from '../messages';
import { agentEndpoint, engineFaultPath, mailboxPath, recorderPath } from '../paths';
import { EngineRings } from './engine-rings';
import { EngineFeatures, headsStream } from './engine-features';
import type { RingStats } from './ring-heads';
import { applyRecorderConfig, type FlightRecorder } from './flight-recorder';
import { AgentRecorder } from './agent-recorder';
import { claimRunDir } from '../launch/run-dir';
import { bindClientSocket, ClientServer } from './client-server';
import { busRoleLine } from './bus-role';
import { inputCapturer, snapshotSelection } from './input-capture';
import { LiveCaptures, offerForward } from './live-captures';
import { DEFAULT_VIEW, viewOf, type RuntimeView } from './runtime-view';
import type { SnapshotCapturer } from '../snapshot/capture';
import { checkSnapshotGating } from '../snapshot/config';
import { agentBusOptions, type AgentOptions } from './agent-options';
import { WaveTimeline } from './timeline';
import { WaveEnds } from './wave-ends';
import { VectorWrites } from './vector-writes';
import { DEFAULT_ARTIFACT_MODES } from '../artifacts/artifact-mode';

export type { AgentOptions } from './agent-options';

export class Agent {
  readonly identity: RankIdentity;
  readonly stats = {
    clientRequests: 0,
    badClientFrames: 0,
    /** Wave heads forwarded to the coordinator as the client's bytes, and re-encoded (rare frames). */
    waveHeadsRelayed: 0,
    waveHeadsReencoded: 0,
    endOfWaveTimeouts: 0,
    /** end_of_wave calls whose vector came late (the client waited, within the bound). */
    lateVectors: 0,
    dumpsWritten: 0,
    dumpsFailed: 0,
    missedWaves: 0,
    snapshotsWritten: 0,
  };
  /** Heads relayed from the telemetry ring and the garbage dropped there (ring-heads.ts). */
  readonly ringStats: RingStats;
  private readonly log: Logger;
  private readonly opts: AgentOptions;
  /** The telemetry ring and the decision ring shared with the engine client (engine-rings.ts). */
  private readonly rings: EngineRings;
  /** What the engine is told is on: the mailbox's bits, the hello's features (engine-features.ts). */
  private readonly features: EngineFeatures;
  private readonly regions: RegionTable;
  /** This rank's fingerprint: the client's hello and the weight checksums (fingerprint-keeper.ts). */
  private readonly fingerprint: FingerprintKeeper;
  private readonly dumps: DumpExecutor;
  private readonly gate: RootGate;
  /** The dumps root served now: the bus's dump.dump_dir when it narrows the local root, else the local root. */
  private servedDumps?: string;
  private readonly capturer?: SnapshotCapturer;
  /** Input snapshots armed on the running job (`wavebus capture`). */
  private readonly live: LiveCaptures;
  private bus?: AgentBus;
  private router?: zmq.Router;
  /** This rank's mailbox, and on the bus the host receiver role (vector-writes.ts). */
  private vectors?: VectorWrites;
  /** The flight recorder and its arms (agent-recorder.ts). */
  private rec?: AgentRecorder;
  /** recorder.forwards / max_bytes warnings already logged (the ring is not resized live). */
  private readonly recorderWarned = new Set<string>();
  private files?: FileServer;
  private direct?: DirectFiles;
  /** A verdict's replay asked over the bus (replay-server.ts). */
  private replays?: ReplayServer;
  private view: RuntimeView = { ...DEFAULT_VIEW };
  private pendingView?: RuntimeView;
  /** Configs and dump lanes by the wave at whose end they are due; the engine's last known wave. */
  private readonly duties: WaveDuties;
  /** The coordinator's snapshots and waves as they arrive, into duties and the mailbox (wave-arrivals.ts). */
  private readonly arrivals: WaveArrivals;
  /** Arrived vectors, ended waves, the floor, end_of_wave waits. */
  private readonly waves = new WaveBook();
  private readonly ended = this.waves.ended;
  /** end_of_wave, due_dumps, missed waves and the dump writes behind the engine (wave-ends.ts). */
  private readonly ends: WaveEnds;
  private stopped = false;
  private readonly clients: ClientServer;
  /** Wave timing for `wavebus trace` (a fixed ring; timeline.ts). */
  readonly timeline = new WaveTimeline();

  constructor(opts: AgentOptions) {
    this.opts = opts;
    this.identity = opts.identity;
    this.log = opts.logger ?? createLogger(`wavebus-agent-rank${opts.identity.globalRank}`);
    this.rings = new EngineRings({
      runDir: opts.runDir, identity: opts.identity, log: this.log, counts: this.stats,
      bus: () => this.bus, relayBus: () => (this.isHead ? this.bus : undefined),
    });
    this.ringStats = this.rings.stats;
    const hooks = agentDutyHooks(
      this.log,
      (cfg, where) => this.applyConfig(cfg, where),
      (job, why) => this.bus?.sendDumpResult(this.dumps.result(job, [], 0, why, 'wave_already_ended')),
    );
    // How far ahead the stream decides is the coordinator's (each snapshot says); until the first
    // one, the default for this layout.
    this.duties = new WaveDuties(opts.identity.isLastPp, decideAheadWaves(opts.identity.pp), (jobs) => jobsFor(this.identity, jobs), hooks);
    this.gate = new RootGate(opts.identity.globalRank, opts.roots ?? {}, this.log);
    this.servedDumps = this.gate.local.dumps;
    this.regions = new RegionTable(opts.cudaStagingBytes);
    this.fingerprint = new FingerprintKeeper((fp) => this.bus?.setFingerprint(fp), opts.cudaStagingBytes);
    this.dumps = new DumpExecutor(opts.identity, this.regions, this.log, this.gate, opts.artifactModes);
    this.clients = new ClientServer(
      this.stats,
      this.log,
      (req, interim) => this.handle(req, interim),
      (raw) => this.rings.clientHead(raw),
      () => this.stopped,
      (pid) => this.recorder?.connectionLost(pid),
    );
    this.capturer = inputCapturer(opts.snapshot, opts.identity, this.log, opts.artifactModes);
    this.ends = new WaveEnds({
      identity: opts.identity, log: this.log, stats: this.stats, timeline: this.timeline, waves: this.waves, duties: this.duties, dumps: this.dumps, stagingBytes: opts.stagingBytes,
      bus: () => this.bus, view: () => this.view, boundMs: () => this.endOfWaveTimeoutMs,
      settle: (upTo, copyAt) => this.settle(upTo, copyAt), publishFeatures: () => this.publishFeatures(), writeTimeline: () => this.writeTimeline(),
      // The same name on every rank of the replica: the wave every rank copies at.
      recorderAtIncident: (wave, jobs) => this.rec?.atIncident(wave, jobs),
    });
    this.live = new LiveCaptures(opts.identity, opts.snapshot?.snapshotRoot ?? opts.roots?.snapshots, this.log, (r) => this.bus?.sendCaptureResult(r), opts.artifactModes);
    this.features = new EngineFeatures({
      identity: opts.identity, view: () => this.view, bus: () => this.bus, due: () => this.duties.due, snapshots: () => Boolean(this.capturer), snapshotSelection: () => (this.capturer ? snapshotSelection(this.capturer) : undefined),
      liveCaptures: () => this.live.inForce, recorder: () => this.recorder, endOfWaveTimeoutMs: this.endOfWaveTimeoutMs,
    });
    this.arrivals = new WaveArrivals({
      log: this.log, duties: this.duties, waves: this.waves, live: this.live, timeline: this.timeline, rec: () => this.rec, vectors: () => this.vectors,
      applyConfig: (cfg, where) => this.applyConfig(cfg, where), settle: (upTo) => this.settle(upTo), publishFeatures: () => this.publishFeatures(),
    });
  }

  /** The flight recorder (WAVEBUS_RECORD_FORWARDS): none when off. */
  get recorder(): FlightRecorder | undefined {
    return this.rec?.recorder;
  }

  /** The rank that heads its replica's wave stream (last-PP TP0, CP 0): it relays its engine's wave heads. */
  get isHead(): boolean {
    return headsStream(this.identity);
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
    this.vectors = new VectorWrites(runDir, identity, this.log);
    this.rings.openDigests();
    this.rec = new AgentRecorder(this.opts, this.opts.roots?.snapshots ?? this.opts.snapshot?.snapshotRoot ?? this.gate.local.dumps, this.log, () => this.bus, (name) => this.regions.tokenIds(name), () => this.view);
    this.publishFeatures(); // what is known before the bus syncs (snapshots), so clients never see a stale 0
    const bound = await bindClientSocket(agentEndpoint(runDir, identity.localRank), Boolean(this.recorder));
    if (this.recorder && !bound.notify) this.log.warn('this zeromq build has no ROUTER_NOTIFY: a closed engine connection is not seen (the pid watch remains)');
    this.router = bound.router;
    void this.clients.serve(this.router, bound.notify);
    const served = () => ({ snapshots: this.opts.roots?.snapshots, dumps: this.servedDumps });
    this.files = new FileServer(identity.globalRank, served, this.log);
    if (this.opts.coordinator) {
      this.vectors.hostPath();
      this.bus = new AgentBus(agentBusOptions(this.opts, this.opts.coordinator, this.log, {
        lanesOnly: this.vectors.lanesOnly,
        recorderForwards: this.recorder?.forwards ?? 0,
        vectorCounts: () => ({ lateVectors: this.stats.lateVectors, missedVectors: this.stats.endOfWaveTimeouts, ringGarbage: this.ringStats.ringGarbage, engineClients: this.clients.engineClients }),
      }));
      if (!this.opts.curve && !this.opts.busToken) {
        this.log.warn(
          { rank: identity.globalRank, coordinator: this.opts.coordinator, roots: this.gate.local },
          'the coordinator is unauthenticated (no CURVE keys, no --bus-token-file): whoever holds its port can steer this agent, but it writes and serves only under its local roots (docs/security.md)',
        );
      }
      this.bus.on('snapshot', (s: SnapshotReplyMsg) => this.arrivals.onSnapshot(s));
      this.bus.on('wave', (w: WaveEvent) => this.arrivals.onWave(w));
      this.bus.on('wake', () => this.publishFeatures());
      this.direct = agentDirectFiles(Boolean(this.opts.curve), this.opts.directFiles, { globalRank: identity.globalRank, roots: served, coordinator: this.opts.coordinator, log: this.log });
      const files = fileRequestHandler(this.files, this.direct, identity.globalRank);
      const replays = (this.replays = new ReplayServer({ globalRank: identity.globalRank, root: this.opts.roots?.snapshots ?? this.opts.snapshot?.snapshotRoot, args: this.opts.verdictArgs ?? [], log: this.log }));
      this.bus.onRequest((req) => (req.body === 'decidedColumn' ? Promise.resolve(this.rings.decidedColumn(Number(req.decidedColumn.wave), Boolean(req.decidedColumn.inputs))) : req.body === 'replay' ? replays.handle(req) : files(req)));
      await this.bus.start();
      this.vectors.watchReceiver(this.bus);
      // Lanes-only: a plain wave's vector is known from the mailbox the host receiver writes.
      const bus = this.bus;
      this.waves.followMailbox((wave) => this.vectors?.decidedNothingDue(wave, bus.currentEpoch) ?? false);
      this.log.info({ rank: identity.globalRank, ppRank: identity.ppRank, pp: identity.pp, lastPp: identity.isLastPp }, busRoleLine(identity));
    } else {
      this.log.warn({ rank: identity.globalRank }, 'no coordinator address: not joining the wave bus (no KV dumps or detector traffic)');
    }
    this.publishFeatures();
  }

  /**
   * Whether this agent's bus has applied the coordinator's snapshot (and no resync is under way):
   * only then does its mailbox show the job's features, and its engine send wave heads.
   */
  get synced(): boolean {
    return this.bus?.synced ?? false;
  }

  /** The bus's counters (frames received, resyncs...); undefined off the bus. */
  get busStats(): Readonly<AgentBus['stats']> | undefined {
    return this.bus?.stats;
  }

  /** Whether this agent writes vectors: its host's receiver (docs/bus.md, "One receiver per host"). */
  get writesVectors(): boolean {
    return this.vectors?.writesVectors ?? true;
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    this.rec?.stop();
    this.replays?.stop();
    this.vectors?.stopWatch();
    this.waves.close();
    await this.ends.writes.catch(() => undefined);
    await this.recorder?.stop();
    await this.timeline.settled();
    this.timeline.writeLogged(this.gate.local.dumps, this.identity, this.opts.artifactModes ?? DEFAULT_ARTIFACT_MODES, this.log);
    await this.bus?.stop();
    await this.direct?.stop();
    this.router?.close();
    this.vectors?.close();
    this.rings.close();
    const sock = agentEndpoint(this.opts.runDir, this.identity.localRank).slice('ipc://'.length);
    fs.rmSync(sock, { force: true });
    this.regions.closeAll();
    this.fingerprint.close();
  }

  /** The timeline beside the local dumps, soon and off the loop (none without a dump root). */
  private writeTimeline(): void {
    this.timeline.writeSoon(this.gate.local.dumps, this.identity, this.opts.artifactModes ?? DEFAULT_ARTIFACT_MODES, this.log);
  }

  /** Waits for every bundle write started so far (tests, shutdown). */
  async drain(): Promise<void> {
    await this.ends.writes;
  }

  private publishFeatures(): void {
    this.rings.setDigestsOn(this.features.digestsOn);
    this.vectors?.mailbox.setFeatures(this.features.bits());
  }

  /** Act on the coordinator's config from now on (a snapshot's, or one at its wave: wave-duties.ts); one this side cannot read leaves the view as it was. */
  private applyConfig(cfg: AgentConfig | null, where: string): void {
    let view: RuntimeView;
    try {
      view = viewOf(cfg);
    } catch (e) {
      this.log.error({ where, err: (e as Error).message }, 'unreadable runtime config from the coordinator; keeping the one in force');
      return;
    }
    // A new bus dump root is checked once here, not on every file request.
    if (view.dumpRoot !== this.view.dumpRoot) this.servedDumps = this.gate.servedDumps(view.dumpRoot);
    this.view = view;
    applyRecorderConfig(this.recorder, view, this.log, this.recorderWarned);
  }

  /** The engine has ended every wave up to `upTo` (`copyAt`: the one ending now): wave-duties.ts. */
  private settle(upTo: number, copyAt?: number): void {
    if (this.duties.settle(upTo, copyAt)) this.publishFeatures();
  }

  private async handle(req: Record<string, any>, interim: () => void = () => undefined): Promise<Record<string, unknown>> {
    switch (req.body) {
      case 'hello':
        return this.onHello(req.hello);
      case 'register':
        if (req.register.role === RegionRole.WEIGHT) return this.fingerprint.addWeight(req.register);
        this.regions.register(req.register);
        return {};
      case 'waveHead':
        if (this.bus && this.isHead) {
          this.bus.sendWaveHead(req.waveHead.wave, req.waveHead.telemetry ?? null);
          this.stats.waveHeadsReencoded++;
        }
        return {};
      case 'endOfWave':
        if (req.id === 0) {
          // The client waited on the mailbox for the bound and went on without the vector.
          if (req.endOfWave.missed && this.bus && !this.ended.has(req.endOfWave.wave)) this.ends.missedWave(req.endOfWave.wave);
          // It waited and the vector came within the bound: counted (/metrics per rank).
          else if (req.endOfWave.late) {
            this.stats.lateVectors++;
            this.timeline.record('late_vector', Number(req.endOfWave.wave), this.timeline.now());
          }
          return {};
        }
        return this.timeline.span('end_of_wave', Number(req.endOfWave.wave), () => this.ends.endOfWave(req.endOfWave.wave));
      case 'dueDumps':
        return this.ends.dueDumps(Number(req.dueDumps.wave));
      case 'beforeForward':
        // An arm may be done here now: the mailbox says so (no more waits for late vectors).
        return this.timeline
          .captureSpan(Number(req.beforeForward.context?.globalStep ?? 0), () => offerForward(this.capturer, this.live, this.regions, req.beforeForward, interim, () => this.stats.snapshotsWritten++, () => this.vectors?.mailbox.captureWaiting() ?? 0))
          .finally(() => this.live.changed() && this.publishFeatures());
      case 'close':
        this.recorder?.engineClosed();
        return {};
      case 'ping':
        return {};
      default:
        throw new WavebusError('ERR_BAD_REQUEST', `unknown client request '${String(req.body)}'`);
    }
  }

  private onHello(hello: { pid: number; asyncScheduling: boolean; fingerprint?: unknown; pidNamespace?: string; ringRows?: number }): Record<string, unknown> {
    if (hello.fingerprint) this.fingerprint.hello(hello.fingerprint);
    if (this.opts.snapshot?.enabled) {
      checkSnapshotGating(this.opts.snapshot, { asyncScheduling: hello.asyncScheduling, backendHasMemoryAccess: true });
    }
    this.recorder?.engine(hello.pid, hello.pidNamespace);
    return {
      mailboxPath: mailboxPath(this.opts.runDir, this.identity.localRank),
      recorderPath: this.recorder ? recorderPath(this.opts.runDir, this.identity.localRank) : '',
      faultPath: this.recorder ? engineFaultPath(this.opts.runDir, this.identity.localRank) : '',
      ...this.rings.helloPaths(hello, this.isHead),
      features: this.features.hello(),
    };
  }
}
