// The whole product against a real forward pass: examples/torch-engine (a TP transformer in torch
// with a paged KV cache, continuous batching, greedy decoding) under `wavebus launch`, instrumented
// through the Python client. Round trips: snapshot -> off-line replay (bitwise), KV dump -> the
// engine's own pool (bitwise) and TP=2 assembled vs TP=1, and faults made by real means.
import * as fs from 'fs';
import * as path from 'path';
import { spawnSync } from 'child_process';
import { ROOT, cleanup, freePortPair, readManifests, runWavebus, spawnWavebus, tmpDir } from './helpers';
import { torchRanks, type TorchRanks } from './torch2';

afterAll(cleanup);

const ENGINE = path.join(ROOT, 'examples', 'torch-engine');
// torch 2.x's torchrun (the stand-in only where torch 2.x is absent); COMPAT: the one compatibility
// run on Debian's torch 1.13 with the stand-in (docs/transformers.md, "Two torches").
const RANKS = torchRanks();
const COMPAT = torchRanks({ compat: true });

interface Run {
  dir: string;
  out: string;
  stdout: string;
  outputs: { requests: Record<string, { text: string; tokens: number[]; spec: [number, number, number][] }> };
  reports: (type: string) => { req_id: string; incident_type: string; detail: Record<string, unknown> }[];
  dumps: { incident_type: string; req_id?: string; arm_wave: number; complete: boolean; completed_ranks: number[]; dir: string }[];
}

const DETECTORS = ['token_repeat', 'logits_finite', 'garbled', 'spec_acceptance'];

/** One `wavebus launch` of the engine with these detectors on (report + dump_kv), to its end. */
async function runEngine(opts: { tp: number; detectors: string[]; engineArgs?: string[]; env?: NodeJS.ProcessEnv; ranks?: TorchRanks }): Promise<Run> {
  const dir = tmpDir('wavebus-torch-');
  const out = path.join(dir, 'out');
  const detector: Record<string, unknown> = {};
  for (const d of DETECTORS) detector[d] = { enabled: opts.detectors.includes(d) };
  const runtimeConfig = {
    detector,
    actions: { defaults: { on_trigger: ['report', 'dump_kv'] } },
    dump: { auto_max_times: 4, free_headroom_bytes: 0 },
  };
  const port = await freePortPair();
  const launch = spawnWavebus(
    [
      'launch', '--nproc-per-node', String(opts.tp), '--tp', String(opts.tp), '--port', String(port),
      '--additional-config', JSON.stringify({ runtime_config: runtimeConfig }),
      '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000',
      '--', ...(opts.ranks ?? RANKS).command(path.join(ENGINE, 'engine.py'), { nproc: opts.tp }), '--out', out, ...(opts.engineArgs ?? []),
    ],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache'), ...opts.env }, cwd: dir },
  );
  const { code } = await launch.exited;
  if (code !== 0) throw new Error(`launch exited ${code}\n${launch.stdout().slice(-4000)}\n${launch.stderr().slice(-6000)}`);
  const reportDir = path.join(dir, 'runtime', 'report');
  return {
    dir,
    out,
    stdout: launch.stdout(),
    outputs: JSON.parse(fs.readFileSync(path.join(out, 'outputs.json'), 'utf8')),
    reports: (type) => {
      const d = path.join(reportDir, type);
      return fs.existsSync(d) ? fs.readdirSync(d).filter((n) => n.endsWith('.json')).map((n) => JSON.parse(fs.readFileSync(path.join(d, n), 'utf8'))) : [];
    },
    dumps: readManifests(path.join(reportDir, 'kv_cache')),
  };
}

