// What `bench overhead` measures beside the rates: the sidecar's CPU per wave, all processes of
// the host together (from --cpu-by-process lines), and the system calls per wave of each process
// of a running job (strace -ttt attached to each process, its calls counted inside a window of
// the steady state measured in waves of an engine rank).
import { spawn, spawnSync, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';

/** Engine ranks and the launcher are not the sidecar; everything else a job starts is. */
/** The engine's processes: the sim's job process and its ranks (`sim-rank`), or the Python engine's (`py-rank`). */
export const ENGINE_ROLES = ['sim', 'sim-rank', 'py-engine', 'py-rank'];
/** The engine's rank processes (the others in ENGINE_ROLES fork them). */
const RANK_ROLES = ['sim-rank', 'py-rank'];
/** `bench overhead --engine python`'s engine script: its process forks the ranks (same command line). */
const PY_ENGINE = 'overhead_engine.py';
export const LAUNCHER = 'launch';

/** By process name (`agent #2`) → thread → µs per wave: per role and the host's sidecar total. */
export function sidecarCpu(byProcess: Record<string, Record<string, number>>): { sidecar: number; engine: number; launcher: number; processes: number } {
  let sidecar = 0;
  let engine = 0;
  let launcher = 0;
  let processes = 0;
  for (const [name, threads] of Object.entries(byProcess)) {
    const us = Object.values(threads).reduce((a, b) => a + b, 0);
    const cmd = name.split(' #')[0];
    if (ENGINE_ROLES.includes(cmd)) engine += us;
    else if (cmd === LAUNCHER) launcher += us;
    else {
      sidecar += us;
      processes++;
    }
  }
  return { sidecar, engine, launcher, processes };
}

export const STRACE = '/usr/bin/strace';

/** The role of a process from its command line: the wavebus subcommand, or null for other programs. */
function roleOf(pid: number): string | null {
  let argv: string[];
  try {
    argv = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
  } catch {
    return null;
  }
  // A Python running the script (not GNU time, whose arguments name it too).
  if (/^python/.test(path.basename(argv[0] ?? '')) && argv.some((a) => a.endsWith(PY_ENGINE))) return 'py-engine';
  const bin = argv.findIndex((a) => a.endsWith(path.join('bin', 'wavebus.js')));
  if (bin < 0) return null;
  return argv.slice(bin + 1).find((a) => !a.startsWith('-')) ?? null;
}

/** Every live descendant of `root` with its wavebus role. */
export function jobProcesses(root: number): { pid: number; role: string }[] {
  const children = new Map<number, number[]>();
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(d)]);
    } catch {
      /* exited meanwhile */
    }
  }
  const out: { pid: number; role: string }[] = [];
  const todo: [number, string | null][] = [[root, null]];
  while (todo.length) {
    const [p, parentRole] = todo.pop()!;
    let role = roleOf(p);
    // The Python engine's ranks are forks of it, with its command line.
    if (role === 'py-engine' && parentRole === 'py-engine') role = 'py-rank';
    if (role) out.push({ pid: p, role });
    todo.push(...(children.get(p) ?? []).map((c): [number, string | null] => [c, role]));
  }
  return out;
}

