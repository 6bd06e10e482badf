// The TypeScript client's flight recorder and registerWeights, on the sim engine (`wavebus sim`,
// src/sim) under `wavebus launch`: a DP=2 job with WAVEBUS_RECORD_FORWARDS=4 and --weights, one
// weight byte flipped on rank 1 and a NaN incident. The incident report's fingerprint_diff names
// the flipped shard; then kill -9 of both sim ranks leaves crash-rank<g>.json with each rank's
// last K forwards flushed, which `wavebus inspect --verify` accepts and whose bytes are the inputs
// the sim wrote for that step. And an uncaught exception in a sim rank leaves its note (the
// client's uncaughtExceptionMonitor) in crash-rank0.json.
import * as fs from 'fs';
import * as path from 'path';
import { loadCallDir } from '../src/snapshot/loader';
import { recorderPath } from '../src/paths';
import { layout } from '../src/shm-layouts';
import { Agent } from '../src/agent/agent';
import { WavebusClient } from '../src/client/client';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { ShmSegment } from '../src/memory';
import { CLI, cleanup, freePortPair, runWavebus, spawnWavebus, tmpDir, waitFor } from './helpers';

afterAll(cleanup);

const K = 4;

/** Forwards the engine client has begun in its ring (the header's count, read as the agent reads it). */
function forwardsIn(ring: string): number {
  const f = layout('recorder').field('header', 'forwards');
  try {
    const fd = fs.openSync(ring, 'r');
    try {
      const b = Buffer.alloc(f.bytes);
      fs.readSync(fd, b, 0, f.bytes, f.at);
      return Number(b.readBigUInt64LE(0));
    } finally {
      fs.closeSync(fd);
    }
  } catch {
    return 0;
  }
}

