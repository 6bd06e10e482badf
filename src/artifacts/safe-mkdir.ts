// Creating directories for artifacts, and checking where they live, as carefully as reading them.
//
// A dump root, report dir or config file may sit in a directory other local users can write
// (/tmp, a shared scratch). There, anything they plant (a link `token_repeat -> /etc/x`, a setgid
// directory of theirs, their own copy of the runtime dir) must never be written through or into.
// The rule, for every component of the absolute path:
//  - a component that exists must be owned by us or by root, and not be writable by others unless
//    its sticky bit is set (then others cannot rename or remove what we put there);
//  - a link is followed only when it is ours or root's, and its target is walked again;
//  - a missing one is created by us: mkdir in the directory already open (by descriptor: the
//    `/proc/self/fd/<n>/<name>` form of safe-fs.ts, so a parent swapped meanwhile cannot redirect
//    it), opened again with O_NOFOLLOW, refused unless we own it, then given our group and its
//    mode explicitly (a setgid parent would otherwise hand it a group and the setgid bit).
// Once every component passes, the path text resolves to the directories checked: nobody else
// can change an entry in any of them. So writers may use the path afterwards.
import * as fs from 'fs';
import * as path from 'path';
import { UnsafePathError, UntrustedPathError } from '../errors';
import { fdPath } from './safe-fs';

const { O_RDONLY, O_DIRECTORY, O_NOFOLLOW, O_NOCTTY, O_NONBLOCK } = fs.constants;
const DIR_FLAGS = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NOCTTY;
const S_ISVTX = 0o1000;
/** Links followed in one walk before giving up (the kernel's own limit). */
const MAX_LINKS = 40;

const euid = (): number => process.geteuid?.() ?? 0;
const egid = (): number => process.getegid?.() ?? 0;

/** "uid 1001 (alice)": the user name from /etc/passwd where it is there (read on each call: errors only). */
export function ownerName(uid: number): string {
  let name: string | undefined;
  try {
    for (const line of fs.readFileSync('/etc/passwd', 'utf8').split('\n')) {
      const f = line.split(':');
      if (f.length >= 3 && f[2] === String(uid)) {
        name = f[0];
        break;
      }
    }
  } catch {
    /* no passwd file: the uid alone */
  }
  return name === undefined ? `uid ${uid}` : `uid ${uid} (${name})`;
}

/** Ours or root's: nobody else may own a directory our artifacts pass through. */
function trustedOwner(uid: number): boolean {
  return uid === 0 || uid === euid();
}

/** The refusal for a component `shown` with stat `st`, or null when it is safe to use. */
function untrusted(st: fs.Stats, shown: string, what: string): UntrustedPathError | null {
  const kind = st.isDirectory() ? 'directory' : st.isSymbolicLink() ? 'symbolic link' : 'file';
  if (!trustedOwner(st.uid)) {
    const trusted = euid() === 0 ? 'root (us)' : `us (${ownerName(euid())}) or root`;
    return new UntrustedPathError(`${what}: ${kind} ${shown} is owned by ${ownerName(st.uid)}, not by ${trusted}; refusing to use it (pick a path of yours, or remove it)`);
  }
  if (!st.isSymbolicLink() && st.mode & 0o002 && !(st.isDirectory() && st.mode & S_ISVTX)) {
    return new UntrustedPathError(`${what}: ${kind} ${shown} (owned by ${ownerName(st.uid)}) is writable by every user${st.isDirectory() ? ' without the sticky bit' : ''}; refusing to use it (chmod o-w ${shown})`);
  }
  return null;
}

/** The components of an absolute, normalised path. */
function components(p: string): string[] {
  return path.resolve(p).split('/').filter((c) => c !== '');
}

export interface WalkOptions {
  /** Create missing directories with this mode (before the umask); absent: a missing one ends the walk. */
  createMode?: number;
  /** The last component must be created by this walk (a fresh temp dir): an existing one is an error. */
  exclusive?: boolean;
}

/** Give a directory we just created our group and exactly its permission bits (no setgid, no sticky). */
function fixCreated(fd: number, st: fs.Stats, shown: string, what: string): void {
  if (st.uid !== euid()) throw new UntrustedPathError(`${what}: directory ${shown} appeared owned by ${ownerName(st.uid)} while we created it; refusing to use it`);
  if (st.gid !== egid()) fs.fchownSync(fd, euid(), egid());
  if (st.gid !== egid() || (st.mode & 0o7000) !== 0) fs.fchmodSync(fd, st.mode & 0o777);
}

/**
 * Walk `dir` from '/' under the rule above; returns the open descriptor of `dir` (the caller
 * closes it), or null when a component is missing and `opts.createMode` is not given.
 */
