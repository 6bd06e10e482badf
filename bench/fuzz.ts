// `wavebus bench fuzz [--frames N] [--seed S] [--sockets a,b] [--oversized|--no-oversized] --json`
//
// Garbage and mutations of valid frames on every socket a wavebus process reads from the network
// or the engine, then proof that each process is alive, still works, and counted what it dropped:
// every target predicts each frame's fate with the same decoders (and MAC checks) the process
// uses, and the process's drop counters (by reason), replies and refusals must match exactly.
// The sockets (TARGETS below; one more is one line):
//   - coordinator ROUTER without keys, with the bus token, and through CURVE with an allowed key;
//   - version hellos of every protocol version, old and future, valid and mutated;
//   - peers without an allowed CURVE key, refused at the handshake and counted;
//   - `wavebus aggregate`'s file requests (list, chunks) through a CURVE coordinator to its own
//     roots and to an agent's, with garbage roots, paths, offsets and lengths;
//   - an agent's direct file socket (CURVE, opened as `wavebus aggregate` opens it): garbage and
//     mutated file requests from an allowed key, peers without one refused at the handshake;
//   - an agent's engine-client ROUTER (ipc), every request kind;
//   - the agents' SUB on the replica wave streams (replicas 0 and 1) from a rogue PUB, without
//     and with the bus token; with CURVE a rogue PUB cannot connect at all.
// The mutations: bench/lib/fuzz-mutator.ts.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { startJob, type Job, type JobSpec } from './lib/fuzz-coordinator';
import { Mutator } from './lib/fuzz-mutator';
import { crashOf, stopProcs, type Proc } from './lib/fuzz-procs';
import { clientTarget, subCurveTarget, subTarget } from './lib/fuzz-agent';
import { directTarget } from './lib/fuzz-direct';
import { filesTarget } from './lib/fuzz-files';
import { helloTarget, refusalTarget, routerTarget } from './lib/fuzz-router';
import type { FuzzTarget, SocketResult } from './lib/fuzz-types';
import type { BenchArgs, BenchFlags } from './lib/flags';

export { Mutator } from './lib/fuzz-mutator';

/** The jobs targets run against, started on first use (a job without an agent: everything its ROUTER receives is the fuzzer's). */
export const JOBS: Record<string, JobSpec> = {
  plain: { name: 'plain' },
  token: { name: 'token', token: true },
  curve: { name: 'curve', curve: true, agent: true },
};

/** Every fuzzed socket, in the order they run. */
export const TARGETS: FuzzTarget[] = [
  routerTarget('coordinator_router', 'plain'),
  helloTarget('coordinator_hello', 'plain'),
  routerTarget('coordinator_router_token', 'token'),
  helloTarget('coordinator_hello_token', 'token'),
  refusalTarget('coordinator_curve_refusals', 'curve'),
  clientTarget('agent_client', 'curve'),
  // before the CURVE ROUTER target: a fuzzer that says Hello as rank 0 takes over rank 0's route
  filesTarget('coordinator_files_curve', 'curve'),
  directTarget('agent_direct_files', 'curve'),
  routerTarget('coordinator_router_curve', 'curve'),
  subTarget('agent_sub', {}),
  subTarget('agent_sub_token', { token: true }),
  subCurveTarget('agent_sub_curve'),
];

export interface FuzzResult {
  frames_per_socket: number;
  sockets: string[];
  seed: number;
  crashes: number;
  hung: boolean;
  accounted: boolean;
  results: Record<string, SocketResult>;
  problems: string[];
  seconds: number;
}

export const summary = 'Garbage and mutated frames on every socket a wavebus process listens on; every process must stay up and answer.';
export const flags = {
  frames: { type: 'int', default: 100000, describe: 'frames per socket' },
  seed: { type: 'int', default: 20240601, min: 0, max: 2 ** 32 - 1, describe: 'seed of the mutator (the same seed sends the same frames)' },
  sockets: { type: 'string', describe: `comma-separated targets (default all: ${TARGETS.map((t) => t.name).join(', ')})` },
  oversized: { type: 'boolean', default: true, describe: 'also send one frame over the 64 MiB limit per tcp socket' },
} satisfies BenchFlags;

export async function run(a: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  const sockets = a.sockets ? a.sockets.split(',').map((s) => s.trim()) : undefined;
  return fuzz({ frames: a.frames, seed: a.seed, oversized: a.oversized, sockets }) as unknown as Record<string, unknown>;
}

export async function fuzz(opts: { frames: number; seed: number; oversized: boolean; sockets?: string[] }): Promise<FuzzResult> {
  const t0 = Date.now();
  const chosen = opts.sockets ?? TARGETS.map((t) => t.name);
  const unknown = chosen.filter((s) => !TARGETS.some((t) => t.name === s));
  if (unknown.length > 0) throw new Error(`--sockets: unknown ${unknown.join(', ')}; known: ${TARGETS.map((t) => t.name).join(', ')}`);
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-fuzz-'));
  const procs: Proc[] = [];
  const env = { ...process.env, WAVEBUS_LOG_LEVEL: 'warn' };
  const jobs = new Map<string, Promise<Job>>();
  const note = (what: string) => process.env.WAVEBUS_FUZZ_DEBUG && process.stderr.write(`fuzz +${Date.now() - t0} ms: ${what}\n`);
  const ctx = {
    m: new Mutator(opts.seed),
    frames: opts.frames,
    oversized: opts.oversized,
    root,
    procs,
    env,
    note,
    job(name: string): Promise<Job> {
      if (!jobs.has(name)) jobs.set(name, startJob(JOBS[name], root, procs, env));
      return jobs.get(name)!;
    },
  };
  const results: Record<string, SocketResult> = {};
  const problems: string[] = [];
  try {
    for (const t of TARGETS.filter((x) => chosen.includes(x.name))) {
      note(`${t.name} starts`);
      try {
        results[t.name] = await t.run(ctx);
      } catch (e) {
        problems.push(`${t.name}: ${String((e as Error)?.stack ?? e)}`);
      }
      note(`${t.name} done: ${JSON.stringify(results[t.name] ?? null).slice(0, 3000)}`);
    }
  } finally {
    await stopProcs(procs);
    fs.rmSync(root, { recursive: true, force: true });
  }
  if (process.env.WAVEBUS_FUZZ_DEBUG) for (const p of procs) note(`${p.name} stderr: ${p.err.slice(-4000)}`);
  let crashes = 0;
  for (const p of procs) {
    const c = crashOf(p);
    if (c) {
      crashes++;
      problems.push(c);
    }
  }
  for (const r of Object.values(results)) problems.push(...r.problems);
  const ran = Object.values(results);
  return {
    frames_per_socket: opts.frames,
    sockets: ran.map((r) => r.socket),
    seed: opts.seed,
    crashes,
    hung: ran.some((r) => r.hung),
    accounted: ran.length === chosen.length && ran.every((r) => r.accounted && r.alive),
    results,
    problems,
    seconds: (Date.now() - t0) / 1000,
  };
}
