// The runtime guard as the coordinator's policy: at the head of wave N of a DP replica it runs the
// enabled detectors on that replica's telemetry of wave N-1 (the detect wave), applies quotas,
// writes reports, arms dump jobs for wave N + decideAheadWaves(pp) (the arm wave, copied at its end
// by the ranks of the stages in force then: dump-ledger.ts, stage-schedule.ts) and hands out a new
// effective config when the file changed (applied by every rank of the replica at the end of that
// same arm wave, before its copies). State per replica: replica-state.ts (with its copy window,
// copy-window.ts); dump jobs: dump-ledger.ts.
import { DEFAULT_ARTIFACT_MODES, type ArtifactModes } from '../artifacts/artifact-mode';
import type { CoordinatorPolicy, DueLanes } from '../bus/policy';
import { decideAheadWaves } from '../bus/constants';
import { createLogger, Logger } from '../log';
import { ConfigHistory } from './config-history';
import type { AgentConfig, DumpJob, StepTelemetry, TelemetryColumns } from '../messages';
import { counter } from '../metrics';
import type { RuntimeConfig } from './config';
import { agentConfig } from './agent-config';
import { Hit, MUTE_BIT, splitNonFinite } from './detectors';
import { IncidentActions } from './incident-actions';
import { findOrphanDumps } from './orphan-dumps';
import { FingerprintBook } from './fingerprint-diff';
import { TokenHasher } from './token-hash';
import { DumpLedger } from './dump-ledger';
import { ConfigFollower } from './reload';
import type { ReqState } from './requests';
import type { KeepIds } from './step-pass';
import { ReplicaState } from './replica-state';
import { replicaHead, type WorldLayout } from '../layout';
import { ReportVerdicts, type ReportVerdict } from './report-verdicts';
import { ManualArms, manualDumpJobs } from './manual-arms';
import { TelemetryColumnizer } from '../client/telemetry';
import { dumpRootOf, loadStartupConfig, StartupConfig, StartupIssue, StartupOptions } from './startup';
import { RecorderRanks } from './recorder-listing';
import { DivergenceWatch, type ColumnAsker } from './divergence';
import type { RankDecisionMsg } from './rank-compare';

export const MANUAL_TRIGGER = 'manual_trigger';

export interface GuardOptions {
  startup: StartupOptions;
  /** The job's layout: its DP replicas, each headed by its last-PP TP0, and the ranks that copy its dumps. */
  layout: WorldLayout;
  /** How long a published dump job's ranks have to ack it (the ledger's timeout; default 10 s). */
  dumpAckTimeoutMs?: number;
  /** The loaded startup config; loaded from `startup` when absent (throws ConfigError). */
  initial?: StartupConfig;
  log?: Logger;
  /** Wall clock in ms, for the automatic-dump cooldown. */
  clock?: () => number;
  pid?: number;
  /** Hot reload: ms between stats (default 500) and between forced re-hashes (default 2000). */
  pollIntervalMs?: number;
  verifyIntervalMs?: number;
  /** The manual_dump watermark already served (a restarted coordinator that knows it). */
  manualDumpDone?: number;
  /** --artifact-mode: reports and dump JSON files (reports with token ids are 0600 regardless). */
  artifactModes?: ArtifactModes;
  /** report.save_sensitive_info "hashed": the key token ids are hashed with (default: an ephemeral one). */
  tokenHasher?: TokenHasher;
}

