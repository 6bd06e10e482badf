// Writing runtime_config.json (seed: writes go through a temp file + rename under a lock file).
// The lock is `<path>.lock`, created with O_EXCL|O_NOFOLLOW and holding "<pid> <host>"; it is
// removed after the write. A lock left by a process that died (same host, pid gone), or one older
// than staleMs whoever made it (a write holds it for milliseconds), is broken; a live holder is
// waited for up to waitMs, then the write fails with ERR_CONFIG_LOCKED. Nothing here follows a
// symbolic link: a link planted at the lock, the temp file or the config is replaced, never
// written through.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { ConfigError } from '../errors';
import { writeFileAtomic } from '../artifacts/atomic-write';
import { mkdirTrustedSync } from '../artifacts/safe-mkdir';

export interface LockOptions {
  /** How long to wait for a live holder (default 5000 ms). */
  waitMs?: number;
  /** A lock older than this is stale whoever holds it (default 60000 ms). */
  staleMs?: number;
  /** Called when a stale lock is broken (for a log line). */
  onStale?: (lockPath: string, why: string) => void;
}

const { O_WRONLY, O_RDONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

interface Holder {
  pid: number | null;
  host: string | null;
  ino: number;
  mtimeMs: number;
}

/** Who holds the lock, read without following links; null when it vanished meanwhile. */
function readHolder(lock: string): Holder | null {
  let fd: number;
  try {
    fd = fs.openSync(lock, O_RDONLY | O_NOFOLLOW);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return null;
    // a link or something unreadable: judged by its age only
    const st = fs.lstatSync(lock, { throwIfNoEntry: false });
    return st ? { pid: null, host: null, ino: st.ino, mtimeMs: st.mtimeMs } : null;
  }
  try {
    const st = fs.fstatSync(fd);
    const buf = Buffer.alloc(256);
    const n = fs.readSync(fd, buf, 0, buf.length, 0);
    const m = /^(\d{1,10}) (\S{1,200})\n?$/.exec(buf.subarray(0, n).toString('utf8'));
    return { pid: m ? Number(m[1]) : null, host: m ? m[2] : null, ino: st.ino, mtimeMs: st.mtimeMs };
  } finally {
    fs.closeSync(fd);
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM'; // exists, not ours
  }
}

/** Why the lock is stale, or null when its holder may still be writing. */
function staleReason(h: Holder, staleMs: number): string | null {
  if (h.pid !== null && h.host === os.hostname() && !pidAlive(h.pid)) return `its holder, pid ${h.pid}, is gone`;
  const age = Date.now() - h.mtimeMs;
  if (age > staleMs) return `it is ${Math.round(age / 1000)} s old`;
  return null;
}

/** Run `fn` holding `<file>.lock`. */
export function withConfigLock<T>(file: string, fn: () => T, opts: LockOptions = {}): T {
  const lock = `${file}.lock`;
  const waitMs = opts.waitMs ?? 5000;
  const staleMs = opts.staleMs ?? 60000;
  const deadline = Date.now() + waitMs;
  let ino = -1;
  for (;;) {
    try {
      const fd = fs.openSync(lock, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o644);
      try {
        fs.writeSync(fd, `${process.pid} ${os.hostname()}\n`);
        ino = fs.fstatSync(fd).ino;
      } finally {
        fs.closeSync(fd);
      }
      break;
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== 'EEXIST') throw new ConfigError(`${lock}: cannot create the lock file: ${(e as Error).message}`, `ERR_${code ?? 'EIO'}`);
    }
    const h = readHolder(lock);
    if (h === null) continue; // released meanwhile
    const why = staleReason(h, staleMs);
    if (why !== null) {
      // Remove exactly the lock we judged (another process may have broken it and taken a new one).
      const now = fs.lstatSync(lock, { throwIfNoEntry: false });
      if (now && now.ino === h.ino) {
        fs.rmSync(lock, { force: true });
        opts.onStale?.(lock, why);
      }
      continue;
    }
    if (Date.now() >= deadline) {
      throw new ConfigError(
        `${lock}: held by ${h.pid !== null ? `pid ${h.pid} on ${h.host}` : 'an unknown process'} for more than ${waitMs} ms; remove it if no wavebus process is writing ${file}`,
        'ERR_CONFIG_LOCKED',
      );
    }
    sleepSync(20);
  }
  try {
    return fn();
  } finally {
    const now = fs.lstatSync(lock, { throwIfNoEntry: false });
    if (now && now.ino === ino) fs.rmSync(lock, { force: true });
  }
}

/**
 * Replace `file` with `text` under its lock, through writeFileAtomic (an unpredictable temp name
 * beside it, O_EXCL|O_NOFOLLOW, fsync, rename, fsync the directory). Parent directories are created.
 */
export function writeConfigFile(file: string, text: string, opts: LockOptions = {}): void {
  // The runtime dir: readable by the ranks' users (the file is 0644), writable by us alone.
  mkdirTrustedSync(path.dirname(file), 0o755, 'runtime config directory');
  withConfigLock(
    file,
    () => {
      writeFileAtomic(file, text, { mode: 0o644 });
    },
    opts,
  );
}
