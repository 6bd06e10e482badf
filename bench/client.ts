// `wavebus bench client [--lang python|ts] [--requests 1,64,256,1024,4096] [--steps N] [--warm N] [--forward sleep|spin] --json`
//
// The engine's own cost per step at real batch sizes: the calls an engine makes every step
// (wave_head, before_forward, end_of_wave, pending_dump for the requests that finished), timed in
// the engine's thread (bench/client_engine.py; with --lang ts bench/lib/client-engine-ts.ts, whose
// seed row is still the Python one: the seed's detectors are Python), p50/p99 of their sum and of each. Each size runs,
// in the same run: the tensor path (TensorBatch, the telemetry ring; in Python also tensor_py, the same
// with WAVEBUS_PY_NATIVE=0: its numpy ring writes beside the native ones) and the dict path against a
// live coordinator (this process, detectors token_repeat, spec_acceptance and garbled on) and
// agent; everything off (an agent without a bus: the mailbox says off); the same loop without
// wavebus; the floor (the same calls, each to a function that does nothing: what the calls alone
// cost after the forward); and the seed's path (its Python detectors in the engine).
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { Agent } from '../src/agent/agent';
import { Coordinator } from '../src/bus/coordinator';
import { ConfigError } from '../src/errors';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { packageRoot } from '../src/paths';
import { freePortPair } from '../src/bus/ports';
import { MAX_TIMER_MS } from '../src/commands/flags';
import type { BenchArgs, BenchFlags } from './lib/flags';

export const summary = "The engine's own per-step cost of the client's calls at N running requests (tensor path, native and numpy ring writes, and dict path, everything off, no wavebus, the calls to no-ops, the seed's Python detectors), in the engine's thread.";
export const flags = {
  lang: { type: 'string', default: 'python', choices: ['python', 'ts'], describe: "the engine's language: python (wavebus_client) or ts (the TypeScript client, typed arrays)" },
  requests: { type: 'string', default: '1,64,256,1024,4096', describe: 'running requests per step, comma-separated' },
  steps: { type: 'int', default: 300, describe: 'timed steps per size and mode (after 30 untimed; the TypeScript engine 3x the timed steps, 30 to 1000, for V8 to optimize the calls)' },
  warm: { type: 'int', default: 0, min: 0, max: 100000, describe: "the TypeScript engine's untimed steps, run without the forward (V8 optimizes a call after enough calls, not time: a long-running engine's steady state, e.g. 6000); 0: 3x --steps, 30 to 1000, each with its forward" },
  'bound-ms': { type: 'int', default: 50, max: MAX_TIMER_MS, describe: "the agent's end-of-wave bound, the bound of every per-step call (default the product's 50 ms; a head the agent cannot take within it is skipped and reported as heads_skipped)" },
  forward: { type: 'string', default: 'sleep', choices: ['sleep', 'spin'], describe: "the 3 ms forward between before_forward and end_of_wave (not timed): sleep, or spin (busy-wait, as an engine thread in cudaStreamSynchronize; the caches stay warmer)" },
} satisfies BenchFlags;

const PY = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
const MODES = ['tensor', 'tensor_py', 'dict', 'off', 'none', 'floor', 'seed'] as const;
/** Modes that run the tensor engine against a live job; tensor_py is Python's with its native path off. */
const TENSOR = new Set(['tensor', 'tensor_py']);
const CFG = { detector: { token_repeat: { enabled: true }, spec_acceptance: { enabled: true }, garbled: { enabled: true } } };

function engineScript(): string {
  // dist/bench -> bench/client_engine.py in the package (tsc does not copy it); from the sources, beside this file.
  const p = path.join(packageRoot(), 'bench', 'client_engine.py');
  if (!fs.existsSync(p)) throw new ConfigError(`bench client: ${p} is missing`);
  return p;
}