/** A python of the torch the engine ran on (replays are bit for bit within one torch). */
function python(args: string[], ranks: TorchRanks = RANKS): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync(ranks.python, args, { encoding: 'utf8', timeout: 120000, env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python') } });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Every dumped .pt of a wave dir equals the blocks of the engine's own pool saved at that wave. */
const CHECK_DUMP = `import sys, os, re, json, torch
wave_dir, out = sys.argv[1], sys.argv[2]
wave = int(os.path.basename(wave_dir).split('_')[1])
n = 0
# The seed's rank dirs, dp<d>_tp<t>_pp<p>_cp<c>; this engine runs TP only, so the global rank is t.
for rd in sorted(d for d in os.listdir(wave_dir) if re.fullmatch(r'dp0_tp[0-9]+_pp0_cp0', d)):
    rank = int(rd.split('_')[1][2:])
    pool = torch.load(os.path.join(out, f'pool_rank{rank}_wave{wave}.pt'))
    for f in sorted(os.listdir(os.path.join(wave_dir, rd))):
        if not f.endswith('.pt'):
            continue
        dump = torch.load(os.path.join(wave_dir, rd, f), weights_only=True)
        layer = f[:-3]
        for kv in ('k', 'v'):
            want = pool[f'{layer}.{kv}'][list(dump['block_ids'])]
            assert dump['tp_rank'] == rank and dump[kv].dtype == torch.float32 and dump[kv].shape == want.shape, (rank, f, dump[kv].shape)
            assert torch.equal(dump[kv].view(torch.int32), want.view(torch.int32)), (rank, layer, kv)
            n += 1
print(n)`;

// The compatibility run: Debian's torch 1.13 (the torch a Debian user has, and the client's oldest)
// with the torchrun stand-in, the whole path once: client, agent, detectors, snapshots, replay.
test('torch 1.13 compatibility (Debian, the torchrun stand-in): healthy run, no incident with every detector on; a snapshot replays off-line bit for bit on every rank', async () => {
  const run = await runEngine({
    tp: 2, detectors: DETECTORS, engineArgs: ['--max-tokens', '24'], ranks: COMPAT,
    env: { WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'req-2', WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '30', WAVEBUS_SNAPSHOT_MAX_CAPTURES: '3' },
  });
  for (const d of DETECTORS) expect(run.reports(d)).toEqual([]);
  expect(run.dumps).toEqual([]);
  // Readable text: a healthy model here writes printable ASCII.
  for (const r of Object.values(run.outputs.requests)) {
    expect(r.tokens).toHaveLength(24);
    expect(r.tokens.every((t) => t >= 32 && t < 127)).toBe(true);
  }
  const snaps = path.join(run.dir, 'cache', 'snapshots', 'torch-engine-tp2');
  const calls = fs.readdirSync(path.join(snaps, 'rank0')).sort();
  expect(calls.length).toBeGreaterThanOrEqual(2);
  expect(fs.readdirSync(path.join(snaps, 'rank1')).sort()).toEqual(calls);
  for (const call of calls) {
    const r = python([path.join(ENGINE, 'replay.py'), '--snapshots', snaps, '--call', call.slice(4), '--engine-out', run.out], COMPAT);
    if (r.code !== 0) throw new Error(`replay ${call}: ${r.stdout}${r.stderr}`);
    const lines = r.stdout.trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.rank, l.bitwise_equal, l.max_abs_diff])).toEqual([[0, true, 0], [1, true, 0]]);
  }
  // The comparison can fail: the same inputs through another seed's weights are not equal.
  const wrong = python([path.join(ENGINE, 'replay.py'), '--snapshots', snaps, '--call', calls[0].slice(4), '--engine-out', run.out, '--seed', '1235'], COMPAT);
  expect(wrong.code).toBe(1);
  expect(wrong.stdout).toContain('"bitwise_equal": false');
}, 150000);

