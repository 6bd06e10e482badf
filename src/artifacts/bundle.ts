// Atomic bundle directories: everything is written under a sibling temp dir
// `<parent>/.<name>.tmp-<pid>-<random>@<host>`, fsynced, and renamed to the final name only when
// complete. Any failure removes the temp dir, so nothing under a final name is ever partial.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { CaptureError } from '../errors';
import { crc32c, formatChecksum } from './checksum';
import { asCaptureError, FileSink, fsFailure, WriteResult } from './sink';
import { isSafeComponent, safeComponent } from './sanitize';
import { DEFAULT_ARTIFACT_MODES, type ArtifactModes } from './artifact-mode';
import { isTensorFormat, TENSOR_FORMATS, tensorFormatOfFile, type TensorFormat } from './tensor-format';
import { tensorFile, type TensorFileValue } from './tensor-files';
import { mkdirTrustedSync } from './safe-mkdir';

/**
 * Tensor files whose fsync may still be running behind the next file's writes. Each holds one
 * writer thread blocked in fsync; past this many, writeTensor waits for the oldest first.
 */
const MAX_BACKGROUND_SYNCS = 8;

export { TENSOR_FORMATS, type TensorFormat } from './tensor-format';

export interface FileEntry {
  /** Relative to the bundle directory, '/'-separated. */
  path: string;
  bytes: number;
  /** "crc32c:%08x" of the whole file. */
  checksum: string;
}

export interface JsonOptions {
  /** Sort object keys recursively (meta.json is written with sorted keys). Default false. */
  sortKeys?: boolean;
  /** Default 2. */
  indent?: number;
}

/** The host tag in temp names, so a cleanup on one host never touches another host's temp dirs on shared storage. */
function hostTag(): string {
  return safeComponent(os.hostname(), 'hostname').replace(/[^A-Za-z0-9_.-]/g, '_').slice(0, 64);
}

/** Temp dirs (`.tmp-`) and replaced bundles on their way out (`.old-`), both removable once their pid is gone. */
const TEMP_RE = /^\.(.+)\.(?:tmp|old)-(\d+)-([0-9a-f]{8})@(.*)$/;

export interface BeginOptions {
  /**
   * Replace an existing finalDir at commit (default false: refuse it). The old bundle is renamed
   * aside, the new one renamed in, then the old one removed: readers see the old or the new
   * bundle whole, never a mix, and the newer bundle is never lost.
   */
  replace?: boolean;
  /** --artifact-mode (default DEFAULT_ARTIFACT_MODES). */
  modes?: ArtifactModes;
}

function sideName(parent: string, name: string, kind: 'tmp' | 'old'): string {
  return path.join(parent, `.${name}.${kind}-${process.pid}-${crypto.randomBytes(4).toString('hex')}@${hostTag()}`);
}

function sortedKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortedKeys);
  if (v && typeof v === 'object' && (Object.getPrototypeOf(v) === Object.prototype || Object.getPrototypeOf(v) === null)) {
    const o: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort()) o[k] = sortedKeys((v as Record<string, unknown>)[k]);
    return o;
  }
  return v;
}

/** JSON text as wavebus writes it: indent 2, bigints as numbers, trailing newline. */
export function jsonText(value: unknown, opts: JsonOptions = {}): string {
  const v = opts.sortKeys ? sortedKeys(value) : value;
  return `${JSON.stringify(v, (_k, x) => (typeof x === 'bigint' ? (Number.isSafeInteger(Number(x)) ? Number(x) : x.toString()) : x), opts.indent ?? 2)}\n`;
}

function fileNameFor(fileName: string, format: TensorFormat): string {
  const named = tensorFormatOfFile(fileName);
  if (named === format) return fileName;
  if (named !== undefined) {
    throw new CaptureError(`file ${JSON.stringify(fileName)} has extension ${tensorFile(named).extension} but format is ${format}`, 'ERR_BUNDLE_NAME');
  }
  return `${fileName}${tensorFile(format).extension}`;
}

