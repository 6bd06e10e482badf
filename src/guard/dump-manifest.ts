// What a dump's manifest.json says (the ledger, dump-ledger.ts, decides when to write it): each
// expected rank's ack sorted into completed / failed / skipped / missing, the stages and layers the
// dump holds, and why a dump whose ranks all copied is still not a good one.
import { MAX_RECORD_FORWARDS } from './recorder-config';
import { rankCoordinates, type PpStages, type WorldLayout } from '../layout';
import type { DumpJob, DumpResult, FileEntry } from '../messages';
import { kvRankDirFor, layoutJson } from '../paths';

/** dump_skipped reasons that mean a copy or write was attempted and failed. */
const FAILURE_REASONS = new Set(['d2h_failed', 'write_failed']);

export interface AckTally {
  completed: number[];
  missing: number[];
  failed: Record<string, string>;
  skipped: Record<string, string>;
  files: Record<string, FileEntry[]>;
  bytes: Record<string, number>;
}

/** Sort the acks of a job that expects `ranks` (acks keyed by global rank). */
export function tallyAcks(ranks: number[], acks: ReadonlyMap<number, DumpResult>): AckTally {
  const t: AckTally = { completed: [], missing: ranks.filter((r) => !acks.has(r)), failed: {}, skipped: {}, files: {}, bytes: {} };
  for (const rank of [...acks.keys()].sort((a, b) => a - b)) {
    const a = acks.get(rank)!;
    t.files[rank] = a.files.map((f) => ({ path: f.path, bytes: f.bytes, checksum: f.checksum }));
    t.bytes[rank] = a.bytes;
    // A refusal before any copy (its ack carries the detail in `error`) is a skip; a copy or
    // write that failed is a failure.
    if (a.skippedReason && !FAILURE_REASONS.has(a.skippedReason)) t.skipped[rank] = a.skippedReason;
    else if (a.error) t.failed[rank] = a.error;
    else if (a.skippedReason) t.skipped[rank] = a.skippedReason;
    else t.completed.push(rank);
  }
  return t;
}

/** Which dump a record is about: the same fields, in the same order, in request_info.json and manifest.json. */
export function jobFields(job: DumpJob): Record<string, unknown> {
  return {
    job_id: job.jobId,
    incident_type: job.incidentType,
    req_id: job.reqId,
    dp_rank: job.replica,
    detect_wave: job.detectWave,
    arm_wave: job.armWave,
  };
}

/** request_info.json and manifest.json carry the layout, so tools map a rank to its directory. */
export function layoutFields(layout?: WorldLayout): Record<string, unknown> {
  return layout ? { layout: layoutJson(layout) } : {};
}

export interface ManifestFacts {
  job: DumpJob;
  ppStages: PpStages;
  layout?: WorldLayout;
  acks: ReadonlyMap<number, DumpResult>;
  tally: AckTally;
  /** Every expected rank completed and nothing spoiled the dump. */
  complete: boolean;
  /** Why it is not complete although the ranks may have copied (freed_before_copy, ...). */
  incompleteReason?: string;
  freedWave?: number;
  timedOut: boolean;
  /** request_info.json could not be written (written after the job's publish: dump-ledger.ts). */
  requestInfoError?: string;
}

export function manifestJson(f: ManifestFacts): Record<string, unknown> {
  const { job, tally: m } = f;
  // Which pipeline stages and layers the dump holds: each rank that copied names its layers (a
  // rank that skipped or failed holds none; skipped_ranks / failed_ranks say why).
  const stages: Record<string, { ranks: number[]; layers: string[] }> = {};
  for (const [g, a] of [...f.acks.entries()].sort((x, y) => x[0] - y[0])) {
    if (!m.completed.includes(g)) continue;
    const pp = f.layout ? rankCoordinates(g, f.layout).ppRank : 0;
    const s = (stages[pp] ??= { ranks: [], layers: [] });
    s.ranks.push(g);
    for (const l of a.layers ?? []) if (!s.layers.includes(l)) s.layers.push(l);
  }
  return {
    ...jobFields(job),
    request_finished_at_dump: job.requestFinishedAtDump,
    pp_stages: f.ppStages,
    expected_ranks: job.ranks,
    ...layoutFields(f.layout),
    ...(f.layout ? { dirs: Object.fromEntries(job.ranks.map((g) => [g, kvRankDirFor(g, f.layout!)])) } : {}),
    completed_ranks: m.completed,
    missing_ranks: m.missing,
    failed_ranks: m.failed,
    skipped_ranks: m.skipped,
    stages,
    complete: f.complete,
    // Why every rank's copy is still not a good dump: the request's blocks were given back
    // before the copy wave ended (freed_wave), or that was never confirmed, or its record failed.
    ...(f.incompleteReason ? { incomplete_reason: f.incompleteReason, freed_wave: f.freedWave ?? null } : {}),
    ...(f.requestInfoError !== undefined ? { request_info_error: f.requestInfoError } : {}),
    timed_out: f.timedOut,
    files: m.files,
    bytes: m.bytes,
    ...recorderFlushFields(f.acks),
    ts: new Date().toISOString(),
  };
}

/**
 * `recorder_flush`: what each acking rank's flight recorder wrote at the dump's wave (the forwards
 * whole on disk, those left out, or why nothing); absent when no rank records. request_info.json
 * says what was wanted, this what is there.
 */
function recorderFlushFields(acks: ReadonlyMap<number, DumpResult>): Record<string, unknown> {
  const per: Record<string, unknown> = {};
  for (const [g, a] of [...acks.entries()].sort((x, y) => x[0] - y[0])) {
    const r = a.recorderFlush;
    if (!r) continue;
    // From the network: bounded by the ring's own limits before it goes into a file.
    const list = (xs: number[] | undefined) => (xs ?? []).slice(0, MAX_RECORD_FORWARDS);
    per[g] = { dir: r.dir.slice(0, 1024), forwards: list(r.forwards), left_out: list(r.leftOut), ...(r.error ? { error: r.error.slice(0, 1024) } : {}) };
  }
  return Object.keys(per).length ? { recorder_flush: per } : {};
}