export function openTrustedDirSync(dir: string, what: string, opts: WalkOptions = {}): number | null {
  let parts = components(dir);
  let fd = fs.openSync('/', O_RDONLY | O_DIRECTORY);
  let at = '/';
  let links = 0;
  try {
    for (let i = 0; i < parts.length; i++) {
      const name = parts[i];
      const shown = path.join(at, name);
      const last = i === parts.length - 1;
      let child: number | undefined;
      let made = false;
      if (!(last && opts.exclusive)) {
        try {
          child = fs.openSync(fdPath(fd, name), DIR_FLAGS);
        } catch (e) {
          const code = (e as NodeJS.ErrnoException).code;
          if (code === 'ENOENT') {
            if (opts.createMode === undefined) return null;
          } else if (code === 'ENOTDIR' || code === 'ELOOP') {
            const lst = fs.lstatSync(fdPath(fd, name));
            if (!lst.isSymbolicLink()) throw e; // a file where a directory belongs: the system's ENOTDIR
            const bad = untrusted(lst, shown, what);
            if (bad) throw bad;
            if (++links > MAX_LINKS) throw new UnsafePathError(`${what}: ${dir}: more than ${MAX_LINKS} links`, 'ERR_PATH_LINK');
            // A link of ours or root's: walk its target (as the kernel resolves it) from '/' again.
            let real: string;
            try {
              real = fs.realpathSync.native(fdPath(fd, name));
            } catch {
              throw new UnsafePathError(`${what}: ${shown} is a link to a missing directory; links are not created through`, 'ERR_PATH_LINK');
            }
            parts = [...components(real), ...parts.slice(i + 1)];
            fs.closeSync(fd);
            fd = fs.openSync('/', O_RDONLY | O_DIRECTORY);
            at = '/';
            i = -1;
            continue;
          } else {
            throw e;
          }
        }
      }
      if (child === undefined) {
        try {
          fs.mkdirSync(fdPath(fd, name), opts.createMode);
          made = true;
        } catch (e) {
          // Created meanwhile (by us or by someone else): opened and judged below.
          if ((e as NodeJS.ErrnoException).code !== 'EEXIST' || (last && opts.exclusive)) throw e;
        }
        try {
          child = fs.openSync(fdPath(fd, name), DIR_FLAGS);
        } catch (e) {
          const code = (e as NodeJS.ErrnoException).code;
          if (code !== 'ENOTDIR' && code !== 'ELOOP') throw e;
          const lst = fs.lstatSync(fdPath(fd, name));
          if (!lst.isSymbolicLink()) throw e;
          throw untrusted(lst, shown, what) ?? new UnsafePathError(`${what}: ${shown} appeared as a symbolic link while we created it; links are not created through`, 'ERR_PATH_LINK');
        }
      }
      try {
        const st = fs.fstatSync(child);
        if (made) fixCreated(child, st, shown, what);
        const bad = untrusted(st, shown, what);
        if (bad) throw bad;
      } catch (e) {
        fs.closeSync(child);
        throw e;
      }
      fs.closeSync(fd);
      fd = child;
      at = shown;
    }
    const done = fd;
    fd = -1;
    return done;
  } finally {
    if (fd >= 0) fs.closeSync(fd);
  }
}

/**
 * The one way wavebus creates a directory it writes artifacts into: `dir` and every missing
 * parent, under the rule above. Returns `dir` (absolute). Throws UntrustedPathError naming the
 * component and its owner, UnsafePathError for a component that is not a directory.
 */
export function mkdirTrustedSync(dir: string, mode: number, what = 'directory', opts: { exclusive?: boolean } = {}): string {
  const fd = openTrustedDirSync(dir, what, { createMode: mode, exclusive: opts.exclusive });
  fs.closeSync(fd as number);
  return path.resolve(dir);
}

/**
 * The startup check of a root, report dir (`kind` 'dir') or config file ('file'): every existing
 * component passes the rule above (what does not exist yet is created by mkdirTrustedSync later).
 * A file must be a regular file of ours or root's that others cannot write.
 */
export function checkTrustedPathSync(p: string, what: string, kind: 'dir' | 'file'): void {
  const abs = path.resolve(p);
  if (kind === 'dir') {
    const fd = openTrustedDirSync(abs, what);
    if (fd !== null) fs.closeSync(fd);
    return;
  }
  const dirFd = openTrustedDirSync(path.dirname(abs), what);
  if (dirFd === null) return;
  try {
    checkTrustedFileAt(dirFd, path.basename(abs), abs, what);
  } finally {
    fs.closeSync(dirFd);
  }
}

function checkTrustedFileAt(dirFd: number, name: string, shown: string, what: string): void {
  let fd: number;
  try {
    fd = fs.openSync(fdPath(dirFd, name), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return;
    if (code !== 'ELOOP') throw e;
    const lst = fs.lstatSync(fdPath(dirFd, name));
    const bad = untrusted(lst, shown, what);
    if (bad) throw bad;
    // A link of ours or root's: its target must pass too.
    let real: string;
    try {
      real = fs.realpathSync.native(fdPath(dirFd, name));
    } catch {
      return; // dangling: nothing to read; the writer replaces the link (atomic rename)
    }
    if (real === shown) throw new UnsafePathError(`${what}: ${shown}: link loop`, 'ERR_PATH_LINK');
    checkTrustedPathSync(real, what, 'file');
    return;
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new UnsafePathError(`${what}: ${shown} is not a regular file`, 'ERR_NOT_REGULAR');
    const bad = untrusted(st, shown, what);
    if (bad) throw bad;
  } finally {
    fs.closeSync(fd);
  }
}

/** The check of a file we just opened or created (fstat): ours or root's, not writable by others. */
export function checkTrustedStat(st: fs.Stats, shown: string, what: string): void {
  const bad = untrusted(st, shown, what);
  if (bad) throw bad;
}

/** A file we just created in a directory that may be setgid: give it our group (its mode is set at creation). */
export function ownCreatedFile(fd: number): void {
  const st = fs.fstatSync(fd);
  if (st.gid !== egid()) fs.fchownSync(fd, euid(), egid());
}
