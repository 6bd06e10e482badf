// Faults on the flight recorder's write-out (docs/recorder.md "Faults"; docs/faults.md): a real
// `wavebus agent` with WAVEBUS_RECORD_FORWARDS and a Python engine (wavebus_client's Client hello
// and Recorder) that fills the ring with large forwards; the engine is killed -9 and the agent
// flushes. (a) The agent is killed -9 in the middle of that flush. (b) The snapshot root is a small
// tmpfs that fills during the flush, or is full before it. Afterwards nothing partial is under a
// final name (every call<N> has its meta.json and every file it lists, of the recorded size and
// checksum) and crash-rank<g>.json, where there is one, says which forwards were written and
// which failed, with the error. A forward larger than its slot: test/recorder-ring.test.ts.
import * as fs from 'fs';
import * as path from 'path';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { buildReport } from '../src/tools/report';
import { PYTHON, ROOT, cleanup, cleanupMounts, describeAsRoot, freePortPair, mountTmpfs, spawnTracked, spawnWavebus, tmpDir, waitFor, type Spawned } from './helpers';

jest.setTimeout(120000);
afterAll(async () => {
  // Lazily unmounted first: cleanup() removes the temp dirs the mounts are in.
  cleanupMounts();
  await cleanup();
});

const MiB = 2 ** 20;

/** The engine: hello to its agent (the agent watches this pid), then `n` forwards of `bytes` each (int64, filled with the forward number) into the ring; then it waits to be killed. */
const ENGINE = `import sys, time, numpy as np
from wavebus_client.client import Client
from wavebus_client.recorder import Recorder
from wavebus_client import wavebus_pb2 as pb
n, nbytes = int(sys.argv[1]), int(sys.argv[2])
c = Client.connect()
for _ in range(600):
    if c.enabled:
        break
    time.sleep(0.05)
c.hello()
rec = Recorder(c._recorder_path)
for i in range(n):
    buf = np.full(nbytes // 8, i + 1, dtype=np.int64)
    ctx = pb.ForwardContext(compilation_hash="h", global_step=i + 1, req_ids=["r"])
    tin = pb.TensorInput(region="ids", offset=0, dtype="int64", shape=[nbytes // 8])
    rec.record(ctx, [tin], [(buf.ctypes.data, buf.nbytes)], i + 1)
print("recorded", rec.forwards, rec.too_large, flush=True)
time.sleep(600)
`;

/** waitFor, and on timeout the processes' logs as they are then. */
function until<T>(fn: () => T, what: string, ms: number, procs: Spawned[], everyMs?: number): Promise<NonNullable<T>> {
  return waitFor(fn, what, ms, everyMs).catch((e) => {
    throw new Error(`${(e as Error).message}\n${procs.map((p) => p.stderr().slice(-3000)).join('\n')}`);
  });
}

interface Job {
  dir: string;
  runDir: string;
  agent: Spawned;
  engine: Spawned;
  enginePid: number;
  /** <snapshot root>/recorder/crash-run: the crash flush's folder. */
  flushDir: string;
}

/** An agent (K forwards of `bytes`, snapshot root under `cacheRoot`; no coordinator answers) and its engine, with the ring filled. */
async function start(cacheRoot: string, k: number, bytes: number, forwards = k, runDir?: string): Promise<Job> {
  const dir = tmpDir('wavebus-faults-recorder-');
  runDir ??= path.join(dir, 'run');
  const port = await freePortPair();
  const env = { ...process.env, WAVEBUS_RECORD_FORWARDS: String(k), WAVEBUS_RECORD_MAX_BYTES: String(k * bytes), WAVEBUS_CACHE_ROOT: cacheRoot };
  // cwd: the agent's default dump root is relative to it.
  const agent = spawnWavebus(['agent', '--coordinator', `127.0.0.1:${port}`, '--rank', '0', '--world-size', '1', '--tp', '1', '--run-dir', runDir, '--dump-root', path.join(dir, 'dumps')], { env, cwd: dir });
  await until(() => fs.existsSync(path.join(runDir!, 'recorder-local0')) && fs.existsSync(path.join(runDir!, 'agent-local0.sock')), "the agent's ring and socket", 30000, [agent]);
  fs.writeFileSync(path.join(dir, 'engine.py'), ENGINE);
  const engine = spawnTracked(PYTHON, [path.join(dir, 'engine.py'), String(forwards), String(bytes)], {
    env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' }, cwd: dir,
  });
  await until(() => /recorded (\d+) 0/.test(engine.stdout()), `the engine's ${forwards} forwards in the ring`, 60000, [engine, agent]);
  return { dir, runDir, agent, engine, enginePid: engine.child.pid!, flushDir: path.join(cacheRoot, 'snapshots', 'recorder', 'crash-run') };
}

