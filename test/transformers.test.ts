// An engine this project did not write: Hugging Face transformers' continuous batching (paged
// cache, FIFO scheduler, block tables), TP=2 through tp_plan="auto" over gloo, on torch 2.x in the
// suite's venv (test/torch2.ts), started by torch's own torchrun under `wavebus launch`, with
// wavebus attached by wavebus_client.integrations.transformers (examples/transformers-engine).
// The model is a small Llama with random weights saved with save_pretrained in the test's dir.
import * as fs from 'fs';
import * as path from 'path';
import { spawnSync } from 'child_process';
import { ROOT, cleanup, freePortPair, readManifests, spawnWavebus, tmpDir, waitWhileRunning } from './helpers';
import { torch2 } from './torch2';
import { metric, pollMetrics } from './rank-divergence-checks';

afterAll(cleanup);

const ENGINE = path.join(ROOT, 'examples', 'transformers-engine');
const LAYERS = 2;
let venv: { python: string; torchrun: string };
let base: string;

interface Report { req_id: string; incident_type: string; detect_wave: number; detail: Record<string, unknown> }

function py(args: string[], timeout = 180000) {
  const r = spawnSync(venv.python, args, { encoding: 'utf8', timeout });
  if (r.status !== 0) throw new Error(`${args.join(' ')} exited ${r.status ?? r.signal}\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

beforeAll(() => {
  venv = torch2();
  base = tmpDir('wavebus-hf-');
  // model-other: the same architecture with other weights; a replay against it must not be bit-exact.
  // model-peaked: its LM head scaled up, a confident model (greedy log-probs near 0) for garbled.
  py([path.join(ENGINE, 'make_model.py'), path.join(base, 'model'), `${path.join(base, 'model-other')}:1`, `${path.join(base, 'model-peaked')}:0:40`, '--layers', String(LAYERS)]);
}, 120000);

/** `wavebus launch --tp 2 -- torchrun --nproc-per-node 2 serve.py ...`, started. */
async function startServe(opts: { runtimeConfig: object; serveArgs?: string[]; env?: NodeJS.ProcessEnv; model?: string; metricsPort?: number }) {
  const dir = tmpDir('wavebus-hf-run-');
  const out = path.join(dir, 'out');
  const runDir = path.join(dir, 'run');
  const port = await freePortPair();
  const metrics = opts.metricsPort === undefined ? [] : ['--metrics-port', String(opts.metricsPort)];
  const launch = spawnWavebus(
    [
      'launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--run-dir', runDir, ...metrics,
      '--additional-config', JSON.stringify({ runtime_config: opts.runtimeConfig }),
      '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000',
      // --standalone: torchrun's rendezvous on a free port of its own (tests run side by side).
      '--', venv.torchrun, '--standalone', '--nproc-per-node', '2', path.join(ENGINE, 'serve.py'),
      '--model', path.join(base, opts.model ?? 'model'), '--out', out, ...(opts.serveArgs ?? []),
    ],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache'), ...opts.env }, cwd: dir, detached: true },
  );
  return { dir, out, runDir, port, launch };
}

async function finish(job: Awaited<ReturnType<typeof startServe>>) {
  const { code } = await job.launch.exited;
  if (code !== 0) throw new Error(`launch exited ${code}\n${job.launch.stdout().slice(-4000)}\n${job.launch.stderr().slice(-8000)}`);
  const reportDir = path.join(job.dir, 'runtime', 'report');
  const reports = (type: string): Report[] => {
    const d = path.join(reportDir, type);
    return fs.existsSync(d) ? fs.readdirSync(d).filter((n) => n.endsWith('.json')).map((n) => JSON.parse(fs.readFileSync(path.join(d, n), 'utf8'))) : [];
  };
  const outputs = JSON.parse(fs.readFileSync(path.join(job.out, 'outputs.json'), 'utf8')) as { requests: Record<string, { tokens: number[]; logprobs: (number | null)[] }>; waves: number; telemetry: { ring_heads: number; inline_heads: number; rows_exhausted: number; live_rows: number } };
  return { reports, outputs, dumps: readManifests<{ arm_wave: number; complete: boolean; completed_ranks: number[]; incident_type: string }>(path.join(reportDir, 'kv_cache')) };
}

/**
 * Every dumped layer of a wave dir equals that request's pages as serve.py read them through
 * transformers' own page views at the copy wave (OUT/copy_rank<r>_wave<w>.pt), bit for bit.
 * Prints the number of K/V tensors compared, and whether the two ranks' shards differ.
 */
const CHECK_DUMP = `import sys, os, re, torch
wave_dir, out = sys.argv[1], sys.argv[2]
wave = int(os.path.basename(wave_dir).split('_')[1])
req = os.path.basename(os.path.dirname(wave_dir))
n, shards = 0, {}
for rd in sorted(d for d in os.listdir(wave_dir) if re.fullmatch(r'dp0_tp[0-9]+_pp0_cp0', d)):
    rank = int(rd.split('_')[1][2:])
    copy = torch.load(os.path.join(out, f'copy_rank{rank}_wave{wave}.pt'))[req]
    for f in sorted(os.listdir(os.path.join(wave_dir, rd))):
        if not f.endswith('.pt'):
            continue
        dump = torch.load(os.path.join(wave_dir, rd, f), weights_only=True)
        want = copy['layers'][f[:-3]]
        assert dump['tp_rank'] == rank and list(dump['block_ids']) == copy['block_ids'], (rank, f)
        for kv in ('k', 'v'):
            assert dump[kv].shape == want[kv].shape and dump[kv].abs().sum() > 0, (rank, f, kv, dump[kv].shape)
            assert torch.equal(dump[kv].view(torch.int32), want[kv].view(torch.int32)), (rank, f, kv)
            shards.setdefault((f, kv), []).append(dump[kv])
            n += 1
differ = all(len(v) == 2 and not torch.equal(v[0], v[1]) for v in shards.values())
print(n, differ)`;

test('TP=2 under torchrun: token_repeat and logits_finite fire from real generation; each KV dump from both ranks equals the engine\'s pages bit for bit', async () => {
  const job = await startServe({
    runtimeConfig: {
      detector: { token_repeat: { enabled: true }, logits_finite: { enabled: true }, garbled: { enabled: false } },
      actions: { defaults: { on_trigger: ['report', 'dump_kv'] } },
      dump: { auto_max_times: 8, auto_cooldown_seconds: 0, free_headroom_bytes: 0 },
    },
    serveArgs: ['--requests', '4', '--max-tokens', '64', '--nan', '5:req-1', '--save-copies'],
  });
  const run = await finish(job);
  // Random weights fall into loops: token_repeat from the engine's own sampled tokens.
  const repeats = run.reports('token_repeat');
  expect(repeats.length).toBeGreaterThanOrEqual(1);
  for (const r of repeats) {
    const toks = run.outputs.requests[r.req_id].tokens;
    expect(toks).toHaveLength(64);
    // The detector's window of the request's own tokens (as the engine returned them) really repeats.
    const seen = Number(r.detail.output_token_count);
    const window = toks.slice(Math.max(0, seen - Number(r.detail.window)), seen);
    expect(window.length - new Set(window).size).toBeGreaterThanOrEqual(10);
  }
  // The NaN went into req-1's rows only, at step 5: one report, that request, that wave.
  const nan = run.reports('logits_finite');
  expect(nan.map((r) => [r.req_id, r.detect_wave, r.detail.kind])).toEqual([['req-1', 5, 'nan']]);
  expect(run.outputs.requests['req-1'].logprobs[4]).toBeNull(); // its 5th token's log-prob was NaN
  expect(run.outputs.requests['req-0'].logprobs.every((x) => x !== null)).toBe(true);
  // The telemetry went through the tensor path's ring (docs/transformers.md, "Telemetry"), every
  // request had a row, and every row was given back by the end.
  expect(run.outputs.telemetry.ring_heads).toBeGreaterThan(0);
  expect([run.outputs.telemetry.rows_exhausted, run.outputs.telemetry.live_rows]).toEqual([0, 0]);
  // Every dump (the NaN one and the loops) complete on both ranks, and equal to the engine's pages.
  expect(run.dumps.length).toBe(nan.length + repeats.length);
  for (const d of run.dumps) {
    expect([d.complete, d.completed_ranks]).toEqual([true, [0, 1]]);
    const [n, differ] = py(['-c', CHECK_DUMP, d.dir, job.out]).trim().split(' ');
    expect(Number(n)).toBe(2 * LAYERS * 2); // ranks x layers x (K, V)
    expect(differ).toBe('True'); // each rank holds its own KV head
  }
}, 240000);

test('rank_divergence on a healthy TP=2 transformers run: both ranks write their digests, the coordinator compares the waves, and nothing fires', async () => {
  const metricsPort = await freePortPair();
  const job = await startServe({
    runtimeConfig: { detector: { rank_divergence: { enabled: true }, token_repeat: { enabled: false } } },
    serveArgs: ['--requests', '2', '--max-tokens', '40', '--step-sleep-ms', '20'],
    metricsPort,
  });
  // The coordinator's counters go with the job: read them while it runs.
  const metricsPoll = pollMetrics(metricsPort);
  let run;
  let metrics: string;
  try {
    run = await finish(job);
  } finally {
    metrics = await metricsPoll.stop();
  }
  expect(run.reports('rank_divergence')).toEqual([]);
  const count = (result: string) => metric(metrics, 'wavebus_rank_digest_waves_total', `result="${result}"`);
  // Both ranks' digests of most waves met (the first and last few may settle without one rank).
  expect(count('agreed')).toBeGreaterThanOrEqual(20);
  expect(count('diverged')).toBe(0);
}, 180000);

test('an input snapshot of TP=2 replays through transformers\' own model under torchrun, bit for bit; other weights do not', async () => {
  const job = await startServe({
    runtimeConfig: { detector: { token_repeat: { enabled: false } } },
    serveArgs: ['--requests', '3', '--max-tokens', '12', '--save-logits'],
    env: { WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'req-2', WAVEBUS_SNAPSHOT_MAX_CAPTURES: '3' },
  });
  await finish(job);
  const snaps = path.join(job.dir, 'cache', 'snapshots', 'transformers-LlamaForCausalLM-tp2');
  const calls = fs.readdirSync(path.join(snaps, 'rank0')).sort();
  expect(calls).toEqual(['call0', 'call1', 'call2']); // the prefill, then two decode steps reading the cache
  expect(fs.readdirSync(path.join(snaps, 'rank1')).sort()).toEqual(calls);
  // One torchrun per model (loading it is most of the time), every call replayed in it.
  const replay = (list: string[], model: string) =>
    spawnSync(venv.torchrun, ['--standalone', '--nproc-per-node', '2', path.join(ENGINE, 'replay.py'), '--model', model, '--snapshots', snaps, '--call', list.map((c) => c.slice(4)).join(','), '--engine-out', job.out], { encoding: 'utf8', timeout: 180000 });
  // The two ranks print through one torchrun: their lines may interleave, so take the objects.
  const results = (out: string) => (out.match(/\{"rank"[^{}]*\}/g) ?? []).map((l) => JSON.parse(l));
  const r = replay(calls, path.join(base, 'model'));
  if (r.status !== 0) throw new Error(`replay: ${r.stdout}${r.stderr.slice(-3000)}`);
  const got = results(r.stdout).map((l) => [l.call, l.rank, l.bitwise_equal, l.max_abs_diff]).sort();
  expect(got).toEqual([[0, 0, true, 0], [0, 1, true, 0], [1, 0, true, 0], [1, 1, true, 0], [2, 0, true, 0], [2, 1, true, 0]]);
  const wrong = replay([calls[1]], path.join(base, 'model-other'));
  expect(wrong.status).not.toBe(0);
  expect(results(wrong.stdout).map((l) => l.bitwise_equal)).toEqual([false, false]);
}, 300000);

/** A live job's control flags and the CLI against it, once its coordinator answers and the job ran a few waves. */
async function liveControl(job: Awaited<ReturnType<typeof startServe>>) {
  const token = path.join(job.runDir, 'bus.token');
  const co = ['--coordinator', `127.0.0.1:${job.port}`, '--bus-token-file', token];
  // The CLI runs asynchronously: a synchronous wait would leave the job's output pipes undrained.
  const cli = async (args: string[]) => {
    const p = spawnWavebus(args);
    const { code } = await p.exited;
    return { code, stdout: p.stdout(), stderr: p.stderr() };
  };
  const status = await waitWhileRunning(job.launch, async () => {
    if (!fs.existsSync(token)) return undefined;
    const r = await cli(['status', ...co, '--json']);
    if (r.code !== 0) return undefined;
    const s = JSON.parse(r.stdout);
    return s.replicas?.['0']?.wave > 3 ? s : undefined;
  }, 'the job to run a few waves', 90000);
  expect(Object.entries(status.ranks).map(([g, r]) => [g, (r as { live: boolean }).live])).toEqual([['0', true], ['1', true]]);
  return { co, cli };
}

test('wavebus status, dump and capture on the live TP=2 transformers job', async () => {
  const job = await startServe({
    // A detector on puts the bus on (waves, control); with everything off nothing is sent.
    runtimeConfig: { detector: { token_repeat: { enabled: false }, logits_finite: { enabled: true } } },
    serveArgs: ['--requests', '2', '--max-tokens', '400', '--num-blocks', '64', '--step-sleep-ms', '30', '--save-copies'],
  });
  const { co, cli } = await liveControl(job);
  const cap = await cli(['capture', ...co, '--request', 'req-1', '--max-captures', '1', '--wait']);
  expect({ code: cap.code, err: cap.stderr }).toEqual({ code: 0, err: '' });
  const dump = await cli(['dump', ...co, '--request', 'req-0', '--wait']);
  expect({ code: dump.code, err: dump.stderr }).toEqual({ code: 0, err: '' });
  expect(dump.stdout).toMatch(/^complete: .*manifest\.json$/m);
  const run = await finish(job);
  const [manual] = run.dumps.filter((d) => d.incident_type === 'manual_trigger');
  expect([manual.complete, manual.completed_ranks]).toEqual([true, [0, 1]]);
  const [n] = py(['-c', CHECK_DUMP, manual.dir, job.out]).trim().split(' ');
  expect(Number(n)).toBe(2 * LAYERS * 2);
  // The capture's own folder (docs/control.md, "Where the bundles go").
  const live = fs.readdirSync(path.join(job.dir, 'cache', 'snapshots', 'live'));
  expect(live).toEqual([expect.stringMatching(/^capture-1-wave\d+$/)]);
  const snaps = path.join(job.dir, 'cache', 'snapshots', 'live', live[0], 'transformers-LlamaForCausalLM-tp2');
  expect(fs.readdirSync(path.join(snaps, 'rank0'))).toHaveLength(1);
  expect(fs.readdirSync(path.join(snaps, 'rank1'))).toHaveLength(1);
}, 300000);

test("a forward rank 1 could not stage for a capture (its staging segment's name was taken): `wavebus capture` names the cause, rank 0's bundle is written, the agent logs it", async () => {
  const tag = `wbstage${process.pid}`;
  const job = await startServe({
    runtimeConfig: { detector: { token_repeat: { enabled: false }, logits_finite: { enabled: true } } },
    serveArgs: ['--requests', '2', '--max-tokens', '300', '--num-blocks', '64', '--step-sleep-ms', '30', '--wavebus-tag', tag],
  });
  const { co, cli } = await liveControl(job);
  // Rank 1's KV segment carries the job's shm prefix; its input_ids staging segment is made at the
  // first forward offered (none before the capture): a real segment of that name is there first.
  const kv = fs.readdirSync('/dev/shm').find((n) => n.endsWith(`${tag}-r1-kv`));
  expect(kv).toBeDefined();
  const taken = path.join('/dev/shm', kv!.replace(/-kv$/, '-in-input_ids'));
  fs.writeFileSync(taken, '', { flag: 'wx', mode: 0o600 });
  try {
    const cap = await cli(['capture', ...co, '--next', '--wait']);
    expect(cap.code).toBe(1);
    expect(cap.stderr).toMatch(/^wavebus capture: rank 1 wave (\d+): capture failed: rank 1: the engine could not stage the inputs of its forward of wave \1: ConfigError: attach\(\): shared memory \/\S+-in-input_ids already exists/m);
    expect(cap.stdout).toMatch(/^rank 0 wave \d+: .+\/rank0\/call0$/m);
  } finally {
    fs.rmSync(taken, { force: true });
  }
  await finish(job);
  expect(job.launch.stderr() + job.launch.stdout()).toContain("input snapshot failed: the engine could not stage the forward's inputs");
}, 300000);

test('kill -9 of both TP ranks mid-run: each agent flushes its last K forwards, which replay through transformers bit for bit', async () => {
  const K = 4;
  // Replay needs the token ids: save_sensitive_info true (docs/recorder.md).
  const job = await startServe({
    runtimeConfig: { detector: { token_repeat: { enabled: false }, logits_finite: { enabled: true } }, report: { save_sensitive_info: true } },
    serveArgs: ['--requests', '2', '--max-tokens', '400', '--num-blocks', '64', '--step-sleep-ms', '30', '--save-logits'],
    env: { WAVEBUS_RECORD_FORWARDS: String(K) },
  });
  await waitWhileRunning(job.launch, () => [0, 1].every((g) => fs.existsSync(path.join(job.out, `logits_rank${g}_wave12.pt`))), 'wave 12 on both ranks', 90000);
  const pids = [0, 1].map((g) => Number(fs.readFileSync(path.join(job.out, `pid_rank${g}`), 'utf8')));
  for (const pid of pids) process.kill(pid, 'SIGKILL');
  const flushRoot = path.join(job.dir, 'cache', 'snapshots', 'recorder');
  const crashDir = await waitWhileRunning(job.launch, () => {
    const names = fs.existsSync(flushRoot) ? fs.readdirSync(flushRoot).filter((n) => n.startsWith('crash-')) : [];
    const dir = names.length === 1 ? path.join(flushRoot, names[0]) : undefined;
    return dir && [0, 1].every((g) => fs.existsSync(path.join(dir, `crash-rank${g}.json`))) ? dir : undefined;
  }, 'crash-rank0.json and crash-rank1.json', 30000).catch(async (e) => {
    // The agents flush before launch tears the job down; if launch is gone first, say what it printed.
    throw new Error(`${(e as Error).message}\n${job.launch.stderr().slice(-6000)}`);
  });
  await job.launch.exited; // torchrun reports its killed workers; launch ends with it
  for (const g of [0, 1]) {
    const c = JSON.parse(fs.readFileSync(path.join(crashDir, `crash-rank${g}.json`), 'utf8'));
    expect([c.global_rank, c.engine_pid, c.last_forward.compilation_hash]).toEqual([g, pids[g], 'transformers-LlamaForCausalLM-tp2']);
    expect(c.forwards_recorded).toBeGreaterThanOrEqual(12);
    expect(c.flushed.length + c.left_out.length).toBe(K);
  }
  // The ranks die one after the other, so their newest forwards may differ by one, and a forward's
  // logits are saved after it: replay the calls both ranks flushed whose logits both ranks saved.
  const snaps = path.join(crashDir, 'transformers-LlamaForCausalLM-tp2');
  const callsOf = (g: number) => new Set(fs.readdirSync(path.join(snaps, `rank${g}`)).filter((n) => /^call\d+$/.test(n)));
  const [c0, c1] = [callsOf(0), callsOf(1)];
  const both = [...c0].filter((c) => c1.has(c)).filter((c) => {
    const meta = JSON.parse(fs.readFileSync(path.join(snaps, 'rank0', c, 'meta.json'), 'utf8'));
    expect(meta.selected_by).toEqual(['recorder']);
    return [0, 1].every((g) => fs.existsSync(path.join(job.out, `logits_rank${g}_wave${meta.global_step}.pt`)));
  });
  expect(both.length).toBeGreaterThanOrEqual(K - 2);
  const r = spawnSync(venv.torchrun, ['--standalone', '--nproc-per-node', '2', path.join(ENGINE, 'replay.py'), '--model', path.join(base, 'model'), '--num-blocks', '64',
    '--snapshots', snaps, '--call', both.map((c) => c.slice(4)).join(','), '--engine-out', job.out], { encoding: 'utf8', timeout: 180000 });
  if (r.status !== 0) throw new Error(`replay: ${r.stdout}${r.stderr.slice(-3000)}`);
  const lines = (r.stdout.match(/\{"rank"[^{}]*\}/g) ?? []).map((l) => JSON.parse(l));
  expect(lines).toHaveLength(2 * both.length);
  expect(lines.every((l) => l.bitwise_equal && l.max_abs_diff === 0)).toBe(true);
}, 300000);

test('garbled fires from a corrupted LM head (every rank\'s shard overwritten with noise at step 40), not before', async () => {
  const job = await startServe({
    model: 'model-peaked',
    runtimeConfig: { detector: { token_repeat: { enabled: false }, garbled: { enabled: true } } },
    serveArgs: ['--requests', '2', '--max-tokens', '80', '--garble', '40'],
  });
  const run = await finish(job);
  const reports = run.reports('garbled');
  // Healthy windows (waves 32..40: full, confident picks) do not fire; noise picks near log(1/256) do.
  expect(reports.map((r) => r.req_id).sort()).toEqual(['req-0', 'req-1']);
  for (const r of reports) expect(r.detect_wave).toBeGreaterThan(40);
  for (const req of Object.values(run.outputs.requests)) {
    expect(req.logprobs.slice(0, 39).every((x) => x !== null && x > -5)).toBe(true);
    expect(req.logprobs.slice(40).every((x) => x !== null && x < -5)).toBe(true);
  }
}, 180000);

test('under cache pressure (transformers offloads running requests): a dump whose blocks were given back says freed_before_copy; the others are bit for bit', async () => {
  const job = await startServe({
    runtimeConfig: {
      detector: { token_repeat: { enabled: true } },
      actions: { defaults: { on_trigger: ['report', 'dump_kv'] } },
      dump: { auto_max_times: 8, auto_cooldown_seconds: 0, free_headroom_bytes: 0 },
    },
    // 6 requests of up to 157 tokens in 16 blocks of 16: the cache cannot hold them all.
    serveArgs: ['--requests', '6', '--max-tokens', '150', '--num-blocks', '16', '--save-copies'],
  });
  const run = await finish(job);
  expect(run.outputs.waves).toBeGreaterThan(200); // offloaded requests are prefilled again
  const dumps = run.dumps as { complete: boolean; incomplete_reason?: string; completed_ranks: number[]; dir: string }[];
  expect(dumps.filter((d) => d.complete).length).toBeGreaterThanOrEqual(1);
  // The schedule is deterministic (greedy, the same requests): req-5 is offloaded between its
  // detection and its copy wave, so that path is taken on every run.
  expect(dumps.filter((d) => !d.complete).length).toBeGreaterThanOrEqual(1);
  for (const d of dumps) {
    if (!d.complete) {
      expect(d.incomplete_reason).toBe('freed_before_copy');
      continue;
    }
    expect(d.completed_ranks).toEqual([0, 1]);
    expect(py(['-c', CHECK_DUMP, d.dir, job.out]).trim()).toBe(`${2 * LAYERS * 2} True`);
  }
}, 180000);
