// `wavebus bench rank-digest [--steps N] [--rows R] --json`
//
// rank_divergence's cost per step on the engine's side, in Python: the client's decided() (the
// sampled token column: one int32 copy into the decision ring and one CRC-32) and
// decided_inputs() (token ids and positions: two CRC-32s; and with the row starts, as the example
// engines call it: three int32 copies into the ring more) at R running requests, each on a CPU
// torch int64 tensor as an engine holds them, into a real decision ring this process created as the
// agent does (src/agent/decision-ring.ts). Also the agent's side: one poll of the ring (a pread of
// the slot headers) in µs. Times are the best of 5 chunks and their median (a busy host inflates
// every figure; compare medians over runs).
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { DecisionRing } from '../src/agent/decision-ring';
import { packageRoot } from '../src/paths';
import { runDirBase } from '../src/launch/run-dir';
import type { BenchArgs, BenchFlags } from './lib/flags';

export const summary = "rank_divergence's cost per step in the engine (Python client: decided() and decided_inputs() at R running requests) and per poll in the agent.";
export const flags = {
  steps: { type: 'int', default: 20000, describe: 'timed steps per chunk (5 chunks, after 200 untimed)' },
  rows: { type: 'int', default: 1024, max: 4096, describe: 'running requests: rows of the token column (and input tokens)' },
} satisfies BenchFlags;

const PY = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

const ENGINE = `import json, sys, time, torch
from wavebus_client.digest import DecisionRing
path, n, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ring = DecisionRing(path)
g = torch.Generator().manual_seed(1)
tokens = torch.randint(0, 150000, (rows,), generator=g)
ids = torch.randint(0, 150000, (rows,), generator=g)
pos = torch.arange(rows) + 1000
starts = torch.arange(rows + 1, dtype=torch.int32)  # a decode step: one input token per row
def timed(f):
    for w in range(200):
        f(w)
    chunks = []
    for c in range(5):
        t0 = time.perf_counter()
        for w in range(n):
            f(w)
        chunks.append((time.perf_counter() - t0) / n * 1e6)
    chunks.sort()
    return {"best": chunks[0], "median": chunks[2]}
out = {"decided": timed(lambda w: ring.decided(w, tokens)), "inputs": timed(lambda w: ring.inputs(w, ids, pos)),
       "inputs_rows": timed(lambda w: ring.inputs(w, ids, pos, starts))}
for w in range(n, n + 64):  # as an engine does each step: inputs, then the decided column
    ring.inputs(w, ids, pos, starts)
    ring.decided(w, tokens)
print(json.dumps(out))
`;

function runEngine(file: string, n: number, rows: number): Promise<Record<string, { best: number; median: number }>> {
  return new Promise((resolve, reject) => {
    const child = spawn(PY, ['-c', ENGINE, file, String(n), String(rows)], { env: { ...process.env, PYTHONPATH: path.join(packageRoot(), 'clients', 'python') }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (b) => (out += b));
    child.stderr.on('data', (b) => (err = (err + b).slice(-4000)));
    child.on('exit', (code) => (code === 0 ? resolve(JSON.parse(out.trim().split('\n').pop()!)) : reject(new Error(`bench rank-digest: the engine exited ${code}: ${err}`))));
  });
}

export async function run(args: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  // Where a job's ring lies: the run dir's base (/dev/shm, tmpfs). A ring on a disk-backed file
  // pays page faults after each writeback, which the engine of a real job does not.
  const dir = fs.mkdtempSync(path.join(runDirBase(), 'wavebus-bench-digest-'));
  try {
    const ring = DecisionRing.create(path.join(dir, 'decided-local0'));
    try {
      const py = await runEngine(ring.path, args.steps, args.rows);
      // The engine's last waves are whole in the ring: the agent's poll reads them.
      const t0 = process.hrtime.bigint();
      let seen = 0;
      const polls = 2000;
      for (let i = 0; i < polls; i++) seen = ring.decided().length;
      const pollUs = Number(process.hrtime.bigint() - t0) / 1e3 / polls;
      if (seen === 0) throw new Error('bench rank-digest: the agent side read no decided wave from the ring');
      const round = (x: number) => Math.round(x * 100) / 100;
      return {
        bench: 'rank-digest', rows: args.rows, steps: args.steps,
        decided_us_best: round(py.decided.best), decided_us_median: round(py.decided.median),
        inputs_us_best: round(py.inputs.best), inputs_us_median: round(py.inputs.median),
        inputs_rows_us_best: round(py.inputs_rows.best), inputs_rows_us_median: round(py.inputs_rows.median),
        per_step_us_median: round(py.decided.median + py.inputs.median),
        per_step_rows_us_median: round(py.decided.median + py.inputs_rows.median),
        agent_poll_us: round(pollUs), waves_in_ring: seen,
        loadavg: os.loadavg().map(round),
      };
    } finally {
      ring.close();
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
