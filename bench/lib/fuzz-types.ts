// What one fuzz target (one socket) is given and what it reports (bench/fuzz.ts runs them).
import type { Job } from './fuzz-coordinator';
import type { Mutator } from './fuzz-mutator';
import type { Proc } from './fuzz-procs';

export interface FuzzCtx {
  m: Mutator;
  frames: number;
  /** Also one frame over the 64 MiB limit per tcp socket. */
  oversized: boolean;
  /** A private directory for this run (removed afterwards). */
  root: string;
  procs: Proc[];
  env: NodeJS.ProcessEnv;
  /** The job of that name (bench/fuzz.ts JOBS), started on first use and shared by the targets that name it. */
  job(name: string): Promise<Job>;
  note(what: string): void;
}

export interface SocketResult {
  socket: string;
  frames: number;
  seconds: number;
  /** Messages sent (frames plus the oversized one and the log flushes, where a target sends those). */
  sent: number;
  /** Handled: sent minus predicted drops (what the process took as valid input). */
  accepted: number;
  /** Drops the process counted during this target, by reason. */
  dropped: Record<string, number>;
  /** Drops predicted from the same decoders, by reason. */
  expected_dropped: Record<string, number>;
  /** Peers refused at the CURVE handshake (ZAP), by reason, where the target tries those. */
  refused?: Record<string, number>;
  /** Replies the process sent at once, by kind, and the prediction. */
  replies?: { got: Record<string, number>; expected: Record<string, number> };
  accounted: boolean;
  hung: boolean;
  /** The process answered a valid request after the garbage. */
  alive: boolean;
  problems: string[];
  [more: string]: unknown;
}

export interface FuzzTarget {
  /** The socket's name in the report. */
  name: string;
  run(ctx: FuzzCtx): Promise<SocketResult>;
}

/** Whether two counts-by-reason are equal (absent = 0). */
export function sameCounts(a: Record<string, number>, b: Record<string, number>): boolean {
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  return [...keys].every((k) => (a[k] ?? 0) === (b[k] ?? 0));
}
