// `bench overhead --cpu-window`: each process's CPU inside a window of a running job's steady
// state, divided by the waves the coordinator published inside it. --cpu-by-process reads each
// process's total at exit, start-up included: about 0.5-0.9 s of CPU per node process (module
// loading, compilation), which over a run of 1500 steps reads as ~400-600 µs "per wave" that no
// wave costs. Here the window opens after a warm-up, both ends are read from the kernel
// (/proc/<pid>/task/*/schedstat: nanoseconds on a CPU, every thread), so start-up and exit are
// left out and the resolution is not the clock tick's 10 ms; the waves are the engine's steps
// that ended inside it.
import * as fs from 'fs';
import * as path from 'path';
import { ENGINE_ROLES, LAUNCHER, waitForJob } from './overhead-probes';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** ns on a CPU of every thread of `pid` (0 once it is gone). */
export function processCpuNs(pid: number): number {
  let ns = 0;
  let tids: string[];
  try {
    tids = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return 0;
  }
  for (const tid of tids) {
    try {
      ns += Number(fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      /* the thread ended meanwhile */
    }
  }
  return ns;
}

export interface CpuWindow {
  /** Engine steps (rank 0's) inside the window: waves. */
  waves: number;
  seconds: number;
  /** By role (numbered when several, in pid order) → µs per wave inside the window. */
  byProcess: Record<string, number>;
  sidecar: number;
  engine: number;
  launcher: number;
}

/** Every process's CPU (ns) at one moment. */
interface Snapshot {
  t: number;
  ns: number[];
}

/** Warm-up: the engine's steps before the window opens (the sidecar's start-up compilation). */
export const WARMUP_STEPS = 200;
const SAMPLE_MS = 250;

/**
 * Once the job under `root` has its processes: every process's CPU every SAMPLE_MS for
 * `warmupS + seconds` (the window is chosen afterwards from the engine's own step times: the
 * coordinator publishes no wave with everything off, and start-up takes seconds on a busy host).
 */
async function sample(root: number, o: { engineRanks: number; sidecarProcs: number; warmupS: number; seconds: number }): Promise<{ procs: { pid: number; role: string }[]; snaps: Snapshot[] }> {
  const procs = await waitForJob(root, o.engineRanks, o.sidecarProcs);
  const snaps: Snapshot[] = [];
  const until = Date.now() + (o.warmupS + o.seconds) * 1000;
  while (Date.now() < until) {
    snaps.push({ t: Date.now(), ns: procs.map((p) => processCpuNs(p.pid)) });
    await sleep(SAMPLE_MS);
  }
  return { procs, snaps };
}

/** The window: from the first snapshot after step WARMUP_STEPS ended, `seconds` long (or to the last snapshot before the steps stopped). */
function window(snaps: Snapshot[], ends: number[], seconds: number): { a: Snapshot; b: Snapshot; waves: number } {
  if (ends.length <= WARMUP_STEPS) throw new Error(`bench overhead --cpu-window: the engine stepped ${ends.length} times, not past its ${WARMUP_STEPS} warm-up steps, while sampled`);
  const a = snaps.find((s) => s.t >= ends[WARMUP_STEPS]);
  const last = ends[ends.length - 1];
  const inside = snaps.filter((s) => a && s.t > a.t && s.t <= Math.min(a.t + seconds * 1000, last));
  const b = inside[inside.length - 1];
  if (!a || !b) throw new Error('bench overhead --cpu-window: the engine did not step through a sampled window (raise --cpu-window-s)');
  return { a, b, waves: ends.filter((t) => t >= a.t && t < b.t).length };
}

function perWave(procs: { pid: number; role: string }[], w: { a: Snapshot; b: Snapshot; waves: number }): CpuWindow {
  const byProcess: Record<string, number> = {};
  const seen: Record<string, number> = {};
  let sidecar = 0;
  let engine = 0;
  let launcher = 0;
  procs.forEach((p, i) => {
    const n = (seen[p.role] = (seen[p.role] ?? 0) + 1);
    const us = w.waves > 0 ? (w.b.ns[i] - w.a.ns[i]) / 1000 / w.waves : 0;
    byProcess[n > 1 ? `${p.role} #${n}` : p.role] = Number(us.toFixed(1));
    if (ENGINE_ROLES.includes(p.role)) engine += us;
    else if (p.role === LAUNCHER) launcher += us;
    else sidecar += us;
  });
  const fixed = (x: number) => Number(x.toFixed(1));
  return { waves: w.waves, seconds: (w.b.t - w.a.t) / 1000, byProcess, sidecar: fixed(sidecar), engine: fixed(engine), launcher: fixed(launcher) };
}

type Start = (stopFile: string, onSpawn: (pid: number) => void) => Promise<{ code: number }>;

/**
 * One run started by `start` (a sim with --step-times writing `resultDir`), its processes' CPU
 * sampled, then stopped through its stop file; the waves are rank 0's steps that ended inside
 * the window. `beforeStop` runs after the window, before the stop file.
 */
export async function cpuWindowRun(resultDir: string, stopFile: string, start: Start, o: Parameters<typeof sample>[1], beforeStop?: () => Promise<void>): Promise<CpuWindow> {
  let root: number | undefined;
  const done = start(stopFile, (pid) => (root = pid));
  let s: Awaited<ReturnType<typeof sample>> | undefined;
  let failure: unknown;
  try {
    if (root === undefined) throw new Error('bench overhead --cpu-window: the run did not start');
    s = await sample(root, o);
    // After the window, while the job still runs (e.g. its /metrics read): nothing in the window.
    await beforeStop?.();
  } catch (e) {
    failure = e;
  }
  fs.writeFileSync(stopFile, '');
  const { code } = await done;
  if (failure !== undefined || !s) throw failure ?? new Error('bench overhead --cpu-window: no window');
  if (code !== 0) throw new Error(`bench overhead --cpu-window: the run exited ${code}`);
  const ends = (JSON.parse(fs.readFileSync(path.join(resultDir, 'rank0.json'), 'utf8')).stepEndsAt ?? []) as number[];
  return perWave(s.procs, window(s.snaps, ends, o.seconds));
}