/** Names in `dir` (none when it is not there). */
const names = (dir: string): string[] => (fs.existsSync(dir) ? fs.readdirSync(dir) : []);

/**
 * Every call<N> under a final name in rank0/: whole (meta.json; every file it lists there, of the
 * size and checksum it records; the forward's bytes the engine wrote). Returns the forwards.
 */
function wholeForwards(flushDir: string, bytes: number): number[] {
  const rankDir = path.join(flushDir, 'h', 'rank0');
  const out: number[] = [];
  for (const n of names(rankDir).filter((x) => /^call\d+$/.test(x))) {
    const call = path.join(rankDir, n);
    const meta = JSON.parse(fs.readFileSync(path.join(call, 'meta.json'), 'utf8'));
    expect(meta.selected_by).toEqual(['recorder']);
    expect(`call${meta.recorder.forward}`).toBe(n);
    expect(meta.files.length).toBe(1);
    for (const f of meta.files) {
      const buf = fs.readFileSync(path.join(call, f.name));
      expect([buf.length, formatChecksum(crc32c(buf))]).toEqual([f.bytes, f.checksum]);
      // The npy's data: the engine's forward number in every int64.
      const data = buf.subarray(buf.length - bytes);
      expect(data.readBigInt64LE(0)).toBe(BigInt(meta.recorder.forward));
      expect(data.readBigInt64LE(bytes - 8)).toBe(BigInt(meta.recorder.forward));
    }
    expect(names(call).sort()).toEqual(['meta.json', ...meta.files.map((f: any) => f.name)].sort());
    out.push(meta.recorder.forward);
  }
  return out.sort((a, b) => a - b);
}

/** crash-rank0.json, if the agent wrote one. */
function crashFile(flushDir: string): any | undefined {
  const f = path.join(flushDir, 'crash-rank0.json');
  return fs.existsSync(f) ? JSON.parse(fs.readFileSync(f, 'utf8')) : undefined;
}

/** What `wavebus report` shows of the flush: rank 0's forwards, as its page writes them. */
function reportedForwards(root: string): string {
  const r = buildReport(root, { out: path.join(root, '..', 'page.html') });
  return /<td class="forwards">([^<]*)<\/td>/.exec(r.html)?.[1] ?? (/id="recorder-flushes" data-count="0"/.test(r.html) ? 'no flush' : '?');
}

test('kill -9 of the agent while it writes out a large ring: nothing partial under a final name, no crash file claiming forwards that are not there', async () => {
  const cache = path.join(tmpDir('wavebus-faults-recorder-cache-'), 'cache');
  const bytes = 48 * MiB;
  const job = await start(cache, 4, bytes);
  const rankDir = path.join(job.flushDir, 'h', 'rank0');
  process.kill(job.enginePid, 'SIGKILL');
  // Mid-flush: the temp dir of forward 1, 2 or 3 with its tensor being written (forward 4's 48 MiB
  // at least still to come, so the flush cannot end before the kill); polled tightly.
  await until(() => {
    const temp = names(rankDir).find((n) => /^\.call[1-3]\.tmp-/.test(n));
    return temp !== undefined && names(path.join(rankDir, temp)).length > 0 ? true : undefined;
  }, `a forward's temp dir in ${rankDir}`, 60000, [job.agent], 2);
  job.agent.child.kill('SIGKILL');
  expect(await job.agent.exited).toEqual({ code: null, signal: 'SIGKILL' });
  const left = names(rankDir);
  // The kill came mid-flush: a temp dir is left (hidden, named for the dead agent), never a final name.
  expect(left.filter((n) => !/^call\d+$/.test(n)).every((n) => /^\.call\d+\.tmp-\d+-[0-9a-f]{8}@/.test(n))).toBe(true);
  const whole = wholeForwards(job.flushDir, bytes);
  expect(whole.length).toBeLessThan(4);
  // The crash file is written after every forward: none claims what is not there.
  expect(crashFile(job.flushDir)).toBeUndefined();
  // `wavebus report` on the tree: the whole forwards only, the temp dirs not counted.
  expect(reportedForwards(cache)).toBe(whole.length ? `rank 0: ${whole[0]}${whole.length > 1 ? `-${whole[whole.length - 1]}` : ''}` : 'no flush');
  job.engine.child.kill('SIGKILL');
  await job.engine.exited;

  // The agent restarted on the same run dir, its engine too, which dies: the crash flush (the same
  // name) removes the dead agent's temp dirs and writes all four forwards.
  const again = await start(cache, 4, 1 * MiB, 4, job.runDir);
  process.kill(again.enginePid, 'SIGKILL');
  const crash2 = await until(() => crashFile(again.flushDir), 'crash-rank0.json after the restart', 60000, [again.agent]);
  expect(crash2.flushed.map((f: any) => [f.forward, f.call_dir !== ''])).toEqual([[1, true], [2, true], [3, true], [4, true]]);
  expect(wholeForwards(again.flushDir, 1 * MiB)).toEqual([1, 2, 3, 4]);
  expect(names(rankDir).sort()).toEqual(['call1', 'call2', 'call3', 'call4']);
  again.agent.child.kill('SIGTERM');
  expect((await again.agent.exited).code).toBe(0);
});