/** A traced system call's wall time (strace -ttt), or null for a line that starts none (a resumption, a signal, an exit). */
export function syscallTime(line: string): number | null {
  const m = /^(?:\d+\s+)?(\d+\.\d+)\s+([a-z_0-9]+)\(/.exec(line);
  return m ? Number(m[1]) * 1000 : null;
}

export interface StraceWindow {
  /** Waves in the window: rank 0's stop-file checks, one per step. */
  waves: number;
  seconds: number;
  /** By role (numbered when several, in pid order) → system calls in the window. */
  calls: Record<string, number | null>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function readLines(file: string): string[] {
  return fs.existsSync(file) ? fs.readFileSync(file, 'utf8').split('\n') : [];
}

/**
 * Once `root` has `engineRanks` engine ranks and `sidecarProcs` other processes, attaches one
 * `strace -f -ttt` per process. The first engine rank checks `stopFile` once per step, so its
 * trace counts the waves: the window runs from its check number `warmupWaves` to its last check
 * (`warmupWaves + waves` of them, or what `maxSeconds` allowed), and each process's system calls
 * inside that window are counted afterwards from its trace.
 */
/** The job's processes once it has `engineRanks` engine ranks and `sidecarProcs` others (within a minute), in pid order. */
export async function waitForJob(root: number, engineRanks: number, sidecarProcs: number): Promise<{ pid: number; role: string }[]> {
  const by = Date.now() + 60000;
  let procs = jobProcesses(root);
  while (procs.filter((p) => RANK_ROLES.includes(p.role)).length < engineRanks || procs.filter((p) => !ENGINE_ROLES.includes(p.role) && p.role !== LAUNCHER).length < sidecarProcs) {
    if (Date.now() > by) throw new Error(`bench overhead: the job's processes did not all start (${procs.map((p) => p.role).join(', ')})`);
    await sleep(100);
    procs = jobProcesses(root);
  }
  return procs.sort((a, b) => a.pid - b.pid);
}

export async function straceJob(root: number, o: { engineRanks: number; sidecarProcs: number; stopFile: string; warmupWaves: number; waves: number; maxSeconds: number; dir: string }): Promise<StraceWindow> {
  const procs = await waitForJob(root, o.engineRanks, o.sidecarProcs);
  const seen: Record<string, number> = {};
  const tracers: { name: string; file: string; child: ChildProcess; done: Promise<void> }[] = [];
  for (const p of procs) {
    const n = (seen[p.role] = (seen[p.role] ?? 0) + 1);
    const name = n > 1 ? `${p.role} #${n}` : p.role;
    const file = path.join(o.dir, `strace-${p.pid}.txt`);
    const child = spawn(STRACE, ['-f', '-ttt', '-o', file, '-p', String(p.pid)], { stdio: 'ignore' });
    tracers.push({ name, file, child, done: new Promise((r) => child.once('exit', () => r())) });
  }
  const counter = tracers.find((t) => t.name === 'sim-rank')!;
  const checks = () => readLines(counter.file).filter((l) => l.includes(o.stopFile) && syscallTime(l) !== null);
  const until = Date.now() + o.maxSeconds * 1000;
  while (checks().length < o.warmupWaves + o.waves + 1 && Date.now() < until) await sleep(200);
  for (const t of tracers) t.child.kill('SIGINT');
  await Promise.race([Promise.all(tracers.map((t) => t.done)), sleep(10000)]);
  for (const t of tracers) if (t.child.exitCode === null) t.child.kill('SIGKILL');
  const times = checks().map((l) => syscallTime(l)!);
  const waves = times.length - 1 - o.warmupWaves;
  const calls: Record<string, number | null> = {};
  if (waves < 1) return { waves: 0, seconds: 0, calls };
  const [from, to] = [times[o.warmupWaves], times[times.length - 1]];
  for (const t of tracers) {
    const lines = readLines(t.file);
    calls[t.name] = lines.length === 0 ? null : lines.reduce((n, l) => {
      const at = syscallTime(l);
      return at !== null && at >= from && at < to ? n + 1 : n;
    }, 0);
  }
  return { waves, seconds: (to - from) / 1000, calls };
}

/** Whether strace can attach to a process of ours here (installed, and ptrace allowed). */
export function straceUsable(): string | null {
  if (!fs.existsSync(STRACE)) return 'strace not installed';
  const r = spawnSync(STRACE, ['-c', '-o', '/dev/null', 'true'], { stdio: 'ignore', timeout: 10000 });
  return r.status === 0 ? null : `strace cannot trace here (exit ${r.status})`;
}
