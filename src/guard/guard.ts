// The runtime guard as the coordinator's policy: at the head of wave N it runs the enabled
// detectors on the telemetry of wave N-1 (the detect wave), applies quotas, writes reports, arms
// dump jobs for wave N (copied at its end by every last-PP TP rank) and hands out a new effective
// config when the file changed (applied by every rank at the end of the same wave).
import type { Counter } from 'prom-client';
import { DEFAULT_ARTIFACT_MODES, sensitiveModes, type ArtifactModes } from '../artifacts/artifact-mode';
import type { CoordinatorPolicy, DueLanes } from '../bus/policy';
import { createLogger, Logger } from '../log';
import type { AgentConfig, DumpJob, DumpResult, StepTelemetry, TelemetryColumns } from '../messages';
import { counter } from '../metrics';
import { actionsFor, DetectorName, RuntimeConfig } from './config';
import { agentConfig } from './agent-config';
import { DetectorSet, Hit, MUTE_BIT, splitNonFinite } from './detectors';
import { DumpBook } from './dumps';
import type { WorldLayout } from '../launch/identity';
import { AutoDumpQuota, admitIncident } from './quotas';
import { ConfigFollower } from './reload';
import { RequestTable, type ReqState } from './requests';
import { StepPass, type KeepIds } from './step-pass';
import { IncidentReport, writeReport } from './reports';
import { TelemetryColumnizer } from '../client/telemetry';
import { dumpRootOf, loadStartupConfig, StartupConfig, StartupIssue, StartupOptions } from './startup';

export const MANUAL_TRIGGER = 'manual_trigger';

export interface GuardOptions {
  startup: StartupOptions;
  /** Global rank of TP0 of the last PP stage (the seed's report writer); goes into reports. */
  rank: number;
  /** Global ranks of the last PP stage: every one of them copies each dump job. */
  expectedRanks: number[];
  /** The job's layout, written into request_info.json and manifest.json (with each rank's dump dir name). */
  layout?: WorldLayout;
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
}

