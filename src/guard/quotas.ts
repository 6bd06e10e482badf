// Quotas (seed): reports per (incident type, request) and automatic dumps per job.
//  - report.max_per_req: a (type, req_id) gets at most this many incidents; reaching the cap also
//    stops that detector for that request. With a cap above 1, the k-th further incident needs a
//    gap of backoff_waves << (k − 1) waves after the previous one (64, 128, 256, ...).
//  - dump.auto_max_times: automatic (detector-triggered) dumps per job; 0 disables them.
//    dump.auto_cooldown_seconds must pass between two automatic dumps.
import type { RuntimeConfig } from './config';

export interface IncidentCount {
  count: number;
  lastWave: number;
}

export type Admission = { ok: true; capReached: boolean } | { ok: false; reason: 'max_per_req' | 'backoff'; waitUntilWave?: number };

/** Decide whether an incident of (type, req) at `wave` is admitted; updates `c` when it is. */
export function admitIncident(c: IncidentCount, wave: number, report: RuntimeConfig['report']): Admission {
  if (c.count >= report.max_per_req) return { ok: false, reason: 'max_per_req' };
  if (c.count >= 1) {
    const shift = Math.min(c.count - 1, 52); // beyond 2^52 waves nothing will ever be due
    const gap = report.backoff_waves * 2 ** shift;
    if (wave - c.lastWave < gap) return { ok: false, reason: 'backoff', waitUntilWave: c.lastWave + gap };
  }
  c.count++;
  c.lastWave = wave;
  return { ok: true, capReached: c.count >= report.max_per_req };
}

/** Automatic-dump budget of the job. */
export class AutoDumpQuota {
  used = 0;
  private lastAtMs = -Infinity;

  /** Take one automatic dump if the quota and the cooldown allow it. */
  tryTake(nowMs: number, dump: RuntimeConfig['dump']): { ok: true } | { ok: false; reason: 'quota' | 'cooldown' } {
    if (this.used >= dump.auto_max_times) return { ok: false, reason: 'quota' };
    if (nowMs - this.lastAtMs < dump.auto_cooldown_seconds * 1000) return { ok: false, reason: 'cooldown' };
    this.used++;
    this.lastAtMs = nowMs;
    return { ok: true };
  }
}