describeAsRoot('a snapshot root that fills during a crash flush (tmpfs)', () => {
  const mounts = tmpDir('wavebus-faults-recorder-mnt-');

  test('the forwards that fit are whole under final names, the rest nowhere; crash-rank0.json names each failed one with ERR_ENOSPC', async () => {
    const mnt = path.join(mounts, 'fills');
    // 14 MiB: three forwards of 4 MiB (an npy, a meta.json) and the crash file fit, not the fourth.
    mountTmpfs(mnt, '14m');
    const bytes = 4 * MiB;
    const job = await start(mnt, 4, bytes);
    process.kill(job.enginePid, 'SIGKILL');
    const crash = await until(() => crashFile(job.flushDir), 'crash-rank0.json', 30000, [job.agent]);
    const whole = wholeForwards(job.flushDir, bytes);
    expect(whole).toEqual([1, 2, 3]);
    // Nothing else under rank0/: the failed forward's temp dir was removed.
    expect(names(path.join(job.flushDir, 'h', 'rank0')).sort()).toEqual(['call1', 'call2', 'call3']);
    expect(crash.forwards_recorded).toBe(4);
    expect(crash.flushed.map((f: any) => [f.forward, f.call_dir !== '', f.error_code ?? null])).toEqual([[1, true, null], [2, true, null], [3, true, null], [4, false, 'ERR_ENOSPC']]);
    expect(crash.flushed[3].error).toMatch(/ENOSPC|no space/i);
    for (const f of crash.flushed.slice(0, 3)) expect(f.call_dir).toBe(path.join(job.flushDir, 'h', 'rank0', `call${f.forward}`));
    // The agent goes on, and stops cleanly.
    expect(job.agent.child.exitCode).toBeNull();
    job.engine.child.kill('SIGKILL');
    job.agent.child.kill('SIGTERM');
    expect((await job.agent.exited).code).toBe(0);
  });

  test('a snapshot root already full: no forward and no crash file can be written; the agent says so in its log and goes on', async () => {
    const mnt = path.join(mounts, 'full');
    mountTmpfs(mnt, '4m');
    const bytes = 1 * MiB;
    const job = await start(mnt, 2, bytes);
    // Fill what is left (the agent's folders exist already or are made in the flush).
    const filler = path.join(mnt, 'filler');
    const fd = fs.openSync(filler, 'w');
    try {
      for (;;) fs.writeSync(fd, Buffer.alloc(64 * 1024, 1));
    } catch (e) {
      expect((e as NodeJS.ErrnoException).code).toBe('ENOSPC');
    } finally {
      fs.closeSync(fd);
    }
    process.kill(job.enginePid, 'SIGKILL');
    const line = await until(() => job.agent.stderr().split('\n').find((l) => /crash-rank0\.json could not be written/.test(l)), "the agent's log line", 30000, [job.agent]);
    const log = JSON.parse(line);
    expect(log.err).toMatch(/ENOSPC/);
    expect(log.failed).toEqual([{ forward: 1, error_code: 'ERR_ENOSPC' }, { forward: 2, error_code: 'ERR_ENOSPC' }]);
    expect(crashFile(job.flushDir)).toBeUndefined();
    expect(names(path.join(job.flushDir, 'h', 'rank0')).filter((n) => !n.startsWith('.'))).toEqual([]);
    expect(names(path.join(job.flushDir, 'h', 'rank0')).filter((n) => n.startsWith('.'))).toEqual([]);
    expect(job.agent.child.exitCode).toBeNull();
    job.engine.child.kill('SIGKILL');
    job.agent.child.kill('SIGTERM');
    expect((await job.agent.exited).code).toBe(0);
  });
});
