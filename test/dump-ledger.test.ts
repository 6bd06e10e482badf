// The one dump ledger (src/guard/dump-ledger.ts): completion, ack timeout, a late ack after the
// timeout, a rank the job does not name, and one manifest per job, written where the job says.
import * as fs from 'fs';
import * as path from 'path';
import { DumpLedger } from '../src/guard/dump-ledger';
import { kvRankDirFor } from '../src/paths';
import type { DumpJob, DumpResult } from '../src/messages';
import { cleanup, tmpDir, waitFor } from './helpers';

afterAll(() => cleanup());

const layout = { worldSize: 8, tp: 2, pp: 2, dp: 2, cp: 1 };
const ack = (rank: number, jobId: string, p: Partial<DumpResult> = {}): DumpResult => ({
  globalRank: rank, jobId, wave: 3, files: [{ path: `${kvRankDirFor(rank, layout)}/l.pt`, bytes: 10, checksum: 'crc32c:00000000' }], bytes: 10, error: '', skippedReason: '', layers: [`layers.${rank < 4 ? (rank < 2 ? 0 : 1) : rank < 6 ? 0 : 1}`], ...p,
});

function arm(ledger: DumpLedger, root: string, replica: number, stages: 'last' | 'all', reqId = 'r'): DumpJob {
  // The config the replica's ranks apply at the end of wave 3 (the stream tells the ledger).
  ledger.configFrom(replica, 3, stages);
  const job = ledger.arm(root, { incidentType: 'nan', reqId, blockIds: [1], detectWave: 2, armWave: 3, requestFinishedAtDump: false, replica, info: {} })!;
  ledger.published(3, [job]);
  return job;
}

test('a job completes once every rank it names acked; one manifest; its replica and stages named', () => {
  const root = tmpDir();
  const done: string[] = [];
  const ledger = new DumpLedger({ layout, ackTimeoutMs: 60000 });
  ledger.listen({ complete: (j) => done.push(j.jobId) });
  const job = arm(ledger, root, 1, 'all');
  expect(job).toMatchObject({ jobId: '3/nan/r@dp1', replica: 1, ranks: [4, 5, 6, 7], dumpDir: path.join(root, 'nan', 'r', 'wave_3_dp1') });
  expect(ledger.lanes(1)).toEqual([{ wave: 3, jobs: [job] }]);
  expect(ledger.lanes(0)).toEqual([]);
  expect(ledger.arm(root, { incidentType: 'nan', reqId: 'r', blockIds: [1], detectWave: 2, armWave: 3, requestFinishedAtDump: false, replica: 1, info: {} })).toBeNull(); // duplicate
  for (const g of [4, 5, 6]) expect(ledger.ack(ack(g, job.jobId))).toBe('counted');
  expect(fs.existsSync(path.join(job.dumpDir, 'manifest.json'))).toBe(false);
  expect(ledger.ack(ack(7, job.jobId))).toBe('counted');
  expect(done).toEqual([job.jobId]);
  const m = JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'manifest.json'), 'utf8'));
  expect(m).toMatchObject({ dp_rank: 1, expected_ranks: [4, 5, 6, 7], completed_ranks: [4, 5, 6, 7], complete: true, pp_stages: 'all' });
  expect(m.stages).toEqual({ '0': { ranks: [4, 5], layers: ['layers.0'] }, '1': { ranks: [6, 7], layers: ['layers.1'] } });
  expect(JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'request_info.json'), 'utf8'))).toMatchObject({ dp_rank: 1, rank: 6, expected_ranks: [4, 5, 6, 7] });
  expect(ledger.lanes(1)).toEqual([]);
  expect(ledger.status()).toMatchObject({ armed: 1, completed: 1, incomplete: 0, pending: 0, duplicates: 1 });
});

