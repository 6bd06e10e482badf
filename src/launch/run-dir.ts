// Run directories (agent sockets, mailboxes, and whatever else a launch keeps next to them):
// private to the user who runs wavebus. A name we make up is unpredictable (mkdtemp); a name the
// user gives is created 0700 or, when it exists, accepted only if it is already a real directory
// of ours with mode 0700. A planted directory or link at a predictable path is refused, never used.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { ConfigError } from '../errors';
import { checkTrustedPathSync, mkdirTrustedSync } from '../artifacts/safe-mkdir';

const PRIVATE_MODE = 0o700;

export interface RunDir {
  path: string;
  /** We created it, so we remove it at the end (never a directory we found). */
  created: boolean;
}

function runDirError(message: string): ConfigError {
  return new ConfigError(message, 'ERR_RUN_DIR');
}

function euid(): number {
  return process.geteuid?.() ?? -1;
}

function modeText(mode: number): string {
  return `0${(mode & 0o7777).toString(8).padStart(3, '0')}`;
}

/** Where wavebus puts run dirs by default: /dev/shm (tmpfs, like the mailboxes want), else tmpdir. */
export function runDirBase(): string {
  return fs.existsSync('/dev/shm') ? '/dev/shm' : os.tmpdir();
}

/** A fresh private directory `<base>/<prefix>XXXXXX` (mkdtemp: unpredictable, made 0700 by the kernel call). */
export function makeRunDir(prefix: string, base: string = runDirBase()): RunDir {
  const dir = fs.mkdtempSync(path.join(base, prefix));
  // mkdtemp asks for 0700; fchmod anyway so a strange umask or ACL default cannot widen it.
  fixMode(dir, 'run dir');
  return { path: dir, created: true };
}

/**
 * The directory the user named with `flag` (e.g. "--run-dir"): created 0700 whatever the umask
 * (its parents as usual), or, when something is already there, accepted only if it is a real
 * directory (not a link) owned by us with mode 0700 exactly. Errors name the flag, the path and
 * what was found.
 */
export function claimRunDir(dir: string, flag: string): RunDir {
  const abs = path.resolve(dir);
  if (fs.lstatSync(abs, { throwIfNoEntry: false })) {
    checkRunDir(abs, flag);
    // Ours and 0700, but in a directory another user could rename it out of: refused too.
    checkTrustedPathSync(path.dirname(abs), flag, 'dir');
    return { path: abs, created: false };
  }
  mkdirTrustedSync(path.dirname(abs), 0o755, flag);
  try {
    mkdirTrustedSync(abs, PRIVATE_MODE, flag, { exclusive: true });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw runDirError(`${flag} ${abs}: cannot create it: ${(e as Error).message}`);
    checkRunDir(abs, flag);
    return { path: abs, created: false };
  }
  fixMode(abs, flag);
  return { path: abs, created: true };
}

/** Refuse `dir` unless it is a directory (lstat: not a link) owned by us with mode 0700. */
export function checkRunDir(dir: string, flag: string): void {
  let st: fs.Stats;
  try {
    st = fs.lstatSync(dir);
  } catch (e) {
    throw runDirError(`${flag} ${dir}: ${(e as Error).message}`);
  }
  const found = `owner uid ${st.uid}, mode ${modeText(st.mode)}`;
  const want = `a run dir must be a directory owned by uid ${euid()} (you) with mode 0700`;
  if (st.isSymbolicLink()) throw runDirError(`${flag} ${dir}: is a symbolic link (${found}); ${want}, not a link`);
  if (!st.isDirectory()) throw runDirError(`${flag} ${dir}: exists and is not a directory (${found}); ${want}`);
  if (st.uid !== euid()) throw runDirError(`${flag} ${dir}: exists and belongs to another user (${found}); ${want}; pick another path`);
  if ((st.mode & 0o7777) !== PRIVATE_MODE) throw runDirError(`${flag} ${dir}: exists with ${found}; ${want} (chmod 700 it, or pick another path)`);
}

// chmod through a descriptor opened without following links: the path cannot be swapped for a
// link between our mkdir and the chmod.
function fixMode(dir: string, flag: string): void {
  const fd = fs.openSync(dir, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY | fs.constants.O_NOFOLLOW);
  try {
    const st = fs.fstatSync(fd);
    if (st.uid !== euid()) throw runDirError(`${flag} ${dir}: was replaced by a directory of uid ${st.uid} while we created it`);
    fs.fchmodSync(fd, PRIVATE_MODE);
  } finally {
    fs.closeSync(fd);
  }
}

/** Remove a run dir we created; one we found is left alone. */
export function releaseRunDir(rd: RunDir): void {
  if (rd.created) fs.rmSync(rd.path, { recursive: true, force: true });
}

/**
 * Whether `p` may be removed to bind a unix socket there: nothing there, or a socket of ours left
 * by a killed process. Anything else (a link, a file, another user's socket) is refused by the caller.
 */
export function staleSocketOrNothing(p: string): 'none' | 'stale' | string {
  let st: fs.Stats;
  try {
    st = fs.lstatSync(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return 'none';
    throw e;
  }
  if (st.isSymbolicLink()) return 'a symbolic link';
  if (!st.isSocket()) return `not a socket (mode ${modeText(st.mode)})`;
  if (st.uid !== euid()) return `a socket of uid ${st.uid}`;
  return 'stale';
}

/**
 * The prefix of every POSIX shm name the job's engines create under one launch
 * (WAVEBUS_SHM_PREFIX): random, so the launcher can remove exactly this job's segments when the
 * command exits, however its processes died (docs/native.md).
 */
export function newShmPrefix(): string {
  return `wavebus-${crypto.randomBytes(6).toString('hex')}-`;
}

const SHM_PREFIX = /^wavebus-[0-9a-f]{12}-$/;

export function isShmPrefix(p: unknown): p is string {
  return typeof p === 'string' && SHM_PREFIX.test(p);
}

/**
 * Unlink the shm segments (entries of /dev/shm) whose names start with `prefix` and that belong to
 * us; returns the names removed. Another user's entry with our prefix is not ours to remove.
 */
export function removeShmSegments(prefix: string, shmDir = '/dev/shm'): string[] {
  if (!isShmPrefix(prefix)) throw new RangeError(`not a wavebus shm prefix: ${JSON.stringify(prefix)}`);
  let names: string[];
  try {
    names = fs.readdirSync(shmDir);
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const n of names) {
    if (!n.startsWith(prefix)) continue;
    const p = path.join(shmDir, n);
    try {
      const st = fs.lstatSync(p);
      if (!st.isFile() || st.uid !== euid()) continue;
      fs.unlinkSync(p);
      removed.push(n);
    } catch {
      /* gone meanwhile */
    }
  }
  return removed;
}
