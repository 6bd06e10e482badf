// The coordinator's wave streams: one per DP replica. Each replica steps on its own (its own
// scheduler, step count and requests), so each has its own wave number, sequence numbers, queued
// lanes and topic ("r<replica>.<kind>", frames.ts): an agent subscribes to its replica's stream only
// and checks that stream's seq for gaps. The epoch is the coordinator's, shared by every stream.
import { ProtocolError } from '../errors';
import { replicaDumpRanks, type PpStages, type WorldLayout } from '../layout';
import type { Logger } from '../log';
import type { AgentConfig, DumpJob, StepTelemetry, WaveHead } from '../messages';
import type { busMetrics } from '../metrics';
import type { BusToken } from './auth';
import type { DumpLedger } from '../guard/dump-ledger';
import { jobIdOf } from '../guard/dump-names';
import { encodeBusFrame, type FrameKind } from './frames';
import type { CoordinatorPolicy, DueLanes } from './policy';
import type { CaptureArms } from './capture-arms';
import type { ManualArms } from '../guard/manual-arms';

export interface ConfigDue {
  version: number;
  /** null only before any config was published (lastConfig). */
  config: AgentConfig | null;
}

export interface ReplicaStream {
  replica: number;
  /** The replica's current wave: its engine's last head (0 before the first); its vector is wave + decideAheadWaves(pp). */
  wave: number;
  /** Last sequence number assigned on this stream. */
  seq: number;
  queuedDumps: DumpJob[];
  queuedConfig?: ConfigDue;
  lastConfig: ConfigDue;
}

export interface StreamDeps {
  layout: WorldLayout;
  /** The head of wave N publishes the vector of N + this (decideAheadWaves, src/bus/constants.ts). */
  decideAhead: number;
  epoch(): number;
  /** Queue [topic, frame] on PUB (in order). */
  send(parts: [string, Buffer]): void;
  token?: BusToken;
  policy?: CoordinatorPolicy;
  ledger: DumpLedger;
  metrics: ReturnType<typeof busMetrics>;
  log: Logger;
  onPublished(): void;
  /** Input snapshots armed on the running job (capture-arms.ts): their heads say snapshot_due. */
  captures?: CaptureArms;
  /** The replica's wake on demand (replica-wake.ts; proto Wake), said in its heartbeats. */
  wake?: (replica: number) => number;
}

/**
 * Fill what the caller left out of queued jobs: the replica (this stream's, whatever a job says),
 * the ranks that copy it (the replica's dump ranks under `stages`, the stages in force at the copy
 * wave: stage-schedule.ts), arm wave and job id. One job per job id.
 */
export function mergeJobs(replica: number, wave: number, jobs: DumpJob[], layout: WorldLayout, log: Logger, stages: PpStages = 'last'): DumpJob[] {
  const byId = new Map<string, DumpJob>();
  const tag = layout.dp > 1 ? replica : undefined;
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
      jobId: j.jobId || jobIdOf(armWave, j.incidentType, j.reqId, tag),
      replica,
      ranks: j.ranks && j.ranks.length > 0 ? j.ranks : replicaDumpRanks(layout, replica, stages),
    };
    if (byId.has(job.jobId)) log.info({ jobId: job.jobId }, 'duplicate dump job in one wave ignored');
    else byId.set(job.jobId, job);
  }
  return [...byId.values()];
}

export class WaveStreams {
  private readonly streams: ReplicaStream[];

  constructor(private readonly deps: StreamDeps) {
    this.streams = Array.from({ length: deps.layout.dp }, (_, replica) => ({ replica, wave: 0, seq: 0, queuedDumps: [], lastConfig: { version: 0, config: null } }));
  }

  get count(): number {
    return this.streams.length;
  }

  stream(replica: number): ReplicaStream {
    const s = this.streams[replica];
    if (!s) throw new ProtocolError(`replica ${replica} is outside the layout's dp=${this.streams.length}`);
    return s;
  }

  all(): readonly ReplicaStream[] {
    return this.streams;
  }

  private publish(s: ReplicaStream, kind: FrameKind, body: Record<string, unknown>): number {
    const seq = ++s.seq;
    // Heads and heartbeats are this coordinator's own numbers and flags; lanes carry more and are checked.
    const [topic, frame] = encodeBusFrame(this.deps.epoch(), seq, kind, body, kind === 'head' || kind === 'heartbeat', s.replica);
    const token = this.deps.token;
    this.deps.send([topic, token ? token.seal('pub', frame, undefined, Buffer.from(topic, 'latin1')) : frame]);
    this.deps.onPublished();
    return seq;
  }

