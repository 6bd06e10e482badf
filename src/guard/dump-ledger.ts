// The one dump ledger: every dump job from arming to its manifest. It owns, per job, the replica
// that owns the request, the ranks expected to copy it, their acks, the ack timeout, completion,
// and request_info.json / manifest.json / dump_skipped.json. The guard arms and refuses through
// it; the coordinator hands it what it publishes and every ack, and asks it for a replica's
// pending lanes (snapshots) and for status. One object serves both, so an ack is counted once.
// Layout: <dump_root>/<incident_type>/<req_id>/wave_<arm_wave>[_dp<replica>]/{request_info.json,
// manifest.json, dump_skipped.json, dp<d>_tp<t>_pp<p>_cp<c>/...}; the coordinator writes the JSON, each
// rank its own directory (the seed's names; the manifest's `dirs` maps global rank to directory).
// Which stages copy a job is the ledger's too (stagesAt): those of the config in force at the job's
// copy wave, per replica, as the stream hands configs out (configFrom).
// Order: arm makes the wave dir (so an agent's copy finds it, and a failure fails the arm before
// anything is published) and defers request_info.json (request-info.ts); the coordinator publishes
// the vector and lanes, then `published` writes it. A manifest is never written before its job's
// request_info.json; a failed one makes the manifest say so (dump-manifest.ts builds it).
import * as fs from 'fs';
import * as path from 'path';
import type { Logger } from '../log';
import type { DumpJob, DumpLane, DumpResult } from '../messages';
import { SkipReason, writeDumpSkipped } from '../artifacts/freespace';
import { DEFAULT_ARTIFACT_MODES, type ArtifactModes } from '../artifacts/artifact-mode';
import { artifactWrite, writeJsonAtomic } from '../artifacts/atomic-write';
import { fsFailure } from '../artifacts/sink';
import { mkdirTrustedSync } from '../artifacts/safe-mkdir';
import { StageSchedule } from './stage-schedule';
import { manifestJson, tallyAcks } from './dump-manifest';
import { RequestInfoWriter, requestInfoJson } from './request-info';
import { FinishedJobs } from './finished-jobs';
import { incidentWaveDir, jobIdOf, waveDir } from './dump-names';
import { replicaDumpRanks, replicaHead, type PpStages, type WorldLayout } from '../layout';

export type { SkipReason };

export interface ArmSpec {
  incidentType: string;
  reqId: string;
  blockIds: number[];
  detectWave: number;
  armWave: number;
  requestFinishedAtDump: boolean;
  replica: number;
  /** Report-like metadata merged into request_info.json. */
  info: Record<string, unknown>;
  /**
   * The guard follows the job's copy window (copy-window.ts): a fully acked job's manifest waits
   * for windowClosed. Default false: the manifest is written when every rank acked.
   */
  copyWindow?: boolean;
}

export interface LedgerEvents {
  /** Every expected rank acked (ok or not). */
  complete?(job: DumpJob, results: DumpResult[]): void;
  timedOut?(job: DumpJob, missing: number[]): void;
}

export interface LedgerOptions {
  /** How long a published job's ranks have to ack it (default 10 s). */
  ackTimeoutMs?: number;
  /** Without a layout: the `rank` the JSON files name (default 0). */
  writerRank?: number;
  /** The job's layout: with dp > 1 dump dirs and job ids carry the replica; manifests name each rank's stage. */
  layout?: WorldLayout;
  log?: Pick<Logger, 'info' | 'warn' | 'error'>;
  /** Modes of request_info.json, manifest.json, dump_skipped.json and the folders made for them. */
  modes?: ArtifactModes;
  /** What request_info.json says of the incident's flight recorder flush (recorder-listing.ts), from the job's ranks. */
  recorderFlush?: (job: DumpJob) => Record<string, unknown> | undefined;
}

