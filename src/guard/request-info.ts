// request_info.json of each armed dump (dump-ledger.ts): its content is decided at arm, its write
// waits until the coordinator has published the vector that carries the job, so the write's
// fsyncs are never on the path every rank's end_of_wave waits on. A job armed and never published
// (the policy failed after arming it) is written on the next turn; a stopping coordinator writes
// whatever is still due. A failed write is logged, counted and handed to the ledger for the manifest.
import * as path from 'path';
import type { Logger } from '../log';
import type { DumpJob } from '../messages';
import type { ArtifactModes } from '../artifacts/artifact-mode';
import { artifactWrite, writeJsonAtomic } from '../artifacts/atomic-write';
import { fsFailure } from '../artifacts/sink';
import type { PpStages, WorldLayout } from '../layout';
import { jobFields, layoutFields } from './dump-manifest';

/** What request_info.json says of `job` (`extra`: the guard's report-like metadata, merged last). */
export function requestInfoJson(job: DumpJob, ppStages: PpStages, writerRank: number, layout: WorldLayout | undefined, extra: Record<string, unknown>): Record<string, unknown> {
  return {
    ...jobFields(job),
    block_ids: job.blockIds,
    num_blocks: job.blockIds.length,
    request_finished_at_dump: job.requestFinishedAtDump,
    rank: writerRank,
    expected_ranks: job.ranks,
    pp_stages: ppStages,
    ...layoutFields(layout),
    ts: new Date().toISOString(),
    ...extra,
  };
}

export class RequestInfoWriter {
  /** job id → its wave dir and content, not written yet. */
  private readonly due = new Map<string, { dir: string; info: Record<string, unknown> }>();
  private soon?: NodeJS.Immediate;
  /** Writes that failed. */
  failed = 0;

  constructor(
    private readonly modes: ArtifactModes,
    /** A write failed: `error` names the file and the errno. */
    private readonly onFailed: (jobId: string, error: string) => void,
    private readonly log?: Pick<Logger, 'error'>,
  ) {}

  /** Keep `info` for `dir` (which exists); written by write(jobId), or on the next turn at the latest. */
  defer(jobId: string, dir: string, info: Record<string, unknown>): void {
    this.due.set(jobId, { dir, info });
    this.soon ??= setImmediate(() => this.writeAll());
  }

  /** Write `jobId`'s request_info.json now if it is still due. */
  write(jobId: string): void {
    const d = this.due.get(jobId);
    if (!d) return;
    this.due.delete(jobId);
    const file = path.join(d.dir, 'request_info.json');
    try {
      writeJsonAtomic(file, d.info, artifactWrite(this.modes));
    } catch (e) {
      const error = fsFailure('write', file, e).message;
      this.failed++;
      this.log?.error({ job_id: jobId, err: error }, 'cannot write request_info.json: the dump will not be complete');
      this.onFailed(jobId, error);
    }
  }

  /** Every one still due (the next turn; a coordinator stopping). */
  writeAll(): void {
    if (this.soon) clearImmediate(this.soon);
    this.soon = undefined;
    for (const jobId of [...this.due.keys()]) this.write(jobId);
  }
}
