// The coordinator side of the wave bus (ZeroMQ Clone pattern): the only publisher of wave
// vectors and lanes (PUB), the server of snapshots, status and dump acks (ROUTER), and the
// tracker of which ranks are subscribed and alive.
import { randomInt } from 'crypto';
import { EventEmitter } from 'events';
import { Context, Dealer, Publisher, Router } from 'zeromq';
import { ConfigError, ProtocolError, WavebusError } from '../errors';
import { lastPpRanks, type WorldLayout } from '../launch/identity';
import { createLogger, type Logger } from '../log';
import type { DumpJob, DumpLane, DumpResult, StepTelemetry, WaveHead } from '../messages';
import { ColumnScratch } from '../client/telemetry';
import { busMetrics, counter, startMetricsServer, type MetricsServer } from '../metrics';
import {
  DropCounter,
  decodeAgentMessage,
  decodeCoordinatorMessage,
  encodeAgentMessage,
  encodeBusFrame,
  encodeCoordinatorMessage,
  type AgentMsg,
  type FrameKind,
} from './frames';
import { checkBindAllowed, socketIpOptions, tcpEndpoint } from './endpoints';
import { payloadOf, withPayload } from './payload';
import { receiveLoop } from './receive-loop';
import { clientSocketOptions, serverSocketOptions, ZapHandler, type CurveClientKeys, type CurveServerKeys } from './curve';
import type { CoordinatorPolicy, DueLanes } from './policy';
import type { BusToken } from './auth';

import { DEFAULT_BUS_PORT, DEFAULT_HEARTBEAT_MS, DEFAULT_MAX_FRAME_BYTES } from './constants';

export interface CoordinatorOptions {
  host?: string;
  port?: number;
  layout: WorldLayout;
  heartbeatMs?: number;
  /** A rank whose heartbeats stop for this long is not live. Default 3 × heartbeatMs. */
  deadAfterMs?: number;
  /** Bind a non-loopback host without encryption (logs a warning). */
  insecure?: boolean;
  /**
   * CURVE: PUB and ROUTER become CURVE servers with this key pair, and only clients whose public
   * key is on the allow-list complete the handshake. Allows binding a non-loopback host.
   */
  curve?: CurveServerKeys;
  /**
   * The launcher's bus token (auth.ts): every frame published and every ROUTER reply carries its
   * MAC, and messages without a right one are dropped ('no_mac' / 'bad_mac'), except status
   * requests (answered: tools without the token may poll liveness).
   */
  busToken?: BusToken;
  /** Serve /healthz and /metrics here (0 picks a free port); off when undefined. */
  metricsPort?: number;
  metricsHost?: string;
  policy?: CoordinatorPolicy;
  logger?: Logger;
  /** Larger messages from the network are dropped and counted ('oversized'). */
  maxFrameBytes?: number;
  /** How long every expected rank has to ack a dump job. */
  dumpAckTimeoutMs?: number;
}

interface RankState {
  rank: number;
  /**
   * The route to the rank (relayed requests go there): the latest of the ROUTER connections it
   * said Hello on to send a message. Messages for this rank from a connection that never said
   * Hello as it are dropped ('wrong_connection'), whatever rank they claim. Undefined until a Hello.
   */
  routingId: Buffer | undefined;
  /** Connections (routing ids, hex) that said Hello as this rank; the last few. */
  helloFrom: string[];
  lastSeen: number;
  live: boolean;
  /** Hello seen in this epoch; a SnapshotRequest after it counts the rank as subscribed. */
  hello: boolean;
  subscribed: boolean;
  wave: number;
  lastSeq: number;
  epochSeen: number;
  pid: number;
  host: string;
}

interface PendingDump {
  wave: number;
  job: DumpJob;
  expected: number[];
  acked: Map<number, DumpResult>;
  timer: NodeJS.Timeout;
}

interface PendingRequest {
  rank: number;
  resolve: (m: AgentMsg) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

export interface CoordinatorStats {
  published: number;
  received: number;
  dropped: Record<string, number>;
  /** Accepted messages whose epoch_seen was not this epoch (agents that have not resynced yet). */
  wrongEpochSeen: number;
  /** CURVE peers refused, by reason (unknown_key, wrong_mechanism, bad_zap_request, handshake_failed). */
  refused: Record<string, number>;
}

const refusalMetric = () => counter('wavebus_curve_refusals_total', 'Bus peers refused by CURVE/ZAP, by reason', ['reason'] as const);

function isAddrInUse(e: unknown): boolean {
  const err = e as { code?: string; errno?: number; message?: string };
  return err?.code === 'EADDRINUSE' || /address already in use/i.test(String(err?.message ?? e));
}

export class Coordinator extends EventEmitter {
  readonly host: string;
  readonly port: number;
  readonly layout: WorldLayout;
  readonly heartbeatMs: number;
  readonly deadAfterMs: number;
  readonly maxFrameBytes: number;
  readonly dumpAckTimeoutMs: number;
  readonly expectedRanks: number[];
  readonly stats: CoordinatorStats;

