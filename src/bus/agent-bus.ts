// The agent side of the wave bus (ZeroMQ Clone pattern): subscribe to this rank's replica's wave
// stream first, then ask the coordinator for a snapshot; apply frames in seq order; on a gap, a new
// epoch or a silent coordinator, resync from a fresh snapshot. Emits one 'wave' per wave once its
// due lanes are in (wave-assembly.ts).
import { EventEmitter } from 'events';
import { identityToProto, type RankIdentity } from '../layout';
import { createLogger, type Logger } from '../log';
import type { DumpResult, StepTelemetry, WaveHead } from '../messages';
import { DEFAULT_HEARTBEAT_MS, DEFAULT_MAX_FRAME_BYTES } from './constants';
import { snapshotMismatch } from './snapshot-checks';
import {
  DropCounter,
  decodeBusFrame,
  decodeCoordinatorMessage,
  encodeAgentMessage,
  replicaTopic,
  workTopics,
  type DecodedFrame,
} from './frames';
import { WaveAssembly } from './wave-assembly';
import { CoordinatorLiveness } from './coordinator-liveness';
import { answerFileRequest } from './agent-file-requests';
import type { AgentBusOptions, AgentBusStats, RequestHandler, ResyncReason, SnapshotReplyMsg } from './agent-bus-types';

export type { AgentBusOptions, AgentBusStats, RequestHandler, ResyncReason, SnapshotReplyMsg, WaveEvent } from './agent-bus-types';
import { socketIpOptions, tcpEndpoint } from './endpoints';
import { BusSubscription } from './bus-subscription';
import { CoordinatorLink } from './coordinator-link';
import { PROTOCOL_VERSION, versionMismatch } from './protocol-version';
import { ProtocolError } from '../errors';
import { clientSocketOptions } from './curve';
import { subscriberSocketOptions } from './auth';
import { agentWaveHead } from './wave-head-relay';
import { payloadOf } from './payload';

/** 'refused': the coordinator speaks another protocol version; nothing is sent until its epoch changes. */
type SyncState = 'connecting' | 'syncing' | 'live' | 'refused';

const MAX_BUFFERED = 100000;

export class AgentBus extends EventEmitter {
  readonly identity: RankIdentity;
  /** The DP replica whose wave stream this agent follows (its dp rank). */
  readonly replica: number;
  readonly heartbeatMs: number;
  readonly deadAfterMs: number;
  readonly maxFrameBytes: number;
  readonly stats: AgentBusStats;

  private readonly opts: AgentBusOptions;
  private readonly log: Logger;
  private readonly drops: DropCounter;
  private sub?: BusSubscription;
  private link?: CoordinatorLink;
  private timer?: NodeJS.Timeout;
  private running = false;

  private state: SyncState = 'connecting';
  private fingerprint: Record<string, unknown> | null = null;
  private epoch = 0;
  private lastSeq = 0;
  /** seq covered by the last snapshot applied in this epoch. */
  private snapshotSeq = 0;
  private buffer: DecodedFrame[] = [];
  private readonly waves: WaveAssembly;
  private snapshotRequestId = 0;
  private nextRequestId = 1;
  private snapshotAskedAt = 0;
  /** Signs of life, the coordinator lost, the epochs left (coordinator-liveness.ts). */
  private readonly liveness: CoordinatorLiveness;
  private handler?: RequestHandler;
  /** The epoch of the coordinator that speaks another protocol version (state 'refused'). */
  private refusedEpoch = 0;
  /** Following only the waves with work (AgentBusOptions.lanesOnly); setLanesOnly switches. */
  private lanesOnly: boolean;

