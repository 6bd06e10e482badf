// Incident reports: one JSON file per incident, written atomically by the coordinator (the seed's
// last-PP TP0), at <report_dir>/<incident_type>/report_<YYYYmmdd_HHMMSS_mmm>[_<req_id>]_pid<pid>.json.
import * as fs from 'fs';
import * as path from 'path';
import { DEFAULT_ARTIFACT_MODES, type ArtifactModes } from '../artifacts/artifact-mode';
import { joinUnder, safeComponent } from '../artifacts/sanitize';
import { artifactWrite, writeJsonAtomic } from '../artifacts/atomic-write';
import type { FingerprintDiff } from './fingerprint-diff';
import type { RecorderFlushListing } from './recorder-listing';

/** Local time as YYYYmmdd_HHMMSS_mmm (the seed's report file stamp). */
export function reportStamp(d: Date): string {
  const p = (n: number, w = 2) => String(n).padStart(w, '0');
  return `${d.getFullYear()}${p(d.getMonth() + 1)}${p(d.getDate())}_${p(d.getHours())}${p(d.getMinutes())}${p(d.getSeconds())}_${p(d.getMilliseconds(), 3)}`;
}

export interface IncidentReport {
  ts: string;
  incident_type: string;
  req_id: string | null;
  rank: number;
  /** The DP replica whose request it is (its head rank is `rank`). */
  dp_rank: number;
  detect_wave: number;
  dump_attempted: boolean;
  dump_arm_wave: number | null;
  dump_count: number;
  dump_max_times: number;
  dump_dir: string | null;
  detail: Record<string, unknown>;
  block_ids?: number[];
  request_finished_at_dump?: boolean;
  /** What differs between ranks that should agree (fingerprint-diff.ts; docs/fingerprints.md). */
  fingerprint_diff?: FingerprintDiff;
  /** The flight recorder flush this incident's dump causes on its ranks (recorder-listing.ts; docs/recorder.md). */
  recorder_flush?: RecorderFlushListing;
}

/**
 * Write `report` under `reportDir`; returns the file path. Never overwrites an earlier report.
 * `modes`: the caller passes sensitiveModes(...) for a report holding token ids.
 */
export function writeReport(reportDir: string, report: IncidentReport, now: Date, pid: number = process.pid, modes: ArtifactModes = DEFAULT_ARTIFACT_MODES): string {
  // Request ids come from the engine over the wire: one safe, injective path component each.
  const dir = joinUnder(reportDir, safeComponent(report.incident_type, 'incident_type'));
  const stem = `report_${reportStamp(now)}${report.req_id ? `_${safeComponent(report.req_id, 'req_id')}` : ''}_pid${pid}`;
  let file = path.join(dir, `${stem}.json`);
  for (let k = 1; fs.existsSync(file); k++) file = path.join(dir, `${stem}_${k}.json`);
  writeJsonAtomic(file, report, artifactWrite(modes));
  return file;
}