  epoch = 0;
  /** Last sequence number assigned; frames are queued to PUB in seq order. */
  seq = 0;
  wave = 0;

  private readonly opts: CoordinatorOptions;
  private readonly log: Logger;
  private readonly policy?: CoordinatorPolicy;
  private readonly drops: DropCounter;
  private readonly metrics = busMetrics();
  private zap?: ZapHandler;
  private pub?: Publisher;
  private router?: Router;
  private metricsServer?: MetricsServer;
  private heartbeatTimer?: NodeJS.Timeout;
  private promptHeartbeat = false;
  private ranks = new Map<number, RankState>();
  private pendingDumps = new Map<string, PendingDump>();
  private requests = new Map<number, PendingRequest>();
  /** Per rank: ids of chunk answers received whole since that rank was last asked for a chunk. */
  private chunkAcks = new Map<number, number[]>();
  private nextRequestId = 1;
  private queuedDumps: DumpJob[] = [];
  private queuedConfig?: { version: number; configJson: string };
  private lastConfig = { version: 0, configJson: '' };
  private readyEmitted = false;
  private running = false;
  /** Telemetry columns of the wave head being handled (consumed before the next message is decoded). */
  private readonly columnScratch = new ColumnScratch();
  private pubQueue: Array<[string, Buffer]> = [];
  private routerQueue: Buffer[][] = [];
  private pubPump: Promise<void> = Promise.resolve();
  private routerPump: Promise<void> = Promise.resolve();
  private pubPumping = false;
  private routerPumping = false;
  private receiveLoop?: Promise<void>;

  constructor(opts: CoordinatorOptions) {
    super();
    this.opts = opts;
    this.host = opts.host ?? '127.0.0.1';
    this.port = opts.port ?? DEFAULT_BUS_PORT;
    this.layout = opts.layout;
    this.heartbeatMs = opts.heartbeatMs ?? DEFAULT_HEARTBEAT_MS;
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
    this.stats = { published: 0, received: 0, dropped: {}, wrongEpochSeen: 0, refused: {} };
    this.drops = new DropCounter(this.log, 'coordinator ROUTER', (reason) => this.metrics.dropped.inc({ reason }));
    this.stats.dropped = this.drops.counts;
    // Zero-valued series, so dashboards see every label from the start.
    for (const lane of ['config', 'dump']) this.metrics.lanes.inc({ lane }, 0);
    for (const result of ['ok', 'error', 'skipped', 'timeout']) this.metrics.dumps.inc({ result }, 0);
    for (const reason of ['frame_count', 'oversized', 'truncated', 'undecodable', 'empty', 'unknown_request', 'no_mac', 'bad_mac', 'wrong_connection']) this.metrics.dropped.inc({ reason }, 0);
  }

  get pubEndpoint(): string {
    return tcpEndpoint(this.host, this.port);
  }

  get routerEndpoint(): string {
    return tcpEndpoint(this.host, this.port + 1);
  }

  /** Where /healthz and /metrics are served, when enabled. */
  get metricsAddress(): { host: string; port: number } | undefined {
    return this.metricsServer ? { host: this.metricsServer.host, port: this.metricsServer.port } : undefined;
  }

  /** Whether PUB and ROUTER are CURVE servers. */
  get curve(): boolean {
    return this.opts.curve !== undefined;
  }

