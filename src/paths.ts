// Owns every directory name wavebus builds, so that layouts live in exactly one place.
import * as fs from 'fs';
import * as path from 'path';
import * as os from 'os';
import { ConfigError } from './errors';

/** The per-process bundle directory name: unique under any parallelism (docs/design.md). */
export function rankDirName(globalRank: number): string {
  if (!Number.isInteger(globalRank) || globalRank < 0) {
    throw new RangeError(`global rank must be a non-negative integer, got ${globalRank}`);
  }
  return `rank${globalRank}`;
}

/**
 * The engine client of local rank `l` talks to its agent here. Keyed on the local rank because
 * the run dir is per host and every launcher (torchrun, Slurm) gives each process LOCAL_RANK.
 */
export function agentEndpoint(runDir: string, localRank: number): string {
  if (!Number.isInteger(localRank) || localRank < 0) {
    throw new RangeError(`local rank must be a non-negative integer, got ${localRank}`);
  }
  return `ipc://${path.join(runDir, `agent-local${localRank}.sock`)}`;
}

/** Longest path a unix socket address holds (sun_path is 108 bytes with the NUL). */
export const MAX_IPC_PATH = 107;

/**
 * Throws a ConfigError naming `flag` when the socket of local rank `localRank` (the highest one
 * that will live there) does not fit a unix socket address. Checked before anything is created.
 */
export function checkRunDirFits(runDir: string, localRank: number, flag: string, code = 'ERR_CONFIG'): void {
  const longest = agentEndpoint(runDir, localRank).slice('ipc://'.length);
  if (Buffer.byteLength(longest) > MAX_IPC_PATH) {
    throw new ConfigError(`${flag} ${runDir}: too long for a unix socket path (${longest} is over ${MAX_IPC_PATH} bytes); pick a shorter directory`, code);
  }
}

/** The shared-memory wave-vector mailbox of local rank `l`, written by its agent, mapped by its client. */
export function mailboxPath(runDir: string, localRank: number): string {
  if (!Number.isInteger(localRank) || localRank < 0) {
    throw new RangeError(`local rank must be a non-negative integer, got ${localRank}`);
  }
  return path.join(runDir, `mailbox-local${localRank}`);
}

/** The package root: walk up from here (src/ under ts-jest, dist/src/ when built) to wavebus's package.json. */
export function packageRoot(from: string = __dirname): string {
  let dir = from;
  for (;;) {
    const pj = path.join(dir, 'package.json');
    if (fs.existsSync(pj)) {
      try {
        if ((JSON.parse(fs.readFileSync(pj, 'utf8')) as { name?: string }).name === 'wavebus') return dir;
      } catch {
        /* unreadable package.json: keep walking */
      }
    }
    const up = path.dirname(dir);
    if (up === dir) throw new Error(`cannot find the wavebus package root (package.json named wavebus) above ${from}`);
    dir = up;
  }
}