  constructor(opts: AgentBusOptions) {
    super();
    this.opts = opts;
    this.identity = opts.identity;
    this.replica = opts.identity.dpRank;
    this.heartbeatMs = opts.heartbeatMs ?? DEFAULT_HEARTBEAT_MS;
    this.deadAfterMs = opts.deadAfterMs ?? 3 * this.heartbeatMs;
    this.maxFrameBytes = opts.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
    this.lanesOnly = opts.lanesOnly ?? false;
    this.log = opts.logger ?? createLogger(`wavebus-agent-rank${opts.identity.globalRank}`);
    this.liveness = new CoordinatorLiveness(this.deadAfterMs, () => this.emit('coordinator-alive'));
    this.drops = new DropCounter(this.log, `agent rank ${opts.identity.globalRank}`);
    this.stats = { received: 0, dropped: this.drops.counts, resyncs: 0, waves: 0, covered: 0, unsent: 0, unproven: 0, connections: 0, subRenewals: 0 };
    this.waves = new WaveAssembly(this.drops, this.log, (w) => {
      this.stats.waves++;
      this.emit('wave', w);
    });
  }

  get rank(): number {
    return this.identity.globalRank;
  }

  /**
   * The replica's wake on demand as the coordinator last said it (proto Wake: 0 off, 1 heads, 2 on;
   * src/bus/replica-wake.ts), from its snapshot and then its heartbeats, in stream order. A change
   * is emitted as 'wake' (a snapshot's comes with 'snapshot').
   */
  wake = 0;

  /** True once a snapshot was applied and no resync is in progress. */
  get synced(): boolean {
    return this.state === 'live';
  }

  /** No frame from the coordinator within the liveness window (deadAfterMs) since it was last heard. */
  get coordinatorLost(): boolean {
    return this.liveness.lost;
  }

  /** The coordinator epoch this agent follows (0 before the first snapshot). */
  get currentEpoch(): number {
    return this.epoch;
  }

  /** The last wave head delivered by 'wave'. */
  latest(): WaveHead | undefined {
    return this.waves.latestHead;
  }

  onRequest(handler: RequestHandler): void {
    this.handler = handler;
  }

  async start(): Promise<void> {
    if (this.running) return;
    const { host, port } = this.opts.coordinator;
    const ip = { ...socketIpOptions(host), ...clientSocketOptions(this.opts.curve) };
    // Subscribe before anything else: frames published after the snapshot must not be missed.
    this.sub = new BusSubscription({
      // With the token and without CURVE, the PUB admits only subscribers with the token's password (server-sockets.ts).
      endpoint: tcpEndpoint(host, port), socketOptions: { ...ip, ...subscriberSocketOptions(this.opts.busToken, this.opts.curve !== undefined) }, maxMessageBytes: 2 * this.maxFrameBytes,
      topics: () => this.topics(), onMessage: (parts) => this.onSubMessage(parts), running: () => this.running, log: this.log,
    });
    this.sub.open();
    // With the bus token, nothing but a challenge goes out until the peer proves the token (coordinator-link.ts).
    this.link = new CoordinatorLink({
      host, port, socketOptions: ip, maxFrameBytes: this.maxFrameBytes, token: this.opts.busToken, rank: this.rank, retryMs: this.deadAfterMs, log: this.log,
      running: () => this.running,
      onMessage: (parts, generation) => this.onCoordinatorMessage(parts, generation),
      onProven: () => this.onProven(),
      onUnsent: () => this.stats.unsent++,
    });
    this.running = true;
    this.link.start();
    this.timer = setInterval(() => this.tick(), this.heartbeatMs);
    this.sendHello(false);
    this.log.info({ rank: this.rank, replica: this.replica, pub: tcpEndpoint(host, port), router: tcpEndpoint(host, port + 1), curve: this.opts.curve !== undefined, token: this.opts.busToken !== undefined }, 'agent bus started');
  }

  /** Whether this agent follows only the waves with work. */
  get followsLanesOnly(): boolean {
    return this.lanesOnly;
  }

  /**
   * Follow the whole stream (false: this agent became its host's receiver) or only the waves with
   * work (true). The stream is then taken up again from a fresh snapshot, so nothing published
   * between the two subscriptions is lost.
   */
  setLanesOnly(on: boolean): void {
    if (on === this.lanesOnly) return;
    const before = this.topics();
    this.lanesOnly = on;
    this.sub?.retopic(before, this.topics());
    if (this.running && this.state === 'live') this.resync('receiver');
  }

  /** This replica's stream only ("r<dp>." never prefixes another replica's topic); lanes-only, its work topics. */
  private topics(): string[] {
    return this.lanesOnly ? workTopics(this.replica) : [replicaTopic(this.replica)];
  }

