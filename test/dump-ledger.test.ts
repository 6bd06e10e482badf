// The one dump ledger (src/guard/dump-ledger.ts): completion, ack timeout, a late ack after the
// timeout, a rank the job does not name, and one manifest per job, written where the job says;
// request_info.json written only after the vector that carries the job went out.
import * as fs from 'fs';
import * as path from 'path';
import pino from 'pino';
import { DumpLedger, MAX_COMPLETE_JOBS_KEPT, MAX_INCOMPLETE_JOBS_KEPT } from '../src/guard/dump-ledger';
import { WaveStreams } from '../src/bus/wave-streams';
import { replicaTopic, topicOf, WORK_HEAD_TOPIC } from '../src/bus/frames';
import { busMetrics } from '../src/metrics';
import { findOrphanDumps, orphanJob } from '../src/guard/orphan-dumps';
import { kvRankDirFor } from '../src/paths';
import { decideAheadWaves } from '../src/bus/constants';
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

describe('dumps an earlier coordinator left unfinished (src/guard/orphan-dumps.ts)', () => {
  test('found at startup and adopted: a manifest that never claims complete, rewritten by acks that still arrive', () => {
    const root = tmpDir();
    // A coordinator armed this job (request_info.json) and was killed before any manifest.
    const old = new DumpLedger({ layout, ackTimeoutMs: 60000 });
    const job = arm(old, root, 1, 'last');
    old.clear();
    // Another job finished normally: not an orphan.
    const done = arm(old, root, 0, 'last', 'fine');
    for (const g of [2, 3]) old.ack(ack(g, done.jobId));
    old.clear();
    const found = findOrphanDumps(root, layout);
    expect(found.map((o) => o.job)).toEqual([{ ...job, ranks: [6, 7] }]);

    const ledger = new DumpLedger({ layout, ackTimeoutMs: 60000 });
    const completed: string[] = [];
    ledger.listen({ complete: (j) => completed.push(j.jobId) });
    for (const o of found) ledger.adopt(o.job, o.ppStages);
    const manifest = () => JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'manifest.json'), 'utf8'));
    expect(manifest()).toMatchObject({ job_id: job.jobId, dp_rank: 1, expected_ranks: [6, 7], completed_ranks: [], missing_ranks: [6, 7], complete: false, incomplete_reason: 'coordinator_restarted' });
    // An agent's queued ack reaches the new coordinator: named, and still not complete.
    expect(ledger.ack(ack(6, job.jobId))).toBe('counted');
    expect(manifest()).toMatchObject({ completed_ranks: [6], missing_ranks: [7], complete: false });
    ledger.ack(ack(7, job.jobId));
    expect(manifest()).toMatchObject({ completed_ranks: [6, 7], missing_ranks: [], complete: false, incomplete_reason: 'coordinator_restarted' });
    expect(ledger.status()).toMatchObject({ adopted: 1, completed: 0, incomplete: 1 });
    expect(completed).toEqual([]);
    ledger.clear();
    // Adopted once: its manifest exists now.
    expect(findOrphanDumps(root, layout)).toEqual([]);
  });

  test('records that do not fit the layout, links and odd names are left alone', () => {
    const root = tmpDir();
    const good = { job_id: '5/nan/q@dp1', incident_type: 'nan', req_id: 'q', dp_rank: 1, detect_wave: 4, arm_wave: 5, block_ids: [1], expected_ranks: [6, 7], pp_stages: 'last' };
    const put = (rel: string, v: unknown) => {
      fs.mkdirSync(path.join(root, rel), { recursive: true });
      fs.writeFileSync(path.join(root, rel, 'request_info.json'), typeof v === 'string' ? v : JSON.stringify(v));
    };
    put('nan/q/wave_5_dp1', good);
    put('nan/a/wave_5_dp1', { ...good, dp_rank: 2 }); // dp=2: no replica 2
    put('nan/b/wave_5_dp1', { ...good, expected_ranks: [6, 8] }); // rank 8 of 8
    put('nan/c/wave_5_dp1', { ...good, arm_wave: -1 });
    put('nan/d/wave_5_dp1', '{not json');
    put('nan/e/not_a_wave', good);
    fs.mkdirSync(path.join(root, 'nan', 'f', 'wave_6'), { recursive: true });
    fs.symlinkSync(path.join(root, 'nan', 'q', 'wave_5_dp1', 'request_info.json'), path.join(root, 'nan', 'f', 'wave_6', 'request_info.json'));
    const warned: string[] = [];
    const found = findOrphanDumps(root, layout, { warn: (o: object) => void warned.push(JSON.stringify(o)) } as never);
    expect(found.map((o) => o.job.dumpDir)).toEqual([path.join(root, 'nan', 'q', 'wave_5_dp1')]);
    expect(warned.join('\n')).toMatch(/dp_rank 2 is outside dp=2/);
    expect(warned.join('\n')).toMatch(/expected_ranks is not a list of ranks below 8/);
    expect(warned.join('\n')).toMatch(/arm_wave or detect_wave/);
    expect(orphanJob('/x', null, layout)).toBe('request_info.json is not a JSON object');
  });
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
  ledger.published(6, [j6]); // request_info.json is written after the publish
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

