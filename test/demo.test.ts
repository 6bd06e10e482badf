// `wavebus demo` is the first command a newcomer runs: it must pass, and it must notice when an
// artifact is wrong. Runs the built CLI as a user would.
import * as fs from 'fs';
import * as path from 'path';
import { checkDumpContents } from '../src/tools/demo';
import { findTorchrun } from '../src/tools/demo-torch';
import { inspectTree } from '../src/tools/inspect';
import { cleanup, runWavebus, tmpDir } from './helpers';

afterAll(cleanup);

test('demo (TP=4, one host) writes and verifies every artifact', () => {
  const out = path.join(tmpDir(), 'demo');
  const r = runWavebus(['demo', '--out', out, '--steps', '80'], { timeout: 120000 });
  expect(r.stdout).toContain('demo OK');
  expect(r.code).toBe(0);
  for (const t of ['token_repeat', 'logits_finite', 'garbled', 'spec_acceptance']) {
    expect(r.stdout).toMatch(new RegExp(`${t}\\s+\\d+`));
    expect(fs.readdirSync(path.join(out, 'runtime', 'report', t)).length).toBeGreaterThan(0);
  }
  expect(r.stdout).toMatch(/input snapshots by rank: rank0=\d+ rank1=\d+ rank2=\d+ rank3=\d+/);
  // It ends with the page (docs/report.md) and the trace, their paths printed.
  expect(r.stdout).toContain(`report:    ${path.join(out, 'report.html')}\n`);
  expect(fs.readFileSync(path.join(out, 'report.html'), 'utf8')).toContain('class="banner ok" id="verify-banner"');
  const trace = JSON.parse(fs.readFileSync(path.join(out, 'job.trace.json'), 'utf8'));
  const reports = ['token_repeat', 'logits_finite', 'garbled', 'spec_acceptance'].reduce((n, t) => n + fs.readdirSync(path.join(out, 'runtime', 'report', t)).length, 0);
  expect(trace.traceEvents.filter((e: { cat?: string }) => e.cat === 'incident').length).toBe(reports);
  const kv = inspectTree(path.join(out, 'runtime', 'report', 'kv_cache'), { verify: true });
  expect(kv.problems).toEqual([]);
  // The content check catches a single flipped byte in any dumped block.
  const rankDir = kv.bundles.find((b) => b.kind === 'kv_dump')!;
  expect(checkDumpContents(rankDir, kv.root, 4)).toEqual([]);
  const file = path.join(kv.root, rankDir.dir, rankDir.files[0].name);
  const bytes = fs.readFileSync(file);
  bytes[Math.floor(bytes.length / 2)] ^= 0x10; // inside the K or V tensor bytes
  fs.writeFileSync(file, bytes);
  expect(checkDumpContents(rankDir, kv.root, 4).join('\n')).toMatch(/bytes differ/);
  expect(inspectTree(kv.root, { verify: true }).problems.join('\n')).toMatch(/checksum/);
});

test('demo with two simulated hosts, PP=2 and DP=2: faults in both replicas, each dump from its replica\'s last PP stage only', () => {
  const out = path.join(tmpDir(), 'demo2');
  const r = runWavebus(['demo', '--out', out, '--tp', '2', '--pp', '2', '--dp', '2', '--hosts', '2', '--steps', '80', '--format', 'npy'], { timeout: 180000 });
  expect(r.stdout).toContain('demo OK');
  expect(r.code).toBe(0);
  expect(r.stdout).toContain("each from its replica's last-PP ranks");
  const kv = inspectTree(path.join(out, 'runtime', 'report', 'kv_cache'));
  // Replica 0's last stage is ranks 2, 3; replica 1's is 6, 7: each dump holds exactly one of them.
  for (const w of kv.bundles.filter((b) => b.kind === 'dump_wave')) {
    const info = JSON.parse(fs.readFileSync(path.join(kv.root, w.dir, 'request_info.json'), 'utf8'));
    expect(w.ranks).toEqual(info.dp_rank === 1 ? [6, 7] : [2, 3]);
    expect(w.dir).toMatch(new RegExp(`_dp${info.dp_rank}$`));
  }
  const replicas = kv.bundles.filter((b) => b.kind === 'dump_wave').map((w) => JSON.parse(fs.readFileSync(path.join(kv.root, w.dir, 'request_info.json'), 'utf8')).dp_rank);
  expect(new Set(replicas)).toEqual(new Set([0, 1]));
});

test('demo with TP=2 and DP=2: both replicas report and dump, request ids repeat across them', () => {
  const out = path.join(tmpDir(), 'demo-dp');
  const r = runWavebus(['demo', '--out', out, '--tp', '2', '--dp', '2', '--steps', '60'], { timeout: 180000 });
  expect(r.stdout).toContain('demo OK');
  expect(r.code).toBe(0);
  // The same request ids fail in both replicas: one dump dir per replica, never mixed.
  const repeat = path.join(out, 'runtime', 'report', 'kv_cache', 'token_repeat');
  const [req] = fs.readdirSync(repeat);
  expect(fs.readdirSync(path.join(repeat, req)).map((d) => d.replace(/^wave_\d+_/, '')).sort()).toEqual(['dp0', 'dp1']);
  const reports = fs.readdirSync(path.join(out, 'runtime', 'report', 'token_repeat')).map((f) => JSON.parse(fs.readFileSync(path.join(out, 'runtime', 'report', 'token_repeat', f), 'utf8')));
  expect(reports.map((x) => [x.dp_rank, x.rank]).sort()).toEqual([[0, 0], [1, 2]]);
});