  async start(): Promise<void> {
    if (this.running) return;
    checkBindAllowed(this.host, { insecure: this.opts.insecure ?? false, curve: this.curve, logger: this.log });
    // One epoch per incarnation; must be exact in a JS number and non-zero (0 means "none").
    this.epoch = randomInt(1, 2 ** 48);
    const ip = socketIpOptions(this.host);
    // CURVE: an own context, so its ZAP handler (one per context) serves this allow-list only,
    // and is bound before either server socket can accept a peer.
    const context = this.opts.curve ? new Context() : undefined;
    if (context && this.opts.curve) {
      const zap = new ZapHandler(context, this.opts.curve.allow, this.log, (reason) => refusalMetric().inc({ reason }));
      await zap.start();
      this.zap = zap;
      this.stats.refused = zap.refused;
    }
    const sec = { ...(context ? { context } : {}), ...serverSocketOptions(this.opts.curve) };
    const pub = new Publisher({ linger: 0, sendHighWaterMark: 100000, ...ip, ...sec });
    // libzmq cuts a peer off beyond maxMessageSize; up to it we drop and count ourselves.
    const router = new Router({ linger: 0, maxMessageSize: 2 * this.maxFrameBytes, ...ip, ...sec });
    if (this.zap) for (const s of [pub, router]) this.watchHandshakes(s);
    try {
      await this.bindOne(pub, this.pubEndpoint, this.port, 'PUB');
      await this.bindOne(router, this.routerEndpoint, this.port + 1, 'ROUTER');
      if (this.opts.metricsPort !== undefined) {
        this.metricsServer = await startMetricsServer({
          host: this.opts.metricsHost ?? '127.0.0.1',
          port: this.opts.metricsPort,
          health: () => this.status(),
        });
      }
    } catch (e) {
      pub.close();
      router.close();
      await this.zap?.stop();
      this.zap = undefined;
      throw e;
    }
    this.pub = pub;
    this.router = router;
    this.running = true;
    this.receiveLoop = this.receiveRouter(router);
    this.heartbeatTimer = setInterval(() => this.tick(), this.heartbeatMs);
    this.publishHeartbeat();
    this.log.info(
      { epoch: this.epoch, pub: this.pubEndpoint, router: this.routerEndpoint, expected: this.expectedRanks, metrics: this.metricsAddress, curve: this.curve, allowed: this.opts.curve?.allow.size, token: this.opts.busToken !== undefined },
      'coordinator started',
    );
  }

  /**
   * Count handshakes that fail before ZAP is asked: a wrong server key, a plain-text peer.
   * (ZAP refusals also raise an auth failure; the handler has counted those already.)
   */
  private watchHandshakes(sock: Publisher | Router): void {
    const failed = (e: { address?: string; error?: Error }) =>
      this.zap?.refuse('handshake_failed', { address: e.address, error: e.error?.message });
    sock.events.on('handshake:error:protocol', failed);
    sock.events.on('handshake:error:other', failed);
  }

  private async bindOne(sock: Publisher | Router, endpoint: string, port: number, what: string): Promise<void> {
    try {
      await sock.bind(endpoint);
    } catch (e) {
      if (isAddrInUse(e)) {
        throw new ConfigError(`port ${port} (${what} ${endpoint}) is already in use; pick another --port (the bus uses port and port+1)`, 'ERR_PORT_IN_USE');
      }
      throw new ConfigError(`cannot bind ${what} to ${endpoint} (--host ${this.host} --port ${this.port}): ${String((e as Error).message ?? e)}`, 'ERR_BIND');
    }
  }

  async stop(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    for (const d of this.pendingDumps.values()) clearTimeout(d.timer);
    this.pendingDumps.clear();
    for (const [id, r] of this.requests) {
      clearTimeout(r.timer);
      r.reject(new WavebusError('ERR_STOPPED', `coordinator stopped before rank ${r.rank} answered request ${id}`));
    }
    this.requests.clear();
    this.chunkAcks.clear();
    await this.pubPump;
    await this.routerPump;
    this.pub?.close();
    this.router?.close();
    await this.receiveLoop;
    await this.zap?.stop();
    this.zap = undefined;
    await this.metricsServer?.close();
    this.metricsServer = undefined;
    this.policy?.close?.();
    this.log.info({ epoch: this.epoch, seq: this.seq, wave: this.wave }, 'coordinator stopped');
  }

  // ------------------------------------------------------------------ publishing

  private publish(kind: FrameKind, body: Record<string, unknown>): number {
    const seq = ++this.seq;
    // Heads and heartbeats are this coordinator's own numbers and flags; lanes carry more and are checked.
    const [topic, frame] = encodeBusFrame(this.epoch, seq, kind, body, kind === 'head' || kind === 'heartbeat');
    const token = this.opts.busToken;
    this.pubQueue.push([topic, token ? token.seal('pub', frame, undefined, Buffer.from(topic, 'latin1')) : frame]);
    this.stats.published++;
    if (!this.pubPumping) this.pubPump = this.drainPub();
    return seq;
  }

  // zeromq allows one send in flight per socket; frames go out strictly in the order queued.
  private async drainPub(): Promise<void> {
    this.pubPumping = true;
    try {
      while (this.pubQueue.length > 0 && this.pub && !this.pub.closed) {
        const parts = this.pubQueue.shift()!;
        try {
          await this.pub.send(parts);
        } catch (e) {
          if (this.running) this.log.error({ err: String(e) }, 'PUB send failed');
        }
      }
    } finally {
      this.pubPumping = false;
    }
  }