test('wavebus capture --request on a running TP=2 job: both ranks capture the same forwards, which replay off-line bit for bit', async () => {
  const dir = tmpDir('wavebus-torch-capture-');
  const out = path.join(dir, 'out');
  const runDir = path.join(dir, 'run');
  const port = await freePortPair();
  const detector: Record<string, unknown> = {};
  for (const d of DETECTORS) detector[d] = { enabled: true };
  // Requests arrive 30 waves apart: req-5 comes at wave 151, long after the capture is armed.
  const launch = spawnWavebus(
    [
      'launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--run-dir', runDir,
      '--additional-config', JSON.stringify({ runtime_config: { detector, actions: { defaults: { on_trigger: ['report'] } } } }),
      '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000',
      '--', ...RANKS.command(path.join(ENGINE, 'engine.py'), { nproc: 2 }), '--out', out, '--requests', '6', '--arrive-every', '30', '--max-tokens', '16',
    ],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache') }, cwd: dir },
  );
  // The launcher writes the job's bus token before it starts the coordinator; the capture waits
  // (its --timeout) for the coordinator, so it is armed before the engine's first wave.
  const token = path.join(runDir, 'bus.token');
  const deadline = Date.now() + 60000;
  while (!fs.existsSync(token) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  const cap = spawnWavebus(['capture', '--coordinator', `127.0.0.1:${port}`, '--bus-token-file', token, '--request', 'req-5', '--max-captures', '2', '--wait', '--timeout', '300000']);
  const capExit = await cap.exited;
  expect({ code: capExit.code, stderr: cap.stderr() }).toEqual({ code: 0, stderr: '' });
  const { code } = await launch.exited;
  if (code !== 0) throw new Error(`launch exited ${code}\n${launch.stdout().slice(-4000)}\n${launch.stderr().slice(-6000)}`);
  const bundles = [...cap.stdout().matchAll(/^rank (\d+) wave (\d+): (.+)$/gm)].map((m) => ({ rank: Number(m[1]), wave: Number(m[2]), dir: m[3] }));
  // Two forwards of req-5 (its prefill and first decode), the same ones on both ranks.
  expect(bundles.filter((b) => b.rank === 0).map((b) => b.wave)).toEqual(bundles.filter((b) => b.rank === 1).map((b) => b.wave));
  expect(bundles.length).toBe(4);
  // The capture's own folder (docs/control.md, "Where the bundles go"), the seed's layout inside it.
  const live = fs.readdirSync(path.join(dir, 'cache', 'snapshots', 'live'));
  expect(live).toEqual([expect.stringMatching(/^capture-1-wave\d+$/)]);
  const snaps = path.join(dir, 'cache', 'snapshots', 'live', live[0], 'torch-engine-tp2');
  for (const b of bundles.filter((x) => x.rank === 0)) {
    expect(path.dirname(path.dirname(b.dir))).toBe(snaps);
    const meta = JSON.parse(fs.readFileSync(path.join(b.dir, 'meta.json'), 'utf8'));
    expect(meta.selected_by).toEqual(['request']);
    expect(meta.matches.map((m: { request_id: string }) => m.request_id)).toEqual(['req-5']);
    const r = python([path.join(ENGINE, 'replay.py'), '--snapshots', snaps, '--call', path.basename(b.dir).slice(4), '--engine-out', out]);
    if (r.code !== 0) throw new Error(`replay ${b.dir}: ${r.stdout}${r.stderr}`);
    const lines = r.stdout.trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.rank, l.bitwise_equal, l.max_abs_diff])).toEqual([[0, true, 0], [1, true, 0]]);
  }
}, 300000);

test('real repetition loop: token_repeat report and KV dump, bit-exact to every rank\'s pool; TP=2 assembled vs TP=1', async () => {
  const args = ['--max-tokens', '48'];
  const [tp2, tp1] = [await runEngine({ tp: 2, detectors: ['token_repeat'], engineArgs: args }), await runEngine({ tp: 1, detectors: ['token_repeat'], engineArgs: args })];
  const reps = tp2.reports('token_repeat');
  expect(reps.length).toBeGreaterThanOrEqual(1);
  const first = tp2.dumps.find((d) => d.incident_type === 'token_repeat' && d.complete);
  expect(first).toBeDefined();
  expect(first!.completed_ranks).toEqual([0, 1]);
  const n = python(['-c', CHECK_DUMP, first!.dir, tp2.out]);
  if (n.code !== 0) throw new Error(n.stderr);
  expect(Number(n.stdout.trim())).toBe(2 * 2 * 2); // 2 ranks x 2 layers x (k, v)
  // The same request in the TP=1 run: same tokens, dumped at the same wave.
  expect(tp1.outputs.requests[reps[0].req_id].tokens).toEqual(tp2.outputs.requests[reps[0].req_id].tokens);
  const rel = path.relative(path.join(tp2.dir, 'runtime', 'report', 'kv_cache'), first!.dir);
  const other = path.join(tp1.dir, 'runtime', 'report', 'kv_cache', rel);
  expect(fs.existsSync(other)).toBe(true);
  const n1 = python(['-c', CHECK_DUMP, other, tp1.out]);
  if (n1.code !== 0) throw new Error(n1.stderr);
  const cmp = runWavebus(['compare', first!.dir, other, '--assemble-tp', '--json', '--atol', '1e-5']);
  const res = JSON.parse(cmp.stdout);
  expect(res.tensors).toHaveLength(4);
  const worst = Math.max(...res.tensors.map((t: { max_abs_diff: number }) => t.max_abs_diff));
  // eslint-disable-next-line no-console
  console.log(`TP=2 assembled vs TP=1, ${rel}: largest |difference| ${worst} (${res.tensors.map((t: { key: string; max_abs_diff: number }) => `${t.key} ${t.max_abs_diff}`).join(', ')})`);
  expect(cmp.code).toBe(0);
  expect(worst).toBeLessThan(1e-5);
}, 200000);

