// `wavebus bench rank-digest [--rows R] [--also-rows R2] [--sleep-ms MS] [--client-dir DIR] --json`
//
// rank_divergence's cost per step on the engine's side: the client's decided() (the sampled token
// column: one int32 copy into the decision ring and one CRC-32) and decided_inputs() (token ids and
// positions: two CRC-32s; with the row starts, as the example engines call it, kept in the ring) at
// R running requests, in Python (bench/rank_digest_engine.py: CPU torch int64 buffers sliced each
// step, as examples/torch-engine holds them) and in TypeScript (DecisionWriter on Int32Array views),
// into a real decision ring this process created as the agent does (src/agent/decision-ring.ts).
// Per size: each call warm in a tight loop (best and median of 5 chunks), and the two calls of one
// step after a sleep of the forward's length (p50, p90: the engine's cost once its caches went
// cold, as `bench client` measures the other calls). Also the agent's side: one poll of the ring.
// `--client-dir` runs the Python side against another checkout's clients/python (an A/B in one run).
// The Python side runs twice: with the client's native path (wavebus_client._native: the copy and
// CRC-32 in one C call; "python", with "python_path" saying which path ran) and with
// WAVEBUS_PY_NATIVE=0 (its numpy path: "python_numpy"), side by side.
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { DecisionRing } from '../src/agent/decision-ring';
import { DecisionWriter } from '../src/client/digest';
import { ConfigError } from '../src/errors';
import { packageRoot } from '../src/paths';
import { runDirBase } from '../src/launch/run-dir';
import type { BenchArgs, BenchFlags } from './lib/flags';

export const summary = "rank_divergence's cost per step in the engine (decided() and decided_inputs() at R running requests, Python and TypeScript clients; warm and after the forward's sleep) and per poll in the agent.";
export const flags = {
  steps: { type: 'int', default: 20000, describe: 'warm calls per chunk (5 chunks, after 200 untimed)' },
  rows: { type: 'int', default: 1024, max: 4096, describe: 'running requests: rows of the token column (and input tokens)' },
  'also-rows': { type: 'int', default: 4096, max: 4096, describe: 'a second size measured the same way (equal to --rows: none)' },
  'step-count': { type: 'int', default: 400, describe: 'steps timed after a sleep, per size (after 20 untimed)' },
  'sleep-ms': { type: 'number', default: 3, max: 1000, describe: "the forward's length: the sleep before each timed step" },
  'client-dir': { type: 'string', describe: "a clients/python directory to import instead of this package's (another checkout's, for an A/B in one run)" },
} satisfies BenchFlags;

const PY = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

type PySize = Record<'decided' | 'inputs' | 'inputs_rows', { best: number; median: number }> & Record<'step_p50' | 'step_p90' | 'step_inputs_p50' | 'step_decided_p50' | 'crc_floor' | 'step_floor_ptr_p50' | 'step_floor_copy_p50', number>;