interface Entry {
  job: DumpJob;
  /** Armed here (its wave dir made, request_info.json written or due): a manifest is written when it finishes. */
  recorded: boolean;
  ppStages: PpStages;
  acks: Map<number, DumpResult>;
  /** Writing request_info.json failed: why (the manifest says so, never complete). */
  infoError?: string;
  /** Published at this wave; undefined while armed and not yet published. */
  wave?: number;
  timer?: NodeJS.Timeout;
  timedOut: boolean;
  finished: boolean;
  ok: boolean;
  /** Its copy window (copy-window.ts) is open: a complete set of acks waits for it to close. */
  windowOpen: boolean;
  /** Acked by every rank while the window was open. */
  held: boolean;
  /** The request was reported freed in this wave, not after the copy wave: `freed_before_copy`. */
  freedWave?: number;
  /** The window never closed (the guard stopped first): not confirmed. */
  unconfirmed?: boolean;
  /** Armed by an earlier coordinator that stopped before it finished (orphan-dumps.ts): never complete. */
  restarted?: boolean;
}

const MAX_TRACKED_JOBS = 4096;
/**
 * Finished jobs kept after their manifest is written (finished-jobs.ts), newest first out last: the
 * complete ones (nothing can change them) and the incomplete ones (a late ack may still complete
 * one). An ack of an older one is counted as unknown_results.
 */
export const MAX_COMPLETE_JOBS_KEPT = 64;
export const MAX_INCOMPLETE_JOBS_KEPT = 256;

export type AckOutcome = 'counted' | 'late' | 'unknown_job' | 'not_expected';

export class DumpLedger {
  private readonly jobs = new Map<string, Entry>();
  private readonly armedAt = new Map<string, Set<string>>(); // "<replica>/<arm wave>" → req ids
  private readonly stages = new StageSchedule();
  private readonly ackTimeoutMs: number;
  private readonly modes: ArtifactModes;
  private events: LedgerEvents = {};
  private readonly info: RequestInfoWriter;
  armed = 0;
  completed = 0; // jobs every expected rank acked without error
  private readonly finishedKept = new FinishedJobs(
    { complete: MAX_COMPLETE_JOBS_KEPT, incomplete: MAX_INCOMPLETE_JOBS_KEPT },
    {
      kindOf: (id) => {
        const e = this.jobs.get(id);
        return e?.finished && !e.windowOpen ? (e.ok ? 'complete' : 'incomplete') : undefined;
      },
      drop: (id) => {
        clearTimeout(this.jobs.get(id)?.timer);
        this.jobs.delete(id);
      },
    },
  );
  incomplete = 0; // jobs that finished (all acked or timed out) with a missing, failed or skipped rank
  skipped: Record<string, number> = {};
  duplicates = 0;
  unknownResults = 0;
  /** Jobs whose request was freed before its copy wave ended (reported, never complete). */
  freedBeforeCopy = 0;
  /** Unfinished jobs of an earlier coordinator found at startup (manifest: coordinator_restarted). */
  adopted = 0;

  constructor(private readonly opts: LedgerOptions = {}) {
    this.ackTimeoutMs = opts.ackTimeoutMs ?? 10000;
    this.modes = opts.modes ?? DEFAULT_ARTIFACT_MODES;
    this.info = new RequestInfoWriter(this.modes, (jobId, error) => {
      const e = this.jobs.get(jobId);
      if (e) e.infoError = error;
    }, opts.log);
  }

  /** The coordinator's hooks (metrics, events, its policy's notices). */
  listen(events: LedgerEvents): void {
    this.events = events;
  }

  /** The JSON files' `rank`: the replica's head (its last-PP TP0, the seed's writer) when the layout is known. */
  private writerOf(replica: number): number {
    return this.opts.layout ? replicaHead(this.opts.layout, replica) : (this.opts.writerRank ?? 0);
  }

  private tag(replica: number): number | undefined {
    return (this.opts.layout?.dp ?? 1) > 1 ? replica : undefined;
  }

  /** The config a replica's ranks apply at `applyWave` has pp_stages `stages` (the stream tells). */
  configFrom(replica: number, applyWave: number, stages: PpStages): void {
    this.stages.configFrom(replica, applyWave, stages);
  }

  /** The stages that copy a dump of `replica` at the end of `wave` (stage-schedule.ts). */
  stagesAt(replica: number, wave: number): PpStages {
    return this.stages.stagesAt(replica, wave);
  }

