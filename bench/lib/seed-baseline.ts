// `bench overhead`'s seed baseline: bench/seed_guard.py run as N Python engine ranks with the
// wavebus modes' forward and host work, once without any guard ("absent") and once doing what the
// seed's Runtime Guard does every step (a gloo broadcast of the due vector on the TP group and the
// detectors in the engine in Python). Its ratio is the one a user compares wavebus's against.
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { freePort } from '../../src/bus/ports';

export const PYTHON = '/usr/bin/python3';

export interface SeedRun {
  mode: 'absent' | 'seed';
  ranks: number;
  steps_per_s: number;
  steady_steps_per_s: number;
  cpu_us_per_step: number;
  /** Per rank: the collectives it completed (steps each in seed mode, 0 in absent). */
  broadcasts: number[];
  broadcast_objects: number[];
  detector_runs: number[];
}

export interface SeedShape {
  ranks: number;
  steps: number;
  forwardMs: number;
  computeUs: number;
  /** Running requests (rows of the logits), and the logits' width. */
  rows: number;
  vocab: number;
}

function script(): string {
  // dist/bench/lib -> bench/seed_guard.py in the package (not copied by tsc); from the sources, ../
  const inPackage = path.resolve(__dirname, '..', '..', '..', 'bench', 'seed_guard.py');
  return fs.existsSync(inPackage) ? inPackage : path.resolve(__dirname, '..', 'seed_guard.py');
}

const isNum = (x: unknown): x is number => typeof x === 'number' && Number.isFinite(x);
const isNums = (x: unknown, n: number): x is number[] => Array.isArray(x) && x.length === n && x.every(isNum);

/** One run of seed_guard.py; throws with its last stderr lines when it fails or prints garbage. */
export async function seedRun(mode: 'absent' | 'seed', s: SeedShape): Promise<SeedRun> {
  const port = await freePort();
  const args = [script(), mode, s.ranks, port, s.steps, s.forwardMs, s.computeUs, s.rows, s.vocab].map(String);
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, OMP_NUM_THREADS: '1' } });
    let out = '';
    let err = '';
    child.stdout.on('data', (b) => (out += String(b)));
    child.stderr.on('data', (b) => (err = (err + String(b)).slice(-4000)));
    child.on('error', reject);
    child.on('exit', (code) => {
      const last = out.trim().split('\n').pop() ?? '';
      let r: Partial<SeedRun> = {};
      try {
        r = JSON.parse(last) as Partial<SeedRun>;
      } catch {
        /* reported below */
      }
      if (code === 0 && r.mode === mode && isNum(r.steps_per_s) && isNum(r.steady_steps_per_s) && isNum(r.cpu_us_per_step) &&
          isNums(r.broadcasts, s.ranks) && isNums(r.broadcast_objects, s.ranks) && isNums(r.detector_runs, s.ranks)) {
        return resolve(r as SeedRun);
      }
      reject(new Error(`seed_guard.py ${mode} exited ${code}: ${(err || out).trim().split('\n').slice(-3).join(' | ')}`));
    });
  });
}

/** Whether PYTHON imports torch with gloo (the seed baseline's only requirement). */
export function seedAvailable(): Promise<boolean> {
  return new Promise((resolve) => {
    if (!fs.existsSync(PYTHON)) return resolve(false);
    const c = spawn(PYTHON, ['-c', 'import torch.distributed as d; assert d.is_gloo_available()'], { stdio: 'ignore' });
    c.on('error', () => resolve(false));
    c.on('exit', (code) => resolve(code === 0));
  });
}