function runEngine(lang: string, mode: string, n: number, steps: number, runDir: string, forward: string, warm: number): Promise<Record<string, any>> {
  // The seed's path is Python whatever the engine's language (its detectors are).
  const cmd = lang === 'ts' && mode !== 'seed' ? [process.execPath, path.join(__dirname, 'lib', 'client-engine-ts.js')] : [PY, engineScript()];
  // tensor_py: the tensor engine with the Python client's native path off (its numpy ring writes).
  const native = mode === 'tensor_py' ? { WAVEBUS_PY_NATIVE: '0' } : {};
  return new Promise((resolve, reject) => {
    const child = spawn(cmd[0], [cmd[1], mode === 'tensor_py' ? 'tensor' : mode, String(n), String(steps), runDir, forward, ...(cmd[0] === process.execPath ? [String(warm)] : [])], { env: { ...process.env, ...native, PYTHONPATH: path.join(packageRoot(), 'clients', 'python') }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (b) => (out += b));
    child.stderr.on('data', (b) => (err = (err + b).slice(-4000)));
    child.on('exit', (code) => (code === 0 ? resolve(JSON.parse(out.trim().split('\n').pop()!)) : reject(new Error(`bench client: the ${mode} engine exited ${code}: ${err}`))));
  });
}

/** A live one-rank job: coordinator and guard (detectors on) and agent, in this process. */
export async function withJob<T>(bus: boolean, fn: (runDir: string, agent: Agent) => Promise<T>, boundMs = 50): Promise<T> {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-bench-client-'));
  const log = createLogger('bench-client', 'error');
  const layout = { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 };
  let guard: Guard | undefined;
  let coordinator: Coordinator | undefined;
  let agent: Agent | undefined;
  try {
    const startup = parseStartupOptions(JSON.stringify({ runtime_config: CFG }), {}, root);
    const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
    const runDir = path.join(root, 'run');
    if (bus) {
      guard = new Guard({ startup, layout });
      const port = await freePortPair();
      coordinator = new Coordinator({ port, layout, heartbeatMs: 300, policy: guard, logger: log });
      await coordinator.start();
      agent = new Agent({ identity, runDir, logger: log, coordinator: { host: '127.0.0.1', port }, heartbeatMs: 300, roots: { dumps: startup.dumpDir }, endOfWaveTimeoutMs: boundMs });
    } else {
      agent = new Agent({ identity, runDir, logger: log, roots: { dumps: startup.dumpDir }, endOfWaveTimeoutMs: boundMs });
    }
    await agent.start();
    const t0 = Date.now();
    while (bus && !(agent.synced && coordinator!.liveRanks().length === 1)) {
      if (Date.now() - t0 > 20000) throw new Error('bench client: the agent did not sync with its coordinator within 20 s');
      await new Promise((r) => setTimeout(r, 20));
    }
    return await fn(runDir, agent);
  } finally {
    await agent?.stop();
    await coordinator?.stop();
    guard?.close();
    fs.rmSync(root, { recursive: true, force: true });
  }
}

export async function run(args: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  const sizes = args.requests.split(',').map((s) => {
    const n = Number(s.trim());
    if (!Number.isInteger(n) || n < 1 || n > 1 << 20) throw new ConfigError(`--requests: ${JSON.stringify(s)} is not a whole number in 1..${1 << 20}`);
    return n;
  });
  const results: Record<string, unknown>[] = [];
  for (const n of sizes) {
    const row: Record<string, unknown> = { requests: n };
    for (const mode of MODES.filter((m) => m !== 'tensor_py' || args.lang === 'python')) {
      const live = (dir: string, agent: Agent): Promise<Record<string, any>> =>
        runEngine(args.lang, mode, n, args.steps, dir, args.forward, args.warm).then(async (r) => {
          // The TypeScript engine's heads are counted where they arrive: the agent relayed each (the last within its poll).
          for (let t0 = Date.now(); args.lang === 'ts' && agent.stats.waveHeadsRelayed < args.steps + (r.warm ?? 30) && Date.now() - t0 < 2000; ) await new Promise((res) => setTimeout(res, 10));
          return args.lang === 'ts' ? { ...r, wave_heads_sent: agent.stats.waveHeadsRelayed } : r;
        });
      const r = TENSOR.has(mode) || mode === 'dict' ? await withJob(true, live, args['bound-ms']) : mode === 'off' ? await withJob(false, (dir) => runEngine(args.lang, mode, n, args.steps, dir, args.forward, args.warm), args['bound-ms']) : await runEngine(args.lang, mode, n, args.steps, os.tmpdir(), args.forward, args.warm);
      // A head not sent: the agent missed its bound (a loaded host) and the client skipped it, as it
      // must. Such a run is reported with heads_skipped, never as if every head went; none sent is an error.
      const heads = args.steps + (r.warm ?? 30); // the engine's untimed steps sent heads too
      const skipped = TENSOR.has(mode) || mode === 'dict' ? heads - r.wave_heads_sent : 0;
      if (skipped === heads) throw new Error(`bench client: the ${mode} engine sent none of its ${heads} heads`);
      // Tensor heads that went inline: the agent had not taken the slot yet (it fell behind), or the step did not fit the ring.
      row[mode] = { p50_us: round(r.p50_us), p99_us: round(r.p99_us), calls: r.calls, ...(TENSOR.has(mode) ? { ring_heads: r.ring_heads, inline_heads: r.inline_heads } : {}), ...(TENSOR.has(mode) && r.ring_path ? { ring_path: r.ring_path } : {}), ...(TENSOR.has(mode) && r.slots ? { slots: r.slots } : {}), ...(skipped > 0 ? { heads_skipped: skipped } : {}), ...(mode === 'off' && r.off_loop_us !== undefined ? { loop_us: round(r.off_loop_us) } : {}) };
    }
    results.push(row);
  }
  return { bench: 'client', lang: args.lang, steps: args.steps, ...(args.warm > 0 ? { warm: args.warm } : {}), forward: args.forward, detectors: Object.keys(CFG.detector), results };
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}