test('a NaN planted in one embedding row at forward 8 makes real NaN logits: logits_finite report and dump for that request only', async () => {
  const run = await runEngine({ tp: 2, detectors: ['logits_finite'], engineArgs: ['--max-tokens', '24', '--fault', 'nan:8:1'] });
  const reps = run.reports('logits_finite');
  expect(reps.map((r) => r.req_id)).toEqual(['req-1']);
  expect(reps[0].detail.kind).toBe('nan');
  const dump = run.dumps.find((d) => d.incident_type === 'logits_finite' && d.complete);
  expect(dump?.completed_ranks).toEqual([0, 1]);
  const n = python(['-c', CHECK_DUMP, dump!.dir, run.out]);
  if (n.code !== 0) throw new Error(n.stderr);
}, 150000);

test('a corrupted LM head makes real garbled bytes: garbled report and dump', async () => {
  const run = await runEngine({ tp: 2, detectors: ['garbled'], engineArgs: ['--max-tokens', '56', '--fault', 'garble:6'] });
  const reps = run.reports('garbled');
  expect(reps.length).toBeGreaterThanOrEqual(1);
  // Control bytes appear: the text is no longer printable.
  const texts = Object.values(run.outputs.requests).map((r) => r.tokens.slice(-32));
  expect(texts.some((t) => t.some((b) => b < 32 || b >= 127))).toBe(true);
  const dump = run.dumps.find((d) => d.incident_type === 'garbled' && d.complete);
  expect(dump?.completed_ranks).toEqual([0, 1]);
}, 150000);

/** The spec_acceptance figures of a window of [forward, draft_len, accepted] records, by the seed's
 * formula (accepted counts the bonus token): rate = Σmax(0, accepted − 1) / Σdraft_len, len = that / steps. */
function acceptance(recs: [number, number, number][]): { rate: number; len: number } {
  const acc = recs.reduce((a, r) => a + Math.max(0, r[2] - 1), 0);
  return { rate: acc / recs.reduce((a, r) => a + r[1], 0), len: acc / recs.length };
}

test('speculative decoding, healthy: drafts verified in one forward, no incident with every detector on; snapshots of verify steps replay bit for bit', async () => {
  const run = await runEngine({
    tp: 2, detectors: DETECTORS, engineArgs: ['--max-tokens', '30', '--spec-tokens', '2'],
    env: { WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'req-2', WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '30', WAVEBUS_SNAPSHOT_MAX_CAPTURES: '3' },
  });
  for (const d of DETECTORS) expect(run.reports(d)).toEqual([]);
  expect(run.dumps).toEqual([]);
  const all: [number, number, number][] = [];
  for (const r of Object.values(run.outputs.requests)) {
    expect(r.tokens).toHaveLength(30);
    expect(r.tokens.every((t) => t >= 32 && t < 127)).toBe(true);
    // The guard's window (10 spec steps) filled, and no window of it drifted low: a healthy draft.
    expect(r.spec.length).toBeGreaterThanOrEqual(10);
    for (const [, draftLen, accepted] of r.spec) expect(accepted >= 1 && accepted <= draftLen + 1 && draftLen <= 2).toBe(true);
    for (let i = 10; i <= r.spec.length; i++) expect(acceptance(r.spec.slice(i - 10, i)).rate).toBeGreaterThanOrEqual(0.3);
    all.push(...r.spec);
  }
  const healthy = acceptance(all);
  // eslint-disable-next-line no-console
  console.log(`healthy spec run (k=2): acceptance rate ${healthy.rate.toFixed(3)}, mean accepted drafts per step ${healthy.len.toFixed(3)} over ${all.length} verify steps`);
  expect(healthy.rate).toBeGreaterThan(0.5);
  const snaps = path.join(run.dir, 'cache', 'snapshots', 'torch-engine-tp2');
  const calls = fs.readdirSync(path.join(snaps, 'rank0')).sort();
  expect(calls.length).toBeGreaterThanOrEqual(1);
  expect(fs.readdirSync(path.join(snaps, 'rank1')).sort()).toEqual(calls);
  let verifyRows = 0;
  for (const call of calls) {
    const meta = JSON.parse(fs.readFileSync(path.join(snaps, 'rank0', call, 'meta.json'), 'utf8'));
    expect(meta.num_speculative_tokens).toBe(2);
    const r = python([path.join(ENGINE, 'replay.py'), '--snapshots', snaps, '--call', call.slice(4), '--engine-out', run.out]);
    if (r.code !== 0) throw new Error(`replay ${call}: ${r.stdout}${r.stderr}`);
    const lines = r.stdout.trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.rank, l.bitwise_equal, l.max_abs_diff])).toEqual([[0, true, 0], [1, true, 0]]);
    verifyRows = Math.max(verifyRows, lines[0].shape[0] - meta.req_ids.length);
  }
  expect(verifyRows).toBeGreaterThan(0); // a captured forward verified drafts (more logits rows than sequences)
}, 150000);

