// Small local secrets kept in files (the bus token, the token-id hash key): 32 random bytes as 64
// hex digits in a 0600 file, created exclusively and never through a link; read back only from a
// regular file of this user that nobody else can read. Only the path ever travels, never the value.
import { randomBytes } from 'crypto';
import * as fs from 'fs';
import { ConfigError } from '../errors';

export const SECRET_BYTES = 32;

/**
 * Read `file`: a regular file (not a link), readable by nobody else, holding 64 hex digits (and an
 * optional newline). `flag` names where the path came from and `what` the secret, for errors.
 */
export function readSecretFile(file: string, flag: string, what: string): Buffer {
  let fd: number;
  try {
    fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    const why = code === 'ELOOP' ? 'is a symbolic link (refused)' : code === 'ENOENT' ? 'does not exist' : String((e as Error).message);
    throw new ConfigError(`${flag} ${file}: ${why}`);
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new ConfigError(`${flag} ${file}: not a regular file`);
    if ((st.mode & 0o077) !== 0) {
      throw new ConfigError(`${flag} ${file}: permissions 0${(st.mode & 0o777).toString(8)} are too open for ${what} (group or others can read it); it must be 0600`);
    }
    const uid = process.getuid?.();
    if (uid !== undefined && uid !== 0 && st.uid !== uid) throw new ConfigError(`${flag} ${file}: owned by uid ${st.uid}, not by this user (uid ${uid})`);
    const buf = Buffer.alloc(2 * SECRET_BYTES + 2);
    const n = fs.readSync(fd, buf, 0, buf.length, 0);
    const text = buf.subarray(0, n).toString('latin1').replace(/\n$/, '');
    if (!/^[0-9a-f]{64}$/.test(text)) throw new ConfigError(`${flag} ${file}: expected ${2 * SECRET_BYTES} lowercase hex digits (a file written by \`wavebus launch\`)`);
    return Buffer.from(text, 'hex');
  } finally {
    fs.closeSync(fd);
  }
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
