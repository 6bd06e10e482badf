// What `wavebus trace` draws for one rank: when each wave's vector arrived here, the engine's
// end_of_wave waits on this agent, late and missed vectors, dump writes and input captures. A
// fixed ring of numbers allocated once: recording one costs a clock read and five stores, nothing
// is allocated per wave, and the oldest entries are overwritten. Written (atomically, the
// artifact mode of the dumps) beside the dumps after a dump, at most once per TIMELINE_WRITE_GAP_MS
// and off the event loop (the host receiver writes every local rank's vectors from that loop), and
// once more when the agent stops: `<dump_root>/timeline/rank<g>.json` (docs/report.md).
import { performance } from 'perf_hooks';
import * as path from 'path';
import { mkdirTrustedSync } from '../artifacts/safe-mkdir';
import { TIMELINE_DIR } from '../paths';
import * as fs from 'fs';
import { writeFileAtomic, writeFileAtomicAsync } from '../artifacts/atomic-write';
import type { ArtifactModes } from '../artifacts/artifact-mode';
import type { RankIdentity } from '../layout';
import type { Logger } from '../log';

/** Entry kinds; their names are written in the file's `kinds` so a reader needs no table. */
export const TIMELINE_KINDS = ['vector', 'end_of_wave', 'late_vector', 'missed_vector', 'dump', 'capture'] as const;
export type TimelineKind = (typeof TIMELINE_KINDS)[number];
const KIND_INDEX: Record<TimelineKind, number> = Object.fromEntries(TIMELINE_KINDS.map((k, i) => [k, i])) as Record<TimelineKind, number>;

/** kind, wave, start (Unix ms, sub-ms precision), duration (ms), arg (dump: jobs; capture: call index; else 0). */
export const TIMELINE_FIELDS = ['kind', 'wave', 'start_ms', 'dur_ms', 'arg'] as const;
const F = TIMELINE_FIELDS.length;
/** 8192 entries: about two minutes of a 40 ms-step engine's vectors, and 320 KiB in memory. */
export const TIMELINE_CAPACITY = 8192;
/**
 * The least time between two writes of the file while the agent runs: a full ring is about 270 KB
 * of JSON, and rewriting it with a synchronous fsync after every dump held the agent's loop 11–20 ms
 * a time, every agent at once on a dump wave (docs/report.md). Dumps closer together share one
 * write; the last state is written at stop.
 */
export const TIMELINE_WRITE_GAP_MS = 2000;

export const timelineFile = (dumpRoot: string, globalRank: number): string => path.join(dumpRoot, TIMELINE_DIR, `rank${globalRank}.json`);

export class WaveTimeline {
  private readonly ring: Float64Array;
  private next = 0;
  /** Entries recorded in all (those over the capacity were overwritten). */
  recorded = 0;
  /** writeSoon's state: a write waiting for its gap, one under way, dumps since it began. */
  private scheduled?: NodeJS.Timeout;
  private writing?: Promise<void>;
  private dirty = false;
  private stopped = false;
  private lastWriteMs = 0;

  constructor(readonly capacity = TIMELINE_CAPACITY) {
    this.ring = new Float64Array(capacity * F);
  }

  /** Unix ms with the monotonic clock's resolution. */
  now(): number {
    return performance.timeOrigin + performance.now();
  }

  record(kind: TimelineKind, wave: number, startMs: number, durMs = 0, arg = 0): void {
    const o = this.next * F;
    this.ring[o] = KIND_INDEX[kind];
    this.ring[o + 1] = wave;
    this.ring[o + 2] = startMs;
    this.ring[o + 3] = durMs;
    this.ring[o + 4] = arg;
    this.next = this.next + 1 === this.capacity ? 0 : this.next + 1;
    this.recorded++;
  }

  /** The entries kept, oldest first. */
  entries(): number[][] {
    const n = Math.min(this.recorded, this.capacity);
    const first = this.recorded > this.capacity ? this.next : 0;
    const out: number[][] = [];
    for (let i = 0; i < n; i++) {
      const o = ((first + i) % this.capacity) * F;
      // Times to the microsecond: the file stays small and the trace's unit is 1 µs.
      out.push([this.ring[o], this.ring[o + 1], Math.round(this.ring[o + 2] * 1000) / 1000, Math.round(this.ring[o + 3] * 1000) / 1000, this.ring[o + 4]]);
    }
    return out;
  }