test('a long job keeps only the newest complete jobs (a coordinator does not grow with every dump); an incomplete one stays for its late acks', () => {
  const root = tmpDir();
  const ledger = new DumpLedger({ layout, ackTimeoutMs: 60000 });
  // One job that never completes (rank 3 never acks), then many that do.
  const open = arm(ledger, root, 0, 'last', 'open');
  ledger.ack(ack(2, open.jobId));
  const n = MAX_COMPLETE_JOBS_KEPT + 40;
  const jobs: DumpJob[] = [];
  for (let i = 0; i < n; i++) {
    const job = arm(ledger, root, 1, 'last', `c${i}`);
    for (const g of [6, 7]) expect(ledger.ack(ack(g, job.jobId))).toBe('counted');
    jobs.push(job);
  }
  // Every manifest was written, complete; only the newest complete ones and the open job are held.
  for (const j of jobs) expect(JSON.parse(fs.readFileSync(path.join(j.dumpDir, 'manifest.json'), 'utf8'))).toMatchObject({ complete: true });
  expect(ledger.status()).toMatchObject({ completed: n, incomplete: 0, pending: 1, tracked: MAX_COMPLETE_JOBS_KEPT + 1 });
  // A duplicate ack of a let-go job is counted as unknown; of a kept one, it rewrites the same manifest.
  expect(ledger.ack(ack(6, jobs[0].jobId))).toBe('unknown_job');
  expect(ledger.ack(ack(6, jobs[n - 1].jobId))).toBe('counted');
  expect(ledger.status()).toMatchObject({ completed: n, unknown_results: 1 });
  // The incomplete job is still there for its last rank.
  expect(ledger.ack(ack(3, open.jobId))).toBe('counted');
  expect(JSON.parse(fs.readFileSync(path.join(open.dumpDir, 'manifest.json'), 'utf8'))).toMatchObject({ completed_ranks: [2, 3], complete: true });
  ledger.clear();
});