  /** A heartbeat on every replica's stream (each stream's seq is gap-checked on its own). */
  heartbeats(): void {
    for (const s of this.streams) this.heartbeat(s.replica);
  }

  /** A heartbeat on one replica's stream now (its wake changed: replica-wake.ts). */
  heartbeat(replica: number): void {
    const s = this.stream(replica);
    this.publish(s, 'heartbeat', { wave: s.wave, unixMs: Date.now(), wake: this.deps.wake?.(replica) ?? 0 });
  }

  /** Queue a config for every replica's next wave head. */
  setConfig(config: ConfigDue): void {
    for (const s of this.streams) s.queuedConfig = config;
  }

  /** Queue dump jobs for their replica's next wave head (job.replica, default 0). */
  armDumps(jobs: DumpJob[]): void {
    for (const j of jobs) this.stream(j.replica ?? 0).queuedDumps.push(j);
  }

  /**
   * The head of `replica` began `headWave` (the engine's wave; telemetry of the one before): ask the
   * policy what is due, merge what was queued, and publish the vector of headWave + decideAheadWaves(pp)
   * and then its due lanes (consecutive seqs of the stream, so a subscriber sees a wave whole or a gap).
   * A config in it applies on every rank of the replica at the end of that wave: the ledger's stage
   * schedule learns it before the jobs are merged, so they name the stages in force at their copy wave.
   * `hold`: the replica's first head after a wake (replica-wake.ts): the policy sees its telemetry,
   * but nothing queued is armed at it (manual dumps, captures, queued jobs wait for the next head).
   */
  begin(replica: number, headWave: number, telemetry: StepTelemetry | null, hold = false): WaveHead {
    const s = this.stream(replica);
    const { log, policy, metrics } = this.deps;
    const wave = headWave + this.deps.decideAhead;
    let due: DueLanes = { dumps: [] };
    if (policy) {
      const arms = (policy as { manualArms?: ManualArms }).manualArms;
      if (hold) arms?.held.add(replica);
      try {
        due = policy.onWaveHead(replica, headWave, telemetry, wave);
      } catch (e) {
        // A policy bug must not stop the bus: the wave goes out with only what was queued.
        log.error({ replica, wave, err: String((e as Error)?.stack ?? e) }, 'policy.onWaveHead failed; publishing the wave without its lanes');
      } finally {
        arms?.held.delete(replica);
      }
    }
    const config = due.config ?? s.queuedConfig;
    s.queuedConfig = undefined;
    if (config?.config) this.deps.ledger.configFrom(replica, wave, config.config.allPpStages ? 'all' : 'last');
    const jobs = mergeJobs(replica, wave, [...(hold ? [] : s.queuedDumps), ...(due.dumps ?? [])], this.deps.layout, log, this.deps.ledger.stagesAt(replica, wave));
    if (!hold) s.queuedDumps = [];
    if (headWave < s.wave) log.warn({ replica, wave: headWave, previous: s.wave }, 'wave went backwards (engine restarted?)');
    // The stream's `wave` (status, heartbeats, snapshots) is the engine's: the last head; its vector is wave + decideAheadWaves(pp).
    s.wave = headWave;
    const cap = this.deps.captures?.atHead(replica, headWave, wave, hold);
    const head: WaveHead = { epoch: this.deps.epoch(), seq: s.seq + 1, wave, configDue: config !== undefined, dumpDue: jobs.length > 0, snapshotDue: cap?.snapshotDue ?? false };
    this.publish(s, 'head', cap && cap.captures.length > 0 ? { ...head, captures: cap.captures } : { ...head });
    metrics.waves.inc();
    metrics.replicaWaves.inc({ dp: String(replica) });
    if (config) {
      this.publish(s, 'config', { wave, version: config.version, config: config.config });
      s.lastConfig = { version: config.version, config: config.config };
      metrics.lanes.inc({ lane: 'config' });
    }
    if (jobs.length > 0) {
      this.publish(s, 'dump', { wave, jobs });
      metrics.lanes.inc({ lane: 'dump' });
      // After the publish: the ledger starts their ack timeouts and writes their request_info.json
      // now, so its fsyncs are never ahead of the vector.
      this.deps.ledger.published(wave, jobs);
    }
    return head;
  }
}
