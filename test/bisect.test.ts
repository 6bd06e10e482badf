// `wavebus bisect` against the real PyTorch engine (examples/torch-engine, torch on the CPU): a TP=2
// run under `wavebus launch` captures a snapshot; replay.py replays it with the probe on at TP=2
// and at TP=1 (the reference), healthy and with faults made by real means (a corrupted weight shard,
// an all-reduce that loses a rank's part, a NaN written by a module), and bisect names the module
// and rank. PP: probe trees of a two-stage run (test/python/probe_pp.py). The probe itself:
// test/python/probe_check.py.
import * as fs from 'fs';
import * as path from 'path';
import { spawnSync } from 'child_process';
import { ROOT, cleanup, freePortPair, runWavebus, spawnWavebus, tmpDir } from './helpers';
import { torchRanks } from './torch2';

afterAll(cleanup);

// How the engine's ranks start: torch 2.x's torchrun (the stand-in where torch 2.x is absent); its python for what reads their files.
const RANKS = torchRanks();

const REPLAY = path.join(ROOT, 'examples', 'torch-engine', 'replay.py');
let dir = '';
let snaps = '';
let call = '';
/** The engine's outputs of the run whose capture is used. */
let eng = '';

function python(args: string[]): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync(RANKS.python, args, { encoding: 'utf8', timeout: 120000, env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python') } });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** replay.py with the probe on into dir/<name>; returns its JSON lines. */
function probe(name: string, args: string[]): Record<string, unknown>[] {
  const r = python([REPLAY, '--snapshots', snaps, '--call', call, '--probe', path.join(dir, name), ...args]);
  if (r.code !== 0) throw new Error(`replay ${args.join(' ')}: exit ${r.code}\n${r.stdout}${r.stderr}`);
  return r.stdout.trim().split('\n').map((l) => JSON.parse(l));
}

function bisect(a: string, b: string, ...flags: string[]) {
  const r = runWavebus(['bisect', path.join(dir, a), path.join(dir, b), ...flags]);
  return { ...r, doc: flags.includes('--json') && r.stdout ? JSON.parse(r.stdout) : undefined };
}

/**
 * One TP=2 run under `wavebus launch` with one capture armed at startup (req-1 or token 20, budget 1).
 * The engine never waits for its agent beyond a bound (50 ms): an agent not scheduled in time (a
 * loaded host) makes before_forward return "not captured", the client warns and counts it
 * (`snapshots_skipped`, in the engine's rank<g>.json), and that forward is never captured later. So a
 * run whose capture is not whole on both ranks is retried only when a rank says it skipped one; a
 * capture missing with nothing skipped is a defect, and fails here.
 */
async function captureRun(run: string, port: number): Promise<{ snaps: string; call: string } | { missed: string }> {
  const engine = path.join(ROOT, 'examples', 'torch-engine');
  const launch = spawnWavebus(
    // The agents' end-of-wave bound (also the bound of before_forward's answer) wider than the
    // default 50 ms: on this 2-vCPU host under other suites' load an agent answered the armed
    // capture late and the client rightly skipped it; what is checked here is bisect, not speed.
    ['launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000', '--', ...RANKS.command(path.join(engine, 'engine.py'), { nproc: 2 }), '--out', path.join(run, 'eng'), '--max-tokens', '12', '--result-dir', path.join(run, 'ranks')],
    {
      cwd: run,
      env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(run, 'cache'), WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'req-1', WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '20', WAVEBUS_SNAPSHOT_MAX_CAPTURES: '1' },
    },
  );
  const { code } = await launch.exited;
  if (code !== 0) throw new Error(`launch exited ${code}\n${launch.stderr().slice(-4000)}`);
  const snapDir = path.join(run, 'cache', 'snapshots', 'torch-engine-tp2');
  const ranks = [0, 1].map((g) => {
    const calls = fs.existsSync(path.join(snapDir, `rank${g}`)) ? fs.readdirSync(path.join(snapDir, `rank${g}`)) : [];
    const counts = JSON.parse(fs.readFileSync(path.join(run, 'ranks', `rank${g}.json`), 'utf8')) as { captures: number; snapshotsSkipped: number };
    return { g, calls, ...counts };
  });
  if (ranks.every((r) => r.calls.length === 1 && r.captures === 1) && ranks[0].calls[0] === ranks[1].calls[0]) return { snaps: snapDir, call: ranks[0].calls[0].slice(4) };
  const said = ranks.map((r) => `rank ${r.g}: calls [${r.calls.join(', ')}], captures ${r.captures}, snapshots skipped ${r.snapshotsSkipped}`).join('; ');
  if (ranks.some((r) => r.snapshotsSkipped > 0)) return { missed: said };
  throw new Error(`the capture is not whole on both ranks and no rank reported a skipped one: ${said}`);
}

beforeAll(async () => {
  dir = tmpDir('wavebus-bisect-');
  const misses: string[] = [];
  for (let attempt = 0; attempt < 3 && !snaps; attempt++) {
    const run = path.join(dir, `run${attempt}`);
    fs.mkdirSync(run);
    const got = await captureRun(run, await freePortPair());
    if ('missed' in got) {
      misses.push(got.missed);
      console.warn(`bisect: run ${attempt}'s capture was missed, and reported (the agent was late for before_forward's bound): ${got.missed}`);
      continue;
    }
    ({ snaps, call } = got);
    eng = path.join(run, 'eng');
  }
  if (!snaps) throw new Error(`the capture was missed (reported) in ${misses.length} runs: ${misses.join(' | ')}`);
  // The module tree with the probe on is the engine's forward bit for bit (same shard, same ops).
  const tp2 = probe('tp2', ['--engine-out', eng]);
  expect(tp2.map((l) => [l.rank, l.bitwise_equal])).toEqual([[0, true], [1, true]]);
  expect(probe('tp1', ['--tp', '1']).map((l) => l.rank)).toEqual([0]);
}, 300000);

test('healthy TP=2 against TP=1: no module out of tolerance, every module in the table', () => {
  const r = bisect('tp2', 'tp1');
  expect(r.code).toBe(0);
  expect(r.stdout).toContain('no module out of tolerance');
  expect(r.stdout).toContain('A: none; B: none');
  const j = bisect('tp2', 'tp1', '--json').doc;
  expect(j.ok).toBe(true);
  expect(j.first).toBeNull();
  expect(j.a).toMatchObject({ tp_size: 2, ranks: [0, 1] });
  expect(j.b).toMatchObject({ tp_size: 1, ranks: [0] });
  const names = j.modules.map((m: { module: string }) => m.module);
  expect(names.slice(0, 3)).toEqual(['model.embed_tokens', 'model.layers.0.input_layernorm', 'model.layers.0.self_attn.q_proj']);
  expect(names.slice(-2)).toEqual(['lm_head', 'logits']);
  for (const n of names) expect(r.stdout).toContain(n); // the table lists every module
  // TP=2 is not bit-identical to TP=1 (the all-reduce sums halves): error is there, within tolerance.
  const oProj = j.modules.find((m: { module: string }) => m.module === 'model.layers.0.self_attn.o_proj');
  expect(oProj.max_abs_diff).toBeGreaterThan(0);
  expect(oProj.max_abs_diff).toBeLessThan(1e-5);
  expect(j.modules.find((m: { module: string }) => m.module === 'lm_head').split).toBe('column');
  // Tolerances are settable: fp32 held to zero, the first module with any difference is out.
  const strict = bisect('tp2', 'tp1', '--tol', 'fp32=0,0', '--json');
  expect(strict.code).toBe(1);
  // --tol takes one value each time, before or after the trees.
  const before = runWavebus(['bisect', '--tol', 'fp32=0,0', '--tol', 'bf16=1,1', path.join(dir, 'tp2'), path.join(dir, 'tp1'), '--json']);
  expect(JSON.parse(before.stdout).tolerances).toMatchObject({ fp32: { atol: 0, rtol: 0 }, bf16: { atol: 1, rtol: 1 } });
  expect(strict.doc.first.module).toBe(j.modules.find((m: { max_abs_diff: number }) => m.max_abs_diff > 0).module);
  // The probe bundles are snapshot-layout bundles: inspect verifies them.
  expect(runWavebus(['inspect', path.join(dir, 'tp2'), '--verify']).code).toBe(0);
});

test('a weight shard corrupted on rank 1 in layer 1\'s MLP: bisect names that module and rank 1', () => {
  probe('weight', ['--fault', 'weight:1:layers.1.up']);
  const r = bisect('weight', 'tp1');
  expect(r.code).toBe(1);
  expect(r.stdout).toMatch(/FIRST OUT OF TOLERANCE: model\.layers\.1\.mlp\.up_proj\n {2}rank\(s\) 1 /);
  const j = bisect('weight', 'tp1', '--json').doc;
  expect(j.first).toMatchObject({ module: 'model.layers.1.mlp.up_proj', ranks: [1], split: 'column' });
  expect(j.first.per_rank.map((p: { rank: number; mismatched: number }) => [p.rank, p.mismatched > 0])).toEqual([[0, false], [1, true]]);
  // The largest difference lies in rank 1's half of the MLP columns (128 columns, 64 per rank).
  expect(j.first.worst.rank).toBe(1);
  expect(j.first.worst.index[1]).toBeGreaterThanOrEqual(64);
  expect(j.first.worst.shard_index[1]).toBe(j.first.worst.index[1] - 64);
  expect(j.first.rel_err).toBeGreaterThan(0.01);
  // Everything before it is within tolerance; the error grows after it.
  const at = j.modules.findIndex((m: { module: string }) => m.module === 'model.layers.1.mlp.up_proj');
  expect(j.modules.slice(0, at).every((m: { out_of_tolerance: boolean }) => !m.out_of_tolerance)).toBe(true);
  expect(j.modules.find((m: { module: string }) => m.module === 'logits').out_of_tolerance).toBe(true);
  // A loose enough tolerance lets it pass.
  expect(bisect('weight', 'tp1', '--tol', 'fp32=1000,0').code).toBe(0);
});

test('an all-reduce that drops rank 1\'s part in layer 0: the module after it is named on every rank', () => {
  probe('drop', ['--fault', 'drop:model.layers.0.mlp.down_proj:1']);
  const j = bisect('drop', 'tp1', '--json');
  expect(j.code).toBe(1);
  expect(j.doc.first).toMatchObject({ module: 'model.layers.0.mlp.down_proj', split: 'replicated', ranks: [0, 1] });
  // Its input (each rank's partial product) was right: the collective broke it.
  expect(j.doc.nan).toEqual({ a: null, b: null });
});

test('a NaN written in layer 1\'s attention on rank 1: provenance names that module and rank', () => {
  probe('nan', ['--fault', 'nan:model.layers.1.self_attn.attn:1']);
  const r = bisect('nan', 'tp1');
  expect(r.code).toBe(1);
  expect(r.stdout).toContain('A: model.layers.1.self_attn.attn rank 1 (tp_rank 1, pp_rank 0) at [0, 0] = nan; B: none');
  const j = bisect('nan', 'tp1', '--json').doc;
  expect(j.nan.a).toMatchObject({ module: 'model.layers.1.self_attn.attn', rank: 1, index: [0, 0], value: 'nan' });
  expect(j.first).toMatchObject({ module: 'model.layers.1.self_attn.attn', ranks: [1], max_abs_diff: 'inf' });
  // Either tree: with the sides swapped the NaN is found in B.
  expect(bisect('tp1', 'nan', '--json').doc.nan.b).toMatchObject({ module: 'model.layers.1.self_attn.attn', rank: 1 });
});

test('PP: stage outputs compare by name across the stage boundary', () => {
  for (const [name, extra] of [['pp', []], ['ppbad', ['--corrupt-boundary']]] as const) {
    const r = python([path.join(ROOT, 'test', 'python', 'probe_pp.py'), path.join(dir, name), ...extra]);
    if (r.code !== 0) throw new Error(r.stderr);
  }
  const ok = bisect('pp/pp2', 'pp/pp1', '--json');
  expect(ok.code).toBe(0);
  expect(ok.doc.a).toMatchObject({ pp_size: 2, tp_size: 1, ranks: [0, 1] });
  const bad = bisect('ppbad/pp2', 'ppbad/pp1', '--json');
  expect(bad.code).toBe(1);
  // What stage 1 received differs from what stage 0 sent (model.layers.0's output, within tolerance).
  expect(bad.doc.first).toMatchObject({ module: 'model.layers.1', io: 'input', ranks: [1] });
  expect(bad.doc.first.worst.index[0]).toBe(3);
  expect(bad.doc.modules.find((m: { key: string }) => m.key === 'model.layers.0#0').out_of_tolerance).toBe(false);
});

test('the probe on its own; per-dtype tolerance (bf16)', () => {
  const out = path.join(dir, 'probe-check');
  const r = python([path.join(ROOT, 'test', 'python', 'probe_check.py'), out]);
  if (r.code !== 0) throw new Error(r.stderr);
  expect(r.stdout.trim()).toBe('ok');
  // One bf16 step apart: within bf16's default tolerance; out when bf16 is held to rtol 1e-3.
  expect(bisect('probe-check/bf16_a', 'probe-check/bf16_b').code).toBe(0);
  const strict = bisect('probe-check/bf16_a', 'probe-check/bf16_b', '--tol', 'bf16=0,1e-3', '--json');
  expect(strict.code).toBe(1);
  expect(strict.doc.first).toMatchObject({ dtype_a: 'bfloat16', ranks: [1], atol: 0, rtol: 0.001 });
});

test('bad input exits 2 naming it: a missing rank, a module on one side only, a bad flag', () => {
  fs.cpSync(path.join(dir, 'tp2'), path.join(dir, 'tp2-lost'), { recursive: true });
  fs.rmSync(path.join(dir, 'tp2-lost', 'rank1'), { recursive: true });
  const lost = bisect('tp2-lost', 'tp1');
  expect(lost.code).toBe(2);
  expect(lost.stderr).toContain('no bundle for tp_rank 1 of tp_size 2 (a rank is missing)');
  // A tp_size of 10^9 in a file is named, not enumerated (the fuzz found it exhausting the heap).
  fs.cpSync(path.join(dir, 'tp1'), path.join(dir, 'tp-huge'), { recursive: true });
  const metaFile = path.join(dir, 'tp-huge', 'rank0', fs.readdirSync(path.join(dir, 'tp-huge', 'rank0'))[0], 'meta.json');
  const meta = JSON.parse(fs.readFileSync(metaFile, 'utf8'));
  meta.probe.tp_size = 1e9;
  fs.writeFileSync(metaFile, JSON.stringify(meta));
  const huge = bisect('tp-huge', 'tp1');
  expect(huge.code).toBe(2);
  expect(huge.stderr).toContain('no bundle for tp_rank 1, 2, 3, 4, 5, 6, 7, 8 and 999999991 more of tp_size 1000000000');
  probe('layer1', ['--probe-layers', '1']);
  const one = bisect('layer1', 'tp1');
  expect(one.code).toBe(2);
  expect(one.stderr).toContain('only in B: model.layers.0.input_layernorm#0');
  const tol = bisect('tp2', 'tp1', '--tol', 'fp64=1');
  expect(tol.code).toBe(2);
  expect(tol.stderr).toContain('--tol: expected DTYPE=ATOL,RTOL');
  const neg = bisect('tp2', 'tp1', '--tol', 'bf16=-1,0');
  expect(neg.code).toBe(2);
  expect(neg.stderr).toContain('--tol bf16 atol');
  const none = runWavebus(['bisect', eng, path.join(dir, 'tp1')]);
  expect(none.code).toBe(2);
  expect(none.stderr).toContain('no probe bundle under it');
  expect(bisect('tp2', 'tp1', '--call', '999').stderr).toContain('no probe bundle of call 999');
});
