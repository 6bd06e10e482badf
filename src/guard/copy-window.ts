// The copy window of armed dump jobs. Vectors are published a wave ahead, so a job detected in
// wave N-1 is copied at the end of wave N+1 (its arm wave): a request can finish and its blocks
// be given back in between. The telemetry says so: a request reported freed in the telemetry of
// any wave up to the arm wave may have had its blocks reused before the copy (conservative: an
// engine that gives blocks back just after end_of_wave is counted too), so the job is marked
// `freed_before_copy` and never presented as a good dump. The window of a job closes once the
// telemetry of its arm wave has been seen (at the head of the wave after it); until then its
// manifest waits (dumps.ts).
export interface WindowJob {
  jobId: string;
  reqId: string;
  armWave: number;
}

export class CopyWindow {
  /** Open jobs by req id. */
  private readonly open = new Map<string, WindowJob[]>();
  private count = 0;

  arm(job: WindowJob): void {
    const list = this.open.get(job.reqId);
    if (list) list.push(job);
    else this.open.set(job.reqId, [job]);
    this.count++;
  }

  /** `reqId` was reported freed in the telemetry of `wave`: the open jobs it spoils. */
  freed(reqId: string, wave: number): WindowJob[] {
    const list = this.open.get(reqId);
    if (!list) return NONE;
    return list.filter((j) => wave <= j.armWave);
  }

  /** The telemetry of `wave` has been seen: jobs armed for it or earlier are out of the window. */
  closeThrough(wave: number): WindowJob[] {
    if (this.count === 0) return NONE;
    const closed: WindowJob[] = [];
    for (const [reqId, list] of this.open) {
      const keep = list.filter((j) => j.armWave > wave);
      if (keep.length === list.length) continue;
      for (const j of list) if (j.armWave <= wave) closed.push(j);
      if (keep.length === 0) this.open.delete(reqId);
      else this.open.set(reqId, keep);
    }
    this.count -= closed.length;
    return closed;
  }

  /** Every job still open (the guard closes: nothing will tell any more). */
  drain(): WindowJob[] {
    const all = [...this.open.values()].flat();
    this.open.clear();
    this.count = 0;
    return all;
  }
}

const NONE: WindowJob[] = [];
