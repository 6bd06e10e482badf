// Dump jobs on the coordinator side: arming (request_info.json, dedupe per (arm wave, req_id)),
// refusals (dump_skipped.json), and completion tracking from the ranks' acks (manifest.json).
// Layout: <dump_root>/<incident_type>/<req_id>/wave_<arm_wave>/{request_info.json, manifest.json,
// dump_skipped.json, dp<d>_tp<t>_pp<p>_cp<c>/...}; the coordinator writes the JSON files, each rank
// its own dp*_tp*_pp*_cp*/ (the seed's names; manifest `dirs` maps global rank → directory).
import * as path from 'path';
import type { Logger } from '../log';
import type { DumpJob, DumpResult, FileEntry } from '../messages';
import { SkipReason, writeDumpSkipped } from '../artifacts/freespace';
import { DEFAULT_ARTIFACT_MODES, type ArtifactModes } from '../artifacts/artifact-mode';
import { joinUnder, safeComponent } from '../artifacts/sanitize';
import { artifactWrite, writeJsonAtomic } from '../artifacts/atomic-write';
import type { WorldLayout } from '../launch/identity';
import { kvRankDirFor, layoutJson } from '../paths';

export type { SkipReason };

export function waveDir(dumpRoot: string, incidentType: string, reqId: string, wave: number): string {
  return joinUnder(dumpRoot, safeComponent(incidentType, 'incident_type'), safeComponent(reqId, 'req_id'), `wave_${wave}`);
}

export function jobIdOf(armWave: number, incidentType: string, reqId: string): string {
  return `${armWave}/${incidentType}/${reqId}`;
}

export interface ArmSpec {
  incidentType: string;
  reqId: string;
  blockIds: number[];
  detectWave: number;
  armWave: number;
  requestFinishedAtDump: boolean;
  /** Report-like metadata merged into request_info.json. */
  info: Record<string, unknown>;
}

interface RankAck {
  files: FileEntry[];
  bytes: number;
  error: string;
  skippedReason: string;
}

interface TrackedJob {
  job: DumpJob;
  acks: Map<number, RankAck>;
  timedOut: boolean;
  finished: boolean;
  ok: boolean;
}

const MAX_TRACKED_JOBS = 4096;
/** dump_skipped reasons that mean a copy or write was attempted and failed. */
const FAILURE_REASONS = new Set(['d2h_failed', 'write_failed']);

export class DumpBook {
  private readonly jobs = new Map<string, TrackedJob>();
  private readonly armedAt = new Map<number, Set<string>>(); // arm wave → req ids
  armed = 0;
  completed = 0; // jobs every expected rank acked without error
  incomplete = 0; // jobs that finished (all acked or timed out) with a missing, failed or skipped rank
  skipped: Record<string, number> = {};
  duplicates = 0;
  unknownResults = 0;

  constructor(
    private readonly expectedRanks: readonly number[],
    private readonly coordinatorRank: number,
    private readonly log?: Pick<Logger, 'info' | 'warn'>,
    /** Modes of request_info.json, manifest.json, dump_skipped.json and the folders made for them. */
    private readonly modes: ArtifactModes = DEFAULT_ARTIFACT_MODES,
    /** The job's layout: request_info.json and manifest.json carry it, and each rank's directory name. */
    private readonly layout?: WorldLayout,
  ) {}

  private layoutJson(): Record<string, unknown> {
    return this.layout ? { layout: layoutJson(this.layout) } : {};
  }

  /** Arm one job: dedupe, write request_info.json, track. Returns null for a duplicate. */
  arm(dumpRoot: string, spec: ArmSpec): DumpJob | null {
    let seen = this.armedAt.get(spec.armWave);
    if (!seen) {
      for (const w of this.armedAt.keys()) if (w < spec.armWave - 4) this.armedAt.delete(w);
      this.armedAt.set(spec.armWave, (seen = new Set()));
    }
    if (seen.has(spec.reqId)) {
      this.duplicates++;
      this.log?.info({ wave: spec.armWave, req_id: spec.reqId, incident_type: spec.incidentType }, 'dump already armed for this request in this wave');
      return null;
    }
    seen.add(spec.reqId);
    const dir = waveDir(dumpRoot, spec.incidentType, spec.reqId, spec.armWave);
    const job: DumpJob = {
      incidentType: spec.incidentType,
      reqId: spec.reqId,
      blockIds: spec.blockIds,
      detectWave: spec.detectWave,
      armWave: spec.armWave,
      dumpDir: dir,
      requestFinishedAtDump: spec.requestFinishedAtDump,
      jobId: jobIdOf(spec.armWave, spec.incidentType, spec.reqId),
    };
    writeJsonAtomic(path.join(dir, 'request_info.json'), {
      job_id: job.jobId,
      incident_type: job.incidentType,
      req_id: job.reqId,
      detect_wave: job.detectWave,
      arm_wave: job.armWave,
      block_ids: job.blockIds,
      num_blocks: job.blockIds.length,
      request_finished_at_dump: job.requestFinishedAtDump,
      rank: this.coordinatorRank,
      expected_ranks: [...this.expectedRanks],
      ...this.layoutJson(),
      ts: new Date().toISOString(),
      ...spec.info,
    }, artifactWrite(this.modes));
    this.jobs.set(job.jobId, { job, acks: new Map(), timedOut: false, finished: false, ok: false });
    if (this.jobs.size > MAX_TRACKED_JOBS) this.jobs.delete(this.jobs.keys().next().value as string);
    this.armed++;
    return job;
  }