  /** The ranks that copy a dump of `replica` at `wave`: its dump ranks under the stages in force then. */
  private ranksFor(replica: number, stages: PpStages): number[] {
    return this.opts.layout ? replicaDumpRanks(this.opts.layout, replica, stages) : [this.opts.writerRank ?? 0];
  }

  /**
   * Arm one job: dedupe per (replica, arm wave, req_id), name the ranks that copy it (stagesAt its
   * arm wave), make its wave dir (throws if it cannot), track. request_info.json is written by
   * `published` (after the coordinator's publish), else on the next turn or at clear(). Null for a duplicate.
   */
  arm(dumpRoot: string, spec: ArmSpec): DumpJob | null {
    const key = `${spec.replica}/${spec.armWave}`;
    let seen = this.armedAt.get(key);
    if (!seen) {
      if (this.armedAt.size > 64) this.armedAt.delete(this.armedAt.keys().next().value as string);
      this.armedAt.set(key, (seen = new Set()));
    }
    if (seen.has(spec.reqId)) {
      this.duplicates++;
      this.opts.log?.info({ wave: spec.armWave, req_id: spec.reqId, dp_rank: spec.replica, incident_type: spec.incidentType }, 'dump already armed for this request in this wave');
      return null;
    }
    seen.add(spec.reqId);
    const ppStages = this.stagesAt(spec.replica, spec.armWave);
    const tag = this.tag(spec.replica);
    const dir = waveDir(dumpRoot, spec.incidentType, spec.reqId, spec.armWave, tag);
    const job: DumpJob = {
      incidentType: spec.incidentType,
      reqId: spec.reqId,
      blockIds: spec.blockIds,
      detectWave: spec.detectWave,
      armWave: spec.armWave,
      dumpDir: dir,
      requestFinishedAtDump: spec.requestFinishedAtDump,
      jobId: jobIdOf(spec.armWave, spec.incidentType, spec.reqId, tag),
      replica: spec.replica,
      ranks: this.ranksFor(spec.replica, ppStages),
    };
    try {
      mkdirTrustedSync(dir, this.modes.dir, 'dump directory');
    } catch (e) {
      throw fsFailure('mkdir', dir, e);
    }
    this.add({ job, recorded: true, ppStages, acks: new Map(), timedOut: false, finished: false, ok: false, windowOpen: spec.copyWindow ?? false, held: false });
    const recorder = this.opts.recorderFlush?.(job);
    this.info.defer(job.jobId, dir, requestInfoJson(job, ppStages, this.writerOf(spec.replica), this.opts.layout, recorder ? { ...spec.info, recorder_flush: recorder } : spec.info));
    this.armed++;
    return job;
  }

  /**
   * A job an earlier coordinator armed and never finished: its manifest is written now (nothing
   * acked to this coordinator yet) and rewritten by each ack that still reaches this one.
   */
  adopt(job: DumpJob, ppStages: PpStages): void {
    if (this.jobs.has(job.jobId)) return;
    const e: Entry = { job, recorded: true, ppStages, acks: new Map(), timedOut: false, finished: false, ok: false, windowOpen: false, held: false, restarted: true };
    this.add(e);
    this.adopted++;
    this.finish(e);
  }

  /** Refuse a dump at arm time: dump_skipped.json in the wave dir it would have had. */
  refuse(dumpRoot: string, s: { incidentType: string; reqId: string; wave: number; replica: number; reason: SkipReason; detail?: Record<string, unknown> }): string {
    this.skipped[s.reason] = (this.skipped[s.reason] ?? 0) + 1;
    const tag = this.tag(s.replica);
    const dir = s.reqId ? waveDir(dumpRoot, s.incidentType, s.reqId, s.wave, tag) : incidentWaveDir(dumpRoot, s.incidentType, s.wave, tag);
    return writeDumpSkipped(dir, { reason: s.reason, req_id: s.reqId, incident_type: s.incidentType, stage: 'arm', rank: this.writerOf(s.replica), dp_rank: s.replica, wave: s.wave, detail: s.detail }, this.modes);
  }

