// The one way wavebus replaces a small file whole (reports, manifests, dump_skipped.json,
// runtime_config.json): readers see the old content or the new, never a part, and a crash
// leaves at worst a dot-named temp file that `wavebus inspect` lists as incomplete.
//
// The temp file sits next to the final name (rename(2) is atomic only within a filesystem) as
// `.<name>.tmp-<pid>-<random>`: unpredictable, so nobody can plant a link there in advance, and
// opened O_CREAT|O_EXCL|O_NOFOLLOW with its final mode, so it is never more readable than the
// result, not even for a moment. Data is fsynced before the rename, the directory after it.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import type { ArtifactModes } from './artifact-mode';
import { fsFailure } from './sink';
import { mkdirTrustedSync, ownCreatedFile } from './safe-mkdir';

const { O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;

export interface AtomicWriteOptions {
  /** Mode of the written file (before the umask), e.g. ArtifactModes.file. */
  mode: number;
  /** When given, missing parent directories are created with this mode (mkdirTrustedSync); otherwise the parent must exist. */
  dirMode?: number;
}

/** Options for an artifact written with `modes`: the file gets modes.file, new parents modes.dir. */
export function artifactWrite(modes: ArtifactModes): AtomicWriteOptions {
  return { mode: modes.file, dirMode: modes.dir };
}

/** The temp name `.<base>.tmp-<pid>-<16 hex>` beside `file`. */
export function atomicTempName(file: string): string {
  return path.join(path.dirname(file), `.${path.basename(file)}.tmp-${process.pid}-${crypto.randomBytes(8).toString('hex')}`);
}

/**
 * Replace `file` with `data`: temp file, fsync, rename, fsync the directory. On failure the temp
 * file is removed and the error (as the system call gave it) is thrown; `file` is untouched.
 */
export function writeFileAtomic(file: string, data: string | Buffer, opts: AtomicWriteOptions): void {
  if (opts.dirMode !== undefined) mkdirTrustedSync(path.dirname(file), opts.dirMode, 'artifact directory');
  const tmp = atomicTempName(file);
  const buf = typeof data === 'string' ? Buffer.from(data) : data;
  try {
    const fd = fs.openSync(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, opts.mode);
    try {
      ownCreatedFile(fd); // our group, not a setgid directory's
      for (let off = 0; off < buf.length; ) off += fs.writeSync(fd, buf, off, buf.length - off);
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, file);
  } catch (e) {
    fs.rmSync(tmp, { force: true }); // nothing half-written under any name
    throw e;
  }
  fsyncDir(path.dirname(file));
}

/**
 * writeFileAtomic with its writes and fsyncs on libuv's thread pool: for a file replaced while the
 * process serves a running engine (the agent's wave timeline), where a synchronous fsync would hold
 * the event loop for as long as the disk takes. Same temp name, modes, order and cleanup.
 */
export async function writeFileAtomicAsync(file: string, data: string | Buffer, opts: AtomicWriteOptions): Promise<void> {
  if (opts.dirMode !== undefined) mkdirTrustedSync(path.dirname(file), opts.dirMode, 'artifact directory');
  const tmp = atomicTempName(file);
  try {
    const fh = await fs.promises.open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, opts.mode);
    try {
      ownCreatedFile(fh.fd);
      await fh.writeFile(data);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await fs.promises.rename(tmp, file);
  } catch (e) {
    await fs.promises.rm(tmp, { force: true });
    throw e;
  }
  const dir = path.dirname(file);
  let dh: fs.promises.FileHandle;
  try {
    dh = await fs.promises.open(dir, 'r');
  } catch (e) {
    throw fsFailure('open', dir, e);
  }
  try {
    await dh.sync();
  } catch (e) {
    throw fsFailure('fsync', dir, e);
  } finally {
    await dh.close();
  }
}

/** writeFileAtomic of `value` as indented JSON with a final newline. */
export function writeJsonAtomic(file: string, value: unknown, opts: AtomicWriteOptions): void {
  writeFileAtomic(file, `${JSON.stringify(value, null, 2)}\n`, opts);
}

/** fsync a directory so a rename in it is durable. */
export function fsyncDir(dir: string): void {
  let fd: number;
  try {
    fd = fs.openSync(dir, 'r');
  } catch (e) {
    throw fsFailure('open', dir, e);
  }
  try {
    fs.fsyncSync(fd);
  } catch (e) {
    throw fsFailure('fsync', dir, e);
  } finally {
    fs.closeSync(fd);
  }
}
