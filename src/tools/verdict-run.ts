// One replay of `wavebus verdict`: a fresh process (the engine's replayer, examples/torch-engine/
// replay.py by default) run with one host's environment and one set of device indices, replaying
// the incident's forwards and saving each rank's logits beside the engine's own; then each replayed
// tensor compared with what the engine computed, with bisect's per-dtype tolerances.
import * as fs from 'fs';
import * as path from 'path';
import { spawn } from 'child_process';
import { itemSize } from '../artifacts/dtype';
import { readNpyHeader } from '../artifacts/npy-reader';
import { readRange } from '../artifacts/read-range';
import { toleranceFor, type Tolerances } from './bisect-compare';
import { decodeElements } from './compare';
import type { DeviceFingerprint } from './verdict-fingerprint';

export interface ReplaySpec {
  /** same (the rank's own host and devices), other (another replica's, or a host the user named), reference (TP=1). */
  role: 'same' | 'other' | 'reference';
  host: string;
  devices: number[];
  /** Global ranks whose engines use those devices (the live-device check). */
  ranksOnDevices: number[];
}

export interface TensorError {
  call: number;
  rank: number;
  shape: number[];
  dtype: string;
  atol: number;
  rtol: number;
  max_abs_diff: number;
  mismatched: number;
  numel: number;
  bit_exact: boolean;
  within_tolerance: boolean;
}

export interface ReplayResult extends ReplaySpec {
  ok: boolean;
  /** Why it did not run or failed (the process's last words). */
  error?: string;
  wall_ms?: number;
  /** The devices it ran on, as the replay process saw them (its fingerprint.json), or why none. */
  fingerprint?: DeviceFingerprint[];
  fingerprint_error?: string;
  /** A replay on another host through its agent (verdict-remote.ts): the rank asked and its machine's name. */
  agent_rank?: number;
  agent_hostname?: string;
  /** Where it ran, as the verdict chose: `here`, `here, with HOST's environment (--host-env)`, `on HOST by rank G's agent`. */
  ran?: string;
  tensors: TensorError[];
}

/** Run `argv` with `env` (bounded by `timeoutMs`); resolves with its exit and the tail of its output. */
export function runProcess(argv: string[], env: NodeJS.ProcessEnv, timeoutMs: number): Promise<{ code: number | null; tail: string; ms: number }> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    let tail = '';
    const keep = (b: Buffer) => {
      tail = (tail + b.toString('utf8')).slice(-4000);
    };
    const child = spawn(argv[0], argv.slice(1), { env, stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout.on('data', keep);
    child.stderr.on('data', keep);
    const timer = setTimeout(() => {
      tail += `\n(killed after ${timeoutMs} ms: --replay-timeout-ms)`;
      child.kill('SIGKILL');
    }, timeoutMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      resolve({ code: null, tail: `${tail}${e.message}`, ms: Date.now() - t0 });
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, tail, ms: Date.now() - t0 });
    });
  });
}

function readNpy(file: string): { dtype: string; shape: number[]; values: Float64Array; raw: Buffer } {
  const info = readNpyHeader(file);
  if (!info.dtype || info.fortranOrder) throw new Error(`${file}: expected a C-order .npy of one dtype, got ${info.descr}`);
  const numel = info.shape.reduce((a, b) => a * b, 1);
  const raw = readRange(file, info.dataOffset, numel * itemSize(info.dtype));
  return { dtype: info.dtype, shape: info.shape, values: decodeElements(info.dtype, raw), raw };
}

/** engine_rank<g>.npy against replay_rank<g>.npy of every call saved under `dir` (replay.py --save-logits). */
export function compareSaved(dir: string, calls: number[], ranks: number[], tols: Tolerances): { tensors: TensorError[]; missing: string[] } {
  const tensors: TensorError[] = [];
  const missing: string[] = [];
  for (const call of calls) {
    for (const g of ranks) {
      const e = path.join(dir, `call${call}`, `engine_rank${g}.npy`);
      const r = path.join(dir, `call${call}`, `replay_rank${g}.npy`);
      if (!fs.existsSync(e) || !fs.existsSync(r)) {
        missing.push(`call ${call} rank ${g}: ${fs.existsSync(r) ? 'no engine output' : 'no replay output'}`);
        continue;
      }
      const a = readNpy(r);
      const b = readNpy(e);
      const tol = toleranceFor(a.dtype as never, b.dtype as never, tols);
      const same = a.shape.length === b.shape.length && a.shape.every((d, i) => d === b.shape[i]);
      let maxAbs = same ? 0 : Infinity;
      let mismatched = same ? 0 : Math.max(a.values.length, b.values.length);
      if (same) {
        for (let i = 0; i < a.values.length; i++) {
          const x = a.values[i];
          const y = b.values[i];
          if (x === y || (Number.isNaN(x) && Number.isNaN(y))) continue;
          const d = Number.isFinite(x) && Number.isFinite(y) ? Math.abs(x - y) : Infinity;
          if (d > maxAbs) maxAbs = d;
          if (!(d <= tol.atol + tol.rtol * Math.abs(y))) mismatched++;
        }
      }
      tensors.push({
        call, rank: g, shape: b.shape, dtype: b.dtype, atol: tol.atol, rtol: tol.rtol, max_abs_diff: maxAbs, mismatched, numel: b.values.length,
        bit_exact: same && a.dtype === b.dtype && a.raw.equals(b.raw), within_tolerance: mismatched === 0,
      });
    }
  }
  return { tensors, missing };
}