  /**
   * The coordinator published these jobs at `wave` of their replica's stream: their ack timeout
   * starts now, then their request_info.json is written (the vector is out already). A job not
   * armed here (queued on the coordinator directly) is tracked without files.
   */
  published(wave: number, jobs: DumpJob[]): void {
    for (const job of jobs) {
      let e = this.jobs.get(job.jobId);
      if (!e || e.finished) {
        if (e) clearTimeout(e.timer);
        e = { job, recorded: false, ppStages: this.stagesAt(job.replica ?? 0, wave), acks: new Map(), timedOut: false, finished: false, ok: false, windowOpen: false, held: false };
        this.add(e);
      }
      const entry = e;
      entry.wave = wave;
      if (entry.timer) clearTimeout(entry.timer);
      entry.timer = setTimeout(() => this.timeout(entry), this.ackTimeoutMs);
      entry.timer.unref();
    }
    for (const job of jobs) this.info.write(job.jobId);
  }

  private add(e: Entry): void {
    this.jobs.set(e.job.jobId, e);
    if (this.jobs.size > MAX_TRACKED_JOBS) {
      const oldest = this.jobs.values().next().value as Entry;
      clearTimeout(oldest.timer);
      this.info.write(oldest.job.jobId);
      this.jobs.delete(oldest.job.jobId);
    }
  }

  /**
   * Count one rank's ack. 'late': after the job timed out (its manifest is rewritten);
   * 'not_expected': a rank the job does not name (refused, counted); 'unknown_job': no such job.
   */
  ack(r: DumpResult): AckOutcome {
    const e = this.jobs.get(r.jobId);
    if (!e) {
      this.unknownResults++;
      this.opts.log?.warn({ job_id: r.jobId, rank: r.globalRank }, 'dump result for a job this coordinator does not track');
      return 'unknown_job';
    }
    if (!e.job.ranks.includes(r.globalRank)) {
      this.unknownResults++;
      this.opts.log?.warn({ job_id: r.jobId, rank: r.globalRank, expected: e.job.ranks }, 'dump result from a rank the job does not expect');
      return 'not_expected';
    }
    const late = e.timedOut;
    e.acks.set(r.globalRank, r);
    if (e.acks.size === e.job.ranks.length && e.windowOpen && !e.timedOut) {
      // Every copy is in, but the request may still be freed before the copy wave's end is seen.
      e.held = true;
      clearTimeout(e.timer);
    } else if (e.acks.size === e.job.ranks.length || e.timedOut || e.restarted) this.finish(e);
    return late ? 'late' : 'counted';
  }

  /** The request of `jobId` was reported freed in `wave`, at or before its copy wave. */
  markFreedBeforeCopy(jobId: string, wave: number): void {
    const e = this.jobs.get(jobId);
    if (!e || e.freedWave !== undefined) return;
    e.freedWave = wave;
    this.freedBeforeCopy++;
    this.opts.log?.warn({ job_id: jobId, dp_rank: e.job.replica, freed_wave: wave, arm_wave: e.job.armWave }, 'request freed before its dump was copied: the dump is marked freed_before_copy');
    if (e.finished) this.finish(e); // a timed-out job's manifest is rewritten with the reason
  }

  /** The copy window of `jobId` closed (`unconfirmed`: the guard stopped before it could). */
  windowClosed(jobId: string, unconfirmed = false): void {
    const e = this.jobs.get(jobId);
    if (!e || !e.windowOpen) return;
    e.windowOpen = false;
    e.unconfirmed = unconfirmed;
    if (e.held) this.finish(e);
    // Finished while its window was open (timed out): it can be let go now, in its turn.
    else if (e.finished) this.finishedKept.finished(jobId, e.ok ? 'complete' : 'incomplete');
  }

  private timeout(e: Entry): void {
    if (e.finished) return;
    e.timedOut = true;
    const missing = e.job.ranks.filter((r) => !e.acks.has(r));
    this.finish(e);
    this.events.timedOut?.(e.job, missing);
  }