export class Bundle {
  readonly finalDir: string;
  readonly tempDir: string;
  private readonly files: FileEntry[] = [];
  private readonly names = new Set<string>();
  /** Files already fsynced (or being fsynced in `syncing`): commit does not fsync them again. */
  private readonly synced = new Set<string>();
  /** fsync + close of tensor files, running on their writers' threads. */
  private syncing: Promise<void>[] = [];
  private state: 'open' | 'committed' | 'aborted' = 'open';
  private failure: CaptureError | null = null;
  /** Set by commit when the bundle replaced an existing finalDir (BeginOptions.replace). */
  replaced = false;

  private constructor(finalDir: string, tempDir: string, private readonly modes: ArtifactModes, private readonly replace: boolean) {
    this.finalDir = finalDir;
    this.tempDir = tempDir;
  }

  /**
   * Start a bundle that will appear as `finalDir` on commit. Refuses an existing finalDir unless
   * `opts.replace`. `opts.modes` (--artifact-mode): files are created with modes.file, the temp dir
   * (renamed to the final name) and any missing parents with modes.dir.
   */
  static begin(finalDir: string, opts: BeginOptions = {}): Bundle {
    const modes = opts.modes ?? DEFAULT_ARTIFACT_MODES;
    const final = path.resolve(finalDir);
    const parent = path.dirname(final);
    const name = path.basename(final);
    if (!opts.replace && fs.existsSync(final)) throw new CaptureError(`bundle ${final} already exists; refusing to overwrite it`, 'ERR_BUNDLE_EXISTS');
    try {
      mkdirTrustedSync(parent, modes.dir, 'bundle directory');
    } catch (e) {
      throw fsFailure('mkdir', parent, e);
    }
    const temp = sideName(parent, name, 'tmp');
    try {
      mkdirTrustedSync(temp, modes.dir, 'bundle directory', { exclusive: true });
    } catch (e) {
      throw fsFailure('mkdir', temp, e);
    }
    return new Bundle(final, temp, modes, opts.replace === true);
  }

  /** Files written so far. */
  get entries(): readonly FileEntry[] {
    return this.files;
  }

  private requireOpen(): void {
    if (this.state === 'committed') throw new CaptureError(`bundle ${this.finalDir} is already committed`, 'ERR_BUNDLE_STATE');
    if (this.state === 'aborted') {
      throw new CaptureError(`bundle ${this.finalDir} was aborted${this.failure ? `: ${this.failure.message}` : ''}`, 'ERR_BUNDLE_STATE');
    }
  }

  /** Validate a relative file name ('/'-separated safe components) and create its folders. */
  private target(rel: string): string {
    const parts = rel.split('/');
    for (const p of parts) {
      // Names arrive escaped (safeComponent, once, where they came in): checked here, never re-escaped.
      if (!isSafeComponent(p)) {
        throw new CaptureError(`bundle ${this.finalDir}: unsafe file name ${JSON.stringify(rel)} (escape untrusted names once with safeComponent)`, 'ERR_BUNDLE_NAME');
      }
    }
    if (this.names.has(rel)) throw new CaptureError(`bundle ${this.finalDir}: file ${rel} written twice`, 'ERR_BUNDLE_NAME');
    this.names.add(rel);
    const full = path.join(this.tempDir, ...parts);
    if (parts.length > 1) mkdirTrustedSync(path.dirname(full), this.modes.dir, 'bundle directory');
    return full;
  }

  /** Fail the bundle: remove the temp dir and return the error to throw. */
  private async fail(e: unknown, what: string, file: string): Promise<CaptureError> {
    const err = asCaptureError(`${what} ${file}`, file, e);
    const wrapped = new CaptureError(`bundle ${this.finalDir}: ${err.message}; nothing was written under the final name`, err.code);
    this.failure = wrapped;
    await this.abort();
    return wrapped;
  }

