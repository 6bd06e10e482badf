// The coordinator side of the wave bus (ZeroMQ Clone pattern): the only publisher of wave vectors
// and lanes (PUB; one stream per DP replica, wave-streams.ts), the server of snapshots, status and
// dump acks (ROUTER), and the tracker of which ranks are subscribed and alive.
import { randomInt } from 'crypto';
import { EventEmitter } from 'events';
import type { Publisher, Router } from 'zeromq';
import { ConfigError, ProtocolError, WavebusError } from '../errors';
import { lastPpRanks, type WorldLayout } from '../layout';
import { createLogger, type Logger } from '../log';
import type { AgentConfig, DumpJob, DumpLane, DumpResult, StepTelemetry, WaveHead } from '../messages';
import { AgentRequests } from './agent-requests';
import { CoordinatorFiles } from './coordinator-files';
import { DumpLedger } from '../guard/dump-ledger';
import { WaveStreams } from './wave-streams';
import { dumpAckHandler } from './coordinator-dumps';
import { statusJson } from './coordinator-replies';
import { RouterDispatch } from './coordinator-dispatch';
import { FingerprintBook } from '../guard/fingerprint-diff';
import { RankTable } from './rank-table';
import { VectorMetrics } from './vector-metrics';
import { EngineCrashes } from './engine-crashes';
import { SendQueue } from './send-queue';
import { busMetrics, startMetricsServer, type MetricsServer } from '../metrics';
import { DropCounter, encodeCoordinatorMessage, type AgentMsg } from './frames';
import { checkBindAllowed, tcpEndpoint } from './endpoints';
import { bindServerSockets } from './server-sockets';
import { receiveLoop } from './receive-loop';
import { CoordinatorControl } from './coordinator-control';
import { coordinatorWake, type ReplicaWake } from './replica-wake';
import type { ZapHandler } from './zap-handler';
import type { CoordinatorPolicy } from './policy';
import type { CoordinatorOptions, CoordinatorStats } from './coordinator-options';
import { VerdictBook } from './verdict-book';
import { DEFAULT_BUS_PORT, DEFAULT_HEARTBEAT_MS, DEFAULT_MAX_FRAME_BYTES, checkLookahead } from './constants';

export type { CoordinatorOptions, CoordinatorStats } from './coordinator-options';

export class Coordinator extends EventEmitter {
  readonly host: string;
  readonly port: number;
  readonly layout: WorldLayout;
  /** How many waves ahead each head decides: lookahead + pp - 1 (src/bus/constants.ts), the same for every replica and agent. */
  readonly decideAhead: number;
  readonly heartbeatMs: number;
  readonly deadAfterMs: number;
  readonly maxFrameBytes: number;
  readonly dumpAckTimeoutMs: number;
  readonly expectedRanks: number[];
  readonly stats: CoordinatorStats;

  epoch = 0;
  /** The dump ledger: the policy's when it has one (one object counts every ack), else the coordinator's. */
  readonly ledger: DumpLedger;

  readonly opts: CoordinatorOptions;
  readonly log: Logger;
  readonly policy?: CoordinatorPolicy;
  /** One wave stream per DP replica (wave-streams.ts). */
  readonly streams: WaveStreams;
  private readonly drops: DropCounter;
  private readonly metrics = busMetrics();
  private zap?: ZapHandler;
  private subscriberZap?: ZapHandler;
  private pub?: Publisher;
  private router?: Router;
  private metricsServer?: MetricsServer;
  private heartbeatTimer?: NodeJS.Timeout;
  private promptHeartbeat = false;
  readonly rankTable: RankTable;
  /** Each rank's fingerprint (the policy's, so its reports diff them; else the coordinator's own). */
  readonly fingerprints: FingerprintBook;
  private readonly agentRequests: AgentRequests;
  /** Each ROUTER message, admitted, to the part that owns it (coordinator-dispatch.ts). */
  private readonly dispatch: RouterDispatch;
  /** Late and missed wave vectors per rank, from the agents' heartbeats (/metrics, /healthz). */
  readonly vectors = new VectorMetrics();
  /** Engines that died under their agents (EngineCrash; /healthz, /metrics). */
  readonly crashes = new EngineCrashes();
  /** Incidents' verdicts as `wavebus verdict --coordinator` reports them (status, /metrics). */
  readonly verdicts: VerdictBook;
  /** Status and control requests, token challenges (coordinator-control.ts), and the captures armed by control. */
  readonly control: CoordinatorControl;
  /** Wake on demand: each replica's state, said in its heartbeats (replica-wake.ts). */
  readonly wake: ReplicaWake;
  /** One rank's dump ack: counted in the ledger once (coordinator-dumps.ts). */
  private readonly onDumpResult: (result: DumpResult) => void;
  private readyEmitted = false;
  private running = false;
  private pubQueue?: SendQueue;
  private routerQueue?: SendQueue;
  private receiveLoop?: Promise<void>;