// The demo derives what it expects from the configuration in force: what is off is expected to stay
// silent (and is named in the summary), what is on must have happened.
test('demo with a runtime config that turns on only token_repeat expects only token_repeat', () => {
  const dir = tmpDir();
  const cfg = path.join(dir, 'only-repeat.jsonc');
  fs.writeFileSync(cfg, '{\n  // one detector, one dump\n  "detector": { "token_repeat": { "enabled": true, "on_trigger": ["report", "dump_kv"] } },\n  "dump": { "auto_max_times": 1 },\n}\n');
  const out = path.join(dir, 'demo');
  const r = runWavebus(['demo', '--out', out, '--steps', '60', '--runtime-config', cfg], { timeout: 120000 });
  expect(r.stdout).toContain('demo OK');
  expect(r.code).toBe(0);
  for (const t of ['logits_finite', 'garbled', 'spec_acceptance']) {
    expect(r.stdout).toMatch(new RegExp(`${t}\\s+detector\\.${t}\\.enabled is false`));
    expect(fs.existsSync(path.join(out, 'runtime', 'report', t))).toBe(false);
  }
  expect(r.stdout).toMatch(/KV dumps \(1\)/);
  expect(r.stdout).toMatch(/token_repeat\s+req-/);
});

test('demo under WAVEBUS_SNAPSHOT_RANKS=1 expects snapshots from tp-rank 1 only', () => {
  const out = path.join(tmpDir(), 'demo');
  const r = runWavebus(['demo', '--out', out, '--steps', '60'], { timeout: 120000, env: { ...process.env, WAVEBUS_SNAPSHOT_RANKS: '1' } });
  expect(r.stdout).toContain('demo OK');
  expect(r.code).toBe(0);
  expect(r.stdout).toMatch(/input snapshots by rank: rank1=\d+ \(only tp-ranks \[1\] capture/);
});

test('demo expectations follow the config in force: no fault or off means nothing expected, RANKS narrows', async () => {
  const { demoExpectations } = await import('../src/tools/demo-expect');
  const dir = tmpDir();
  const cfg = path.join(dir, 'c.json');
  fs.writeFileSync(cfg, JSON.stringify({ detector: { garbled: { enabled: true } } }));
  const layout = { worldSize: 2, tp: 2, pp: 1, dp: 1, cp: 1 };
  const e = demoExpectations({ runtimeConfig: cfg, format: 'pt', layout, faults: { garbled: { request: 1, from: 2 } }, env: {} });
  expect(e.detectors.find((d) => d.name === 'garbled')).toMatchObject({ report: true, dump: false });
  expect(e.detectors.find((d) => d.name === 'token_repeat')?.why).toMatch(/no fault injected/);
  expect(e.autoDumps).toMatchObject({ min: 0, max: 0 });
  const off = demoExpectations({ format: 'pt', layout, faults: {}, env: { WAVEBUS_SNAPSHOT_ENABLE: '0' } });
  expect(off.snapshotRanks).toEqual([]);
  expect(off.snapshotWhy).toMatch(/snapshots are off/);
  const narrowed = demoExpectations({ format: 'pt', layout, faults: {}, env: { VLLM_NEURON_RUNTIME_INPUT_SNAPSHOT_RANKS: '0' } });
  expect(narrowed.snapshotRanks).toEqual([0]);
  expect(narrowed.snapshotFlags.ranks).toBeUndefined();
});

test('demo refuses an --out that holds someone else\'s files', () => {
  const out = tmpDir();
  fs.writeFileSync(path.join(out, 'precious.txt'), 'keep me');
  const r = runWavebus(['demo', '--out', out]);
  expect(r.code).not.toBe(0);
  expect(r.stderr).toMatch(/--out .* is not a wavebus demo directory/);
  expect(fs.readFileSync(path.join(out, 'precious.txt'), 'utf8')).toBe('keep me');
});

test("demo --engine torch's torchrun: WAVEBUS_TORCH2_VENV's when it holds bin/torchrun and bin/python; any other value (garbage, too long, a NUL, a dir without them) is absent, never a throw", () => {
  const venv = tmpDir('wavebus-demo-venv-');
  expect(findTorchrun({ WAVEBUS_TORCH2_VENV: venv })).toBeUndefined(); // empty dir
  fs.mkdirSync(path.join(venv, 'bin'));
  fs.writeFileSync(path.join(venv, 'bin', 'torchrun'), '');
  expect(findTorchrun({ WAVEBUS_TORCH2_VENV: venv })).toBeUndefined(); // no python beside it
  fs.writeFileSync(path.join(venv, 'bin', 'python'), '');
  expect(findTorchrun({ WAVEBUS_TORCH2_VENV: venv })).toBe(path.join(venv, 'bin', 'torchrun'));
  for (const bad of ['relative/nowhere', 'x\0y', 'x'.repeat(5000), `${'/a'.repeat(3000)}`, '\n', '\u00ff\u20ac']) {
    expect(() => findTorchrun({ WAVEBUS_TORCH2_VENV: bad })).not.toThrow();
    expect(findTorchrun({ WAVEBUS_TORCH2_VENV: bad })).toBeUndefined();
  }
});