test('a sim job records its last K forwards through the TypeScript client: kill -9 leaves crash files inspect --verify accepts; registerWeights puts the flipped shard in the incident diff', async () => {
  const dir = tmpDir('wavebus-recorder-ts-');
  const ranks = path.join(dir, 'ranks');
  const port = await freePortPair();
  const runtimeConfig = {
    detector: { logits_finite: { enabled: true }, token_repeat: { enabled: false }, garbled: { enabled: false }, spec_acceptance: { enabled: false } },
    actions: { defaults: { on_trigger: ['report'] } },
    // The flushed bundles keep input_ids (else withheld): the test compares them with the sim's.
    report: { save_sensitive_info: true },
  };
  const launch = spawnWavebus(
    [
      'launch', '--nproc-per-node', '2', '--tp', '1', '--dp', '2', '--port', String(port), '--run-dir', path.join(dir, 'run'),
      '--additional-config', JSON.stringify({ runtime_config: runtimeConfig }),
      '--', process.execPath, CLI, 'sim', '--steps', '100000', '--step-ms', '20', '--requests', '4', '--layers', '2', '--num-blocks', '64',
      '--result-dir', ranks, '--weights', '--faults', JSON.stringify({ nonFinite: { request: 0, at: 10 }, weightFlip: { rank: 1 } }),
    ],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache'), WAVEBUS_RECORD_FORWARDS: String(K), WAVEBUS_LOG_LEVEL: 'warn' }, cwd: dir },
  );
  const until = async <T>(fn: () => T | undefined, what: string, ms: number): Promise<T> => {
    try {
      return await waitFor(fn, what, ms);
    } catch (e) {
      throw new Error(`${(e as Error).message}\n${launch.stderr().slice(-6000)}`);
    }
  };
  // The incident: its report carries the weight difference registerWeights made visible.
  const reportDir = path.join(dir, 'runtime', 'report', 'logits_finite');
  const report = await until(() => {
    const files = fs.existsSync(reportDir) ? fs.readdirSync(reportDir) : [];
    return files.length > 0 ? JSON.parse(fs.readFileSync(path.join(reportDir, files[0]), 'utf8')) : undefined;
  }, 'a logits_finite incident report', 120000);
  expect(report.fingerprint_diff.ranks).toEqual([0, 1]);
  expect(report.fingerprint_diff.differences).toEqual([
    {
      kind: 'weight', name: 'model.layers.0.mlp.weight', among: 'pp0_tp0_cp0',
      values: [{ value: expect.stringMatching(/^crc32c:[0-9a-f]{8}$/), ranks: [0] }, { value: expect.stringMatching(/^crc32c:[0-9a-f]{8}$/), ranks: [1] }],
    },
  ]);

  // kill -9 of both sim ranks, mid-run, once each has filled its ring twice over (DP replicas step
  // apart: the incident's replica may be ahead of the other).
  const runDir = path.join(dir, 'run');
  await until(() => ([0, 1].every((r) => forwardsIn(recorderPath(runDir, r)) >= 2 * K) ? true : undefined), `both rings past ${2 * K} forwards`, 60000);
  const pids = [0, 1].map((g) => Number(fs.readFileSync(path.join(ranks, `pid-rank${g}`), 'utf8')));
  for (const pid of pids) process.kill(pid, 'SIGKILL');
  const flushRoot = path.join(dir, 'cache', 'snapshots', 'recorder');
  const flush = await until(() => {
    const names = fs.existsSync(flushRoot) ? fs.readdirSync(flushRoot).filter((n) => n.startsWith('crash-')) : [];
    if (names.length !== 1) return undefined;
    const files = [0, 1].map((g) => path.join(flushRoot, names[0], `crash-rank${g}.json`));
    if (!files.every((f) => fs.existsSync(f))) return undefined;
    return { dir: path.join(flushRoot, names[0]), crash: files.map((f) => JSON.parse(fs.readFileSync(f, 'utf8'))) };
  }, 'crash-rank0.json and crash-rank1.json', 60000);
  await launch.exited;

  // Each rank on its own (DP ranks step apart, and ranks killed one after another may stop a
  // forward apart): its last K forwards, one being written at the kill named in left_out.
  for (const [g, c] of flush.crash.entries()) {
    expect(c.global_rank).toBe(g);
    expect(c.engine_pid).toBe(pids[g]);
    expect(c.forwards_recorded).toBeGreaterThanOrEqual(2 * K);
    const want = Array.from({ length: K }, (_, i) => c.forwards_recorded - K + 1 + i);
    const got = [...c.flushed.map((f: any) => f.forward), ...c.left_out.map((t: any) => t.forward)].sort((a: number, b: number) => a - b);
    expect(got).toEqual(want);
    expect(c.flushed.length).toBeGreaterThanOrEqual(K - 1);
    expect(c.last_forward.compilation_hash).toMatch(/^sim-(prefill|decode)-tp1$/);
    expect(fs.statSync(path.join(flush.dir, `crash-rank${g}.json`)).mode & 0o777).toBe(0o600);
    for (const f of c.flushed) {
      expect(f.too_large).toBeFalsy();
      const callDir: string = f.call_dir;
      expect(callDir.startsWith(flush.dir + path.sep)).toBe(true);
      const meta = JSON.parse(fs.readFileSync(path.join(callDir, 'meta.json'), 'utf8'));
      expect(meta.selected_by).toEqual(['recorder']);
      expect(meta.recorder.forward).toBe(f.forward);
      // The sim's step N is its forward N (one forward per step); positions as the sim wrote them.
      expect(meta.global_step).toBe(f.forward);
      expect(meta.inputs.map((i: any) => i.dtype)).toEqual(['int32', 'int64']);
      // The bytes are that forward's: the positions buffer the sim filled for it is its context's positions.
      const loaded = await loadCallDir(callDir);
      const pos = loaded.tensors[1].data;
      const rows = Array.from({ length: pos.length / 8 }, (_, i) => Number(pos.readBigInt64LE(i * 8)));
      expect(rows).toEqual(meta.positions);
      expect(rows.length).toBeGreaterThan(0);
    }
  }
  const inspect = runWavebus(['inspect', flush.dir, '--verify']);
  if (inspect.code !== 0) throw new Error(`inspect --verify: ${inspect.stdout}${inspect.stderr}`);
  expect(inspect.stdout).toMatch(/snapshot/i);
}, 240000);

