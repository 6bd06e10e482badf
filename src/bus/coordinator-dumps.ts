// The coordinator's side of the dump ledger (guard/dump-ledger.ts): every ack from the ROUTER is
// counted there once; completion and ack timeouts become metrics, events and policy notices.
import type { DumpLedger } from '../guard/dump-ledger';
import type { Logger } from '../log';
import type { DumpResult } from '../messages';
import type { busMetrics } from '../metrics';
import type { CoordinatorPolicy } from './policy';

export interface DumpHooks {
  ledger: DumpLedger;
  metrics: ReturnType<typeof busMetrics>;
  log: Logger;
  policy?: CoordinatorPolicy;
  timeoutMs: number;
  emit(event: string, arg: unknown): void;
}

/** Listen to the ledger; returns the handler of one rank's DumpResult. */
export function dumpAckHandler(h: DumpHooks): (result: DumpResult) => void {
  for (const result of ['ok', 'error', 'skipped', 'timeout']) h.metrics.dumps.inc({ result }, 0);
  h.ledger.listen({
    complete: (job, results) => h.emit('dump-complete', { jobId: job.jobId, replica: job.replica, results }),
    timedOut: (job, missing) => {
      h.metrics.dumps.inc({ result: 'timeout' }, missing.length);
      h.log.warn({ jobId: job.jobId, replica: job.replica, missing, timeoutMs: h.timeoutMs }, 'dump job not acked by every rank in time');
      try {
        h.policy?.onDumpTimeout?.(job.jobId, missing);
      } catch (e) {
        h.log.error({ jobId: job.jobId, err: String(e) }, 'policy.onDumpTimeout failed');
      }
      h.emit('dump-timeout', { jobId: job.jobId, missing });
    },
  });
  return (result) => {
    h.metrics.dumps.inc({ result: result.error ? 'error' : result.skippedReason ? 'skipped' : 'ok' });
    const counted = h.ledger.ack(result);
    if (counted !== 'counted') h.log.info({ jobId: result.jobId, rank: result.globalRank, counted }, 'dump result for a job no longer pending');
    try {
      h.policy?.onDumpResult?.(result);
    } catch (e) {
      h.log.error({ jobId: result.jobId, err: String(e) }, 'policy.onDumpResult failed');
    }
    h.emit('dump-result', result);
  };
}