  async stop(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    if (this.timer) clearInterval(this.timer);
    await this.link?.stop();
    await this.sub?.close();
  }

  // ------------------------------------------------------------------ to the coordinator

  /** The replica's head (its last-PP TP0): the head of `wave`, with the telemetry of the previous wave. */
  sendWaveHead(wave: number, telemetry: StepTelemetry | null): void {
    this.send({ waveHead: telemetry ? { wave, telemetry } : { wave } });
  }

  /** The same, with the client's WaveHeadRequest bytes forwarded as they came (wave-head-relay.ts). */
  relayWaveHead(waveHead: Uint8Array): void {
    if (!this.running) return;
    const msg = agentWaveHead(this.rank, this.epoch, waveHead);
    this.link?.send(this.opts.busToken ? this.opts.busToken.seal('to-coordinator', msg) : msg);
  }

  sendDumpResult(result: DumpResult): void {
    this.send({ dumpResult: { ...result, globalRank: this.rank } });
  }

  /** An input snapshot armed on the running job: a bundle written, a failure, or the arm done here. */
  /** This rank's engine died (the flight recorder flushed): EngineCrash. */
  sendEngineCrash(crash: Record<string, unknown>): void {
    this.send({ engineCrash: crash });
  }

  /** rank_divergence: the digests of the waves this rank's engine decided since the last send. */
  sendDecisions(decisions: object[]): void {
    this.send({ decided: { decisions } });
  }

  sendCaptureResult(result: Record<string, unknown>): void {
    this.send({ captureResult: { ...result, globalRank: this.rank } });
  }

  /** This rank's fingerprint: sent now if the coordinator has our Hello, again after each Hello asking for a snapshot. */
  setFingerprint(fp: Record<string, unknown>): void {
    this.fingerprint = fp;
    if (this.state === 'live' || this.state === 'syncing') this.send({ fingerprint: fp });
  }

  private send(body: Record<string, unknown>, requestId = 0): void {
    if (!this.running) return;
    const payload = payloadOf(body);
    let msg = encodeAgentMessage({ globalRank: this.rank, epochSeen: this.epoch, requestId, ...body });
    if (this.opts.busToken) msg = this.opts.busToken.seal('to-coordinator', msg, payload);
    this.link?.send(payload ? [msg, payload] : msg);
  }

  /** The peer of a new connection proved the token: what the state machine needs goes out now. */
  private onProven(): void {
    if (this.state === 'connecting') this.sendHello(false);
    else if (this.state === 'syncing') this.requestSnapshot();
    // Live on a new connection: the coordinator routes to it only after a Hello, and what was
    // sent on the old one may be lost: sync again.
    else if (this.state === 'live') this.resync('reconnect');
  }

  private sendHello(subscribed: boolean): void {
    this.send({ hello: { identity: identityToProto(this.identity), subscribed, agentVersion: this.opts.agentVersion ?? '', protocolVersion: PROTOCOL_VERSION, recorderForwards: this.opts.recorderForwards ?? 0 } });
  }

  private requestSnapshot(): void {
    this.snapshotRequestId = this.nextRequestId++;
    this.snapshotAskedAt = Date.now();
    // Hello first, on the same connection: the coordinator counts us subscribed on the request after it.
    this.sendHello(true);
    if (this.fingerprint) this.send({ fingerprint: this.fingerprint });
    this.send({ snapshot: { globalRank: this.rank } }, this.snapshotRequestId);
  }

