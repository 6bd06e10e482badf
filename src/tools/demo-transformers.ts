// `wavebus demo --engine transformers`: the demo's job is Hugging Face transformers' continuous
// batching (examples/transformers-engine/serve.py, a small random Llama, TP over gloo on CPU under
// torch's torchrun, in the torch 2.x venv that scripts/torch2-venv.js makes from the machine's
// local pip indexes). Faults by real means: greedy decoding of random weights loops by itself
// (token_repeat), a NaN goes into request 1's rows of the final norm's output at step 5
// (logits_finite), and every rank's LM head shard is overwritten with small noise at step 40 of a
// model whose LM head is scaled up (confident until then: garbled after it).
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { packageRoot } from '../paths';
import { ConfigError } from '../errors';
import type { SimFaults } from '../sim/faults';

export const HF_ENGINE_DIR = path.join(packageRoot(), 'examples', 'transformers-engine');
const GARBLE_AT = 40;
const NAN_AT = 5;
const REQUESTS = 4;

export const HF_FAULTS: SimFaults = {
  repetition: { request: 0, from: 1 },
  nonFinite: { request: 1, at: NAN_AT, kind: 'nan' },
  garbled: { request: 0, from: GARBLE_AT },
};

/** Prompts have 5..7 tokens: position 10 is a decode step of every request (the token rule's target). */
export const HF_CAPTURE_TOKEN = '10';

interface Venv {
  python: string;
  torchrun: string;
}

function venv(): Venv {
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const { ensure } = require(path.join(packageRoot(), 'scripts', 'torch2-venv.js')) as { ensure: (log?: (m: string) => void) => Venv };
  return ensure();
}

/** Make the model (its LM head scaled, a confident model) and return the engine command line. */
export function transformersEngineCommand(opts: { tp: number; pp: number; dp: number; hosts: number; steps: number; format: string; out: string; resultDir: string; log: (l: string) => void }): string[] {
  if (opts.pp !== 1 || opts.dp !== 1 || opts.hosts !== 1) throw new ConfigError('--engine transformers runs TP only: --pp 1 --dp 1 --hosts 1');
  if (![1, 2].includes(opts.tp)) throw new ConfigError(`--engine transformers: --tp must divide the model's 2 KV heads (1 or 2), got ${opts.tp}`);
  if (opts.steps < GARBLE_AT + 24) throw new ConfigError(`--engine transformers: --steps must be >= ${GARBLE_AT + 24} (each request decodes --steps tokens; the LM head is corrupted at step ${GARBLE_AT}), got ${opts.steps}`);
  if (opts.format !== 'pt') throw new ConfigError(`--engine transformers: --format must be pt (its dumps are checked with torch.load), got ${opts.format}`);
  const serve = path.join(HF_ENGINE_DIR, 'serve.py');
  if (!fs.existsSync(serve)) throw new ConfigError(`--engine transformers: ${serve} not found`);
  const v = venv();
  const model = path.join(opts.out, 'model');
  fs.mkdirSync(opts.out, { recursive: true });
  opts.log(`wavebus demo: writing a small random Llama to ${model} (${v.python})`);
  const made = spawnSync(v.python, [path.join(HF_ENGINE_DIR, 'make_model.py'), `${model}:0:40`], { encoding: 'utf8', timeout: 300000 });
  if (made.status !== 0) throw new ConfigError(`--engine transformers: make_model.py failed: ${(made.stderr ?? '').slice(-2000)}`);
  return [
    v.torchrun, '--standalone', '--nproc-per-node', String(opts.tp), serve, '--model', model, '--out', opts.out,
    // A cache that holds every request whole (prompts of at most 7 tokens, pages of 16): no offload under pressure.
    '--requests', String(REQUESTS), '--max-tokens', String(opts.steps), '--num-blocks', String(REQUESTS * Math.ceil((opts.steps + 8) / 16) + 4), '--nan', `${NAN_AT}:req-1`, '--garble', String(GARBLE_AT),
    '--save-copies', '--result-dir', opts.resultDir,
  ];
}

/**
 * Each dumped K and V of a rank directory against that request's pages as serve.py read them
 * through transformers' own page views at the dump's wave (OUT/copy_rank<r>_wave<w>.pt), bit for
 * bit, by examples/transformers-engine/check_dump.py in the venv. Problems, one per line.
 */
export function checkTransformersDump(waveDir: string, engineOut: string): string[] {
  const r = spawnSync(venv().python, [path.join(HF_ENGINE_DIR, 'check_dump.py'), waveDir, engineOut], { encoding: 'utf8', timeout: 120000 });
  if (r.status === 0) return [];
  const lines = `${r.stdout ?? ''}${r.stderr ?? ''}`.trim().split('\n').filter(Boolean);
  return lines.length ? lines.slice(-5).map((l) => `${waveDir}: ${l}`) : [`${waveDir}: check_dump.py exited ${r.status ?? r.signal}`];
}