  toJson(id: RankIdentity): Record<string, unknown> {
    return {
      kind: 'wavebus_timeline',
      version: 1,
      global_rank: id.globalRank,
      identity: { tp_rank: id.tpRank, pp_rank: id.ppRank, dp_rank: id.dpRank, cp_rank: id.cpRank, host: id.host },
      written_ms: Date.now(),
      kinds: TIMELINE_KINDS,
      fields: TIMELINE_FIELDS,
      recorded: this.recorded,
      overwritten: Math.max(0, this.recorded - this.capacity),
      entries: this.entries(),
    };
  }

  /** Run `fn` and record its span (an end_of_wave the engine waits on). */
  async span<T>(kind: TimelineKind, wave: number, fn: () => Promise<T>): Promise<T> {
    const start = this.now();
    try {
      return await fn();
    } finally {
      this.record(kind, wave, start, this.now() - start);
    }
  }

  /** A beforeForward: recorded only when it captured (wave column: the engine's global_step; arg: the call index). */
  async captureSpan(step: number, fn: () => Promise<Record<string, unknown>>): Promise<Record<string, unknown>> {
    const start = this.now();
    const res = await fn();
    if (res.captured === true) this.record('capture', step, start, this.now() - start, Number(/call(\d+)$/.exec(String(res.callDir))?.[1] ?? -1));
    return res;
  }

  /** write() where there is a dump root; a failure is logged, never thrown (debugging never takes the job down). */
  writeLogged(dumpRoot: string | undefined, id: RankIdentity, modes: ArtifactModes, log: Logger): void {
    if (dumpRoot === undefined || this.recorded === 0) return;
    try {
      this.write(dumpRoot, id, modes);
    } catch (e) {
      log.warn({ err: (e as Error).message }, 'could not write the wave timeline');
    }
  }

  /**
   * After a dump: the file is replaced soon, off the event loop (writeFileAtomicAsync), at most once
   * per TIMELINE_WRITE_GAP_MS; dumps meanwhile are in that write or the next. Failures are logged.
   */
  writeSoon(dumpRoot: string | undefined, id: RankIdentity, modes: ArtifactModes, log: Logger): void {
    if (dumpRoot === undefined || this.recorded === 0) return;
    if (this.scheduled || this.writing) {
      this.dirty = true;
      return;
    }
    const run = (): void => {
      this.scheduled = undefined;
      this.dirty = false;
      this.lastWriteMs = Date.now();
      this.writing = this.writeAsync(dumpRoot, id, modes)
        .catch((e) => log.warn({ err: (e as Error).message }, 'could not write the wave timeline'))
        .finally(() => {
          this.writing = undefined;
          if (this.dirty && !this.stopped) this.writeSoon(dumpRoot, id, modes, log);
        });
    };
    this.scheduled = setTimeout(run, Math.max(0, this.lastWriteMs + TIMELINE_WRITE_GAP_MS - Date.now()));
    this.scheduled.unref();
  }

  /** No write is scheduled any more, and the one under way has ended (the agent is stopping). */
  async settled(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.scheduled);
    this.scheduled = undefined;
    await this.writing;
  }

  private async writeAsync(dumpRoot: string, id: RankIdentity, modes: ArtifactModes): Promise<void> {
    const file = this.fileFor(dumpRoot, id, modes);
    if (file) await writeFileAtomicAsync(file, `${JSON.stringify(this.toJson(id))}\n`, { mode: modes.file });
  }

  /** The file's path with its folder made, or undefined when the dump root's parent is gone. */
  private fileFor(dumpRoot: string, id: RankIdentity, modes: ArtifactModes): string | undefined {
    // The root is made if need be (a rank that dumped nothing still has its waves), but never
    // where its parent is gone: a job's dir removed under a stopping agent is not made again.
    if (!fs.existsSync(path.dirname(dumpRoot))) return undefined;
    const file = timelineFile(dumpRoot, id.globalRank);
    mkdirTrustedSync(path.dirname(file), modes.dir, 'wave timeline directory');
    return file;
  }

  /** Replace the rank's timeline file (temp + fsync + rename, the dumps' modes). */
  write(dumpRoot: string, id: RankIdentity, modes: ArtifactModes): string | undefined {
    const file = this.fileFor(dumpRoot, id, modes);
    if (file) writeFileAtomic(file, `${JSON.stringify(this.toJson(id))}\n`, { mode: modes.file });
    return file;
  }
}