function runEngine(file: string, args: BenchArgs<typeof flags>, sizes: number[], native: '0' | 'auto'): Promise<{ python: Record<string, PySize>; path: string }> {
  const clientDir = args['client-dir'] ? path.resolve(args['client-dir']) : path.join(packageRoot(), 'clients', 'python');
  if (!fs.existsSync(path.join(clientDir, 'wavebus_client', 'digest.py'))) throw new ConfigError(`bench rank-digest: --client-dir: ${clientDir} holds no wavebus_client/digest.py`);
  const script = path.join(packageRoot(), 'bench', 'rank_digest_engine.py');
  const argv = [script, file, String(args.steps), String(args['step-count']), String(args['sleep-ms']), ...sizes.map(String)];
  return new Promise((resolve, reject) => {
    const child = spawn(PY, argv, { env: { ...process.env, WAVEBUS_PY_NATIVE: native, PYTHONPATH: clientDir }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (b) => (out += b));
    child.stderr.on('data', (b) => (err = (err + b).slice(-4000)));
    child.on('exit', (code) => (code === 0 ? resolve(JSON.parse(out.trim().split('\n').pop()!)) : reject(new Error(`bench rank-digest: the engine exited ${code}: ${err}`))));
  });
}

/** The TypeScript client's DecisionWriter, timed in this process the same way as the Python engine. */
function runTs(file: string, args: BenchArgs<typeof flags>, rows: number, firstWave: number): Record<string, number> {
  const w = DecisionWriter.open(file);
  const cap = rows + 1;
  const ids = new Int32Array(cap).map((_, i) => (i * 7919) % 150000);
  const pos = new Int32Array(cap).map((_, i) => i + 1000);
  const qsl = new Int32Array(cap).map((_, i) => i);
  const tok = new Int32Array(cap).map((_, i) => (i * 104729) % 150000);
  const sleeper = new Int32Array(new SharedArrayBuffer(4));
  let wave = firstWave;
  const warm = (f: (w: number) => void): number => {
    for (let i = 0; i < 200; i++) f(wave++);
    const n = Math.max(1, Math.floor(args.steps / 4));
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) f(wave++);
    return Number(process.hrtime.bigint() - t0) / 1e3 / n;
  };
  const out: Record<string, number> = {
    decided: warm((v) => w.decided(v, tok.subarray(0, rows))),
    inputs_rows: warm((v) => w.inputs(v, ids.subarray(0, rows), pos.subarray(0, rows), qsl.subarray(0, rows + 1))),
  };
  const steps: number[] = [];
  const src = new Int32Array(rows).map((_, i) => (i * 31) % 150000);
  const logits = new Float32Array(rows * 64).map((_, i) => Math.sin(i));
  for (let i = 0; i < args['step-count'] + 20; i++) {
    Atomics.wait(sleeper, 0, 0, args['sleep-ms']); // the forward: a sleep that blocks the thread
    // The engine's own work first, untimed (bench/rank_digest_engine.py's order): its argmax...
    const sampled = new Int32Array(rows);
    for (let r = 0; r < rows; r++) {
      let best = 0;
      for (let k = 1; k < 64; k++) if (logits[r * 64 + k] > logits[r * 64 + best]) best = k;
      sampled[r] = best;
    }
    const t0 = process.hrtime.bigint();
    w.decided(wave, sampled);
    const t1 = process.hrtime.bigint();
    ids.set(src); // ...and the next step's inputs staged
    const t2 = process.hrtime.bigint();
    w.inputs(wave + 1, ids.subarray(0, rows), pos.subarray(0, rows), qsl.subarray(0, rows + 1));
    const dt = Number(t1 - t0 + process.hrtime.bigint() - t2) / 1e3;
    wave += 2;
    if (i >= 20) steps.push(dt);
  }
  w.close();
  steps.sort((x, y) => x - y);
  out.step_p50 = steps[Math.floor(steps.length / 2)];
  out.step_p90 = steps[Math.floor(steps.length * 0.9)];
  return out;
}

export async function run(args: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  // Where a job's ring lies: the run dir's base (/dev/shm, tmpfs). A ring on a disk-backed file
  // pays page faults after each writeback, which the engine of a real job does not.
  const dir = fs.mkdtempSync(path.join(runDirBase(), 'wavebus-bench-digest-'));
  try {
    const ring = DecisionRing.create(path.join(dir, 'decided-local0'));
    try {
      const sizes = args['also-rows'] === args.rows ? [args.rows] : [args.rows, args['also-rows']];
      const round = (x: number) => Math.round(x * 100) / 100;
      const roundAll = (o: Record<string, unknown>): Record<string, unknown> => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, typeof v === 'number' ? round(v) : roundAll(v as Record<string, unknown>)]));
      const py = await runEngine(ring.path, args, sizes, 'auto');
      const pyNumpy = await runEngine(ring.path, args, sizes, '0');
      // The engine's last waves are whole in the ring: the agent's poll reads them.
      const t0 = process.hrtime.bigint();
      let seen = 0;
      const polls = 2000;
      for (let i = 0; i < polls; i++) seen = ring.decided().length;
      const pollUs = Number(process.hrtime.bigint() - t0) / 1e3 / polls;
      if (seen === 0) throw new Error('bench rank-digest: the agent side read no decided wave from the ring');
      const ts: Record<string, Record<string, number>> = {};
      sizes.forEach((rows, i) => (ts[rows] = runTs(ring.path, args, rows, (i + 1) * 1_000_000_000)));
      return {
        bench: 'rank-digest', rows: sizes, steps: args.steps, step_count: args['step-count'], sleep_ms: args['sleep-ms'],
        python_client: args['client-dir'] ? path.resolve(args['client-dir']) : 'this package',
        python: roundAll(py.python), python_path: py.path, python_numpy: roundAll(pyNumpy.python), python_numpy_path: pyNumpy.path, typescript: roundAll(ts),
        agent_poll_us: round(pollUs), waves_in_ring: seen,
      };
    } finally {
      ring.close();
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