test('incomplete jobs are kept for late acks up to MAX_INCOMPLETE_JOBS_KEPT; a complete job its request spoiled later is let go too', async () => {
  const root = tmpDir();
  const ledger = new DumpLedger({ layout, ackTimeoutMs: 30 });
  // Jobs that time out with rank 7 missing (incomplete, every rank's ack held).
  const n = MAX_INCOMPLETE_JOBS_KEPT + 20;
  const timedOut: DumpJob[] = [];
  for (let i = 0; i < n; i++) {
    const job = arm(ledger, root, 1, 'last', `t${i}`);
    ledger.ack(ack(6, job.jobId));
    timedOut.push(job);
  }
  await waitFor(() => (ledger.status() as { incomplete: number }).incomplete === n || undefined, 'every job timed out');
  expect(ledger.status()).toMatchObject({ incomplete: n, pending: 0, tracked: MAX_INCOMPLETE_JOBS_KEPT });
  // The oldest were let go: a late ack is unknown; a kept one still completes its job.
  expect(ledger.ack(ack(7, timedOut[0].jobId))).toBe('unknown_job');
  expect(ledger.ack(ack(7, timedOut[n - 1].jobId))).toBe('late');
  expect(JSON.parse(fs.readFileSync(path.join(timedOut[n - 1].dumpDir, 'manifest.json'), 'utf8'))).toMatchObject({ complete: true });
  expect(ledger.status()).toMatchObject({ incomplete: n - 1, completed: 1, unknown_results: 1 });
  ledger.clear();

  // A complete job later reported freed before its copy wave becomes incomplete, and is still let go in its turn.
  const l2 = new DumpLedger({ layout, ackTimeoutMs: 60000 });
  const spoiled = arm(l2, root, 0, 'last', 'spoiled');
  for (const g of [2, 3]) l2.ack(ack(g, spoiled.jobId));
  l2.markFreedBeforeCopy(spoiled.jobId, 3);
  expect(JSON.parse(fs.readFileSync(path.join(spoiled.dumpDir, 'manifest.json'), 'utf8'))).toMatchObject({ complete: false, incomplete_reason: 'freed_before_copy' });
  for (let i = 0; i < MAX_INCOMPLETE_JOBS_KEPT; i++) {
    const job = arm(l2, root, 0, 'last', `x${i}`);
    l2.markFreedBeforeCopy(job.jobId, 3);
    for (const g of [2, 3]) l2.ack(ack(g, job.jobId));
  }
  expect(l2.status()).toMatchObject({ incomplete: MAX_INCOMPLETE_JOBS_KEPT + 1, tracked: MAX_INCOMPLETE_JOBS_KEPT });
  expect(l2.ack(ack(2, spoiled.jobId))).toBe('unknown_job');
  l2.clear();
});

