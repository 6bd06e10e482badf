// Which finished dump jobs the ledger still tracks. A finished job holds every rank's ack and file
// list (~100 KB per dump at 64 ranks), so a long job's coordinator keeps only the newest of each
// kind: complete ones (nothing can change them; a duplicate ack of an older one is counted as
// unknown) and incomplete ones (kept a while for a late ack that completes one). A job that moves
// between the kinds (a late ack completes it, or its request is reported freed before its copy
// wave) is queued again under its new kind; its old place is skipped when it comes up.

export type FinishedKind = 'complete' | 'incomplete';

export interface FinishedJobsDeps {
  /** The job's kind now, or undefined when it cannot be let go yet (unknown, unfinished, copy window open). */
  kindOf(jobId: string): FinishedKind | undefined;
  /** Let go of the job (it is of the kind it was queued under). */
  drop(jobId: string): void;
}

export class FinishedJobs {
  private readonly queued: Record<FinishedKind, string[]> = { complete: [], incomplete: [] };

  constructor(
    private readonly keep: Record<FinishedKind, number>,
    private readonly deps: FinishedJobsDeps,
  ) {}

  /** `jobId` finished as `kind` (or became it): the oldest of that kind beyond its cap are let go. */
  finished(jobId: string, kind: FinishedKind): void {
    const q = this.queued[kind];
    q.push(jobId);
    while (q.length > this.keep[kind]) {
      const old = q.shift()!;
      if (this.deps.kindOf(old) === kind) this.deps.drop(old);
    }
  }
}
