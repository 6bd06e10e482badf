// Opening files beneath a root without following links, one component at a time.
//
// Every component is opened relative to its parent's open descriptor as
// `/proc/self/fd/<parent fd>/<name>` with O_NOFOLLOW. Why that is race-free like openat(2): the
// kernel resolves `/proc/self/fd/<n>` as a magic link straight to the already-open directory (no
// path text is read again), then looks `<name>` up in that directory, and O_NOFOLLOW refuses a
// link as that last component. So a component swapped for a link, or a parent renamed, after we
// opened it cannot redirect the walk. Node has no openat(); this gives its guarantee without
// native code (wavebus is Linux-only anyway: /dev/shm, futex mailboxes). The root itself is a
// local decision (configuration, flags) and is opened as given.
//
// Only regular files and directories are accepted: links, fifos, sockets and devices are refused
// with UnsafePathError. Opens use O_NONBLOCK so a fifo is refused instead of blocking the opener
// until some writer appears (it has no effect on reads of regular files), and O_NOCTTY.
import * as fs from 'fs';
import { UnsafePathError } from '../errors';

const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW, O_DIRECTORY, O_NONBLOCK, O_NOCTTY } = fs.constants;
const READ_FLAGS = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY;

export type Want = 'file' | 'dir' | 'any';

/** The path that opens `name` inside the directory open as `dirFd` (or that directory itself). */
export function fdPath(dirFd: number, name?: string): string {
  return name === undefined ? `/proc/self/fd/${dirFd}` : `/proc/self/fd/${dirFd}/${name}`;
}

/** The components of a relative '/'-separated path; refuses '', '.', '..', NUL and absolute paths. */
export function splitRelative(rel: string, what: string): string[] {
  if (typeof rel !== 'string') throw new UnsafePathError(`${what}: expected a string path, got ${typeof rel}`, 'ERR_UNSAFE_PATH');
  if (rel.includes('\0')) throw new UnsafePathError(`${what}: path '${rel.replace(/\0/g, '\\0')}' contains NUL`, 'ERR_UNSAFE_PATH');
  if (rel.startsWith('/')) throw new UnsafePathError(`${what}: path '${rel}' is absolute; expected a path relative to the root`, 'ERR_UNSAFE_PATH');
  if (rel === '') return [];
  const parts = rel.split('/');
  for (const p of parts) {
    if (p === '' || p === '.' || p === '..') throw new UnsafePathError(`${what}: path '${rel}' has the component ${JSON.stringify(p)}, which is not allowed`, 'ERR_UNSAFE_PATH');
  }
  return parts;
}

function kindOf(st: fs.Stats): string {
  if (st.isFIFO()) return 'a fifo';
  if (st.isSocket()) return 'a socket';
  if (st.isCharacterDevice() || st.isBlockDevice()) return 'a device';
  if (st.isSymbolicLink()) return 'a symbolic link';
  return 'not a regular file or directory';
}

/** The refusal for an fstat result that is not what was wanted, or undefined when it is. */
function refusal(st: fs.Stats, want: Want, shown: string): UnsafePathError | undefined {
  if (want === 'dir' && !st.isDirectory()) return new UnsafePathError(`${shown} is ${st.isFile() ? 'a regular file' : kindOf(st)}, not a directory`, 'ERR_NOT_DIRECTORY');
  if (want === 'file' && !st.isFile()) return new UnsafePathError(`${shown} is ${st.isDirectory() ? 'a directory' : kindOf(st)}, not a regular file`, 'ERR_NOT_REGULAR');
  if (want === 'any' && !st.isFile() && !st.isDirectory()) return new UnsafePathError(`${shown} is ${kindOf(st)}; only regular files and directories are served`, 'ERR_NOT_REGULAR');
  return undefined;
}

/**
 * An open(2) failure as UnsafePathError for links and special files; other errors (ENOENT,
 * EACCES) pass through. O_DIRECTORY|O_NOFOLLOW on a link fails with ENOTDIR, like on a file: the
 * lstat only words the message (the open already refused it).
 */
