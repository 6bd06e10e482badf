// Owns every directory name wavebus builds, so that layouts live in exactly one place.
import * as path from 'path';
import * as os from 'os';

/** The per-process bundle directory name: unique under any parallelism (DESIGN.md). */
export function rankDirName(globalRank: number): string {
  if (!Number.isInteger(globalRank) || globalRank < 0) {
    throw new RangeError(`global rank must be a non-negative integer, got ${globalRank}`);
  }
  return `rank${globalRank}`;
}

/** Default cache root for snapshots: WAVEBUS_CACHE_ROOT, else ~/.cache/wavebus. */
export function defaultCacheRoot(env: NodeJS.ProcessEnv = process.env): string {
  return env.WAVEBUS_CACHE_ROOT && env.WAVEBUS_CACHE_ROOT !== '' ? env.WAVEBUS_CACHE_ROOT : path.join(os.homedir(), '.cache', 'wavebus');
}