  /** Refuse a dump at arm time: dump_skipped.json in the wave dir it would have had. */
  refuse(dumpRoot: string, s: { incidentType: string; reqId: string; wave: number; reason: SkipReason; detail?: Record<string, unknown> }): string {
    this.skipped[s.reason] = (this.skipped[s.reason] ?? 0) + 1;
    const dir = s.reqId ? waveDir(dumpRoot, s.incidentType, s.reqId, s.wave) : joinUnder(dumpRoot, safeComponent(s.incidentType, 'incident_type'), `wave_${s.wave}`);
    return writeDumpSkipped(dir, { reason: s.reason, req_id: s.reqId, incident_type: s.incidentType, stage: 'arm', rank: this.coordinatorRank, wave: s.wave, detail: s.detail }, this.modes);
  }

  onResult(r: DumpResult): void {
    const t = this.jobs.get(r.jobId);
    if (!t) {
      this.unknownResults++;
      this.log?.warn({ job_id: r.jobId, rank: r.globalRank }, 'dump result for a job this coordinator does not track');
      return;
    }
    if (!this.expectedRanks.includes(r.globalRank)) {
      this.unknownResults++;
      this.log?.warn({ job_id: r.jobId, rank: r.globalRank }, 'dump result from a rank that is not a last-PP rank');
      return;
    }
    t.acks.set(r.globalRank, { files: r.files, bytes: r.bytes, error: r.error, skippedReason: r.skippedReason });
    if (t.acks.size === this.expectedRanks.length || t.timedOut) this.finish(t);
  }

  onTimeout(jobId: string, _missing: number[]): void {
    const t = this.jobs.get(jobId);
    if (!t) {
      this.unknownResults++;
      return;
    }
    t.timedOut = true;
    this.finish(t);
  }

  private finish(t: TrackedJob): void {
    const completed: number[] = [];
    const failed: Record<string, string> = {};
    const skipped: Record<string, string> = {};
    const files: Record<string, FileEntry[]> = {};
    const bytes: Record<string, number> = {};
    for (const rank of [...t.acks.keys()].sort((a, b) => a - b)) {
      const a = t.acks.get(rank)!;
      files[rank] = a.files.map((f) => ({ path: f.path, bytes: f.bytes, checksum: f.checksum }));
      bytes[rank] = a.bytes;
      // A refusal before any copy (its ack carries the detail in `error`) is a skip; a copy or
      // write that failed is a failure.
      if (a.skippedReason && !FAILURE_REASONS.has(a.skippedReason)) skipped[rank] = a.skippedReason;
      else if (a.error) failed[rank] = a.error;
      else if (a.skippedReason) skipped[rank] = a.skippedReason;
      else completed.push(rank);
    }
    const missing = this.expectedRanks.filter((r) => !t.acks.has(r));
    const ok = completed.length === this.expectedRanks.length;
    if (!t.finished) {
      t.finished = true;
      if (ok) this.completed++;
      else this.incomplete++;
    } else if (ok && !t.ok) {
      // a late ack completed a job that had timed out
      this.incomplete--;
      this.completed++;
    }
    t.ok = ok;
    writeJsonAtomic(path.join(t.job.dumpDir, 'manifest.json'), {
      job_id: t.job.jobId,
      incident_type: t.job.incidentType,
      req_id: t.job.reqId,
      detect_wave: t.job.detectWave,
      arm_wave: t.job.armWave,
      request_finished_at_dump: t.job.requestFinishedAtDump,
      expected_ranks: [...this.expectedRanks],
      ...this.layoutJson(),
      ...(this.layout ? { dirs: Object.fromEntries(this.expectedRanks.map((g) => [g, kvRankDirFor(g, this.layout!)])) } : {}),
      completed_ranks: completed,
      missing_ranks: missing,
      failed_ranks: failed,
      skipped_ranks: skipped,
      complete: ok,
      timed_out: t.timedOut,
      files,
      bytes,
      ts: new Date().toISOString(),
    }, artifactWrite(this.modes));
    if (!ok) this.log?.warn({ job_id: t.job.jobId, missing, failed, skipped }, 'dump job incomplete');
  }

  /** Jobs waiting for acks (armed, not finished). */
  pending(): number {
    let n = 0;
    for (const t of this.jobs.values()) if (!t.finished) n++;
    return n;
  }
}