  constructor(opts: CoordinatorOptions) {
    super();
    this.opts = opts;
    this.host = opts.host ?? '127.0.0.1';
    this.port = opts.port ?? DEFAULT_BUS_PORT;
    this.layout = opts.layout;
    this.heartbeatMs = opts.heartbeatMs ?? DEFAULT_HEARTBEAT_MS;
    this.decideAhead = checkLookahead(opts.lookaheadWaves, opts.layout.pp, opts.lookaheadName ?? 'lookaheadWaves');
    this.deadAfterMs = opts.deadAfterMs ?? 3 * this.heartbeatMs;
    this.maxFrameBytes = opts.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
    this.dumpAckTimeoutMs = opts.dumpAckTimeoutMs ?? 10000;
    this.policy = opts.policy;
    this.log = opts.logger ?? createLogger('wavebus-coordinator');
    if (!Number.isInteger(this.port) || this.port < 1 || this.port > 65534) {
      throw new ConfigError(`--port: expected 1..65534 (the ROUTER uses port+1), got ${this.port}`);
    }
    if (!(this.heartbeatMs > 0)) throw new ConfigError(`--heartbeat-ms: expected a positive number, got ${this.heartbeatMs}`);
    this.expectedRanks = lastPpRanks(this.layout);
    this.stats = { published: 0, received: 0, dropped: {}, wrongEpochSeen: 0, refused: {}, subscribersRefused: {}, relaysRefusedBusy: 0 };
    this.drops = new DropCounter(this.log, 'coordinator ROUTER', (reason) => this.metrics.dropped.inc({ reason }));
    this.stats.dropped = this.drops.counts;
    this.rankTable = new RankTable(this.expectedRanks, this.deadAfterMs, this.drops, {
      joined: (rank) => {
        this.log.info({ rank }, 'agent joined');
        this.emit('agent-joined', rank);
        this.metrics.liveAgents.set(this.liveRanks().length);
      },
      lost: (rank, silentMs) => {
        this.log.warn({ rank, silentMs }, 'agent lost');
        this.emit('agent-lost', rank);
      },
    });
    this.fingerprints = opts.policy?.fingerprints ?? new FingerprintBook(this.layout);
    this.verdicts = new VerdictBook(this.layout.worldSize);
    this.ledger = opts.policy?.ledger ?? new DumpLedger({ ackTimeoutMs: this.dumpAckTimeoutMs, layout: this.layout, log: this.log });
    this.control = new CoordinatorControl(this, (route, m) => this.reply(route, m), this.drops);
    this.onDumpResult = dumpAckHandler({ ledger: this.ledger, metrics: this.metrics, log: this.log, policy: this.policy, timeoutMs: this.dumpAckTimeoutMs, emit: (e, a) => this.emit(e, a) });
    this.streams = new WaveStreams({
      layout: this.layout,
      decideAhead: this.decideAhead,
      epoch: () => this.epoch,
      send: (parts) => this.pubQueue!.push(parts),
      token: opts.busToken,
      policy: this.policy,
      ledger: this.ledger,
      metrics: this.metrics,
      log: this.log,
      onPublished: () => this.stats.published++,
      captures: this.control.captures,
      wake: (r) => this.wake.of(r),
    });
    this.wake = coordinatorWake(this, () => this.running);
    this.agentRequests = new AgentRequests(this.rankTable, (route, msg, payload) => this.reply(route, msg, payload), this.drops, () => this.running, () => (this.opts.curve ? [...this.opts.curve.allow.keys()] : undefined), () => this.stats.relaysRefusedBusy++);
    const ownFiles = opts.ownFiles ? new CoordinatorFiles(opts.ownFiles, this.expectedRanks[0] ?? 0, this.log) : undefined;
    this.dispatch = new RouterDispatch(this, {
      drops: this.drops, agentRequests: this.agentRequests, ownFiles, onDumpResult: this.onDumpResult,
      reply: (route, m, payload) => this.reply(route, m, payload), heartbeatSoon: () => this.heartbeatSoon(), checkReady: () => this.checkReady(),
    });
  }

