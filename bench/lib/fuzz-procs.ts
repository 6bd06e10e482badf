// The processes of the fuzz bench (bench/fuzz.ts) and how it reads them: spawned CLIs with their
// output kept, waiting with a bound, drop totals from the agent's log, the coordinator's status,
// the crash scan (a process that died, or printed a stack trace) and a real wave round trip.
import { spawn, type ChildProcess } from 'child_process';
import * as path from 'path';
import { requestStatus } from '../../src/bus/coordinator';
import type { CurveClientKeys } from '../../src/bus/curve';
import type { BusToken } from '../../src/bus/auth';
import { WavebusClient } from '../../src/client/client';
import { agentEndpoint, mailboxPath, packageRoot } from '../../src/paths';
import { COORDINATOR_NODE_FLAGS } from '../../src/bus/constants';

export interface Proc {
  name: string;
  child: ChildProcess;
  out: string;
  err: string;
  exit?: { code: number | null; signal: string | null };
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export function startProc(name: string, args: string[], env: NodeJS.ProcessEnv = process.env): Proc {
  // A coordinator runs with the node flags the launcher gives it.
  const nodeFlags = args[0] === 'coordinator' ? COORDINATOR_NODE_FLAGS : [];
  const child = spawn(process.execPath, [...nodeFlags, path.join(packageRoot(), 'bin', 'wavebus.js'), ...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
  const p: Proc = { name, child, out: '', err: '' };
  child.stdout!.on('data', (b) => (p.out = (p.out + b.toString()).slice(-200000)));
  child.stderr!.on('data', (b) => (p.err = (p.err + b.toString()).slice(-2000000)));
  child.on('exit', (code, signal) => (p.exit = { code, signal }));
  return p;
}

/** `p`, or `late` once `ms` passed; the timer is cleared either way (a pending one would keep the process up). */
export async function within<T>(p: Promise<T>, ms: number, late: T): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<T>((r) => (timer = setTimeout(() => r(late), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** A process's end: its exit and its output pipes closed. */
const closed = (p: Proc) => (p.child.exitCode !== null || p.child.signalCode !== null) && p.child.stdout!.closed && p.child.stderr!.closed ? Promise.resolve() : new Promise<void>((r) => p.child.once('close', () => r()));

/** SIGTERM, 5 s to exit, then SIGKILL; returns once each one is gone (its pipes closed too). */
export async function stopProcs(procs: Proc[]): Promise<void> {
  for (const p of procs) if (!p.exit) p.child.kill('SIGTERM');
  await Promise.all(procs.map((p) => within(closed(p), 5000, undefined)));
  for (const p of procs) if (!p.exit) p.child.kill('SIGKILL');
  await Promise.all(procs.map((p) => within(closed(p), 5000, undefined)));
}

export async function until<T>(fn: () => T | Promise<T>, what: string, ms = 20000): Promise<NonNullable<T>> {
  const end = Date.now() + ms;
  let last: unknown;
  while (Date.now() < end) {
    try {
      const v = await fn();
      if (v) return v as NonNullable<T>;
    } catch (e) {
      last = e;
    }
    await sleep(50);
  }
  throw new Error(`fuzz: timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
}

/**
 * The last drop total the agent logged per reason (its DropCounter logs at most once per reason
 * every 5 s), of one counter (`where`, e.g. 'rank 0 file socket') or of all.
 */
export function droppedFromLog(stderr: string, where?: string): Record<string, number> {
  return totalsFromLog(stderr, 'dropped a bus frame', where);
}

/** The last refusal total a process logged per reason (ZapHandler: at most once per reason every 5 s). */
export function refusedFromLog(stderr: string): Record<string, number> {
  return totalsFromLog(stderr, 'refused a bus peer (CURVE)');
}

function totalsFromLog(stderr: string, msg: string, where?: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of stderr.split('\n')) {
    if (!line.includes(msg)) continue;
    try {
      const j = JSON.parse(line);
      if (where !== undefined && j.where !== where) continue;
      if (typeof j.reason === 'string' && typeof j.total === 'number') out[j.reason] = Math.max(out[j.reason] ?? 0, j.total);
    } catch {
      /* not a log line */
    }
  }
  return out;
}

export function count(into: Record<string, number>, reason: string | undefined): void {
  if (reason) into[reason] = (into[reason] ?? 0) + 1;
}

export function diff(after: Record<string, number>, before: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(after)) if (v - (before[k] ?? 0) > 0) out[k] = v - (before[k] ?? 0);
  return out;
}

export function sum(r: Record<string, number>): number {
  return Object.values(r).reduce((a, b) => a + b, 0);
}

/** A coordinator the bench started, with the keys a client needs and a count of the status requests it sent. */
export interface CoordinatorHandle {
  proc: Proc;
  port: number;
  curve?: CurveClientKeys;
  token?: BusToken;
  /** Status requests sent to it (each is one more message its ROUTER received). */
  polls: number;
}

/** The coordinator's status JSON (one status request, counted). */
export async function statusOf(c: CoordinatorHandle, timeoutMs = 3000): Promise<Record<string, any>> {
  c.polls++;
  const r = await requestStatus({ host: '127.0.0.1', port: c.port }, timeoutMs, c.curve, c.token);
  return { ...JSON.parse(r.statusJson), ready: r.ready };
}

/** A real wave round trip through an agent: head from its engine client, vector back in the mailbox. */
export async function roundTrip(runDir: string, wave: number): Promise<boolean> {
  const client = await WavebusClient.connect({ endpoint: agentEndpoint(runDir, 0), mailbox: mailboxPath(runDir, 0) });
  try {
    for (let w = wave; w < wave + 50; w++) {
      await client.waveHead(w);
      const r = await client.endOfWave(w);
      if (!r.timedOut && client.featureFlags() !== 0) return true;
      await sleep(20);
    }
    return false;
  } finally {
    await client.close();
  }
}

/** A crash: a process that died before we stopped it, or a stack trace in its output. */
export function crashOf(p: Proc): string | undefined {
  const died = p.exit && p.exit.signal !== 'SIGTERM' && !(p.exit.code === 0 && p.exit.signal === null);
  const trace = /\n\s+at .+\(.+:\d+:\d+\)/.test(p.err) && /TypeError|RangeError|ReferenceError|uncaught/i.test(p.err);
  if (!died && !trace) return undefined;
  return `${p.name} ${died ? `exited ${JSON.stringify(p.exit)}` : 'printed a stack trace'}: ${p.err.slice(-1500)}`;
}
