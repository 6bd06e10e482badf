// `wavebus bench soak`'s own logic: the workload an engine replica runs (pendingDump before
// freeing), the dump checker (a dump passes only with exactly its replica's ranks), the flatness
// rule, and a short DP=2 run of the real thing (processes, dumps, verification). The long soak is a
// bench (docs/benchmarks.md); nothing here asserts speed.
import * as fs from 'fs';
import * as path from 'path';
import { flatness, RULE } from '../bench/soak';
import { checkDump, collectDumps, emptyTally } from '../bench/lib/soak-collector';
import { SoakWorkload } from '../bench/lib/soak-workload';
import { flockHolder } from '../bench/lib/soak-samples';
import { spawn } from 'child_process';
import { kvRankDirFor } from '../src/paths';
import { cleanup, runWavebus, tmpDir } from './helpers';

jest.setTimeout(120000);
afterAll(() => cleanup());

const layout = { worldSize: 4, tp: 2, pp: 1, dp: 2, cp: 1 };

test('the workload: staggered requests, finished then freed a wave later, kept while a dump is pending', () => {
  const w = new SoakWorkload({ slots: 2, life: 4, blocksPerRequest: 2, poolBlocks: 8 });
  const rows = (t: ReturnType<SoakWorkload['step']>) => t.requests.map((r) => `${r.reqId}${r.finished ? ':finished' : ''}${r.freed ? ':freed' : ''}`);
  expect(rows(w.step(1))).toEqual(['soak-req-0']); // slot 1 starts at wave 1 + life/slots = 3
  expect(rows(w.step(2))).toEqual(['soak-req-0']);
  expect(rows(w.step(3))).toEqual(['soak-req-0', 'soak-req-1']);
  expect(rows(w.step(4))).toEqual(['soak-req-0', 'soak-req-1']);
  expect(rows(w.step(5))).toEqual(['soak-req-0:finished', 'soak-req-1']);
  expect(w.finishedHolding()).toEqual(['soak-req-0']);
  // A dump of soak-req-0 is pending: its blocks stay a wave; a new request takes the slot anyway.
  expect(rows(w.step(6, new Set(['soak-req-0'])))).toEqual(['soak-req-2', 'soak-req-1']);
  expect(w.deferredFrees).toBe(1);
  const t7 = w.step(7);
  expect(rows(t7)).toEqual(['soak-req-0:freed', 'soak-req-2', 'soak-req-1:finished']);
  const blocks = t7.requests.filter((r) => !r.freed).map((r) => r.blockIds);
  expect(new Set(blocks.flat()).size).toBe(blocks.flat().length); // live requests never share blocks
  expect(() => new SoakWorkload({ slots: 3, life: 4, blocksPerRequest: 2, poolBlocks: 8 })).toThrow(/need a pool of 12 blocks/);
});

test('the flatness rule: RSS ratio and fd growth per process', () => {
  expect(flatness([{ rssKb: 100, fds: 30 }], [{ rssKb: 125, fds: 32 }])).toEqual({ rssRatioMax: 1.25, rssWorst: 0, fdGrowthMax: 2, rssFlat: true, fdsFlat: true });
  expect(flatness([{ rssKb: 100, fds: 30 }, { rssKb: 100, fds: 30 }], [{ rssKb: 90, fds: 30 }, { rssKb: 130, fds: 33 }])).toMatchObject({ rssRatioMax: 1.3, rssWorst: 1, rssFlat: false, fdsFlat: false });
  expect(RULE).toMatch(/0 lost waves.*RSS end <= 1.25 x after warm-up.*fds end <= after warm-up \+ 2/);
});