  /** Write one tensor file. `value`: a Tensor (npy), a Tensor or dict of tensors + metadata (pt, safetensors). */
  async writeTensor(fileName: string, format: TensorFormat, value: TensorFileValue): Promise<FileEntry> {
    this.requireOpen();
    if (!isTensorFormat(format)) {
      throw new CaptureError(`format must be one of ${TENSOR_FORMATS.join(', ')}, got ${JSON.stringify(format)}`, 'ERR_BUNDLE_FORMAT');
    }
    const rel = fileNameFor(fileName, format);
    let full = '';
    try {
      full = this.target(rel);
      const writer = tensorFile(format);
      const refused = writer.refuses(value);
      if (refused) throw new CaptureError(`${rel}: ${refused}`, 'ERR_BUNDLE_FORMAT');
      // Keep at most MAX_BACKGROUND_SYNCS fsyncs in flight (each holds a thread).
      while (this.syncing.length >= MAX_BACKGROUND_SYNCS) await this.syncing.shift();
      const sink = await FileSink.create(full, this.modes.file);
      let r: WriteResult;
      try {
        r = await writer.write(sink, value);
        // fsync + close on the writer's thread, right after the last byte: it runs while the
        // next file is written, and commit() waits for it.
        const done = await sink.finishInBackground();
        r = done.result;
        this.syncing.push(done.durable);
      } catch (e) {
        await sink.discard();
        throw e;
      }
      this.synced.add(rel);
      const entry = { path: rel, ...r };
      this.files.push(entry);
      return entry;
    } catch (e) {
      throw await this.fail(e, 'writing', full || path.join(this.tempDir, rel));
    }
  }

  /** Write a JSON file (indent 2; sortKeys optional). */
  writeJson(fileName: string, value: unknown, opts: JsonOptions = {}): FileEntry {
    this.requireOpen();
    let full = '';
    try {
      full = this.target(fileName);
      const buf = Buffer.from(jsonText(value, opts), 'utf8');
      fs.writeFileSync(full, buf, { flag: 'wx', mode: this.modes.file });
      const entry = { path: fileName, bytes: buf.length, checksum: formatChecksum(crc32c(buf)) };
      this.files.push(entry);
      return entry;
    } catch (e) {
      const err = asCaptureError(`writing ${full || fileName}`, full || fileName, e);
      this.failure = new CaptureError(`bundle ${this.finalDir}: ${err.message}; nothing was written under the final name`, err.code);
      this.abortSync();
      throw this.failure;
    }
  }

  /**
   * Make the bundle visible: wait until every file is fsynced (tensor files were fsynced by their
   * writers as soon as written), write the bundle JSON last (if given), fsync it and the folders,
   * rename the temp dir to the final name, fsync the parent. Returns every file written.
   */
  async commit(meta?: { name: string; value: unknown } & JsonOptions): Promise<FileEntry[]> {
    this.requireOpen();
    let step = 'fsync files';
    try {
      const syncing = this.syncing;
      this.syncing = [];
      const settled = await Promise.allSettled([
        ...syncing,
        ...this.files.filter((f) => !this.synced.has(f.path)).map((f) => fsyncFile(this.full(f.path))),
      ]);
      const failed = settled.find((x): x is PromiseRejectedResult => x.status === 'rejected');
      if (failed) throw failed.reason;
      for (const f of this.files) this.synced.add(f.path);
      const toSync: string[] = [];
      if (meta) {
        step = `write ${meta.name}`;
        this.writeJson(meta.name, meta.value, { sortKeys: meta.sortKeys ?? true, indent: meta.indent });
        toSync.push(this.full(meta.name));
      }
      const dirs = new Set<string>([this.tempDir]);
      for (const f of this.files) {
        const parts = f.path.split('/');
        for (let i = 1; i < parts.length; i++) dirs.add(path.join(this.tempDir, ...parts.slice(0, i)));
      }
      // The bundle JSON and the folders, together: all of it is still under the temp name.
      step = 'fsync folders';
      await Promise.all([...toSync, ...dirs].map((p) => fsyncFile(p)));
      step = 'rename';
      if (this.replace) {
        this.replaced = this.renameReplacing();
      } else {
        // rename(2) would silently replace an empty directory: check first (a concurrent creator of
        // the same final name is a caller bug; the check turns the common case into a clear error).
        if (fs.existsSync(this.finalDir)) throw new CaptureError(`bundle ${this.finalDir} appeared while writing; refusing to replace it`, 'ERR_BUNDLE_EXISTS');
        try {
          fs.renameSync(this.tempDir, this.finalDir);
        } catch (e) {
          throw fsFailure('rename', `${this.tempDir} -> ${this.finalDir}`, e);
        }
      }
      this.state = 'committed';
      await fsyncFile(path.dirname(this.finalDir));
      return [...this.files];
    } catch (e) {
      if (this.state === 'committed') throw asCaptureError(`commit ${this.finalDir} (${step})`, this.finalDir, e);
      if (this.state === 'aborted') throw this.failure ?? e;
      throw await this.fail(e, `commit (${step})`, this.tempDir);
    }
  }