test('an uncaught exception in a TypeScript engine (the sim rank, at forward 6): crash-rank0.json carries its note and the forwards up to 6', async () => {
  const dir = tmpDir('wavebus-recorder-ts-');
  const port = await freePortPair();
  // save_sensitive_info true: the note keeps the exception's message (else its type only).
  const launch = spawnWavebus(
    [
      'launch', '--nproc-per-node', '1', '--port', String(port), '--run-dir', path.join(dir, 'run'),
      '--additional-config', JSON.stringify({ runtime_config: { report: { save_sensitive_info: true } } }),
      '--', process.execPath, CLI, 'sim', '--steps', '1000', '--step-ms', '20', '--requests', '2', '--layers', '1', '--num-blocks', '16',
      '--result-dir', path.join(dir, 'ranks'), '--faults', JSON.stringify({ uncaught: { rank: 0, at: 6 } }),
    ],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache'), WAVEBUS_RECORD_FORWARDS: String(K), WAVEBUS_LOG_LEVEL: 'warn' }, cwd: dir },
  );
  const { code } = await launch.exited;
  expect(code).not.toBe(0); // the engine died
  const flushRoot = path.join(dir, 'cache', 'snapshots', 'recorder');
  const names = fs.readdirSync(flushRoot).filter((n) => n.startsWith('crash-'));
  expect(names).toHaveLength(1);
  const crash = JSON.parse(fs.readFileSync(path.join(flushRoot, names[0], 'crash-rank0.json'), 'utf8'));
  expect(crash.note).toBe('uncaught Error: injected fault: uncaught exception in forward 6');
  expect(crash.forwards_recorded).toBe(6);
  expect(crash.flushed.map((f: any) => f.forward)).toEqual([3, 4, 5, 6]);
  expect(crash.left_out).toEqual([]);
  const inspect = runWavebus(['inspect', path.join(flushRoot, names[0]), '--verify']);
  if (inspect.code !== 0) throw new Error(`inspect --verify: ${inspect.stdout}${inspect.stderr}`);
}, 180000);

test('the client never fails a forward for the recorder: an input whose segment is gone is not recorded (counted, lastError), a bad shape is refused naming it, the others are recorded', async () => {
  const runDir = tmpDir('wavebus-recorder-ts-run-');
  const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
  const agent = new Agent({ identity, runDir, logger: createLogger('recorder-ts', 'error'), roots: { dumps: path.join(runDir, 'dumps') }, recorder: { forwards: K, maxBytes: K * 8192 } });
  await agent.start();
  const names = [`/wbrec-ts-${process.pid}-a`, `/wbrec-ts-${process.pid}-b`];
  const segs = names.map((n) => ShmSegment.create(n, 1024));
  const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
  try {
    await client.register({ name: 'input_ids', shmName: names[0], nbytes: 1024, dtype: 'int32', shape: [256], role: 'input' });
    await client.register({ name: 'gone', shmName: names[1], nbytes: 1024, dtype: 'int32', shape: [256], role: 'input' });
    segs[1].close();
    ShmSegment.unlink(names[1]);
    const ctx = { compilationHash: 'h', globalStep: 1 };
    await expect(client.beforeForward(ctx, [{ region: 'gone', dtype: 'int32', shape: [4] }])).resolves.toEqual({ captured: false });
    expect(client.stats).toMatchObject({ recorded: 0, notRecorded: 1 });
    expect(client.lastError).toMatch(/not recorded: region 'gone': its segment \/wbrec-ts-\d+-b cannot be mapped/);
    await expect(client.beforeForward(ctx, [{ region: 'input_ids', dtype: 'int32', shape: [-1] }])).rejects.toThrow(/inputs\[0\]\.shape must be a list of non-negative integers/);
    segs[0].buffer().writeInt32LE(42, 0);
    await client.beforeForward({ ...ctx, globalStep: 2 }, [{ region: 'input_ids', dtype: 'int32', shape: [4] }]);
    expect(client.stats).toMatchObject({ recorded: 1, notRecorded: 1 });
  } finally {
    await client.close();
    await agent.stop();
    segs[0].close();
    ShmSegment.unlink(names[0]);
  }
}, 60000);