  private tick(): void {
    if (this.state === 'refused') return; // a coordinator of another version: wait for a new epoch
    const now = Date.now();
    this.link?.tick(now);
    this.stats.unproven = this.link?.unproven ?? 0;
    this.stats.connections = this.link?.connections ?? 0;
    this.send({ heartbeat: { wave: this.waves.lastWave, globalRank: this.rank, epochSeen: this.epoch, lastSeq: this.lastSeq, unixMs: now, ...this.opts.vectorCounts?.() } });
    const silentMs = this.liveness.silence(now);
    if (silentMs !== undefined) {
      this.state = 'connecting';
      this.buffer = [];
      this.waves.reset();
      this.log.warn({ silentMs }, 'coordinator lost: no frame on the bus');
      // Its connection may be half dead (a frozen process) or gone: a new one is challenged.
      this.link?.renew();
      this.emit('coordinator-lost');
    }
    // Lost: a SUB that hears nothing may have been ended by a squatter's bad handshake (bus-subscription.ts).
    if (this.state === 'connecting' && this.sub?.renewIfSilent(now, this.deadAfterMs)) this.stats.subRenewals = this.sub.renewals;
    if (this.state === 'connecting') this.sendHello(false);
    else if (this.state === 'syncing' && now - this.snapshotAskedAt > this.deadAfterMs) {
      // Unanswered: without a token the DEALER may be one a bad handshake ended (with one, the link renews itself).
      if (!this.opts.busToken) this.link?.renew();
      this.requestSnapshot();
    }
  }

  // ------------------------------------------------------------------ SUB

  private onSubMessage(parts: Buffer[]): void {
    this.stats.received++;
    const d = decodeBusFrame(parts, this.maxFrameBytes, this.opts.busToken);
    if (!d.ok) return this.drops.drop(d.reason, d.detail);
    const f = d.value;
    // ZeroMQ filtered on our prefix; a frame of another replica here is garbage, never applied.
    if (f.replica !== this.replica) return this.drops.drop('wrong_topic', `a frame of replica ${f.replica} on replica ${this.replica}'s stream`);
    if (this.opts.dropSeqs?.(f.seq)) return this.drops.drop('injected', `seq ${f.seq}`);
    if (this.liveness.hasLeft(f.epoch)) return this.drops.drop('wrong_epoch', `epoch ${f.epoch} was left`);
    // A frame seen before (a replay) is no sign of life; the stream never sends one twice.
    const life = this.liveness.frame(f.epoch, f.seq, Date.now());
    if (life === 'stale') return this.drops.drop('stale', `seq ${f.seq} of epoch ${f.epoch} was already seen`);
    if (life === 'back') return this.resync('coordinator-silent', f);
    this.handleFrame(f);
  }

  private handleFrame(f: DecodedFrame): void {
    switch (this.state) {
      case 'refused':
        if (f.epoch === this.refusedEpoch) return;
        // A new coordinator incarnation (upgraded, perhaps): start over with it.
        this.state = 'connecting';
        return this.handleFrame(f);
      case 'connecting':
        // Readiness handshake: our SUB has seen a frame, so it is subscribed; now ask.
        this.state = 'syncing';
        this.buffer = [f];
        this.requestSnapshot();
        return;
      case 'syncing':
        if (this.buffer.length >= MAX_BUFFERED) this.buffer.shift();
        this.buffer.push(f);
        return;
      case 'live':
        if (f.epoch !== this.epoch) return this.resync('epoch', f);
        if (f.seq <= this.snapshotSeq) {
          // Published before the snapshot was taken but slower than its reply: already covered.
          this.stats.covered++;
          return;
        }
        if (f.seq <= this.lastSeq) return this.drops.drop('stale', `seq ${f.seq} <= ${this.lastSeq}`);
        // Lanes-only, the seqs of the plain heads never come here: a jump is expected.
        if (f.seq !== this.lastSeq + 1 && !this.lanesOnly) return this.resync('gap', f);
        this.lastSeq = f.seq;
        this.apply(f);
    }
  }

  private resync(reason: ResyncReason, frame?: DecodedFrame): void {
    this.stats.resyncs++;
    this.log.info({ reason, epoch: this.epoch, lastSeq: this.lastSeq, frameEpoch: frame?.epoch, frameSeq: frame?.seq }, 'resync');
    this.state = 'syncing';
    this.buffer = frame ? [frame] : [];
    this.waves.reset();
    this.emit('resync', { reason });
    this.requestSnapshot();
  }

  private apply(f: DecodedFrame): void {
    if (f.kind === 'heartbeat') {
      const wake = Number(f.heartbeat?.wake ?? 0);
      if (wake !== this.wake) {
        this.wake = wake;
        this.emit('wake', wake);
      }
    }
    this.waves.apply(f);
  }