describe('request_info.json is written after the vector that carries the job is published', () => {
  const nanSpec = (reqId: string, armWave: number, replica = 0) => ({ incidentType: 'nan', reqId, blockIds: [1, 2], detectWave: armWave - 2, armWave, requestFinishedAtDump: false, replica, info: { detector_detail: { k: reqId } } });
  const logged = () => {
    const lines: Array<Record<string, unknown>> = [];
    return { lines, log: pino({ level: 'info' }, { write: (s: string) => void lines.push(JSON.parse(s)) }) };
  };

  test('the wave stream hands the head and the dump lane to PUB while the wave dir exists and request_info.json does not; then it is written, and the manifest follows it', () => {
    const root = tmpDir();
    const { log } = logged();
    const ledger = new DumpLedger({ layout, ackTimeoutMs: 60000, log });
    let armed: DumpJob | null = null;
    // The frames as the coordinator's PUB gets them, with what the wave dir held at that moment.
    const sent: Array<{ topic: string; dir: boolean; info: boolean }> = [];
    const streams = new WaveStreams({
      layout,
      decideAhead: decideAheadWaves(layout.pp),
      epoch: () => 7,
      send: ([topic]) => sent.push({ topic, dir: armed !== null && fs.existsSync(armed.dumpDir), info: armed !== null && fs.existsSync(path.join(armed.dumpDir, 'request_info.json')) }),
      policy: {
        ledger,
        onWaveHead: (replica, headWave) => {
          armed = ledger.arm(root, nanSpec('q', headWave + 2, replica));
          return { dumps: armed ? [armed] : [] };
        },
        status: () => ({}),
        snapshotState: () => ({ configVersion: 0, config: null, manualDumpDone: 0 }),
      },
      ledger,
      metrics: busMetrics(),
      log,
      onPublished: () => undefined,
    });
    const head = streams.begin(1, 10, null);
    expect(head).toMatchObject({ wave: 12, dumpDue: true });
    const job = armed as unknown as DumpJob;
    expect(job.dumpDir).toBe(path.join(root, 'nan', 'q', 'wave_12_dp1'));
    // A head that carries work goes out under the work topic (lanes-only agents follow only those).
    expect(sent.map((f) => f.topic)).toEqual([`${replicaTopic(1)}${WORK_HEAD_TOPIC}`, topicOf(1, 'dump')]);
    for (const f of sent) expect(f).toMatchObject({ dir: true, info: false });
    // begin() returned: the record is on disk, whole, with what was decided at arm.
    const info = JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'request_info.json'), 'utf8'));
    expect(info).toMatchObject({ job_id: '12/nan/q@dp1', dp_rank: 1, arm_wave: 12, detect_wave: 10, block_ids: [1, 2], rank: 6, expected_ranks: [6, 7], pp_stages: 'last', detector_detail: { k: 'q' } });
    for (const g of [6, 7]) ledger.ack(ack(g, job.jobId));
    const m = JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'manifest.json'), 'utf8'));
    expect(m).toMatchObject({ job_id: job.jobId, complete: true, completed_ranks: [6, 7] });
    expect(m.request_info_error).toBeUndefined();
    expect(fs.readdirSync(job.dumpDir).sort()).toEqual(['manifest.json', 'request_info.json']);
    expect(ledger.status()).toMatchObject({ completed: 1, request_info_failed: 0 });
    ledger.clear();
  });

  test('a request_info.json that cannot be written is logged, counted, and makes the manifest say so: never complete', () => {
    const root = tmpDir();
    const { lines, log } = logged();
    const ledger = new DumpLedger({ layout, ackTimeoutMs: 60000, log });
    const job = ledger.arm(root, nanSpec('w', 5))!;
    // Something took the name in the wave dir after the arm: the rename onto it fails (EISDIR), as root too.
    fs.mkdirSync(path.join(job.dumpDir, 'request_info.json'));
    ledger.published(5, [job]);
    expect(ledger.status()).toMatchObject({ request_info_failed: 1 });
    const err = lines.find((l) => /cannot write request_info\.json/.test(String(l.msg)));
    expect(err).toMatchObject({ level: 50, job_id: job.jobId });
    expect(String(err!.err)).toMatch(/request_info\.json failed: EISDIR/);
    for (const g of [2, 3]) expect(ledger.ack(ack(g, job.jobId))).toBe('counted');
    const m = JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'manifest.json'), 'utf8'));
    expect(m).toMatchObject({ completed_ranks: [2, 3], missing_ranks: [], complete: false, incomplete_reason: 'request_info_failed' });
    expect(m.request_info_error).toMatch(/^write .*wave_5_dp0[/\\]request_info\.json failed: EISDIR/);
    expect(ledger.status()).toMatchObject({ completed: 0, incomplete: 1 });
    // no half-written temp file left beside it
    expect(fs.readdirSync(job.dumpDir).sort()).toEqual(['manifest.json', 'request_info.json']);
    expect(fs.statSync(path.join(job.dumpDir, 'request_info.json')).isDirectory()).toBe(true);
    ledger.clear();
  });

  test('a wave dir that cannot be made fails the arm at once (nothing tracked, nothing to publish)', () => {
    const root = tmpDir();
    fs.writeFileSync(path.join(root, 'nan'), 'not a directory');
    const ledger = new DumpLedger({ layout, ackTimeoutMs: 60000 });
    expect(() => ledger.arm(root, nanSpec('x', 4))).toThrow(/^mkdir .*[/\\]nan[/\\]x[/\\]wave_4_dp0 failed: ENOTDIR/);
    expect(ledger.status()).toMatchObject({ armed: 0, pending: 0 });
    ledger.clear();
  });

  test('a job armed and never published is written on the next turn; a stopping ledger writes what is still due', async () => {
    const root = tmpDir();
    const ledger = new DumpLedger({ layout, ackTimeoutMs: 60000 });
    const a = ledger.arm(root, nanSpec('a', 4))!;
    const infoOf = (j: DumpJob) => path.join(j.dumpDir, 'request_info.json');
    expect(fs.existsSync(a.dumpDir)).toBe(true);
    expect(fs.existsSync(infoOf(a))).toBe(false);
    await new Promise((r) => setImmediate(r));
    expect(JSON.parse(fs.readFileSync(infoOf(a), 'utf8'))).toMatchObject({ job_id: a.jobId, req_id: 'a' });
    const b = ledger.arm(root, nanSpec('b', 4))!;
    expect(fs.existsSync(infoOf(b))).toBe(false);
    ledger.clear(); // coordinator stop
    expect(JSON.parse(fs.readFileSync(infoOf(b), 'utf8'))).toMatchObject({ job_id: b.jobId, req_id: 'b' });
  });
});
