// Small local secrets kept in files (the bus token, the token-id hash key): 32 random bytes as 64
// hex digits in a 0600 file, created exclusively and never through a link; read back only from a
// regular file of this user that nobody else can read, in a directory nobody else can change.
// Only the path ever travels, never the value (the launcher hands its own sidecars the value on a
// pipe: readSecretFd).
import { randomBytes } from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { ConfigError, UntrustedPathError } from '../errors';
import { fdPath } from './safe-fs';
import { openTrustedDirSync, ownerName } from './safe-mkdir';

export const SECRET_BYTES = 32;

/**
 * Read `file`: a regular file (not a link), readable by nobody else, holding 64 hex digits (and an
 * optional newline). `flag` names where the path came from and `what` the secret, for errors.
 */
export function readSecretFile(file: string, flag: string, what: string): Buffer {
  const abs = path.resolve(file);
  // Another user who owns (or may write) the directory can swap the file for one of theirs, or
  // remove ours: every component is checked (safe-mkdir.ts's rule), and the directory holding the
  // secret must be ours or root's and writable by nobody else, sticky bit or not.
  const dirFd = openTrustedDirSync(path.dirname(abs), `${flag} ${file}`);
  if (dirFd === null) throw new ConfigError(`${flag} ${file}: does not exist`);
  let fd: number;
  try {
    checkSecretDir(fs.fstatSync(dirFd), path.dirname(abs), `${flag} ${file}: its directory ${path.dirname(abs)}`);
    fd = fs.openSync(fdPath(dirFd, path.basename(abs)), fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK);
  } catch (e) {
    if (e instanceof ConfigError || e instanceof UntrustedPathError) throw e;
    const code = (e as NodeJS.ErrnoException).code;
    const why = code === 'ELOOP' ? 'is a symbolic link (refused)' : code === 'ENOENT' ? 'does not exist' : String((e as Error).message);
    throw new ConfigError(`${flag} ${file}: ${why}`);
  } finally {
    fs.closeSync(dirFd);
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new ConfigError(`${flag} ${file}: not a regular file`);
    if ((st.mode & 0o077) !== 0) {
      throw new ConfigError(`${flag} ${file}: permissions 0${(st.mode & 0o777).toString(8)} are too open for ${what} (group or others can read it); it must be 0600`);
    }
    // Ours only, root included: a root job must not take a secret another user planted.
    const uid = process.geteuid?.();
    if (uid !== undefined && st.uid !== uid) throw new UntrustedPathError(`${flag} ${file}: owned by ${ownerName(st.uid)}, not by this user (${ownerName(uid)}); refusing ${what} another user could have written`);
    return parseSecret(readAll(fd), flag, file);
  } finally {
    fs.closeSync(fd);
  }
}

/** `shown`: how errors name the directory ("--bus-token-file F: its directory D"). */
function checkSecretDir(st: fs.Stats, dir: string, shown: string): void {
  const uid = process.geteuid?.() ?? 0;
  if (st.uid !== uid && st.uid !== 0) throw new UntrustedPathError(`${shown} is owned by ${ownerName(st.uid)}, not by this user (${ownerName(uid)}) or root; whoever owns it can swap the token file`);
  if ((st.mode & 0o022) !== 0) {
    throw new UntrustedPathError(`${shown} (mode 0${(st.mode & 0o7777).toString(8)}) is writable by ${st.mode & 0o002 ? 'every user' : 'its group'}; whoever may write it can swap the token file (chmod go-w ${dir}, or use another directory)`);
  }
}

/**
 * Where a secret file may be written or read: `dir` passes safe-mkdir.ts's walk, and is ours (or
 * root's) and writable by nobody else (`wavebus launch --bus-token-dir`).
 */
export function checkSecretDirPath(dir: string, flag: string): void {
  const fd = openTrustedDirSync(dir, `${flag} ${dir}`);
  if (fd === null) throw new ConfigError(`${flag} ${dir}: does not exist (an existing directory)`);
  try {
    checkSecretDir(fs.fstatSync(fd), dir, `${flag} ${dir}`);
  } finally {
    fs.closeSync(fd);
  }
}

/** Waits out an empty non-blocking pipe (the launcher writes the token right after the spawn). */
const PIPE_WAIT_MS = 10_000;

/** At most 64 hex digits and a newline, and one byte more to see a longer file. */
function readAll(fd: number): string {
  const buf = Buffer.alloc(2 * SECRET_BYTES + 2);
  let n = 0;
  const until = Date.now() + PIPE_WAIT_MS;
  for (;;) {
    let got: number;
    try {
      got = fs.readSync(fd, buf, n, buf.length - n, null);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EAGAIN' || Date.now() > until) throw e;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5);
      continue;
    }
    if (got === 0 || (n += got) === buf.length) break;
  }
  return buf.subarray(0, n).toString('latin1');
}

function parseSecret(raw: string, flag: string, file: string): Buffer {
  const text = raw.replace(/\n$/, '');
  if (!/^[0-9a-f]{64}$/.test(text)) throw new ConfigError(`${flag} ${file}: expected ${2 * SECRET_BYTES} lowercase hex digits (a file written by \`wavebus launch\`)`);
  return Buffer.from(text, 'hex');
}

/**
 * Read a secret from descriptor `fd` (a pipe the launcher wrote it into, then closed): what a
 * restarted sidecar is given, so it never reads a path again that someone could have changed.
 */
export function readSecretFd(fd: number, flag: string): Buffer {
  let raw: string;
  try {
    raw = readAll(fd);
  } catch (e) {
    throw new ConfigError(`${flag} ${fd}: cannot read it: ${(e as Error).message}`);
  } finally {
    try {
      fs.closeSync(fd);
    } catch {
      /* already closed */
    }
  }
  return parseSecret(raw, flag, `(descriptor ${fd})`);
}

/** The secret in `file`, as 64 hex digits and a newline (for a launcher to hand on: readSecretFd). */
export function secretText(secret: Buffer): string {
  return `${secret.toString('hex')}\n`;
}

/** Create `file` with a fresh secret: exclusively, never through a link, 0600 whatever the umask. */
export function createSecretFile(file: string, what: string): string {
  // One left by a launcher that was killed: removed (a link planted there is removed, not followed).
  fs.rmSync(file, { force: true });
  const { O_CREAT, O_EXCL, O_NOFOLLOW, O_WRONLY } = fs.constants;
  let fd: number;
  try {
    fd = fs.openSync(file, O_CREAT | O_EXCL | O_NOFOLLOW | O_WRONLY, 0o600);
  } catch (e) {
    throw new ConfigError(`cannot create ${what} ${file}: ${(e as Error).message}`, 'ERR_TOKEN_FILE');
  }
  try {
    fs.fchmodSync(fd, 0o600);
    fs.writeSync(fd, `${randomBytes(SECRET_BYTES).toString('hex')}\n`);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  return file;
}