  // ------------------------------------------------------------------ DEALER

  private onCoordinatorMessage(parts: Buffer[], generation: number): void {
    if (parts.length !== 1) return this.drops.drop('frame_count', `${parts.length} frames from the coordinator`);
    const d = decodeCoordinatorMessage(parts[0], this.maxFrameBytes, this.opts.busToken);
    if (!d.ok) return this.drops.drop(d.reason, d.detail);
    const msg = d.value;
    if (msg.body === 'proof') {
      if (!this.link?.proof(msg.proof.nonce, generation)) this.drops.drop('stale_proof', 'a proof for another connection or nonce');
      return;
    }
    // A message on a connection replaced since (or not proven yet): never acted on.
    if (!this.link?.current(generation)) return this.drops.drop('old_connection', `a ${msg.body} message on a replaced connection`);
    switch (msg.body) {
      case 'snapshot':
        if (this.state !== 'syncing' || msg.requestId !== this.snapshotRequestId) return; // an answer to an older ask
        if (Number(msg.snapshot.protocolVersion ?? 0) !== PROTOCOL_VERSION) {
          this.refuse(msg.epoch, versionMismatch('coordinator', Number(msg.snapshot.protocolVersion ?? 0), `agent (rank ${this.rank})`, PROTOCOL_VERSION));
          return;
        }
        this.applySnapshot(msg.snapshot as SnapshotReplyMsg);
        return;
      case 'refused':
        if (this.state !== 'refused') this.refuse(msg.epoch, msg.refused.error || versionMismatch(`agent (rank ${this.rank})`, PROTOCOL_VERSION, 'coordinator', msg.refused.protocolVersion));
        return;
      case 'fileList':
      case 'fileChunk':
      case 'fileServe':
      case 'replay':
      case 'decidedColumn':
        answerFileRequest(this.handler, msg, this.rank, (body, requestId) => this.send(body, requestId));
        return;
      default:
        return; // heartbeat / status: nothing to do
    }
  }

  /**
   * The coordinator speaks another protocol version: say so once, loudly, and stay off its bus
   * (no heartbeats, no snapshot asks) until a coordinator with another epoch publishes.
   */
  private refuse(epoch: number, error: string): void {
    this.state = 'refused';
    this.refusedEpoch = epoch;
    this.buffer = [];
    this.waves.reset();
    this.stats.refused = error;
    this.log.error({ epoch }, error);
    this.emit('protocol-mismatch', new ProtocolError(error, 'ERR_PROTOCOL_VERSION'));
  }

  private applySnapshot(snap: SnapshotReplyMsg): void {
    if (this.liveness.hasLeft(snap.epoch)) {
      // A late reply from a coordinator incarnation we already left: ask again.
      this.requestSnapshot();
      return;
    }
    if (this.epoch !== snap.epoch) this.liveness.leave(this.epoch);
    const mismatch = snapshotMismatch(snap, this.replica, this.opts.identity.pp);
    if (mismatch) return this.drops.drop(mismatch.reason, mismatch.detail);
    this.stats.refused = undefined;
    this.epoch = snap.epoch;
    this.lastSeq = snap.seq;
    this.snapshotSeq = snap.seq;
    this.waves.snapshot(snap.wave);
    this.state = 'live';
    this.wake = Number(snap.wake ?? 0);
    this.log.info({ epoch: snap.epoch, replica: this.replica, seq: snap.seq, wave: snap.wave, pending: snap.pending.length }, 'snapshot applied');
    this.emit('snapshot', snap);
    // Replay what arrived while we waited; anything the snapshot covers is skipped.
    const buffered = this.buffer;
    this.buffer = [];
    for (const f of buffered) {
      if (this.state !== 'live') {
        this.handleFrame(f); // a replayed frame caused another resync: keep buffering
      } else if (f.epoch !== this.epoch) {
        this.drops.drop('wrong_epoch', `buffered frame of epoch ${f.epoch}, snapshot epoch ${this.epoch}`);
      } else if (f.seq <= this.lastSeq) {
        this.stats.covered++;
      } else {
        this.handleFrame(f);
      }
    }
  }
}
