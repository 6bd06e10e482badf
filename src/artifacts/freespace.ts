// Free-space check before a dump, and dump_skipped.json for dumps that were not taken.
import * as fs from 'fs';
import * as path from 'path';
import { DEFAULT_ARTIFACT_MODES, type ArtifactModes } from './artifact-mode';
import { CaptureError, ConfigError } from '../errors';
import { fsFailure } from './sink';
import { writeJsonAtomic } from './atomic-write';
import { mkdirTrustedSync } from './safe-mkdir';

export interface FreeSpace {
  ok: boolean;
  freeBytes: number;
  neededBytes: number;
}

/** The nearest existing directory at or above `dir` (the dump dir may not exist yet). */
function existingAncestor(dir: string): string {
  let d = path.resolve(dir);
  for (;;) {
    if (fs.existsSync(d)) return d;
    const up = path.dirname(d);
    if (up === d) return d;
    d = up;
  }
}

export interface SpaceNeed {
  /** Bytes this rank writes for the dump. */
  estimatePerRankBytes: number;
  /** Ranks of the TP group writing their shard of the same dump (to the same file system, typically). */
  tpSize: number;
  /** dump.free_headroom_bytes: left free after the dump. */
  headroomBytes: number;
}

/**
 * Is there room for the dump on the file system holding `dir`? The seed's rule: skip when
 * free < estimate_per_rank × tp_size + free_headroom_bytes (every TP rank of the last PP stage
 * writes its shard beside this one, so one rank's estimate alone would let the dump fill the disk).
 */
export function checkFreeSpace(dir: string, need: SpaceNeed): FreeSpace {
  for (const [k, v] of [['estimatePerRankBytes', need.estimatePerRankBytes], ['headroomBytes', need.headroomBytes]] as const) {
    if (!Number.isFinite(v) || v < 0) throw new ConfigError(`${k} must be a non-negative number, got ${v}`);
  }
  if (!Number.isSafeInteger(need.tpSize) || need.tpSize < 1) throw new ConfigError(`tpSize must be a positive integer, got ${need.tpSize}`);
  const at = existingAncestor(dir);
  let st: fs.StatsFs;
  try {
    st = fs.statfsSync(at);
  } catch (e) {
    throw fsFailure('statfs', at, e);
  }
  const freeBytes = Number(st.bavail) * Number(st.bsize);
  const neededBytes = need.estimatePerRankBytes * need.tpSize + need.headroomBytes;
  return { ok: freeBytes >= neededBytes, freeBytes, neededBytes };
}

export const SKIP_REASONS = [
  'finished_or_reaped',
  'no_dump_targets',
  'empty_block_ids',
  'insufficient_free_space',
  'quota_or_cooldown_blocked',
  'd2h_failed',
  'write_failed',
  // The rank's engine had ended the job's copy wave before the job reached its agent: nothing to copy.
  'wave_already_ended',
] as const;
export type SkipReason = (typeof SKIP_REASONS)[number];

export interface DumpSkipped {
  reason: SkipReason;
  req_id: string;
  incident_type: string;
  stage: 'arm' | 'drain';
  rank: number;
  wave: number;
  /** The DP replica that owns the request. */
  dp_rank?: number;
  /** Seconds since the epoch; default now. */
  ts?: number;
  /** Optional free-form detail (e.g. the error message, free/needed bytes). */
  detail?: Record<string, unknown>;
}

/** Write `<dir>/dump_skipped.json` atomically (temp file, fsync, rename, fsync dir). Returns its path. */
export function writeDumpSkipped(dir: string, info: DumpSkipped, modes: ArtifactModes = DEFAULT_ARTIFACT_MODES): string {
  if (!SKIP_REASONS.includes(info.reason)) throw new ConfigError(`dump_skipped.reason must be one of ${SKIP_REASONS.join(', ')}, got ${JSON.stringify(info.reason)}`);
  if (info.stage !== 'arm' && info.stage !== 'drain') throw new ConfigError(`dump_skipped.stage must be arm or drain, got ${JSON.stringify(info.stage)}`);
  for (const k of ['rank', 'wave'] as const) {
    if (!Number.isSafeInteger(info[k]) || info[k] < 0) throw new ConfigError(`dump_skipped.${k} must be a non-negative integer, got ${info[k]}`);
  }
  const body: Record<string, unknown> = {
    reason: info.reason,
    req_id: String(info.req_id),
    incident_type: String(info.incident_type),
    stage: info.stage,
    rank: info.rank,
    wave: info.wave,
    ...(info.dp_rank !== undefined ? { dp_rank: info.dp_rank } : {}),
    ts: info.ts ?? Date.now() / 1000,
  };
  if (info.detail) body.detail = info.detail;
  const final = path.join(dir, 'dump_skipped.json');
  try {
    mkdirTrustedSync(dir, modes.dir, 'dump directory');
  } catch (e) {
    throw fsFailure('mkdir', dir, e);
  }
  try {
    writeJsonAtomic(final, body, { mode: modes.file });
  } catch (e) {
    throw e instanceof CaptureError ? e : fsFailure('write', final, e);
  }
  return final;
}

