// What the guard does with one incident (a detector's hit on a request, at the head that found it):
// its quota decides whether it counts, then the config's actions: the request's KV dump armed for
// the arm wave (or refused with a dump_skipped.json that says why), and the incident report written
// (naming the dump and the recorder flush it causes). Every outcome is counted per type and action
// (`wavebus_incidents_total`). guard.ts finds the hits and calls take(); manual dumps use armOne().
import type { Counter } from 'prom-client';
import { DEFAULT_ARTIFACT_MODES, sensitiveModes, type ArtifactModes } from '../artifacts/artifact-mode';
import type { WorldLayout } from '../layout';
import type { Logger } from '../log';
import type { DumpJob } from '../messages';
import { counter } from '../metrics';
import { actionsFor, DetectorName, RuntimeConfig } from './config';
import type { Hit } from './detectors';
import { MUTE_BIT } from './detectors';
import type { DumpLedger } from './dump-ledger';
import type { FingerprintBook } from './fingerprint-diff';
import { incidentReport } from './incident-report';
import type { ArmOutcome } from './manual-arms';
import { admitIncident } from './quotas';
import type { RecorderFlushListing, RecorderRanks } from './recorder-listing';
import type { ReplicaState } from './replica-state';
import type { ReportVerdicts } from './report-verdicts';
import { writeReport } from './reports';
import type { ReqState } from './requests';
import type { TokenHasher } from './token-hash';

/** What the guard lends: its parts, and the config in force (read at each incident: hot reload changes it). */
export interface IncidentContext {
  layout: WorldLayout;
  ledger: DumpLedger;
  recorderRanks: RecorderRanks;
  fingerprints: FingerprintBook;
  reportVerdicts: ReportVerdicts;
  hasher: TokenHasher;
  log: Logger;
  clock: () => number;
  reportDir: string;
  pid?: number;
  artifactModes?: ArtifactModes;
  config: () => RuntimeConfig;
  configVersion: () => number;
  dumpRoot: () => string;
}

export class IncidentActions {
  /** Incidents by type and action, for the guard's status. */
  readonly counts: Record<string, Record<string, number>> = {};
  private readonly metric: Counter<'incident_type' | 'action'>;

  constructor(private readonly c: IncidentContext) {
    this.metric = counter('wavebus_incidents_total', 'Runtime guard incidents, by type and action taken', ['incident_type', 'action'] as const);
  }

  count(type: string, action: string): void {
    const m = this.counts[type] ?? (this.counts[type] = {});
    m[action] = (m[action] ?? 0) + 1;
    this.metric.inc({ incident_type: type, action });
  }

  /** Arm one request's dump or refuse it; a dump dir that cannot be made safely fails this dump alone, never the wave. */
  armOne(rs: ReplicaState, type: string, st: ReqState, detectWave: number, wave: number, dumps: DumpJob[], info: Record<string, unknown>): ArmOutcome {
    try {
      return this.armOrRefuse(rs, type, st, detectWave, wave, dumps, info);
    } catch (e) {
      this.c.log.error({ incident_type: type, req_id: st.reqId, wave, err: (e as Error).message, code: (e as { code?: string }).code }, 'dump not armed: cannot write its directory');
      return { failed: true };
    }
  }

  /** freed → finished_or_reaped; no blocks → empty_block_ids; else the job. */
  private armOrRefuse(rs: ReplicaState, type: string, st: ReqState, detectWave: number, wave: number, dumps: DumpJob[], info: Record<string, unknown>): { job?: DumpJob; skipped?: string; dir?: string } {
    const root = this.c.dumpRoot();
    const replica = rs.replica;
    if (st.freed) {
      return { skipped: 'finished_or_reaped', dir: this.c.ledger.refuse(root, { incidentType: type, reqId: st.reqId, wave, replica, reason: 'finished_or_reaped' }) };
    }
    if (st.blockIds.length === 0) {
      return { skipped: 'empty_block_ids', dir: this.c.ledger.refuse(root, { incidentType: type, reqId: st.reqId, wave, replica, reason: 'empty_block_ids' }) };
    }
    // The ranks that copy it are the ledger's to name: the stages in force at its copy wave.
    const job = this.c.ledger.arm(root, {
      incidentType: type,
      reqId: st.reqId,
      blockIds: st.blockIds,
      detectWave,
      armWave: wave,
      requestFinishedAtDump: st.finished,
      replica,
      copyWindow: true,
      info: {
        prompt_token_count: st.promptLen,
        output_token_count: st.outputTokens,
        format: this.c.config().dump.format,
        config_version: this.c.configVersion(),
        ...info,
      },
    });
    if (job) {
      dumps.push(job);
      rs.window.arm(job);
    }
    return job ? { job } : {};
  }