test('a rank outside the job is refused and counted; the timeout finishes the job; a late ack completes it', async () => {
  const root = tmpDir();
  const timedOut: Array<{ jobId: string; missing: number[] }> = [];
  const ledger = new DumpLedger({ layout, ackTimeoutMs: 150 });
  ledger.listen({ timedOut: (j, missing) => timedOut.push({ jobId: j.jobId, missing }) });
  const job = arm(ledger, root, 0, 'last');
  expect(ledger.ack(ack(6, job.jobId))).toBe('not_expected'); // another replica's rank
  expect(ledger.ack(ack(2, 'no/such/job'))).toBe('unknown_job');
  expect(ledger.ack(ack(2, job.jobId))).toBe('counted');
  expect(ledger.pendingIds(0)).toEqual([job.jobId]);
  await waitFor(() => timedOut.length === 1, 'the ack timeout');
  expect(timedOut).toEqual([{ jobId: job.jobId, missing: [3] }]);
  expect(ledger.pendingIds()).toEqual([]); // not in snapshots any more
  let m = JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'manifest.json'), 'utf8'));
  expect(m).toMatchObject({ completed_ranks: [2], missing_ranks: [3], complete: false, timed_out: true });
  expect(ledger.status()).toMatchObject({ completed: 0, incomplete: 1, unknown_results: 2 });
  expect(ledger.ack(ack(3, job.jobId))).toBe('late');
  m = JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'manifest.json'), 'utf8'));
  expect(m).toMatchObject({ completed_ranks: [2, 3], missing_ranks: [], complete: true });
  expect(ledger.status()).toMatchObject({ completed: 1, incomplete: 0 });
  expect(fs.readdirSync(job.dumpDir).sort()).toEqual(['manifest.json', 'request_info.json']);
});

test('jobs queued on the coordinator (not armed here) are tracked without files', async () => {
  const ledger = new DumpLedger({ layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, ackTimeoutMs: 60000 });
  const job: DumpJob = { incidentType: 'x', reqId: 'q', blockIds: [], detectWave: 0, armWave: 4, dumpDir: '', requestFinishedAtDump: false, jobId: '4/x/q', replica: 0, ranks: [0] };
  ledger.published(4, [job]);
  expect(ledger.lanes(0)).toEqual([{ wave: 4, jobs: [job] }]);
  expect(ledger.ack(ack(0, '4/x/q'))).toBe('counted');
  expect(ledger.lanes(0)).toEqual([]);
  ledger.clear();
});

test('the stages of a dump are those of the config in force at its copy wave, per replica; no job names a stage before its config applies', () => {
  const root = tmpDir();
  const ledger = new DumpLedger({ layout, ackTimeoutMs: 60000 });
  const armAt = (replica: number, wave: number, reqId: string) => ledger.arm(root, { incidentType: 'nan', reqId, blockIds: [1], detectWave: wave - 3, armWave: wave, requestFinishedAtDump: false, replica, info: {} })!;
  // Before any config: the seed's rule.
  expect(armAt(0, 2, 'a').ranks).toEqual([2, 3]);
  ledger.configFrom(0, 4, 'last');
  ledger.configFrom(0, 6, 'all'); // replica 0's ranks switch at the end of wave 6
  ledger.configFrom(1, 9, 'all'); // replica 1's at its own wave 9
  expect(ledger.stagesAt(0, 5)).toBe('last');
  expect(ledger.stagesAt(0, 6)).toBe('all'); // applied before that wave's copies
  const j6 = armAt(0, 6, 'b');
  expect(j6.ranks).toEqual([0, 1, 2, 3]);
  expect(JSON.parse(fs.readFileSync(path.join(j6.dumpDir, 'request_info.json'), 'utf8'))).toMatchObject({ pp_stages: 'all', expected_ranks: [0, 1, 2, 3] });
  expect(armAt(1, 8, 'c').ranks).toEqual([6, 7]);
  expect(armAt(1, 9, 'd').ranks).toEqual([4, 5, 6, 7]);
  ledger.configFrom(0, 10, 'last');
  expect(armAt(0, 11, 'e').ranks).toEqual([2, 3]);
  // An engine that restarted its waves: the schedule from the new apply wave on replaces the old one.
  ledger.configFrom(0, 1, 'all');
  expect(ledger.stagesAt(0, 11)).toBe('all');
  ledger.clear();
});
