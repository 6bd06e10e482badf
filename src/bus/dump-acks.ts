// The coordinator's dump-ack tracking: each published dump job waits for an ack from every
// expected rank until a timeout; complete and timed-out jobs leave the table, and the jobs still
// waiting go into every snapshot (a resynced agent must still see them).
import type { DumpJob, DumpLane, DumpResult } from '../messages';
import type { Logger } from '../log';

interface PendingDump {
  wave: number;
  job: DumpJob;
  expected: number[];
  acked: Map<number, DumpResult>;
  timer: NodeJS.Timeout;
}

export interface DumpAckEvents {
  complete(jobId: string, results: DumpResult[]): void;
  timedOut(jobId: string, missing: number[]): void;
}

/** Fill arm wave and job id where the caller left them out; one job per job id. */
export function mergeJobs(wave: number, jobs: DumpJob[], log: Logger): DumpJob[] {
  const byId = new Map<string, DumpJob>();
  for (const j of jobs) {
    const armWave = j.armWave || wave;
    const job: DumpJob = {
      incidentType: j.incidentType ?? '',
      reqId: j.reqId ?? '',
      blockIds: j.blockIds ?? [],
      detectWave: j.detectWave ?? 0,
      armWave,
      dumpDir: j.dumpDir ?? '',
      requestFinishedAtDump: j.requestFinishedAtDump ?? false,
      jobId: j.jobId || `${armWave}/${j.incidentType}/${j.reqId}`,
    };
    if (byId.has(job.jobId)) log.info({ jobId: job.jobId }, 'duplicate dump job in one wave ignored');
    else byId.set(job.jobId, job);
  }
  return [...byId.values()];
}

export class DumpAcks {
  private readonly pending = new Map<string, PendingDump>();

  constructor(
    private readonly timeoutMs: number,
    private readonly events: DumpAckEvents,
  ) {}

  track(wave: number, job: DumpJob, expected: number[]): void {
    const old = this.pending.get(job.jobId);
    if (old) clearTimeout(old.timer);
    const timer = setTimeout(() => this.timedOut(job.jobId), this.timeoutMs);
    timer.unref();
    this.pending.set(job.jobId, { wave, job, expected: [...expected], acked: new Map(), timer });
  }

  /** Count one rank's ack; false when its job is no longer pending. */
  ack(result: DumpResult): boolean {
    const d = this.pending.get(result.jobId);
    if (!d) return false;
    d.acked.set(result.globalRank, result);
    if (d.expected.every((r) => d.acked.has(r))) {
      clearTimeout(d.timer);
      this.pending.delete(result.jobId);
      this.events.complete(result.jobId, [...d.acked.values()]);
    }
    return true;
  }

  jobIds(): string[] {
    return [...this.pending.keys()];
  }

  /** Dump jobs not yet acked by every expected rank nor timed out, grouped by wave. */
  lanes(): DumpLane[] {
    const byWave = new Map<number, DumpJob[]>();
    for (const d of this.pending.values()) {
      if (!byWave.has(d.wave)) byWave.set(d.wave, []);
      byWave.get(d.wave)!.push(d.job);
    }
    return [...byWave.entries()].sort((a, b) => a[0] - b[0]).map(([wave, jobs]) => ({ wave, jobs }));
  }

  clear(): void {
    for (const d of this.pending.values()) clearTimeout(d.timer);
    this.pending.clear();
  }

  private timedOut(jobId: string): void {
    const d = this.pending.get(jobId);
    if (!d) return;
    this.pending.delete(jobId);
    this.events.timedOut(jobId, d.expected.filter((r) => !d.acked.has(r)));
  }
}