export class Guard implements CoordinatorPolicy {
  /** Each rank's flight recorder K (its Hello): incident reports list the flush a dump causes. */
  private readonly recorderRanks: RecorderRanks;
  private readonly opts: GuardOptions;
  private readonly log: Logger;
  /** Configs sent per replica, for `wavebus trace`'s coordinator track. */
  private readonly configHistory: ConfigHistory;
  private readonly clock: () => number;
  private readonly follower: ConfigFollower | null;
  private cfg: RuntimeConfig;
  private version = 1;
  private lane!: AgentConfig;
  /** Bumped when the detector settings change: each replica then restarts its detector state. */
  private detectorGen = 0;
  private readonly replicas: ReplicaState[];
  /** Row-form telemetry (tests, older clients) is turned into columns here. */
  private readonly rowColumns = new TelemetryColumnizer();
  /** Reports that name a recorder flush, for its verdict (report-verdicts.ts). */
  private readonly reportVerdicts = new ReportVerdicts();
  /** Per-step scratch, reused: hits of this wave head and the request each belongs to. */
  private readonly hits: Hit[] = [];
  private readonly hitStates: ReqState[] = [];
  private keepTail = false;
  /** The one dump ledger (the coordinator counts acks in it too). */
  readonly ledger: DumpLedger;
  /** What each incident does: quota, dump armed or refused, report (incident-actions.ts). */
  private readonly incidents: IncidentActions;
  private readonly startupIssues: StartupIssue[];
  /** Manual dumps asked for by `wavebus dump` (docs/control.md). */
  readonly manualArms = new ManualArms();
  /** Each rank's fingerprint (the coordinator stores them here): every report carries their diff. */
  readonly fingerprints: FingerprintBook;
  private readonly hasher: TokenHasher;
  /** rank_divergence: the ranks' digests compared, and the incidents they give (divergence.ts). */
  readonly divergence: DivergenceWatch;

  constructor(opts: GuardOptions) {
    this.opts = opts;
    this.log = opts.log ?? createLogger('guard');
    this.clock = opts.clock ?? Date.now;
    const initial = opts.initial ?? loadStartupConfig(opts.startup, this.log);
    this.cfg = initial.config;
    // Startup config errors never stop the job: they show in /healthz and as a metric.
    this.startupIssues = initial.issues ?? [];
    const startupErrors = counter('wavebus_runtime_config_startup_errors_total', 'Runtime config problems at startup (the job ran on), by source: overlay, file, write', ['source'] as const);
    for (const i of this.startupIssues) startupErrors.inc({ source: i.source });
    this.follower = opts.startup.hotReload
      ? new ConfigFollower(opts.startup.configPath, initial.config, {
          pollIntervalMs: opts.pollIntervalMs,
          verifyIntervalMs: opts.verifyIntervalMs,
          initialHash: initial.fileHash,
          log: this.log,
        })
      : null;
    this.keepTail = this.cfg.report.save_sensitive_info !== false;
    const { layout } = opts;
    this.replicas = Array.from({ length: layout.dp }, (_, r) => new ReplicaState(r, replicaHead(layout, r), opts.manualDumpDone ?? 0, this.cfg, 0));
    this.configHistory = new ConfigHistory(opts.artifactModes ?? DEFAULT_ARTIFACT_MODES, this.log);
    this.fingerprints = new FingerprintBook(layout);
    this.hasher = opts.tokenHasher ?? TokenHasher.ephemeral();
    this.recorderRanks = new RecorderRanks(layout.worldSize);
    this.divergence = new DivergenceWatch(layout, this.log);
    this.ledger = new DumpLedger({
      ackTimeoutMs: opts.dumpAckTimeoutMs, layout, log: this.log, modes: opts.artifactModes,
      recorderFlush: (job) => this.recorderRanks.listing(job.armWave, job.replica, job.ranks, layout) as Record<string, unknown> | undefined,
    });
    // Dumps a killed predecessor left without a manifest get one that says so.
    for (const o of findOrphanDumps(this.dumpRoot(), layout, this.log)) this.ledger.adopt(o.job, o.ppStages);
    this.incidents = new IncidentActions({
      layout, ledger: this.ledger, recorderRanks: this.recorderRanks, fingerprints: this.fingerprints, reportVerdicts: this.reportVerdicts,
      hasher: this.hasher, log: this.log, clock: this.clock, reportDir: opts.startup.reportDir, pid: opts.pid, artifactModes: opts.artifactModes,
      config: () => this.cfg, configVersion: () => this.version, dumpRoot: () => this.dumpRoot(),
    });
    this.refreshLane();
  }

  /** The effective config now in force. */
  config(): RuntimeConfig {
    return this.cfg;
  }

  dumpRoot(): string {
    return dumpRootOf(this.cfg, this.opts.startup);
  }

  private refreshLane(): void {
    // Ranks receive what they act on, with the dump root resolved.
    this.lane = agentConfig(this.cfg, { hotReload: this.opts.startup.hotReload, dumpRoot: this.dumpRoot() });
  }