  get pubEndpoint(): string { return tcpEndpoint(this.host, this.port); } // prettier-ignore
  get routerEndpoint(): string { return tcpEndpoint(this.host, this.port + 1); } // prettier-ignore

  /** Where /healthz and /metrics are served, when enabled. */
  get metricsAddress(): { host: string; port: number } | undefined {
    return this.metricsServer ? { host: this.metricsServer.host, port: this.metricsServer.port } : undefined;
  }

  /** Whether PUB and ROUTER are CURVE servers. */
  get curve(): boolean { return this.opts.curve !== undefined; } // prettier-ignore

  async start(): Promise<void> {
    if (this.running) return;
    checkBindAllowed(this.host, { insecure: this.opts.insecure ?? false, curve: this.curve, logger: this.log });
    // One epoch per incarnation; must be exact in a JS number and non-zero (0 means "none").
    this.epoch = randomInt(1, 2 ** 48);
    const { pub, router, zap, subscriberZap } = await bindServerSockets(this.host, this.port, this.maxFrameBytes, this.opts.curve, this.log, this.opts.busToken);
    this.zap = zap;
    this.subscriberZap = subscriberZap;
    if (zap) this.stats.refused = zap.refused;
    if (subscriberZap) this.stats.subscribersRefused = subscriberZap.refused;
    if (this.opts.metricsPort !== undefined) {
      try {
        this.metricsServer = await startMetricsServer({
          host: this.opts.metricsHost ?? '127.0.0.1',
          port: this.opts.metricsPort,
          health: () => this.status(),
        });
      } catch (e) {
        pub.close();
        router.close();
        await this.zap?.stop();
        await this.subscriberZap?.stop();
        this.zap = this.subscriberZap = undefined;
        throw e;
      }
    }
    this.pub = pub;
    this.router = router;
    this.pubQueue = new SendQueue(
      pub,
      (e) => {
        if (this.running) this.log.error({ err: String(e) }, 'PUB send failed');
      },
      true,
    );
    this.routerQueue = new SendQueue(router, (e) => {
      if (this.running) this.log.warn({ err: String(e) }, 'ROUTER send failed');
    });
    this.running = true;
    this.receiveLoop = this.receiveRouter(router);
    this.heartbeatTimer = setInterval(() => this.tick(), this.heartbeatMs);
    this.publishHeartbeat();
    this.log.info(
      { epoch: this.epoch, pub: this.pubEndpoint, router: this.routerEndpoint, expected: this.expectedRanks, metrics: this.metricsAddress, curve: this.curve, allowed: this.opts.curve?.allow.size, token: this.opts.busToken !== undefined },
      'coordinator started',
    );
  }

  async stop(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    this.ledger.clear();
    this.agentRequests.stop();
    await this.pubQueue?.idle();
    await this.routerQueue?.idle();
    this.pub?.close();
    this.router?.close();
    await this.receiveLoop;
    await this.zap?.stop();
    await this.subscriberZap?.stop();
    this.zap = this.subscriberZap = undefined;
    await this.metricsServer?.close();
    this.metricsServer = undefined;
    this.policy?.close?.();
    this.log.info({ epoch: this.epoch, waves: this.streams.all().map((s) => s.wave) }, 'coordinator stopped');
  }

