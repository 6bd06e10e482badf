// `wavebus demo --engine torch`: the demo's job is examples/torch-engine (a real TP transformer in
// torch) instead of the simulator, started by torch 2.x's own torchrun when a torch 2.x venv is
// there (WAVEBUS_TORCH2_VENV, or .venv-torch2 of the checkout the demo runs from), else by the
// torchrun stand-in on Debian's python3-torch (whose torchrun 1.13 fails on Python 3.11). Faults are made by real means there: request 0
// falls into a repetition loop by itself (greedy decoding of random weights), a NaN is planted in
// one embedding row at forward 8 for request 1, and the LM head is corrupted from forward 40.
import * as fs from 'fs';
import * as path from 'path';
import { packageRoot } from '../paths';
import { ConfigError } from '../errors';
import { readBytes } from '../artifacts/read-range';
import { readPt } from '../artifacts/pt-reader';
import type { SimFaults } from '../sim/faults';

export const TORCH_ENGINE_DIR = path.join(packageRoot(), 'examples', 'torch-engine');
const NUM_BLOCKS = 128; // engine.py --num-blocks default
const GARBLE_AT = 40;

/** What the torch engine injects, in the simulator's terms (so the demo's expectations apply). */
export const TORCH_FAULTS: SimFaults = {
  repetition: { request: 0, from: 1 },
  nonFinite: { request: 1, at: 8, kind: 'nan' },
  garbled: { request: 0, from: GARBLE_AT },
};

/** Decode step 5 of request 0 (prompt of 20 bytes) generates token position 25; no prefill runs then. */
export const TORCH_CAPTURE_TOKEN = '25';

/** torch 2.x's torchrun: WAVEBUS_TORCH2_VENV's, else the checkout's .venv-torch2 (scripts/torch2-venv.js makes it). */
export function findTorchrun(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const venv = env.WAVEBUS_TORCH2_VENV || path.join(packageRoot(), '.venv-torch2');
  const torchrun = path.join(venv, 'bin', 'torchrun');
  return fs.existsSync(torchrun) && fs.existsSync(path.join(venv, 'bin', 'python')) ? torchrun : undefined;
}

export function torchEngineCommand(opts: { tp: number; pp: number; dp: number; hosts: number; steps: number; out: string; resultDir: string; warn?: (l: string) => void }): string[] {
  if (opts.pp !== 1 || opts.dp !== 1 || opts.hosts !== 1) throw new ConfigError('--engine torch runs TP only: --pp 1 --dp 1 --hosts 1');
  if (![1, 2, 4].includes(opts.tp)) throw new ConfigError(`--engine torch: --tp must divide the model's 4 heads (1, 2 or 4), got ${opts.tp}`);
  if (opts.steps < 92) throw new ConfigError(`--engine torch: --steps must be >= 92 (each request decodes steps - 20 tokens; the LM head is corrupted at forward ${GARBLE_AT}), got ${opts.steps}`);
  const engine = path.join(TORCH_ENGINE_DIR, 'engine.py');
  if (!fs.existsSync(engine)) throw new ConfigError(`--engine torch: ${engine} not found`);
  const torchrun = findTorchrun();
  let ranks: string[];
  if (torchrun) {
    ranks = [torchrun, '--standalone', '--nproc-per-node', String(opts.tp), engine];
  } else {
    const warn = opts.warn ?? ((l: string) => process.stderr.write(`${l}\n`));
    warn(`wavebus demo: torch 2.x is absent (no ${path.join(process.env.WAVEBUS_TORCH2_VENV || path.join(packageRoot(), '.venv-torch2'), 'bin', 'torchrun')}; ` +
      'node scripts/torch2-venv.js makes it): the ranks run on python3 with the torchrun stand-in (examples/torch-engine/torchrun_env.py)');
    ranks = [fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3', path.join(TORCH_ENGINE_DIR, 'torchrun_env.py'), engine];
  }
  return [
    ...ranks,
    '--out', opts.out, '--result-dir', opts.resultDir, '--max-tokens', String(opts.steps - 20),
    '--fault', 'nan:8:1', '--fault', `garble:${GARBLE_AT}`,
  ];
}

/** The bytes of `blocks` of one K or V tensor of the pool the engine saved at the dump's wave. */
export function torchPoolBlocks(engineOut: string, rankDirRel: string, rank: number, layer: string, kv: 'k' | 'v', blocks: number[]): Buffer {
  const wave = /wave_(\d+)/.exec(rankDirRel)?.[1];
  if (!wave) throw new ConfigError(`${rankDirRel}: no wave_<N> in the dump path`);
  const file = path.join(engineOut, `pool_rank${rank}_wave${wave}.pt`);
  const c = readPt(file);
  const names = [...(c.value as Map<string, unknown>).entries()].filter(([, v]) => (v as { kind?: string })?.kind === 'tensor').map(([k]) => k);
  const i = names.indexOf(`${layer}.${kv}`);
  if (i < 0) throw new ConfigError(`${file}: no tensor ${layer}.${kv}`);
  const t = c.tensors[i];
  const per = t.nbytes / NUM_BLOCKS;
  return Buffer.concat(blocks.map((b) => readBytes(file, t.dataOffset + b * per, per)));
}