  private pollConfig(): void {
    if (!this.follower) return;
    const r = this.follower.poll(this.clock());
    if (r.kind !== 'changed') return;
    const detectorsChanged = JSON.stringify(r.config.detector) !== JSON.stringify(this.cfg.detector);
    this.cfg = r.config;
    this.keepTail = this.cfg.report.save_sensitive_info !== false;
    this.version = r.version;
    this.refreshLane();
    // New windows/thresholds: detector state restarts (a new, zeroed slab under the same slots,
    // per replica at its next head); quotas (and muted detectors) stay.
    if (detectorsChanged) this.detectorGen++;
  }

  /** What this step keeps of the request's token ids (the report config in force). */
  private keepIds(): KeepIds {
    return { keepTail: this.keepTail, maxPromptTokenIds: this.cfg.report.max_prompt_token_ids, maxOutputTokenIds: this.cfg.report.max_output_token_ids };
  }

  /** A replica's state; a replica outside the layout is a caller's bug. */
  private replica(replica: number): ReplicaState {
    const r = this.replicas[replica];
    if (!r) throw new RangeError(`replica ${replica} is outside the layout's dp=${this.replicas.length}`);
    return r;
  }

  onWaveHead(replica: number, headWave: number, telemetry: StepTelemetry | null, vectorWave?: number): DueLanes {
    const rs = this.replica(replica);
    rs.lastWave = headWave;
    this.pollConfig();
    rs.syncDetectors(this.cfg, this.detectorGen);
    // Everything decided now is due in the vector published now: the arm wave (the coordinator's
    // streams say which; a guard driven without one decides at the default lookahead).
    const wave = vectorWave ?? headWave + decideAheadWaves(this.opts.layout.pp);
    const detectWave = headWave - 1;
    const dumps: DumpJob[] = [];
    const lanes: DueLanes = { dumps };
    // The first head of each replica carries the startup config; a new one goes to each replica at
    // its own next head. It applies at the end of `wave` on every rank, before that wave's copies,
    // so the dumps armed below already follow its dump.pp_stages (the ledger's stage schedule).
    if (rs.configSent !== this.version) {
      rs.configSent = this.version;
      lanes.config = { version: this.version, config: this.lane };
      this.ledger.configFrom(replica, wave, this.cfg.dump.pp_stages);
      this.configHistory.record(replica, wave, this.version, this.dumpRoot());
    }
    let freedNow: ReqState[] | null = null;
    if (telemetry) {
      const hits = this.hits;
      const hitStates = this.hitStates;
      hits.length = 0;
      hitStates.length = 0;
      const c: TelemetryColumns | null = telemetry.columns ?? (telemetry.requests ? this.rowColumns.columns(telemetry.requests) : null);
      if (c) freedNow = rs.pass.run(c, rs.requests, rs.detectors, this.keepIds(), hits, hitStates);
      if (c && this.cfg.detector.rank_divergence.enabled) this.divergence.noteRows(replica, Number(telemetry.wave ?? detectWave), c, rs.requests);
      const nonFinite = telemetry.nonFinite ?? [];
      if (rs.detectors.logitsFinite && nonFinite.length > 0) {
        const split = splitNonFinite(nonFinite);
        if (split.unattributed.length > 0) {
          rs.unattributedNonFinite += split.unattributed.length;
          if (rs.lastUnattributedLogWave !== wave) {
            rs.lastUnattributedLogWave = wave;
            this.log.warn({ dp_rank: replica, wave: detectWave, rows: split.unattributed.map((r) => r.row) }, 'non-finite logits in rows with no request; no report');
          }
        }
        for (const [reqId, hit] of split.byRequest) {
          const st = rs.requests.state(reqId);
          if ((st.muted & MUTE_BIT.logits_finite) !== 0) continue;
          hits.push({ type: 'logits_finite', detail: hit as unknown as Record<string, unknown> });
          hitStates.push(st);
        }
      }
      for (let k = 0; k < hits.length; k++) this.incidents.take(rs, hits[k], hitStates[k], detectWave, wave, dumps);
      hits.length = 0;
      hitStates.length = 0;
    }
    if (this.cfg.detector.rank_divergence.enabled) {
      for (const { hit, st } of this.divergence.take(replica, detectWave)) {
        // No request named (no column, or no telemetry of that wave): the report alone, no dump.
        const who = st ?? rs.requests.detached('');
        this.incidents.take(rs, { type: 'rank_divergence', detail: hit.detail }, who, hit.divergence.wave, wave, dumps);
      }
    }
    this.manualTrigger(rs, detectWave, wave, dumps);
    if (freedNow) {
      for (const st of freedNow) {
        for (const j of rs.window.freed(st.reqId, detectWave)) this.ledger.markFreedBeforeCopy(j.jobId, detectWave);
        rs.requests.forget(st);
      }
    }
    // The replica's telemetry of detectWave is in (or the engine sends none: nothing more can be
    // known): its jobs copied at its end or before are out of the window.
    for (const j of rs.window.closeThrough(detectWave)) this.ledger.windowClosed(j.jobId);
    return lanes;
  }