  /**
   * Move an existing finalDir aside (`.<name>.old-...`), rename the temp dir in, remove the old one.
   * If the rename in fails, the old bundle is put back. Returns whether one was replaced.
   */
  private renameReplacing(): boolean {
    const parent = path.dirname(this.finalDir);
    let old: string | null = null;
    if (fs.existsSync(this.finalDir)) {
      old = sideName(parent, path.basename(this.finalDir), 'old');
      try {
        fs.renameSync(this.finalDir, old);
      } catch (e) {
        throw fsFailure('rename', `${this.finalDir} -> ${old}`, e);
      }
    }
    try {
      fs.renameSync(this.tempDir, this.finalDir);
    } catch (e) {
      if (old !== null) {
        try {
          fs.renameSync(old, this.finalDir);
        } catch {
          /* removeStaleTemps will find it; the error below names what failed */
        }
      }
      throw fsFailure('rename', `${this.tempDir} -> ${this.finalDir}`, e);
    }
    if (old !== null) {
      try {
        fs.rmSync(old, { recursive: true, force: true });
      } catch {
        /* best effort: removeStaleTemps() removes it once this process is gone */
      }
    }
    return old !== null;
  }

  private full(rel: string): string {
    return path.join(this.tempDir, ...rel.split('/'));
  }

  /** Drop everything written so far. Idempotent; never throws. */
  async abort(): Promise<void> {
    if (this.state === 'committed') return;
    this.state = 'aborted';
    // Let background fsyncs finish first: their descriptors are open, and some filesystems (NFS)
    // cannot remove a folder that holds open files.
    const syncing = this.syncing;
    this.syncing = [];
    await Promise.allSettled(syncing);
    this.abortSync();
  }

  private abortSync(): void {
    if (this.state === 'committed') return;
    this.state = 'aborted';
    for (const p of this.syncing.splice(0)) p.catch(() => undefined); // already observed; just drop them
    try {
      fs.rmSync(this.tempDir, { recursive: true, force: true });
    } catch {
      /* best effort: removeStaleTemps() catches leftovers */
    }
  }
}

/** fsync a file or folder by path (opened read-only). */
async function fsyncFile(p: string): Promise<void> {
  let fh: fs.promises.FileHandle | undefined;
  try {
    fh = await fs.promises.open(p, 'r');
    await fh.sync();
  } catch (e) {
    throw fsFailure('fsync', p, e);
  } finally {
    await fh?.close().catch(() => undefined);
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Remove bundle temp dirs under `parent` left by killed processes on this host (temp dirs of
 * live processes and of other hosts are kept). Returns the paths removed.
 */
export function removeStaleTemps(parent: string): string[] {
  let names: string[];
  try {
    names = fs.readdirSync(parent);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw fsFailure('readdir', parent, e);
  }
  const me = hostTag();
  const removed: string[] = [];
  for (const n of names) {
    const m = TEMP_RE.exec(n);
    if (!m) continue;
    const pid = Number(m[2]);
    if (m[4] !== me || pid === process.pid || pidAlive(pid)) continue;
    const p = path.join(parent, n);
    fs.rmSync(p, { recursive: true, force: true });
    removed.push(p);
  }
  return removed;
}
