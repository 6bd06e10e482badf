// The flight recorder against the PyTorch engine (examples/torch-engine) under `wavebus launch`:
// kill -9 every engine rank mid-run, and an uncaught Python exception inside a forward on one
// rank. Each agent flushes its ring after the engine dies; the last K forwards replay off-line bit
// for bit (replay.py, the same check as snapshots) and crash-rank<g>.json says what happened.
import * as fs from 'fs';
import * as path from 'path';
import { spawnSync } from 'child_process';
import { ROOT, cleanup, freePort, freePortPair, readManifests, spawnWavebus, tmpDir, waitFor } from './helpers';
import { torchRanks } from './torch2';

afterAll(cleanup);

const ENGINE = path.join(ROOT, 'examples', 'torch-engine');
const K = 4;

// How the engine's ranks start: torch 2.x's torchrun (the stand-in where torch 2.x is absent); its python for what reads their files.
const RANKS = torchRanks();

function python(args: string[]): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync(RANKS.python, args, { encoding: 'utf8', timeout: 120000, env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python') } });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

// Replay needs the token ids: every job here runs with report.save_sensitive_info true (with false
// the recorder withholds input_ids, with "hashed" it writes their keyed hashes; docs/recorder.md).
const KEEP_TOKENS = { report: { save_sensitive_info: true } };

async function launch(engineArgs: string[], launchArgs: string[] = [], k = K) {
  const dir = tmpDir('wavebus-recorder-');
  const out = path.join(dir, 'out');
  const port = await freePortPair();
  const proc = spawnWavebus(
    ['launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--run-dir', path.join(dir, 'run'), ...launchArgs,
      '--', ...RANKS.command(path.join(ENGINE, 'engine.py'), { nproc: 2 }), '--out', out, '--save-every-forward', ...engineArgs],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache'), WAVEBUS_RECORD_FORWARDS: String(k) }, cwd: dir },
  );
  const until = async <T>(fn: () => T, what: string, ms: number) => {
    try {
      return await waitFor(fn, what, ms);
    } catch (e) {
      throw new Error(`${(e as Error).message}\n${proc.stderr().slice(-6000)}`);
    }
  };
  return { dir, out, proc, port, until, flushRoot: path.join(dir, 'cache', 'snapshots', 'recorder') };
}

/** The crash flush folder (one per launch) once both ranks wrote their crash-rank<g>.json. */
function crashFlush(flushRoot: string): { dir: string; crash: any[] } | undefined {
  if (!fs.existsSync(flushRoot)) return undefined;
  const names = fs.readdirSync(flushRoot).filter((n) => n.startsWith('crash-'));
  if (names.length !== 1) return undefined;
  const dir = path.join(flushRoot, names[0]);
  const files = [0, 1].map((g) => path.join(dir, `crash-rank${g}.json`));
  if (!files.every((f) => fs.existsSync(f))) return undefined;
  return { dir, crash: files.map((f) => JSON.parse(fs.readFileSync(f, 'utf8'))) };
}

/** Every flushed call of both ranks replays bit for bit against the engine's own logits. */
function replayAll(snaps: string, out: string): number[] {
  const calls = [0, 1].map((g) => fs.readdirSync(path.join(snaps, `rank${g}`)).filter((n) => /^call\d+$/.test(n)).map((n) => Number(n.slice(4))).sort((a, b) => a - b));
  expect(calls[1]).toEqual(calls[0]);
  for (const call of calls[0]) {
    const meta = JSON.parse(fs.readFileSync(path.join(snaps, 'rank0', `call${call}`, 'meta.json'), 'utf8'));
    expect(meta.selected_by).toEqual(['recorder']);
    expect(meta.recorder.forward).toBe(call);
    expect([meta.recorder.save_sensitive_info, meta.withheld, meta.hashed]).toEqual([true, undefined, undefined]);
    expect(fs.statSync(path.join(snaps, 'rank0', `call${call}`, 'meta.json')).mode & 0o777).toBe(0o600);
    const r = python([path.join(ENGINE, 'replay.py'), '--snapshots', snaps, '--call', String(call), '--engine-out', out]);
    if (r.code !== 0) throw new Error(`replay call${call}: ${r.stdout}${r.stderr}`);
    // Python's json writes NaN: logits holding a NaN (after the NaN incident) give a NaN difference even when bit for bit equal.
    const lines = r.stdout.trim().split('\n').map((l) => JSON.parse(l.replace(/\bNaN\b/g, 'null')));
    expect(lines.map((l) => [l.rank, l.bitwise_equal, l.max_abs_diff ?? 0])).toEqual([[0, true, 0], [1, true, 0]]);
  }
  return calls[0];
}

test('kill -9 of every engine rank mid-run: each agent flushes its last K forwards, which replay off-line bit for bit', async () => {
  const run = await launch(['--requests', '4', '--max-tokens', '400', '--arrive-every', '1', '--step-sleep-ms', '30'], ['--additional-config', JSON.stringify({ runtime_config: KEEP_TOKENS })]);
  // Mid-run: both ranks past forward 12 (their logits saved), far from the end (400 tokens).
  await run.until(() => [0, 1].every((g) => fs.existsSync(path.join(run.out, `forward_rank${g}_step12.pt`))), 'forward 12 on both ranks', 90000);
  const pids = [0, 1].map((g) => Number(fs.readFileSync(path.join(run.out, `pid_rank${g}`), 'utf8')));
  for (const pid of pids) process.kill(pid, 'SIGKILL');
  const flush = await run.until(() => crashFlush(run.flushRoot), 'crash-rank0.json and crash-rank1.json', 30000);
  await run.proc.exited;
  for (const [g, c] of flush.crash.entries()) {
    expect(c.global_rank).toBe(g);
    expect(c.engine_pid).toBe(pids[g]);
    expect(c.forwards_recorded).toBeGreaterThanOrEqual(12);
    // The last K forwards, oldest first (one being written when the kill came is left out and named).
    const want = Array.from({ length: K }, (_, i) => c.forwards_recorded - K + 1 + i);
    const got = [...c.flushed.map((f: any) => f.forward), ...c.left_out.map((t: any) => t.forward)].sort((a: number, b: number) => a - b);
    expect(got).toEqual(want);
    expect(c.last_forward.compilation_hash).toBe('torch-engine-tp2');
    expect(fs.statSync(path.join(flush.dir, `crash-rank${g}.json`)).mode & 0o777).toBe(0o600);
  }
  const snaps = path.join(flush.dir, 'torch-engine-tp2');
  // The ranks die one after the other and record a forward's inputs before its first collective,
  // so their newest forwards may differ by one (CI saw call 13 on rank 0 only; killing rank 1 first
  // gives rank 0 10..13 and rank 1 9..12). A call on one rank only is outside the other's last K,
  // or the one the other was writing when its kill came (named in its left_out).
  const callsOf = (g: number) => fs.readdirSync(path.join(snaps, `rank${g}`)).filter((n) => /^call\d+$/.test(n)).map((n) => Number(n.slice(4)));
  const flushed = [0, 1].map((g) => new Set(callsOf(g)));
  const oneRankOnly: number[] = [];
  for (const g of [0, 1]) {
    for (const call of flushed[g]) {
      if (flushed[1 - g].has(call)) continue;
      const other = flush.crash[1 - g];
      const inWindow = call > other.forwards_recorded - K && call <= other.forwards_recorded;
      if (inWindow) expect(other.left_out.map((t: any) => t.forward)).toContain(call);
      oneRankOnly.push(call);
    }
  }
  // The engine saves a forward's logits after it: the kill may come between the record and the save.
  const withLogits = (call: number) => {
    const g = flushed[0].has(call) ? 0 : 1;
    const meta = JSON.parse(fs.readFileSync(path.join(snaps, `rank${g}`, `call${call}`, 'meta.json'), 'utf8'));
    return [0, 1].every((r) => fs.existsSync(path.join(run.out, `forward_rank${r}_step${meta.global_step}.pt`)));
  };
  const union = [...new Set([...flushed[0], ...flushed[1]])].sort((a, b) => a - b);
  const unsaved = union.filter((c) => !withLogits(c));
  // Only the newest forward of either rank can lack its logits.
  for (const c of unsaved) expect(c).toBeGreaterThanOrEqual(union[union.length - 1] - 1);
  // Every call on both ranks with its logits replays: K - 1 of them when the ranks died on the same
  // forward, K - 2 at worst when one was a forward ahead.
  const setAside = new Set([...unsaved, ...oneRankOnly]);
  for (const c of setAside) for (const g of [0, 1]) fs.rmSync(path.join(snaps, `rank${g}`, `call${c}`), { recursive: true, force: true });
  const replayed = replayAll(snaps, run.out);
  expect(replayed).toEqual(union.filter((c) => !setAside.has(c)));
  expect(replayed.length).toBeGreaterThanOrEqual(K - 2);
}, 180000);

test('an uncaught Python exception inside a forward on one rank: crash-rank<g>.json names it, and the flushed forwards include that one', async () => {
  // The coordinator lingers after the engine ended: /healthz and /metrics say what the agents reported.
  const metricsPort = await freePort();
  // save_sensitive_info true: crash-rank<g>.json keeps the exception's message (else its type only).
  const config = { runtime_config: KEEP_TOKENS };
  const run = await launch(['--requests', '2', '--max-tokens', '40', '--arrive-every', '1', '--raise-at', '9:1'], ['--linger-ms', '60000', '--metrics-port', String(metricsPort), '--additional-config', JSON.stringify(config)]);
  const flush = await run.until(() => crashFlush(run.flushRoot), 'crash-rank0.json and crash-rank1.json', 90000);
  const health = await run.until(async () => {
    const h = (await (await fetch(`http://127.0.0.1:${metricsPort}/healthz`)).json()) as any;
    return h.engine_crashes?.length === 2 ? h : undefined;
  }, 'both crashes in /healthz', 30000);
  const byRank = new Map<number, any>(health.engine_crashes.map((c: any) => [c.rank, c]));
  expect(byRank.get(1)).toMatchObject({ note: 'RuntimeError', forwards_flushed: K, flush_dir: flush.dir, engine_pid: Number(fs.readFileSync(path.join(run.out, 'pid_rank1'), 'utf8')) });
  const metrics = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
  expect(metrics).toMatch(/^wavebus_engine_crashes_total\{rank="1"\} 1$/m);
  run.proc.child.kill('SIGTERM');
  await run.proc.exited;
  const [c0, c1] = flush.crash;
  expect(c1.note).toContain('uncaught RuntimeError: engine: --raise-at 9:1');
  // Rank 1 recorded forward 9 (its inputs were staged and offered) before raising inside it.
  expect(c1.last_forward.global_step).toBe(9);
  expect(c1.flushed.map((f: any) => f.global_step)).toContain(9);
  expect(c0.forwards_recorded).toBeGreaterThanOrEqual(8);
  // The forwards before 9 replay bit for bit (9 itself never finished: no logits to compare with).
  const snaps = path.join(flush.dir, 'torch-engine-tp2');
  const step9 = fs.readdirSync(path.join(snaps, 'rank1')).find((n) => JSON.parse(fs.readFileSync(path.join(snaps, 'rank1', n, 'meta.json'), 'utf8')).global_step === 9);
  expect(step9).toBeDefined();
  for (const g of [0, 1]) fs.rmSync(path.join(snaps, `rank${g}`, step9!), { recursive: true, force: true });
  expect(replayAll(snaps, run.out).length).toBeGreaterThanOrEqual(K - 1);
}, 180000);

test('wavebus capture --flush-recorder on a running TP=2 job: both ranks write out the same forwards, which replay bit for bit', async () => {
  // A detector on (report only) keeps the wave bus in use: the flush travels as a capture arm on it.
  const config = { runtime_config: { ...KEEP_TOKENS, detector: { token_repeat: { enabled: true } }, actions: { defaults: { on_trigger: ['report'] } } } };
  const run = await launch(['--requests', '2', '--max-tokens', '120', '--arrive-every', '1', '--step-sleep-ms', '30'],
    ['--additional-config', JSON.stringify(config), '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000']);
  await run.until(() => [0, 1].every((g) => fs.existsSync(path.join(run.out, `forward_rank${g}_step10.pt`))), 'forward 10 on both ranks', 90000);
  const token = path.join(run.dir, 'run', 'bus.token');
  const cap = spawnWavebus(['capture', '--coordinator', `127.0.0.1:${run.port}`, '--bus-token-file', token, '--flush-recorder', '--wait', '--timeout', '60000']);
  const capExit = await cap.exited;
  expect({ code: capExit.code, stderr: cap.stderr() }).toEqual({ code: 0, stderr: '' });
  const lines = [...cap.stdout().matchAll(/^rank (\d+) wave (\d+): (.+)$/gm)].map((m) => ({ rank: Number(m[1]), wave: Number(m[2]), dir: m[3] }));
  expect(lines.map((l) => l.rank).sort()).toEqual([0, 1]);
  expect(lines[0].dir).toBe(lines[1].dir);
  expect(path.dirname(lines[0].dir)).toBe(run.flushRoot);
  const { code } = await run.proc.exited;
  expect(code).toBe(0);
  const snaps = path.join(lines[0].dir, 'torch-engine-tp2');
  const calls = replayAll(snaps, run.out);
  // K-1 unless this host starved the agent while its engine ran two forwards past the wave (the
  // ring's oldest were overwritten: docs/recorder.md); replayAll checked both ranks wrote the same.
  expect(calls.length).toBeGreaterThanOrEqual(1);
  expect(calls.length).toBeLessThanOrEqual(K - 1);
  // Consecutive forwards, none past the arm's wave.
  expect(calls).toEqual(Array.from({ length: calls.length }, (_, i) => calls[0] + i));
  for (const c of calls) expect(JSON.parse(fs.readFileSync(path.join(snaps, 'rank0', `call${c}`, 'meta.json'), 'utf8')).recorder.wave).toBeLessThanOrEqual(lines[0].wave);
}, 180000);

test('a NaN incident (logits_finite, dump_kv): every rank flushes the same forwards, the one where the NaN appeared among them; the others replay bit for bit', async () => {
  const config = { runtime_config: { ...KEEP_TOKENS, detector: { logits_finite: { enabled: true } }, actions: { defaults: { on_trigger: ['report', 'dump_kv'] } }, dump: { auto_max_times: 4, free_headroom_bytes: 0 } } };
  const run = await launch(['--requests', '4', '--max-tokens', '24', '--fault', 'nan:8:1'], ['--additional-config', JSON.stringify(config), '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000'], 8);
  const { code } = await run.proc.exited;
  expect(code).toBe(0);
  const flushes = fs.existsSync(run.flushRoot) ? fs.readdirSync(run.flushRoot).filter((n) => n.startsWith('incident-wave')) : [];
  if (flushes.length === 0) throw new Error(`no incident flush in ${run.flushRoot}:\n${run.proc.stderr().split('\n').filter((l) => /recorder|dump|incident|logits/i.test(l)).join('\n').slice(-4000)}`);
  const snaps = path.join(run.flushRoot, flushes.sort()[0], 'torch-engine-tp2');
  const stepOf = (g: number, call: string) => JSON.parse(fs.readFileSync(path.join(snaps, `rank${g}`, call, 'meta.json'), 'utf8')).global_step;
  const nanCall = fs.readdirSync(path.join(snaps, 'rank0')).find((c) => stepOf(0, c) === 8);
  expect(nanCall).toBeDefined();
  expect(stepOf(1, nanCall!)).toBe(8);
  // Each rank's dump ack accounts for its flush: the manifest lists the forwards on disk, no more.
  const flushName = flushes.sort()[0];
  const manifests = readManifests<{ arm_wave: number; recorder_flush?: Record<string, { dir: string; forwards: number[]; left_out: number[] }> }>(run.dir).filter(
    (m) => m.recorder_flush && Object.values(m.recorder_flush).some((r) => r.dir === path.join('recorder', flushName)),
  );
  expect(manifests.length).toBeGreaterThan(0);
  for (const g of [0, 1]) {
    const onDisk = fs.readdirSync(path.join(snaps, `rank${g}`)).filter((n) => /^call\d+$/.test(n)).map((n) => Number(n.slice(4))).sort((a, b) => a - b);
    expect(manifests[0].recorder_flush![g]).toEqual({ dir: path.join('recorder', flushName), forwards: onDisk, left_out: [] });
  }
  // The fault is planted in the weights during forward 8 (not an input): its replay with clean
  // weights differs; every other flushed forward, those after it reading the NaN in their KV cache
  // included, replays bit for bit.
  for (const g of [0, 1]) fs.rmSync(path.join(snaps, `rank${g}`, nanCall!), { recursive: true });
  expect(replayAll(snaps, run.out).length).toBeGreaterThanOrEqual(3);
  // The forward where the NaN appeared: its logits hold one.
  const logits = python(['-c', `import torch,sys; print(bool(torch.isnan(torch.load(sys.argv[1])["logits"]).any()))`, path.join(run.out, 'forward_rank0_step8.pt')]);
  expect(logits.stdout.trim()).toBe('True');
}, 180000);