  /** The dump.manual_dump watermark and what `wavebus dump` asked of this replica, armed at its head (manual-arms.ts). */
  private manualTrigger(rs: ReplicaState, detectWave: number, wave: number, dumps: DumpJob[]): void {
    this.manualArms.atHead(rs, this.cfg.dump.manual_dump, wave, (wants, info) => {
      const running = [...rs.requests.reqs.values()].filter((st) => !st.finished && !st.freed && wants(st.reqId));
      this.log.info({ dp_rank: rs.replica, wave, ...info, requests: running.length }, 'manual dump');
      return manualDumpJobs(running, {
        armOne: (st) => this.incidents.armOne(rs, MANUAL_TRIGGER, st, detectWave, wave, dumps, info),
        refuseNone: () => this.ledger.refuse(this.dumpRoot(), { incidentType: MANUAL_TRIGGER, reqId: '', wave, replica: rs.replica, reason: 'no_dump_targets' }),
        count: (action) => this.incidents.count(MANUAL_TRIGGER, action),
      });
    });
  }

  /** rank_divergence: a last-PP rank's digests of the waves its engine decided (off: ignored). */
  onRankDecisions(rank: number, decisions: RankDecisionMsg[], ask: ColumnAsker): void {
    const cfg = this.cfg.detector.rank_divergence;
    if (!cfg.enabled) return;
    this.divergence.add(rank, decisions, cfg.grace_waves, ask);
  }

  onAgentHello(rank: number, hello: { recorderForwards: number }): void {
    this.recorderRanks.hello(rank, hello.recorderForwards);
  }

  status(): Record<string, unknown> {
    return {
      config_version: this.version,
      config_path: this.opts.startup.configPath,
      hot_reload: this.follower !== null,
      config_rejections: this.follower?.rejections ?? 0,
      config_error: this.follower?.lastError ?? null,
      startup_config_errors: this.startupIssues,
      // Replica 0's, and every replica's under `guard_replicas` (the automatic-dump quota is per replica).
      wave: this.replicas[0].lastWave,
      manual_dump: this.cfg.dump.manual_dump,
      manual_dump_done: Math.min(...this.replicas.map((r) => r.manualDone)),
      auto_dumps_used: this.replicas.reduce((n, r) => n + r.autoQuota.used, 0),
      auto_max_times: this.cfg.dump.auto_max_times,
      pp_stages: this.cfg.dump.pp_stages,
      incidents: this.incidents.counts,
      dumps: this.ledger.status(),
      guard_replicas: Object.fromEntries(this.replicas.map((r) => [String(r.replica), r.status()])),
      unattributed_non_finite: this.replicas.reduce((n, r) => n + r.unattributedNonFinite, 0),
      unbound_telemetry_rows: this.replicas.reduce((n, r) => n + r.pass.unboundRows, 0),
      tracked_requests: this.replicas.reduce((n, r) => n + r.requests.reqs.size, 0),
      rank_divergence: this.divergence.compare.status(),
      report_dir: this.opts.startup.reportDir,
      dump_dir: this.dumpRoot(),
    };
  }

  snapshotState(replica: number): { configVersion: number; config: AgentConfig; manualDumpDone: number } {
    return { configVersion: this.version, config: this.lane, manualDumpDone: this.replica(replica).manualDone };
  }

  /** A verdict on an incident's recorder flush (docs/verdict.md): into the incident report that names the flush. */
  onVerdict(v: ReportVerdict): string | undefined {
    return this.reportVerdicts.attach(v);
  }

  close(): void {
    this.configHistory.close();
    for (const r of this.replicas) {
      for (const j of r.window.drain()) this.ledger.windowClosed(j.jobId, true);
      r.requests.clear();
    }
    this.ledger.clear();
  }
}