test('a perturbed draft model makes acceptance really drop: spec_acceptance report and KV dump, bit-exact to every rank\'s pool; the text stays the target\'s', async () => {
  const FAULT_AT = 10;
  // Side by side: most of a launch is start-up (python, torch, agents).
  const [bad, plain] = await Promise.all([
    runEngine({ tp: 2, detectors: ['spec_acceptance'], engineArgs: ['--max-tokens', '40', '--spec-tokens', '2', '--fault', `draft:${FAULT_AT}`] }),
    runEngine({ tp: 2, detectors: [], engineArgs: ['--max-tokens', '40'] }),
  ]);
  const all = Object.values(bad.outputs.requests).flatMap((r) => r.spec);
  const before = acceptance(all.filter((x) => x[0] < FAULT_AT));
  const after = acceptance(all.filter((x) => x[0] >= FAULT_AT));
  // eslint-disable-next-line no-console
  console.log(`draft perturbed at forward ${FAULT_AT}: acceptance rate ${before.rate.toFixed(3)} before, ${after.rate.toFixed(3)} after`);
  expect(before.rate).toBeGreaterThan(0.5);
  expect(after.rate).toBeLessThan(0.2);
  const reps = bad.reports('spec_acceptance');
  expect(reps.length).toBeGreaterThanOrEqual(1);
  for (const rep of reps) {
    expect(rep.detail.direction).toBe('low');
    expect(rep.detail.accept_rate as number).toBeLessThan(0.3);
    expect(rep.detail.window).toBe(10);
  }
  const dump = bad.dumps.find((d) => d.incident_type === 'spec_acceptance' && d.complete);
  expect(dump?.completed_ranks).toEqual([0, 1]);
  const n = python(['-c', CHECK_DUMP, dump!.dir, bad.out]);
  if (n.code !== 0) throw new Error(n.stderr);
  expect(Number(n.stdout.trim())).toBe(2 * 2 * 2);
  // Verification keeps greedy decoding exact: a broken draft costs speed, never text. Every rejected
  // draft's K/V slot was overwritten before it was read, or the text would differ from plain decoding.
  for (const [id, r] of Object.entries(plain.outputs.requests)) expect(bad.outputs.requests[id].tokens).toEqual(r.tokens);
}, 200000);

test('wavebus demo --engine torch: the demo\'s summary and verification over the real engine', async () => {
  const out = path.join(tmpDir('wavebus-torch-demo-'), 'demo');
  const port = await freePortPair();
  const r = runWavebus(['demo', '--engine', 'torch', '--tp', '2', '--out', out, '--port', String(port)], { timeout: 150000 });
  if (r.code !== 0) {
    // The launch logs say what the agents and the engine did (kept in the error: the dir goes at the end).
    const logs = fs.existsSync(out) ? fs.readdirSync(out).filter((f) => f.startsWith('launch-host')).map((f) => `--- ${f}\n${fs.readFileSync(path.join(out, f), 'utf8').slice(-6000)}`) : [];
    throw new Error(`demo exited ${r.code}\n${r.stdout}\n${r.stderr}\n${logs.join('\n')}`);
  }
  expect(r.stdout).toContain('engine torch');
  // The demo finds the checkout's torch 2.x venv as the tests do, and says so when it must fall back.
  if (RANKS.kind === 'torchrun') expect(r.stderr).not.toContain('torch 2.x is absent');
  else expect(r.stderr).toContain('wavebus demo: torch 2.x is absent');
  expect(r.stdout).toContain('demo OK: every expected artifact was written and verified');
  for (const t of ['token_repeat', 'logits_finite', 'garbled']) expect(r.stdout).toMatch(new RegExp(`^  ${t}\\s+[1-9]`, 'm'));
  // The engine saved its pool at every dump wave: the demo compared every dumped block with it.
  expect(fs.readdirSync(path.join(out, 'engine')).some((f) => /^pool_rank1_wave\d+\.pt$/.test(f))).toBe(true);
  // Bad layouts are refused before anything starts.
  const bad = runWavebus(['demo', '--engine', 'torch', '--pp', '2', '--out', path.join(out, '..', 'bad')]);
  expect(bad.code).not.toBe(0);
  expect(bad.stderr + bad.stdout).toContain('--engine torch runs TP only');
}, 180000);
