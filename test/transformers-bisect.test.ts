// `wavebus bisect` of TP=2 against TP=1 on Hugging Face transformers' module tree
// (model.layers.N.self_attn.q_proj ...): a forward captured from a TP=2 continuous-batching job
// (torch 2.x's torchrun under `wavebus launch`, the small random Llama), replayed by
// examples/transformers-engine/replay.py with the probe on at TP=2 (both ranks under torchrun, each
// its DTensor shard, the splits from the model's tp_plan) and at TP=1 from the same saved model dir
// (the ranks' caches joined along the KV heads); then a noise fault in rank 1's shard of one weight.
import * as fs from 'fs';
import * as path from 'path';
import { spawnSync } from 'child_process';
import { ROOT, cleanup, freePortPair, runWavebus, spawnWavebus, tmpDir } from './helpers';
import { torch2 } from './torch2';

afterAll(cleanup);

const ENGINE = path.join(ROOT, 'examples', 'transformers-engine');

test('bisect names the first module out of tolerance on the HF module tree: none for a healthy TP=2 replay, rank 1\'s up_proj for a fault in its shard', async () => {
  const venv = torch2();
  const dir = tmpDir('wavebus-hf-bisect-');
  const model = path.join(dir, 'model');
  const py = (args: string[]) => spawnSync(venv.python, args, { encoding: 'utf8', timeout: 180000 });
  const made = py([path.join(ENGINE, 'make_model.py'), model, '--layers', '2']);
  expect(made.status).toBe(0);
  const port = await freePortPair();
  // Capture req-1's first two forwards (its prefill, then a decode step reading the cache) on both ranks.
  const launch = spawnWavebus(
    ['launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--run-dir', path.join(dir, 'run'),
      '--additional-config', JSON.stringify({ runtime_config: { detector: { token_repeat: { enabled: false } } } }),
      '--', venv.torchrun, '--standalone', '--nproc-per-node', '2', path.join(ENGINE, 'serve.py'), '--model', model,
      '--out', path.join(dir, 'out'), '--requests', '3', '--max-tokens', '6', '--save-logits'],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache'), WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'req-1', WAVEBUS_SNAPSHOT_MAX_CAPTURES: '2' }, cwd: dir },
  );
  const { code } = await launch.exited;
  if (code !== 0) throw new Error(`launch exited ${code}\n${launch.stderr().slice(-6000)}`);
  const snaps = path.join(dir, 'cache', 'snapshots', 'transformers-LlamaForCausalLM-tp2');
  expect(fs.readdirSync(path.join(snaps, 'rank1')).sort()).toEqual(['call0', 'call1']);

  // Started without torchrun, replay.py runs itself under torchrun with the capture's TP size.
  const replay = (probe: string, ...extra: string[]) => {
    const r = py([path.join(ENGINE, 'replay.py'), '--model', model, '--snapshots', snaps, '--call', '1', '--probe', path.join(dir, probe), ...extra]);
    if (r.status !== 0) throw new Error(`replay ${extra.join(' ')} exited ${r.status ?? r.signal}\n${r.stdout}\n${r.stderr.slice(-4000)}`);
    return (r.stdout.match(/\{"rank"[^{}]*\}/g) ?? []).map((l) => JSON.parse(l));
  };
  // TP=2 with the probe on computes the engine's logits bit for bit (the hooks change nothing).
  const tp2 = replay('tp2', '--engine-out', path.join(dir, 'out'));
  expect(tp2.map((l) => [l.rank, l.bitwise_equal, l.max_abs_diff]).sort()).toEqual([[0, true, 0], [1, true, 0]]);
  expect(replay('tp1', '--tp', '1').map((l) => l.rank)).toEqual([0]);
  replay('bad', '--fault', 'weight:1:model.layers.1.mlp.up_proj.weight');

  const bisect = (a: string) => {
    const r = runWavebus(['bisect', path.join(dir, a), path.join(dir, 'tp1'), '--json']);
    expect(r.stderr).toBe('');
    return { code: r.code, doc: JSON.parse(r.stdout) };
  };
  const healthy = bisect('tp2');
  expect([healthy.code, healthy.doc.first]).toEqual([0, null]);
  const mods = healthy.doc.modules.map((m: any) => [m.module, m.split]);
  // The HF names and the splits the tp_plan gives: colwise projections column, rowwise ones (all-reduced) replicated.
  for (const want of [['model.embed_tokens', 'replicated'], ['model.layers.0.self_attn.q_proj', 'column'], ['model.layers.0.self_attn.k_proj', 'column'],
    ['model.layers.0.self_attn.o_proj', 'replicated'], ['model.layers.1.mlp.up_proj', 'column'], ['model.layers.1.mlp.down_proj', 'replicated'],
    ['model.norm', 'replicated'], ['lm_head', 'replicated']]) expect(mods).toContainEqual(want);
  // TP=2 is not bit-identical to TP=1 after the first all-reduce, but within tolerance: the joined cache is right.
  expect(healthy.doc.modules.find((m: any) => m.module === 'model.layers.1.self_attn.o_proj').max_abs_diff).toBeGreaterThan(0);

  const bad = bisect('bad');
  expect(bad.code).toBe(1);
  expect([bad.doc.first.module, bad.doc.first.split, bad.doc.first.ranks]).toEqual(['model.layers.1.mlp.up_proj', 'column', [1]]);
  // Up to it, every module was within tolerance; rank 0's half of up_proj is right.
  const order = bad.doc.modules.map((m: any) => m.module);
  expect(bad.doc.modules.slice(0, order.indexOf('model.layers.1.mlp.up_proj')).every((m: any) => !m.out_of_tolerance)).toBe(true);
  expect(bad.doc.first.per_rank.map((p: any) => p.mismatched === 0)).toEqual([true, false]);
}, 600000);