  /** One hit on request `st` found at the head of `wave`'s vector (its telemetry of `detectWave`). */
  take(rs: ReplicaState, hit: Hit, st: ReqState, detectWave: number, wave: number, dumps: DumpJob[]): void {
    const type: DetectorName = hit.type;
    const cfg = this.c.config();
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
    let recorderFlush: RecorderFlushListing | undefined;
    if (wantDump) {
      const taken = rs.autoQuota.tryTake(this.c.clock(), cfg.dump);
      if (!taken.ok) {
        skippedReason = 'quota_or_cooldown_blocked';
        dumpDir = this.c.ledger.refuse(this.c.dumpRoot(), {
          incidentType: type,
          reqId: st.reqId,
          wave,
          replica: rs.replica,
          reason: 'quota_or_cooldown_blocked',
          detail: { blocked_by: taken.reason, auto_dumps_used: rs.autoQuota.used, auto_max_times: cfg.dump.auto_max_times, auto_cooldown_seconds: cfg.dump.auto_cooldown_seconds },
        }).replace(/[/\\]dump_skipped\.json$/, '');
        this.count(type, 'dump_skipped');
      } else {
        const info = { detector_detail: hit.detail };
        const own = this.armOne(rs, type, st, detectWave, wave, dumps, info);
        if (own.job) {
          dumpArmWave = wave;
          dumpDir = own.job.dumpDir;
          finishedAtDump = own.job.requestFinishedAtDump;
          recorderFlush = this.c.recorderRanks.listing(wave, rs.replica, own.job.ranks, this.c.layout);
          this.count(type, 'dump_kv');
        } else if (own.failed) {
          this.count(type, 'dump_failed');
        } else if (own.dir) {
          skippedReason = own.skipped;
          dumpDir = own.dir.replace(/[/\\]dump_skipped\.json$/, '');
          this.count(type, 'dump_skipped');
        }
        if ((cfg.detector[type].dump_kv?.scope ?? 'request') === 'all_requests') {
          for (const other of rs.requests.reqs.values()) {
            if (other === st || other.finished || other.freed) continue;
            this.armOne(rs, type, other, detectWave, wave, dumps, { triggered_by_req_id: st.reqId });
          }
        }
      }
    }
    if (actions.includes('report')) {
      const report = incidentReport(cfg, rs, hit, st, detectWave, { attempted: wantDump, armWave: dumpArmWave, dir: dumpDir, finishedAtDump, skippedReason }, this.c.hasher);
      report.fingerprint_diff = this.c.fingerprints.diff();
      if (recorderFlush) report.recorder_flush = recorderFlush;
      try {
        // Token ids in it (save_sensitive_info): created owner-only, never readable by the group.
        const modes = this.c.artifactModes ?? DEFAULT_ARTIFACT_MODES;
        const reportModes = cfg.report.save_sensitive_info ? sensitiveModes(modes) : modes;
        const file = writeReport(this.c.reportDir, report, new Date(), this.c.pid, reportModes);
        this.c.reportVerdicts.remember(report, file, reportModes);
        this.count(type, 'report');
        this.c.log.warn({ incident_type: type, req_id: st.reqId, dp_rank: rs.replica, wave: detectWave, file }, 'runtime guard incident');
      } catch (e) {
        // A full disk must not take the coordinator down; the counter shows it.
        this.count(type, 'report_failed');
        this.c.log.error({ incident_type: type, req_id: st.reqId, err: (e as Error).message }, 'cannot write incident report');
      }
    }
  }
}
