// rank_divergence against an engine this project did not write: Hugging Face transformers'
// continuous batching at TP=2 (tp_plan="auto" over gloo, torch 2.x venv, torchrun under `wavebus
// launch`), wavebus attached by wavebus_client.integrations.transformers, which writes each rank's
// digests of its forward's inputs (with their row starts, cu_seq_lens_q) and of the tokens it
// sampled. Faults come from serve.py's test doubles (env vars only these tests set): one rank's
// logits row pushed to another argmax at one wave, and a sampler reseeded apart on each rank. The
// healthy case samples (multinomial) with transformers' TP-shared seed.
import * as fs from 'fs';
import * as path from 'path';
import { spawnSync } from 'child_process';
import { ROOT, cleanup, freePortPair, readManifests, spawnWavebus, tmpDir } from './helpers';
import { torch2 } from './torch2';
import { divergenceReports, expectOutputsDivergence, metric, pollMetrics } from './rank-divergence-checks';

afterAll(cleanup);

const ENGINE = path.join(ROOT, 'examples', 'transformers-engine');
let venv: { python: string; torchrun: string };
let model: string;

beforeAll(() => {
  venv = torch2();
  model = path.join(tmpDir('wavebus-hf-rankdiv-'), 'model');
  const r = spawnSync(venv.python, [path.join(ENGINE, 'make_model.py'), model, '--layers', '2'], { encoding: 'utf8', timeout: 180000 });
  if (r.status !== 0) throw new Error(`make_model.py exited ${r.status ?? r.signal}\n${r.stderr}`);
}, 240000);

/** One TP=2 serve.py run with rank_divergence alone on (report + dump_kv); its reports, dumps, last /metrics and outputs. */
async function serve(serveArgs: string[], env: NodeJS.ProcessEnv = {}, report: object = {}) {
  const dir = tmpDir('wavebus-hf-rankdiv-run-');
  const out = path.join(dir, 'out');
  const port = await freePortPair();
  const metricsPort = await freePortPair();
  const runtimeConfig = {
    detector: { rank_divergence: { enabled: true }, token_repeat: { enabled: false }, garbled: { enabled: false } },
    actions: { defaults: { on_trigger: ['report', 'dump_kv'] } },
    dump: { auto_max_times: 4, free_headroom_bytes: 0 },
    report,
  };
  const launch = spawnWavebus(
    [
      'launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--metrics-port', String(metricsPort), '--run-dir', path.join(dir, 'run'),
      '--additional-config', JSON.stringify({ runtime_config: runtimeConfig }),
      '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000',
      '--', venv.torchrun, '--standalone', '--nproc-per-node', '2', path.join(ENGINE, 'serve.py'), '--model', model, '--out', out, ...serveArgs,
    ],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache'), ...env }, cwd: dir, detached: true },
  );
  const metricsPoll = pollMetrics(metricsPort);
  const { code } = await launch.exited;
  const metrics = await metricsPoll.stop();
  if (code !== 0) throw new Error(`launch exited ${code}\n${launch.stdout().slice(-4000)}\n${launch.stderr().slice(-8000)}`);
  const reportDir = path.join(dir, 'runtime', 'report');
  const reports = divergenceReports(reportDir);
  const outputs = JSON.parse(fs.readFileSync(path.join(out, 'outputs.json'), 'utf8')) as { requests: Record<string, { tokens: number[] }>; waves: number };
  return { reports, metrics, outputs, dumps: readManifests<{ incident_type: string; req_id?: string; arm_wave: number; completed_ranks: number[] }>(path.join(reportDir, 'kv_cache')) };
}

test("rank 1's logits row of req-1 pushed to another argmax at wave 6: the incident names wave 6, rank 1, row 1 and req-1 a few waves later at most; wave 7's says the inputs differed, at row 1", async () => {
  // The four requests are all in the batch from wave 1 (rows req-0..req-3); 30 ms forwards (a small
  // real model's), as the digests and the column round trip take a few ms under load.
  const run = await serve(['--requests', '4', '--max-tokens', '16', '--step-sleep-ms', '30'], { WAVEBUS_TEST_DOUBLE_DIVERGE: '6:req-1:1' }, { backoff_waves: 1, max_per_req: 2 });
  // Taken at the first head after both ranks' digests of wave 6 and their columns are in: wave 7's
  // on an idle machine, 9 seen under a loaded one (the engine never waits for it; the digests and
  // the column round trip take a few ms each, more under load). Its dump is armed decide_ahead (1)
  // wave after that head.
  const first = expectOutputsDivergence(run.reports, run.dumps, { wave: 6, rank: 1, row: 1, req: 'req-1', armedWithin: 4 });
  // Rank 0 returned the engine's tokens: its req-1 token at wave 6 is the one the incident names
  // for rank 0 (wave 1 was the prefill that sampled the first token).
  expect(run.outputs.requests['req-1'].tokens[5]).toBe(first.detail.row_tokens['0']);
  // Before the fault every wave agreed; after it rank 1 feeds its own token back: its inputs differ.
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="agreed"')).toBeGreaterThanOrEqual(5);
  // Wave 7: rank 1 fed its own req-1 token back, so its inputs already differ there; the agents'
  // per-row input digests (from cu_seq_lens_q, the integration's row starts) name row 1, req-1.
  const next = run.reports.find((r) => r.detect_wave === 7);
  expect(next).toBeDefined();
  expect(next!.detail.inputs_differed).toBe(true);
  expect(next!.detail.divergence).toBe('inputs');
  expect(next!.detail.first_input_row).toBe(1);
  expect(next!.detail.first_row).toBe(1);
  expect(next!.req_id).toBe('req-1');
  expect(next!.detail.divergent_ranks).toEqual([1]);
  expect(next!.detail.column_errors).toBeUndefined();
}, 300000);

test('sampling with the TP-shared seed (healthy): no alert over a long run; the same sampler seeded apart on each rank: an alert at the first sampled wave', async () => {
  const healthy = await serve(['--requests', '4', '--max-tokens', '80', '--sample', '1234']);
  expect(healthy.reports).toEqual([]);
  expect(metric(healthy.metrics, 'wavebus_rank_digest_waves_total', 'result="diverged"')).toBe(0);
  expect(metric(healthy.metrics, 'wavebus_rank_digest_waves_total', 'result="agreed"')).toBeGreaterThanOrEqual(60);
  expect(metric(healthy.metrics, 'wavebus_rank_digest_waves_with_unknown', 'dp_rank="0"')).toBe(0);
  // The same run with each rank's sampler reseeded apart (a test double): the check above could fail.
  const apart = await serve(['--requests', '4', '--max-tokens', '80', '--sample', '1234'], { WAVEBUS_TEST_DOUBLE_SEED_APART: '1' });
  expect(apart.reports.length).toBeGreaterThanOrEqual(1);
  expect(apart.reports[0].detect_wave).toBe(1);
  expect(apart.reports[0].detail.divergence).toBe('outputs');
  expect(apart.reports[0].detail.first_row).not.toBeNull();
}, 400000);