  /** `payload`: a frame forwarded as it arrived after the message (a relayed chunk's data, payload.ts). */
  private reply(routingId: Buffer, msg: Record<string, unknown>, payload?: Buffer): void {
    let head = encodeCoordinatorMessage({ epoch: this.epoch, ...msg });
    if (this.opts.busToken) head = this.opts.busToken.seal('from-coordinator', head, payload);
    this.routerQueue.push(payload ? [routingId, head, payload] : [routingId, head]);
    if (!this.routerPumping) this.routerPump = this.drainRouter();
  }

  private async drainRouter(): Promise<void> {
    this.routerPumping = true;
    try {
      while (this.routerQueue.length > 0 && this.router && !this.router.closed) {
        const parts = this.routerQueue.shift()!;
        try {
          await this.router.send(parts);
        } catch (e) {
          if (this.running) this.log.warn({ err: String(e) }, 'ROUTER send failed');
        }
      }
    } finally {
      this.routerPumping = false;
    }
  }

  private publishHeartbeat(): void {
    if (!this.running) return;
    this.publish('heartbeat', { wave: this.wave, unixMs: Date.now() });
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

  /** Queue dump jobs for the next wave head. */
  armDumps(jobs: DumpJob[]): void {
    this.queuedDumps.push(...jobs);
  }

  /** Queue a new effective config for the next wave head. */
  setConfig(version: number, configJson: string): void {
    this.queuedConfig = { version, configJson };
  }

  /**
   * Begin `wave`: ask the policy what is due, merge what was queued, publish the head and then
   * the due lanes (all with consecutive seqs, so a subscriber sees a wave whole or sees a gap).
   */
  beginWave(wave: number, telemetry: StepTelemetry | null): WaveHead {
    if (!this.running) throw new WavebusError('ERR_NOT_RUNNING', 'coordinator is not running');
    if (!Number.isSafeInteger(wave) || wave < 0) throw new ProtocolError(`wave must be a non-negative integer, got ${wave}`);
    let due: DueLanes = { dumps: [] };
    if (this.policy) {
      try {
        due = this.policy.onWaveHead(wave, telemetry);
      } catch (e) {
        // A policy bug must not stop the bus: the wave goes out with only what was queued.
        this.log.error({ wave, err: String((e as Error)?.stack ?? e) }, 'policy.onWaveHead failed; publishing the wave without its lanes');
      }
    }
    const config = due.config ?? this.queuedConfig;
    this.queuedConfig = undefined;
    const jobs = this.mergeJobs(wave, [...this.queuedDumps, ...(due.dumps ?? [])]);
    this.queuedDumps = [];

    if (wave < this.wave) this.log.warn({ wave, previous: this.wave }, 'wave went backwards (engine restarted?)');
    this.wave = wave;
    const head: WaveHead = { epoch: this.epoch, seq: this.seq + 1, wave, configDue: config !== undefined, dumpDue: jobs.length > 0 };
    this.publish('head', { ...head });
    this.metrics.waves.inc();
    if (config) {
      this.publish('config', { wave, version: config.version, configJson: config.configJson });
      this.lastConfig = { version: config.version, configJson: config.configJson };
      this.metrics.lanes.inc({ lane: 'config' });
    }
    if (jobs.length > 0) {
      this.publish('dump', { wave, jobs });
      this.metrics.lanes.inc({ lane: 'dump' });
      for (const job of jobs) this.trackDump(wave, job);
    }
    this.emit('wave', head);
    return head;
  }

  /** Fill arm wave and job id where the caller left them out; one job per job id. */
  private mergeJobs(wave: number, jobs: DumpJob[]): DumpJob[] {
    const byId = new Map<string, DumpJob>();
    for (const j of jobs) {
      const armWave = j.armWave || wave;
      const job: DumpJob = {
        incidentType: j.incidentType ?? '',
        reqId: j.reqId ?? '',
        blockIds: j.blockIds ?? [],
        detectWave: j.detectWave ?? 0,
        armWave,
        dumpDir: j.dumpDir ?? '',
        requestFinishedAtDump: j.requestFinishedAtDump ?? false,
        jobId: j.jobId || `${armWave}/${j.incidentType}/${j.reqId}`,
      };
      if (byId.has(job.jobId)) this.log.info({ jobId: job.jobId }, 'duplicate dump job in one wave ignored');
      else byId.set(job.jobId, job);
    }
    return [...byId.values()];
  }

  private trackDump(wave: number, job: DumpJob): void {
    const old = this.pendingDumps.get(job.jobId);
    if (old) clearTimeout(old.timer);
    const timer = setTimeout(() => this.dumpTimedOut(job.jobId), this.dumpAckTimeoutMs);
    timer.unref();
    this.pendingDumps.set(job.jobId, { wave, job, expected: [...this.expectedRanks], acked: new Map(), timer });
  }

  private dumpTimedOut(jobId: string): void {
    const d = this.pendingDumps.get(jobId);
    if (!d) return;
    this.pendingDumps.delete(jobId);
    const missing = d.expected.filter((r) => !d.acked.has(r));
    this.metrics.dumps.inc({ result: 'timeout' }, missing.length);
    this.log.warn({ jobId, missing, timeoutMs: this.dumpAckTimeoutMs }, 'dump job not acked by every rank in time');
    try {
      this.policy?.onDumpTimeout?.(jobId, missing);
    } catch (e) {
      this.log.error({ jobId, err: String(e) }, 'policy.onDumpTimeout failed');
    }
    this.emit('dump-timeout', { jobId, missing });
  }

  private onDumpResult(result: DumpResult): void {
    const outcome = result.error ? 'error' : result.skippedReason ? 'skipped' : 'ok';
    this.metrics.dumps.inc({ result: outcome });
    const d = this.pendingDumps.get(result.jobId);
    if (d) {
      d.acked.set(result.globalRank, result);
      if (d.expected.every((r) => d.acked.has(r))) {
        clearTimeout(d.timer);
        this.pendingDumps.delete(result.jobId);
        this.emit('dump-complete', { jobId: result.jobId, results: [...d.acked.values()] });
      }
    } else {
      this.log.info({ jobId: result.jobId, rank: result.globalRank }, 'dump result for a job no longer pending');
    }
    try {
      this.policy?.onDumpResult(result);
    } catch (e) {
      this.log.error({ jobId: result.jobId, err: String(e) }, 'policy.onDumpResult failed');
    }
    this.emit('dump-result', result);
  }

  /** Dump jobs not yet acked by every expected rank nor timed out, grouped by wave. */
  pendingDumpLanes(): DumpLane[] {
    const byWave = new Map<number, DumpJob[]>();
    for (const d of this.pendingDumps.values()) {
      if (!byWave.has(d.wave)) byWave.set(d.wave, []);
      byWave.get(d.wave)!.push(d.job);
    }
    return [...byWave.entries()].sort((a, b) => a[0] - b[0]).map(([wave, jobs]) => ({ wave, jobs }));
  }

  // ------------------------------------------------------------------ requests to agents

  /**
   * Send a request (a CoordinatorMessage body such as `{ fileList: {...} }`) to one rank's agent
   * and resolve with its reply, correlated by request id.
   */
  requestFromAgent(rank: number, body: Record<string, unknown>, timeoutMs = 10000): Promise<AgentMsg> {
    const st = this.ranks.get(rank);
    if (!this.running) return Promise.reject(new WavebusError('ERR_NOT_RUNNING', 'coordinator is not running'));
    if (!st) return Promise.reject(new WavebusError('ERR_UNKNOWN_RANK', `rank ${rank} has not joined the bus`));
    const route = st.routingId;
    if (!route) return Promise.reject(new WavebusError('ERR_UNKNOWN_RANK', `rank ${rank} has not said Hello on this bus (no route to it)`));
    const requestId = this.nextRequestId++;
    return new Promise<AgentMsg>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.requests.delete(requestId);
        reject(new WavebusError('ERR_TIMEOUT', `rank ${rank} did not answer request ${requestId} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.requests.set(requestId, { rank, resolve, reject, timer });
      this.reply(route, { ...body, requestId });
    });
  }

  // ------------------------------------------------------------------ status, readiness, liveness

  liveRanks(): number[] {
    return [...this.ranks.values()].filter((s) => s.live).map((s) => s.rank).sort((a, b) => a - b);
  }

  get ready(): boolean {
    return this.expectedRanks.every((r) => {
      const s = this.ranks.get(r);
      return s !== undefined && s.live && s.subscribed;
    });
  }

  /** The JSON /healthz serves and StatusReply.status_json carries. */
  status(): Record<string, unknown> {
    const ranks: Record<string, unknown> = {};
    for (const s of [...this.ranks.values()].sort((a, b) => a.rank - b.rank)) {
      ranks[String(s.rank)] = { live: s.live, subscribed: s.subscribed, wave: s.wave, last_seq: s.lastSeq, epoch_seen: s.epochSeen, pid: s.pid, host: s.host };
    }
    let policyStatus: Record<string, unknown> = {};
    try {
      policyStatus = this.policy?.status() ?? {};
    } catch (e) {
      policyStatus = { policy_error: String(e) };
    }
    return {
      epoch: this.epoch,
      seq: this.seq,
      wave: this.wave,
      live_ranks: this.liveRanks(),
      expected_ranks: this.expectedRanks,
      ready: this.ready,
      config_version: this.lastConfig.version,
      pending_dumps: [...this.pendingDumps.keys()],
      dropped: { ...this.stats.dropped },
      security: {
        ...(this.curve ? { curve: true, allowed_keys: this.opts.curve!.allow.size, refused: { ...this.stats.refused } } : { curve: false }),
        bus_token: this.opts.busToken !== undefined,
      },
      ranks,
      ...policyStatus,
    };
  }

  private checkReady(): void {
    if (!this.readyEmitted && this.ready) {
      this.readyEmitted = true;
      this.log.info({ expected: this.expectedRanks }, 'bus ready: every expected rank is subscribed and live');
      this.emit('ready');
    }
  }

  private tick(): void {
    const now = Date.now();
    for (const s of this.ranks.values()) {
      if (s.live && now - s.lastSeen > this.deadAfterMs) {
        s.live = false;
        this.log.warn({ rank: s.rank, silentMs: now - s.lastSeen }, 'agent lost');
        this.emit('agent-lost', s.rank);
      }
    }
    this.metrics.liveAgents.set(this.liveRanks().length);
    this.publishHeartbeat();
  }

  /**
   * Note a message from `rank` on connection `routingId`. `hello`: it registers that connection
   * for the rank. A message from a connection that never said Hello as the rank is dropped and
   * counted (undefined returned): what a message claims never moves a route.
   */
  private touch(rank: number, routingId: Buffer, hello = false): RankState | undefined {
    let s = this.ranks.get(rank);
    const conn = routingId.toString('hex');
    if (!hello && s?.routingId && !s.helloFrom.includes(conn)) {
      this.drops.drop('wrong_connection', `a message claiming rank ${rank} from a connection other than the one it said Hello on`);
      return undefined;
    }
    const now = Date.now();
    if (!s) {
      s = { rank, routingId: undefined, helloFrom: [], lastSeen: now, live: false, hello: false, subscribed: false, wave: 0, lastSeq: 0, epochSeen: 0, pid: 0, host: '' };
      this.ranks.set(rank, s);
    }
    if (hello && !s.helloFrom.includes(conn)) {
      s.helloFrom.push(conn);
      if (s.helloFrom.length > 8) s.helloFrom.shift();
    }
    if (s.helloFrom.includes(conn)) s.routingId = routingId;
    s.lastSeen = now;
    if (!s.live) {
      s.live = true;
      this.log.info({ rank }, 'agent joined');
      this.emit('agent-joined', rank);
      this.metrics.liveAgents.set(this.liveRanks().length);
    }
    return s;
  }

  // ------------------------------------------------------------------ ROUTER

  private receiveRouter(router: Router): Promise<void> {
    // Never let one message take the coordinator down: receiveLoop logs what a handler throws.
    return receiveLoop(router, { role: 'ROUTER', what: 'an agent message', running: () => this.running, log: this.log }, (parts) =>
      this.onRouterMessage(parts),
    );
  }

  private onRouterMessage(parts: Buffer[]): void {
    this.stats.received++;
    // [identity, message], or [identity, FileChunk message, its data] (payload.ts).
    if (parts.length !== 2 && parts.length !== 3) {
      this.drops.drop('frame_count', `${parts.length} frames (expected identity + 1, or + 2 for a file chunk)`);
      return;
    }
    const [routingId, payload, data] = parts;
    // With a token, the MAC is checked before anything in the message is read.
    let bytes = payload;
    let authed = this.opts.busToken === undefined;
    if (this.opts.busToken && payload.length <= this.maxFrameBytes && (data === undefined || data.length <= this.maxFrameBytes)) {
      const o = this.opts.busToken.open('to-coordinator', payload, data);
      if (o.ok) {
        bytes = o.msg;
        authed = true;
      } else if (o.reason === 'bad_mac') {
        this.drops.drop('bad_mac', `${payload.length} bytes`);
        return;
      }
    }
    const d = decodeAgentMessage(bytes, this.maxFrameBytes, this.columnScratch);
    if (!d.ok) {
      this.drops.drop(d.reason, d.detail);
      return;
    }
    const msg = d.value;
    if (data !== undefined) {
      if (msg.body !== 'fileChunk') {
        this.drops.drop('frame_count', `a data frame after a ${msg.body} message (only a file chunk has one)`);
        return;
      }
      if (data.length > this.maxFrameBytes) {
        this.drops.drop('oversized', `data frame of ${data.length} bytes`);
        return;
      }
    }
    if (!authed && msg.body !== 'status') {
      // Only a liveness poll is answered without the token; a relay gets a clear refusal.
      this.drops.drop('no_mac', `a ${msg.body} message without the bus token's MAC`);
      if (msg.body === 'relay') {
        this.reply(routingId, { requestId: msg.requestId, relay: { rank: Number(msg.relay?.rank ?? 0), error: 'this coordinator requires the bus token for relay requests (--bus-token-file, or WAVEBUS_BUS_TOKEN_FILE)' } });
      }
      return;
    }
    if (msg.epochSeen && msg.epochSeen !== this.epoch) this.stats.wrongEpochSeen++;
    const rank: number = msg.globalRank;
    // Only ranks of this job's layout exist: a made-up rank number is garbage, not a new agent.
    const claimed = msg.body === 'hello' ? (msg.hello?.identity?.globalRank ?? rank) : rank;
    if (msg.body !== 'status' && msg.body !== 'relay' && !(Number.isInteger(claimed) && claimed >= 0 && claimed < this.opts.layout.worldSize)) {
      this.drops.drop('rank_out_of_range', `rank ${claimed} of a world of ${this.opts.layout.worldSize}`);
      return;
    }
    switch (msg.body) {
      case 'status':
        this.reply(routingId, { requestId: msg.requestId, status: this.statusReply() });
        return;
      case 'hello': {
        const id = msg.hello.identity ?? {};
        const r = id.globalRank ?? rank;
        const s = this.touch(r, routingId, true)!;
        s.hello = true;
        s.subscribed = false;
        s.pid = id.pid ?? 0;
        s.host = id.host ?? '';
        if (!this.expectedRanks.includes(r)) this.log.warn({ rank: r, expected: this.expectedRanks }, 'Hello from a rank that is not a last-PP rank of this layout');
        // Readiness handshake: the agent waits for any frame on its SUB before asking for a snapshot.
        this.heartbeatSoon();
        return;
      }
      case 'snapshot': {
        const r = msg.snapshot.globalRank ?? rank;
        const s = this.touch(r, routingId);
        if (!s) return;
        if (s.hello) s.subscribed = true;
        this.reply(routingId, { requestId: msg.requestId, snapshot: this.snapshotReply() });
        this.checkReady();
        return;
      }
      case 'heartbeat': {
        const s = this.touch(rank, routingId);
        if (!s) return;
        s.wave = msg.heartbeat.wave;
        s.lastSeq = msg.heartbeat.lastSeq;
        s.epochSeen = msg.heartbeat.epochSeen;
        this.checkReady();
        return;
      }
      case 'dumpResult':
        if (!this.touch(rank, routingId)) return;
        this.onDumpResult({ ...msg.dumpResult, globalRank: msg.dumpResult.globalRank || rank });
        return;
      case 'waveHead':
        if (!this.touch(rank, routingId)) return;
        this.beginWave(msg.waveHead.wave, msg.waveHead.telemetry ?? null);
        return;
      case 'relay':
        this.onRelay(routingId, msg);
        return;
      case 'fileList':
      case 'fileChunk': {
        // Only an answer to a request this coordinator sent that rank counts (and only then does
        // it refresh the rank's route): a stray reply must not take over a rank's routing id.
        const pending = this.requests.get(msg.requestId);
        if (!pending || pending.rank !== rank) {
          this.drops.drop('unknown_request', `request ${msg.requestId} from rank ${rank}`);
          return;
        }
        if (!this.touch(rank, routingId)) return;
        this.requests.delete(msg.requestId);
        clearTimeout(pending.timer);
        if (data) {
          // The agent's buffer behind this frame is free once we have it whole: say so next time.
          const acks = this.chunkAcks.get(rank) ?? [];
          if (acks.length < 4096) acks.push(msg.requestId);
          this.chunkAcks.set(rank, acks);
        }
        pending.resolve(data ? withPayload(msg, data) : msg);
        return;
      }
      default:
        this.drops.drop('undecodable', `unexpected body ${msg.body}`);
    }
  }

  // ------------------------------------------------------------------ relay (tools -> agents)

  /**
   * `wavebus aggregate` reaches every agent through the coordinator alone: forward the tool's
   * file request to one rank with requestFromAgent and answer with the agent's reply, or an
   * error when the rank is not live or does not answer. The tool is not an agent: no rank state.
   * A chunk's data frame is forwarded as it arrived (never decoded, never copied).
   */
  private onRelay(routingId: Buffer, msg: AgentMsg): void {
    const relay = (msg.relay ?? {}) as Record<string, any>;
    const rank = Number(relay.rank ?? 0);
    const kind = relay.request as string | undefined;
    const answer = (body: Record<string, unknown>, data?: Buffer) => this.reply(routingId, { requestId: msg.requestId, relay: { rank, ...body } }, data);
    if (kind !== 'fileList' && kind !== 'fileChunk') {
      answer({ error: 'relay request carries neither file_list nor file_chunk' });
      return;
    }
    const st = this.ranks.get(rank);
    if (!st || !st.live) {
      answer({ error: `rank ${rank} is not live on this bus` });
      return;
    }
    const timeoutMs = relay.timeoutMs > 0 ? Math.min(Number(relay.timeoutMs), 600000) : 30000;
    let request = relay[kind] as Record<string, unknown>;
    if (kind === 'fileChunk') {
      // Which chunk buffers the agent may reuse is for the coordinator to say, never the tool.
      request = { ...request, received: this.chunkAcks.get(rank) ?? [] };
      this.chunkAcks.delete(rank);
    }
    this.requestFromAgent(rank, { [kind]: request }, timeoutMs).then(
      (m) => (m.body === kind ? answer({ [kind]: m[kind] }, payloadOf(m)) : answer({ error: `rank ${rank} answered ${m.body} to ${kind}` })),
      (e) => answer({ error: String((e as Error)?.message ?? e) }),
    );
  }

  private statusReply(): Record<string, unknown> {
    return {
      epoch: this.epoch,
      seq: this.seq,
      wave: this.wave,
      liveRanks: this.liveRanks(),
      expectedRanks: this.expectedRanks,
      ready: this.ready,
      statusJson: JSON.stringify(this.status()),
    };
  }

  private snapshotReply(): Record<string, unknown> {
    let cfg = { configVersion: this.lastConfig.version, configJson: this.lastConfig.configJson, manualDumpDone: 0 };
    if (this.policy) {
      try {
        cfg = this.policy.snapshotState();
      } catch (e) {
        this.log.error({ err: String(e) }, 'policy.snapshotState failed; the snapshot carries the last published config');
      }
    }
    // seq is the last one assigned: the state below already includes every frame up to it.
    return {
      epoch: this.epoch,
      seq: this.seq,
      wave: this.wave,
      configVersion: cfg.configVersion,
      configJson: cfg.configJson,
      pending: this.pendingDumpLanes(),
      manualDumpDone: cfg.manualDumpDone,
    };
  }
}

export interface StatusReplyMsg {
  epoch: number;
  seq: number;
  wave: number;
  liveRanks: number[];
  expectedRanks: number[];
  ready: boolean;
  statusJson: string;
}

/**
 * Ask a coordinator for its status over its ROUTER (what tools that are not agents use).
 * Rejects with ERR_TIMEOUT when nothing answers. A CURVE coordinator needs `curve` (client keys
 * whose public key is on its allow-list); without them it never answers, so this times out.
 */
export async function requestStatus(coordinator: { host: string; port: number }, timeoutMs = 2000, curve?: CurveClientKeys, token?: BusToken): Promise<StatusReplyMsg> {
  const dealer = new Dealer({ linger: 0, receiveTimeout: timeoutMs, ...socketIpOptions(coordinator.host), ...clientSocketOptions(curve) });
  try {
    dealer.connect(tcpEndpoint(coordinator.host, coordinator.port + 1));
    const ask = encodeAgentMessage({ requestId: 1, status: {} });
    await dealer.send(token ? token.seal('to-coordinator', ask) : ask);
    for (;;) {
      let parts: Buffer[];
      try {
        parts = await dealer.receive();
      } catch {
        throw new WavebusError('ERR_TIMEOUT', `no status reply from coordinator ${tcpEndpoint(coordinator.host, coordinator.port + 1)} within ${timeoutMs} ms`);
      }
      // With a token, only the coordinator that holds it is believed.
      const d = decodeCoordinatorMessage(parts[parts.length - 1], DEFAULT_MAX_FRAME_BYTES, token);
      if (d.ok && d.value.body === 'status') return d.value.status as StatusReplyMsg;
    }
  } finally {
    dealer.close();
  }
}