export class Guard implements CoordinatorPolicy {
  private readonly opts: GuardOptions;
  private readonly log: Logger;
  private readonly clock: () => number;
  private readonly follower: ConfigFollower | null;
  private cfg: RuntimeConfig;
  private version = 1;
  private lane!: AgentConfig;
  private configDue = true; // the first wave head carries the startup config
  private detectors: DetectorSet;
  private readonly requests = new RequestTable();
  private readonly pass = new StepPass();
  /** Row-form telemetry (tests, older clients) is turned into columns here. */
  private readonly rowColumns = new TelemetryColumnizer();
  /** Per-step scratch, reused: hits of this wave head and the request each belongs to. */
  private readonly hits: Hit[] = [];
  private readonly hitStates: ReqState[] = [];
  private keepTail = false;
  private manualDone: number;
  private readonly autoQuota = new AutoDumpQuota();
  private readonly dumps: DumpBook;
  private readonly incidents: Record<string, Record<string, number>> = {};
  private unattributedNonFinite = 0;
  private lastUnattributedLogWave = -1;
  private lastWave = -1;
  private readonly metric: Counter<'incident_type' | 'action'>;
  private readonly startupIssues: StartupIssue[];

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
    this.detectors = new DetectorSet(this.cfg);
    this.keepTail = this.cfg.report.save_sensitive_info;
    this.manualDone = opts.manualDumpDone ?? 0;
    this.dumps = new DumpBook(opts.expectedRanks, opts.rank, this.log, opts.artifactModes, opts.layout);
    this.metric = counter('wavebus_incidents_total', 'Runtime guard incidents, by type and action taken', ['incident_type', 'action'] as const);
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
    this.keepTail = this.cfg.report.save_sensitive_info;
    this.version = r.version;
    this.refreshLane();
    this.configDue = true;
    if (detectorsChanged) {
      // New windows/thresholds: detector state restarts (a new, zeroed slab under the same
      // slots); quotas (and muted detectors) stay.
      this.detectors = new DetectorSet(this.cfg);
    }
  }

  /** What this step keeps of the request's token ids (the report config in force). */
  private keepIds(): KeepIds {
    return { keepTail: this.keepTail, maxPromptTokenIds: this.cfg.report.max_prompt_token_ids, maxOutputTokenIds: this.cfg.report.max_output_token_ids };
  }

  onWaveHead(wave: number, telemetry: StepTelemetry | null): DueLanes {
    this.lastWave = wave;
    this.pollConfig();
    const detectWave = wave - 1;
    const dumps: DumpJob[] = [];
    let freedNow: ReqState[] | null = null;
    if (telemetry) {
      const hits = this.hits;
      const hitStates = this.hitStates;
      hits.length = 0;
      hitStates.length = 0;
      const c: TelemetryColumns | null = telemetry.columns ?? (telemetry.requests ? this.rowColumns.columns(telemetry.requests) : null);
      if (c) freedNow = this.pass.run(c, this.requests, this.detectors, this.keepIds(), hits, hitStates);
      const nonFinite = telemetry.nonFinite ?? [];
      if (this.detectors.logitsFinite && nonFinite.length > 0) {
        const split = splitNonFinite(nonFinite);
        if (split.unattributed.length > 0) {
          this.unattributedNonFinite += split.unattributed.length;
          if (this.lastUnattributedLogWave !== wave) {
            this.lastUnattributedLogWave = wave;
            this.log.warn({ wave: detectWave, rows: split.unattributed.map((r) => r.row) }, 'non-finite logits in rows with no request; no report');
          }
        }
        for (const [reqId, hit] of split.byRequest) {
          const st = this.requests.state(reqId);
          if ((st.muted & MUTE_BIT.logits_finite) !== 0) continue;
          hits.push({ type: 'logits_finite', detail: hit as unknown as Record<string, unknown> });
          hitStates.push(st);
        }
      }
      for (let k = 0; k < hits.length; k++) this.incident(hits[k], hitStates[k], wave, dumps);
      hits.length = 0;
      hitStates.length = 0;
    }
    this.manualTrigger(wave, dumps);
    if (freedNow) for (const st of freedNow) this.requests.forget(st);
    const lanes: DueLanes = { dumps };
    if (this.configDue) {
      this.configDue = false;
      lanes.config = { version: this.version, config: this.lane };
    }
    return lanes;
  }

  private count(type: string, action: string): void {
    const m = this.incidents[type] ?? (this.incidents[type] = {});
    m[action] = (m[action] ?? 0) + 1;
    this.metric.inc({ incident_type: type, action });
  }

  /** Arm one request's dump or refuse it (freed → finished_or_reaped; no blocks → empty_block_ids). */
  private armOne(type: string, st: ReqState, detectWave: number, wave: number, dumps: DumpJob[], info: Record<string, unknown>): { job?: DumpJob; skipped?: string; dir?: string } {
    const root = this.dumpRoot();
    if (st.freed) {
      return { skipped: 'finished_or_reaped', dir: this.dumps.refuse(root, { incidentType: type, reqId: st.reqId, wave, reason: 'finished_or_reaped' }) };
    }
    if (st.blockIds.length === 0) {
      return { skipped: 'empty_block_ids', dir: this.dumps.refuse(root, { incidentType: type, reqId: st.reqId, wave, reason: 'empty_block_ids' }) };
    }
    const job = this.dumps.arm(root, {
      incidentType: type,
      reqId: st.reqId,
      blockIds: st.blockIds,
      detectWave,
      armWave: wave,
      requestFinishedAtDump: st.finished,
      info: {
        prompt_token_count: st.promptLen,
        output_token_count: st.outputTokens,
        format: this.cfg.dump.format,
        config_version: this.version,
        ...info,
      },
    });
    if (job) dumps.push(job);
    return job ? { job } : {};
  }

  private incident(hit: Hit, st: ReqState, wave: number, dumps: DumpJob[]): void {
    const type: DetectorName = hit.type;
    const detectWave = wave - 1;
    const cfg = this.cfg;
    const quota = st.quota ?? (st.quota = new Map());
    let c = quota.get(type);
    if (!c) quota.set(type, (c = { count: 0, lastWave: 0 }));
    const adm = admitIncident(c, detectWave, cfg.report);
    if (!adm.ok) {
      this.count(type, `suppressed_${adm.reason}`);
      if (adm.reason === 'max_per_req') st.muted |= MUTE_BIT[type];
      return;
    }
    if (adm.capReached) st.muted |= MUTE_BIT[type]; // stop detection for it
    const actions = actionsFor(cfg, type);
    const wantDump = actions.includes('dump_kv');
    let dumpArmWave: number | null = null;
    let dumpDir: string | null = null;
    let skippedReason: string | undefined;
    let finishedAtDump = false;
    if (wantDump) {
      const taken = this.autoQuota.tryTake(this.clock(), cfg.dump);
      if (!taken.ok) {
        skippedReason = 'quota_or_cooldown_blocked';
        dumpDir = this.dumps.refuse(this.dumpRoot(), {
          incidentType: type,
          reqId: st.reqId,
          wave,
          reason: 'quota_or_cooldown_blocked',
          detail: { blocked_by: taken.reason, auto_dumps_used: this.autoQuota.used, auto_max_times: cfg.dump.auto_max_times, auto_cooldown_seconds: cfg.dump.auto_cooldown_seconds },
        }).replace(/[/\\]dump_skipped\.json$/, '');
        this.count(type, 'dump_skipped');
      } else {
        const info = { detector_detail: hit.detail };
        const own = this.armOne(type, st, detectWave, wave, dumps, info);
        if (own.job) {
          dumpArmWave = wave;
          dumpDir = own.job.dumpDir;
          finishedAtDump = own.job.requestFinishedAtDump;
          this.count(type, 'dump_kv');
        } else if (own.dir) {
          skippedReason = own.skipped;
          dumpDir = own.dir.replace(/[/\\]dump_skipped\.json$/, '');
          this.count(type, 'dump_skipped');
        }
        if ((cfg.detector[type].dump_kv?.scope ?? 'request') === 'all_requests') {
          for (const other of this.requests.reqs.values()) {
            if (other === st || other.finished || other.freed) continue;
            this.armOne(type, other, detectWave, wave, dumps, { triggered_by_req_id: st.reqId });
          }
        }
      }
    }
    if (actions.includes('report')) {
      const detail: Record<string, unknown> = { ...hit.detail, prompt_token_count: st.promptLen, output_token_count: st.outputTokens };
      if (cfg.report.save_sensitive_info && st.tail) {
        if (type === 'token_repeat') detail.recent_token_ids = st.tail.slice(-32);
        detail.output_token_ids = cfg.report.max_output_token_ids > 0 ? st.tail.slice(-cfg.report.max_output_token_ids) : [];
      }
      if (cfg.report.save_sensitive_info && st.prompt) detail.prompt_token_ids = st.prompt.slice(0, cfg.report.max_prompt_token_ids);
      const report: IncidentReport = {
        ts: new Date().toISOString(),
        incident_type: type,
        req_id: st.reqId,
        rank: this.opts.rank,
        detect_wave: detectWave,
        dump_attempted: wantDump,
        dump_arm_wave: dumpArmWave,
        dump_count: this.autoQuota.used,
        dump_max_times: cfg.dump.auto_max_times,
        dump_dir: dumpDir,
        detail,
      };
      if (cfg.report.include_block_ids) report.block_ids = st.blockIds;
      if (finishedAtDump) report.request_finished_at_dump = true;
      if (skippedReason) (report as unknown as Record<string, unknown>).dump_skipped_reason = skippedReason;
      try {
        // Token ids in it (save_sensitive_info): created owner-only, never readable by the group.
        const modes = this.opts.artifactModes ?? DEFAULT_ARTIFACT_MODES;
        const file = writeReport(this.opts.startup.reportDir, report, new Date(), this.opts.pid, cfg.report.save_sensitive_info ? sensitiveModes(modes) : modes);
        this.count(type, 'report');
        this.log.warn({ incident_type: type, req_id: st.reqId, wave: detectWave, file }, 'runtime guard incident');
      } catch (e) {
        // A full disk must not take the coordinator down; the counter shows it.
        this.count(type, 'report_failed');
        this.log.error({ incident_type: type, req_id: st.reqId, err: (e as Error).message }, 'cannot write incident report');
      }
    }
  }

  /** dump.manual_dump watermark: one manual dump of all running requests per wave while behind. */
  private manualTrigger(wave: number, dumps: DumpJob[]): void {
    if (this.cfg.dump.manual_dump <= this.manualDone) return;
    this.manualDone++;
    const running = [...this.requests.reqs.values()].filter((st) => !st.finished && !st.freed);
    this.log.info({ wave, manual_dump: this.cfg.dump.manual_dump, done: this.manualDone, requests: running.length }, 'manual dump');
    if (running.length === 0) {
      this.dumps.refuse(this.dumpRoot(), { incidentType: MANUAL_TRIGGER, reqId: '', wave, reason: 'no_dump_targets' });
      this.count(MANUAL_TRIGGER, 'dump_skipped');
      return;
    }
    for (const st of running) {
      const r = this.armOne(MANUAL_TRIGGER, st, wave - 1, wave, dumps, { manual_dump: this.manualDone });
      this.count(MANUAL_TRIGGER, r.job ? 'dump_kv' : r.dir ? 'dump_skipped' : 'duplicate');
    }
  }

  onDumpResult(result: DumpResult): void {
    try {
      this.dumps.onResult(result);
    } catch (e) {
      this.log.error({ job_id: result.jobId, err: (e as Error).message }, 'cannot record dump result');
    }
  }

  onDumpTimeout(jobId: string, missingRanks: number[]): void {
    try {
      this.dumps.onTimeout(jobId, missingRanks);
    } catch (e) {
      this.log.error({ job_id: jobId, err: (e as Error).message }, 'cannot record dump timeout');
    }
  }

  status(): Record<string, unknown> {
    return {
      config_version: this.version,
      config_path: this.opts.startup.configPath,
      hot_reload: this.follower !== null,
      config_rejections: this.follower?.rejections ?? 0,
      config_error: this.follower?.lastError ?? null,
      startup_config_errors: this.startupIssues,
      wave: this.lastWave,
      manual_dump: this.cfg.dump.manual_dump,
      manual_dump_done: this.manualDone,
      auto_dumps_used: this.autoQuota.used,
      auto_max_times: this.cfg.dump.auto_max_times,
      incidents: this.incidents,
      dumps: {
        armed: this.dumps.armed,
        completed: this.dumps.completed,
        incomplete: this.dumps.incomplete,
        pending: this.dumps.pending(),
        skipped: this.dumps.skipped,
        duplicates: this.dumps.duplicates,
        unknown_results: this.dumps.unknownResults,
      },
      unattributed_non_finite: this.unattributedNonFinite,
      unbound_telemetry_rows: this.pass.unboundRows,
      tracked_requests: this.requests.reqs.size,
      report_dir: this.opts.startup.reportDir,
      dump_dir: this.dumpRoot(),
    };
  }

  snapshotState(): { configVersion: number; config: AgentConfig; manualDumpDone: number } {
    return { configVersion: this.version, config: this.lane, manualDumpDone: this.manualDone };
  }

  close(): void {
    this.requests.clear();
  }
}