  private finish(e: Entry): void {
    clearTimeout(e.timer);
    this.info.write(e.job.jobId); // nothing looks finished without its request_info.json
    const tally = tallyAcks(e.job.ranks, e.acks);
    const spoiled = e.freedWave !== undefined ? 'freed_before_copy' : e.restarted ? 'coordinator_restarted' : e.unconfirmed ? 'copy_window_unconfirmed' : e.infoError !== undefined ? 'request_info_failed' : undefined;
    const ok = tally.completed.length === e.job.ranks.length && spoiled === undefined;
    const first = !e.finished;
    if (first) {
      e.finished = true;
      if (ok) this.completed++;
      else this.incomplete++;
    } else if (ok && !e.ok) {
      // a late ack completed a job that had timed out
      this.incomplete--;
      this.completed++;
    } else if (!ok && e.ok) {
      // marked freed_before_copy after it finished
      this.completed--;
      this.incomplete++;
    }
    const changed = first || ok !== e.ok;
    e.ok = ok;
    if (e.recorded) {
      const m = manifestJson({ job: e.job, ppStages: e.ppStages, layout: this.opts.layout, acks: e.acks, tally, complete: ok, incompleteReason: spoiled, freedWave: e.freedWave, timedOut: e.timedOut, requestInfoError: e.infoError });
      writeJsonAtomic(path.join(e.job.dumpDir, 'manifest.json'), m, artifactWrite(this.modes));
    }
    const { missing, failed, skipped } = tally;
    if (!ok && first) this.opts.log?.warn({ job_id: e.job.jobId, dp_rank: e.job.replica, missing, failed, skipped }, 'dump job incomplete');
    if (first && !e.timedOut && !e.restarted) this.events.complete?.(e.job, [...e.acks.values()]);
    if (changed) this.finishedKept.finished(e.job.jobId, ok ? 'complete' : 'incomplete');
  }

  /** Jobs of `replica` (all replicas when undefined) published and waiting for acks. */
  pendingIds(replica?: number): string[] {
    const out: string[] = [];
    for (const e of this.jobs.values()) if (this.isPending(e) && (replica === undefined || e.job.replica === replica)) out.push(e.job.jobId);
    return out;
  }

  /** Whether a job of `replica` is armed and not finished (its ranks must stay on the vector). */
  unfinished(replica: number): boolean {
    for (const e of this.jobs.values()) if (!e.finished && e.job.replica === replica) return true;
    return false;
  }

  /** Jobs armed and not finished (published or about to be). */
  pending(): number {
    let n = 0;
    for (const e of this.jobs.values()) if (!e.finished) n++;
    return n;
  }

  private isPending(e: Entry): boolean {
    return !e.finished && !e.held && e.wave !== undefined;
  }

  /** A replica's jobs not yet acked by every expected rank nor timed out, grouped by wave (snapshots). */
  lanes(replica: number): DumpLane[] {
    const byWave = new Map<number, DumpJob[]>();
    for (const e of this.jobs.values()) {
      if (!this.isPending(e) || e.job.replica !== replica) continue;
      if (!byWave.has(e.wave!)) byWave.set(e.wave!, []);
      byWave.get(e.wave!)!.push(e.job);
    }
    return [...byWave.entries()].sort((a, b) => a[0] - b[0]).map(([wave, jobs]) => ({ wave, jobs }));
  }

  /** Counters for status / healthz. */
  status(): Record<string, unknown> {
    return { armed: this.armed, tracked: this.jobs.size, completed: this.completed, incomplete: this.incomplete, pending: this.pending(), skipped: this.skipped, duplicates: this.duplicates, unknown_results: this.unknownResults, freed_before_copy: this.freedBeforeCopy, adopted: this.adopted, request_info_failed: this.info.failed };
  }

  /** Stop every ack timer and write every request_info.json still due (coordinator stop). */
  clear(): void {
    this.info.writeAll();
    for (const e of this.jobs.values()) clearTimeout(e.timer);
    for (const e of this.jobs.values()) if (!e.finished) e.wave = undefined;
  }
}
