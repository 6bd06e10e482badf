// What one admitted incident's report says (token ids only with save_sensitive_info, block ids only
// with include_block_ids): apart from guard.ts, which decides, arms and writes; reports.ts writes it.
import type { RuntimeConfig } from './config';
import type { Hit } from './detectors';
import type { ReplicaState } from './replica-state';
import type { IncidentReport } from './reports';
import type { ReqState } from './requests';
import { TokenHasher } from './token-hash';

/** What the incident's dump came to (guard.ts incident()). */
export interface ReportDump {
  attempted: boolean;
  armWave: number | null;
  dir: string | null;
  finishedAtDump: boolean;
  skippedReason?: string;
}

export function incidentReport(cfg: RuntimeConfig, rs: ReplicaState, hit: Hit, st: ReqState, detectWave: number, dump: ReportDump, hasher?: TokenHasher): IncidentReport {
  const type = hit.type;
  const detail: Record<string, unknown> = { ...hit.detail, prompt_token_count: st.promptLen, output_token_count: st.outputTokens };
  // "hashed": the same lists, each id a keyed hash (token-hash.ts), and how they were made.
  const sensitive = cfg.report.save_sensitive_info;
  const hashed = sensitive === 'hashed' ? (hasher ?? TokenHasher.ephemeral()) : undefined;
  const ids = (list: number[]): number[] | string[] => (hashed ? hashed.hashAll(list) : list);
  if (sensitive !== false && st.tail) {
    if (type === 'token_repeat') detail.recent_token_ids = ids(st.tail.slice(-32));
    detail.output_token_ids = cfg.report.max_output_token_ids > 0 ? ids(st.tail.slice(-cfg.report.max_output_token_ids)) : [];
  }
  if (sensitive !== false && st.prompt) detail.prompt_token_ids = ids(st.prompt.slice(0, cfg.report.max_prompt_token_ids));
  if (hashed && (st.tail || st.prompt)) detail.token_id_hash = hashed.scheme;
  const report: IncidentReport = {
    ts: new Date().toISOString(),
    incident_type: type,
    req_id: st.reqId,
    rank: rs.headRank,
    dp_rank: rs.replica,
    detect_wave: detectWave,
    dump_attempted: dump.attempted,
    dump_arm_wave: dump.armWave,
    dump_count: rs.autoQuota.used,
    dump_max_times: cfg.dump.auto_max_times,
    dump_dir: dump.dir,
    detail,
  };
  if (cfg.report.include_block_ids) report.block_ids = st.blockIds;
  if (dump.finishedAtDump) report.request_finished_at_dump = true;
  if (dump.skippedReason) (report as unknown as Record<string, unknown>).dump_skipped_reason = dump.skippedReason;
  return report;
}