function openFailure(e: unknown, dirFd: number, name: string, shown: string): unknown {
  const code = (e as NodeJS.ErrnoException).code;
  if (code !== 'ELOOP' && code !== 'ENXIO' && code !== 'ENOTDIR') return e;
  let st: fs.Stats | undefined;
  try {
    st = fs.lstatSync(fdPath(dirFd, name));
  } catch {
    /* gone meanwhile: word it from the errno */
  }
  if (code === 'ELOOP' || st?.isSymbolicLink()) return new UnsafePathError(`${shown} is a symbolic link; links are not followed`, 'ERR_PATH_LINK');
  if (code === 'ENOTDIR') return new UnsafePathError(`${shown} is ${st?.isFile() ? 'a regular file' : st ? kindOf(st) : 'not a directory'}, not a directory`, 'ERR_NOT_DIRECTORY');
  return new UnsafePathError(`${shown} is ${st ? kindOf(st) : 'a socket or device'}; only regular files and directories are served`, 'ERR_NOT_REGULAR');
}

export interface OpenedSync {
  fd: number;
  stat: fs.Stats;
}

/** Open `name` in the directory open as `dirFd`, without following a link; `shown` names it in errors. */
export function openChildSync(dirFd: number, name: string, want: Want, shown: string = name): OpenedSync {
  let fd: number;
  try {
    fd = fs.openSync(fdPath(dirFd, name), READ_FLAGS | (want === 'dir' ? O_DIRECTORY : 0));
  } catch (e) {
    throw openFailure(e, dirFd, name, shown);
  }
  try {
    const stat = fs.fstatSync(fd);
    const bad = refusal(stat, want, shown);
    if (bad) throw bad;
    return { fd, stat };
  } catch (e) {
    fs.closeSync(fd);
    throw e;
  }
}

/** Open the root directory (a local decision: opened as given). */
export function openRootSync(root: string): number {
  return fs.openSync(root, O_RDONLY | O_DIRECTORY);
}

/** Open `rel` beneath `root`: every component without following links. The caller closes `fd`. */
export function openBeneathSync(root: string, rel: string, want: Want): OpenedSync {
  const parts = splitRelative(rel, 'path');
  let dir = openRootSync(root);
  if (parts.length === 0) {
    // '' names the root itself: a directory, never what a file request wants
    const stat = fs.fstatSync(dir);
    const bad = refusal(stat, want, 'the root itself');
    if (bad) {
      fs.closeSync(dir);
      throw bad;
    }
    return { fd: dir, stat };
  }
  try {
    for (let i = 0; i < parts.length - 1; i++) {
      const next = openChildSync(dir, parts[i], 'dir', `'${parts.slice(0, i + 1).join('/')}'`);
      fs.closeSync(dir);
      dir = next.fd;
    }
    return openChildSync(dir, parts[parts.length - 1], want, `'${rel}'`);
  } finally {
    fs.closeSync(dir);
  }
}

/** The async twin of openBeneathSync (opens run on the libuv pool). The caller closes `fh`. */
export async function openBeneath(root: string, rel: string, want: Want): Promise<{ fh: fs.promises.FileHandle; stat: fs.Stats }> {
  const parts = splitRelative(rel, 'path');
  let dir = await fs.promises.open(root, O_RDONLY | O_DIRECTORY);
  if (parts.length === 0) {
    // '' names the root itself: a directory, never what a file request wants
    const stat = await dir.stat();
    const bad = refusal(stat, want, 'the root itself');
    if (bad) {
      await dir.close();
      throw bad;
    }
    return { fh: dir, stat };
  }
  try {
    for (let i = 0; i < parts.length - 1; i++) {
      const next = await openChildAsync(dir.fd, parts[i], 'dir', `'${parts.slice(0, i + 1).join('/')}'`);
      await dir.close();
      dir = next.fh;
    }
    return await openChildAsync(dir.fd, parts[parts.length - 1], want, `'${rel}'`);
  } finally {
    await dir.close();
  }
}

async function openChildAsync(dirFd: number, name: string, want: Want, shown: string): Promise<{ fh: fs.promises.FileHandle; stat: fs.Stats }> {
  let fh: fs.promises.FileHandle;
  try {
    fh = await fs.promises.open(fdPath(dirFd, name), READ_FLAGS | (want === 'dir' ? O_DIRECTORY : 0));
  } catch (e) {
    throw openFailure(e, dirFd, name, shown);
  }
  try {
    const stat = await fh.stat();
    const bad = refusal(stat, want, shown);
    if (bad) throw bad;
    return { fh, stat };
  } catch (e) {
    await fh.close();
    throw e;
  }
}

/**
 * Create `name` in the directory open as `dirFd`: O_CREAT|O_EXCL|O_NOFOLLOW, so an existing
 * file or a planted link there is an error, never written through. `mode` applies at creation
 * (the umask may only take bits away).
 */
export function createChildSync(dirFd: number, name: string, mode: number): number {
  return fs.openSync(fdPath(dirFd, name), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY, mode);
}