test("flockHolder names the process that holds a file's flock (as the host receiver holds its role), and nobody once it is gone", async () => {
  const dir = tmpDir('wavebus-soak-flock-');
  const file = path.join(dir, 'wave-receiver.r0.lock');
  const other = path.join(dir, 'other.lock');
  fs.writeFileSync(other, '');
  expect(flockHolder(file)).toBeUndefined(); // no file
  // The agent's own way to take the role (MailboxWriter.holdLock, a flock), in a process of its own.
  const js = `require(${JSON.stringify(path.resolve(__dirname, '..', 'dist', 'src', 'client', 'mailbox.js'))}).MailboxWriter.holdLock(${JSON.stringify(file)}); console.log('held'); setInterval(() => {}, 1000);`;
  const child = spawn(process.execPath, ['-e', js], { stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    await new Promise<void>((resolve, reject) => {
      child.stdout.on('data', (b) => String(b).includes('held') && resolve());
      child.on('exit', (c) => reject(new Error(`the lock holder exited ${c}`)));
    });
    expect(flockHolder(file)).toBe(child.pid);
    expect(flockHolder(other)).toBeUndefined(); // a file nobody locked
  } finally {
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
  }
  expect(flockHolder(file)).toBeUndefined(); // the kernel dropped it with its holder
});

test('the dump checker refuses a "complete" manifest that holds another replica\'s ranks, counts incomplete ones, and removes what it checked', () => {
  const root = tmpDir('wavebus-soak-check-');
  const wdir = (req: string, r: number) => path.join(root, 'manual_trigger', req, `wave_9_dp${r}`);
  const write = (dir: string, m: Record<string, unknown>, rankDirs: number[]) => {
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, 'manifest.json'), JSON.stringify(m));
    for (const g of rankDirs) fs.mkdirSync(path.join(dir, kvRankDirFor(g, layout)));
  };
  // Replica 1's dir whose manifest and rank dirs are replica 0's.
  write(wdir('a', 1), { complete: true, dp_rank: 0, expected_ranks: [0, 1], completed_ranks: [0, 1] }, [0, 1]);
  write(wdir('b', 0), { complete: false, dp_rank: 0, expected_ranks: [0, 1], completed_ranks: [0], missing_ranks: [1], failed_ranks: {} }, [0]);
  fs.mkdirSync(path.join(root, 'manual_trigger', 'c', 'wave_10_dp0'), { recursive: true }); // pending: no manifest yet
  const t = collectDumps(root, layout, emptyTally(2));
  expect(t.replicas[1]).toMatchObject({ jobsComplete: 0, jobsIncomplete: 1, dumpWaves: [9] });
  expect(t.replicas[0]).toMatchObject({ jobsComplete: 0, jobsIncomplete: 1 });
  expect(t.problems.join('\n')).toMatch(/dp_rank 0 in replica 1's dir; expected_ranks \[0,1\], replica 1's are \[2,3\]/);
  expect(t.problems.join('\n')).toMatch(/incomplete \(missing \[1\]/);
  expect(fs.existsSync(wdir('a', 1))).toBe(false);
  expect(fs.existsSync(path.join(root, 'manual_trigger', 'c', 'wave_10_dp0'))).toBe(true);
  // A replica outside the layout is a problem, not a crash.
  const t2 = emptyTally(2);
  write(path.join(root, 'x', 'r', 'wave_1_dp5'), { complete: true }, []);
  checkDump(path.join(root, 'x', 'r', 'wave_1_dp5'), 5, 1, layout, t2);
  expect(t2.problems).toEqual([expect.stringMatching(/no replica 5 in dp=2/)]);
});

test('a short DP=2 soak of real processes: every replica serves every manual dump, each dump exactly its replica\'s ranks, verified', () => {
  // A generous end_of_wave bound: this checks what the soak checks, not how fast the host is.
  const r = runWavebus(['bench', 'soak', '--agents', '4', '--dp', '2', '--waves', '240', '--dump-every', '60', '--bound-ms', '5000', '--json'], { timeout: 110000 });
  expect({ code: r.code, stderr: r.code === 0 ? '' : r.stderr.slice(-3000) }).toEqual({ code: 0, stderr: '' });
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  expect(out).toMatchObject({ bench: 'soak', agents: 4, dp: 2, waves: 240, dumps_asked: 4, jobs_incomplete: 0, freed_before_copy: 0 });
  expect(out.problems).toEqual([]);
  for (const [i, rep] of out.replicas.entries()) {
    expect(rep).toMatchObject({ replica: i, ranks: [2 * i, 2 * i + 1], manual_dumps_served: 4, dump_waves: 4, jobs_incomplete: 0, dumps_skipped: 0 });
    expect(rep.jobs_complete).toBeGreaterThanOrEqual(4);
    expect(rep.bundles_verified).toBe(2 * rep.jobs_complete); // both TP ranks of the replica, every dump
  }
  expect(out.rule).toBe(RULE);
  expect(out.pass).toBe(out.failures.length === 0);
  // Who received for each replica (one of its own ranks, as the flock says), and RSS across the run.
  expect(out.receivers).toHaveLength(2);
  for (const [i, rec] of out.receivers.entries()) {
    expect([2 * i, 2 * i + 1]).toContain(rec.global_rank);
    expect(rec.role).toMatch(/its host's receiver/);
  }
  const s = out.rss_samples;
  expect(s.waves.length).toBeGreaterThan(10);
  expect(s.coordinator_mb).toHaveLength(s.waves.length);
  expect(s.other_agents_max_mb).toHaveLength(s.waves.length);
  for (const r of s.receivers_mb) expect(r.mb).toHaveLength(s.waves.length);
  expect(Math.min(...s.coordinator_mb)).toBeGreaterThan(10);
  expect(s.peak_ratio_max).toBeGreaterThanOrEqual(1);
});
