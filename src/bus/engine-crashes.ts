// Engine deaths the agents report (EngineCrash, docs/recorder.md): each agent flushed its flight
// recorder; the coordinator keeps the last few for /healthz and counts them per rank (/metrics).
import { counter } from '../metrics';

/** Crashes kept for /healthz (the counter keeps the total). */
const KEPT = 32;
const MAX_TEXT = 256;

export interface EngineCrashRecord {
  rank: number;
  engine_pid: number;
  exit_code: number | null;
  signal: string | null;
  last_wave: number;
  forwards_flushed: number;
  flush_dir: string;
  note: string;
  time: string;
}

const text = (v: unknown) => String(v ?? '').slice(0, MAX_TEXT);
const nat = (v: unknown) => {
  const n = Number(v ?? 0);
  return Number.isSafeInteger(n) && n >= 0 ? n : 0;
};

export class EngineCrashes {
  private readonly kept: EngineCrashRecord[] = [];
  private readonly total = counter('wavebus_engine_crashes_total', 'Engines that died without closing their client, per rank, as their agents reported them (each flushed its flight recorder)', ['rank'] as const);

  /** One agent's report (fields from the wire: bounded and checked here). */
  record(rank: number, m: Record<string, any>): void {
    const known = Boolean(m.exitKnown);
    this.kept.push({
      rank,
      engine_pid: nat(m.enginePid),
      exit_code: known && !m.signal ? Number(m.exitCode ?? 0) | 0 : null,
      signal: known && m.signal ? text(m.signal) : null,
      last_wave: nat(m.lastWave),
      forwards_flushed: nat(m.forwardsFlushed),
      flush_dir: text(m.flushDir),
      note: text(m.note),
      time: new Date().toISOString(),
    });
    if (this.kept.length > KEPT) this.kept.shift();
    this.total.inc({ rank: String(rank) });
  }

  /** For /healthz: the newest last. */
  status(): EngineCrashRecord[] {
    return this.kept.map((c) => ({ ...c }));
  }
}