  /** Replica 0's stream position (a job without DP has only that one). */
  get seq(): number { return this.streams.stream(0).seq; } // prettier-ignore
  get wave(): number { return this.streams.stream(0).wave; } // prettier-ignore

  /** `payload`: a frame forwarded as it arrived after the message (a relayed chunk's data, payload.ts). */
  private reply(routingId: Buffer, msg: Record<string, unknown>, payload?: Buffer): void {
    let head = encodeCoordinatorMessage({ epoch: this.epoch, ...msg });
    if (this.opts.busToken) head = this.opts.busToken.seal('from-coordinator', head, payload);
    this.routerQueue?.push(payload ? [routingId, head, payload] : [routingId, head]);
  }

  private publishHeartbeat(): void {
    if (!this.running) return;
    this.streams.heartbeats();
  }

  /** Publish a heartbeat soon (coalesced): a new subscriber is waiting for its first frame. */
  private heartbeatSoon(): void {
    if (this.promptHeartbeat) return;
    this.promptHeartbeat = true;
    setImmediate(() => {
      this.promptHeartbeat = false;
      this.publishHeartbeat();
    });
  }

  // ------------------------------------------------------------------ waves and lanes

  /** Queue dump jobs for their replica's next wave head (DumpJob.replica, default 0). */
  armDumps(jobs: DumpJob[]): void {
    this.streams.armDumps(jobs);
  }

  /** Queue a new effective config for every replica's next wave head. */
  setConfig(version: number, config: AgentConfig): void {
    this.streams.setConfig({ version, config });
  }

  /**
   * The head of `replica` began `headWave` (the engine's wave; telemetry of the one before): its
   * stream publishes the vector of headWave + decideAheadWaves(pp) and its due lanes (wave-streams.ts).
   */
  beginWave(headWave: number, telemetry: StepTelemetry | null, replica = 0): WaveHead {
    if (!this.running) throw new WavebusError('ERR_NOT_RUNNING', 'coordinator is not running');
    if (!Number.isSafeInteger(headWave) || headWave < 0) throw new ProtocolError(`wave must be a non-negative integer, got ${headWave}`);
    const head = this.streams.begin(replica, headWave, telemetry, this.wake.holdAtHead(replica));
    this.wake.afterHead(replica);
    this.emit('wave', head, replica);
    return head;
  }

  /** `replica`'s dump jobs not yet acked by every expected rank nor timed out, grouped by wave. */
  pendingDumpLanes(replica = 0): DumpLane[] {
    return this.ledger.lanes(replica);
  }

  // ------------------------------------------------------------------ requests to agents

  /**
   * Send a request (a CoordinatorMessage body such as `{ fileList: {...} }`) to one rank's agent
   * and resolve with its reply, correlated by request id.
   */
  requestFromAgent(rank: number, body: Record<string, unknown>, timeoutMs = 10000): Promise<AgentMsg> {
    return this.agentRequests.request(rank, body, timeoutMs);
  }

  // ------------------------------------------------------------------ status, readiness, liveness

  liveRanks(): number[] {
    return this.rankTable.liveRanks();
  }

  get ready(): boolean {
    return this.rankTable.ready;
  }

  /** The JSON /healthz serves and StatusReply.status_json carries (coordinator-replies.ts). */
  status(): Record<string, unknown> {
    return statusJson(this);
  }

  private checkReady(): void {
    if (!this.readyEmitted && this.ready) {
      this.readyEmitted = true;
      this.log.info({ expected: this.expectedRanks }, 'bus ready: every expected rank is subscribed and live');
      this.emit('ready');
    }
  }

  private tick(): void {
    this.rankTable.expire();
    this.metrics.liveAgents.set(this.liveRanks().length);
    this.wake.refresh();
    this.publishHeartbeat();
  }

  // ------------------------------------------------------------------ ROUTER

  private receiveRouter(router: Router): Promise<void> {
    // Never let one message take the coordinator down: receiveLoop logs what a handler throws.
    return receiveLoop(router, { role: 'ROUTER', what: 'an agent message', running: () => this.running, log: this.log }, (parts) =>
      this.dispatch.onMessage(parts),
    );
  }
}

export { requestStatus, type StatusReplyMsg } from './status-client';
