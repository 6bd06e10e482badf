// A strictly sequential file sink: tracks the offset, and the native FileWriter keeps the running
// crc32c of every byte written.
//
// Why there is no "patch an earlier offset": the whole-file checksum is computed as bytes go out,
// in file order, so a later pwrite would invalidate it. Every writer here is laid out so that each
// byte is final when written: npy and safetensors headers only need sizes known up front, and zip
// records whose CRC32 is not known before their data (tensor payloads) carry it in a data
// descriptor after the data (zip flag bit 3) and in the central directory. See docs/formats.md.
//
// Large writes go to native/file_writer.cc, which checksums and writes them on the writer's own
// thread in cache-sized blocks (one read of each byte from memory, JS thread free, never queued
// behind staging copies on the libuv pool) and starts the device writeback every WRITEBACK_BYTES,
// so the final fsync only waits for the tail. Small writes (headers, descriptors) are gathered
// here into one call.
import * as fs from 'fs';
import * as zlib from 'zlib';
import { CaptureError, WavebusError } from '../errors';
import { formatChecksum } from './checksum';
import { native, NativeFileWriter } from '../native';

/** Writes smaller than this are gathered into one native call. */
const SMALL_WRITE = 256 * 1024;
/**
 * Checksum-then-write granularity of the native writer: the block is still in cache (L2/L3) when
 * write(2) copies it. 2 MiB rather than 512 KiB: a quarter of the system calls and of the
 * writeback hints; on the dev VM (bench dump's flow, 12 runs each) 221 ms vs 234 ms per 256 MB
 * (1 MiB 232, 4 MiB 235).
 */
const BLOCK_BYTES = 2 * 1024 * 1024;
/**
 * Early writeback step (sync_file_range): the device starts on each 8 MiB while the next ones are
 * written, so the final fsync mostly waits for the device's cache flush. Measured on the dev VM
 * (256 MB, ext4 on virtio, a C loop of write + fsync): 216-250 ms without it, 191-210 ms with it
 * (fsync 186-208 ms -> 136-146 ms); 4 and 16 MiB steps did about the same. It also keeps a
 * multi-GB dump from piling up dirty pages until the fsync (or the dirty_ratio throttle).
 */
const WRITEBACK_BYTES = 8 * 1024 * 1024;

export interface WriteResult {
  /** Size of the file in bytes. */
  bytes: number;
  /** crc32c of the whole file, "crc32c:%08x". */
  checksum: string;
}

/** An fs error as a CaptureError naming the operation, the path and the errno code. */
export function fsFailure(op: string, path: string, e: unknown): CaptureError {
  if (e instanceof CaptureError) return e;
  // A refusal of ours (an untrusted or unsafe path) keeps its code.
  if (e instanceof WavebusError) return new CaptureError(`${op} ${path} failed: ${e.message}`, e.code);
  const err = e as NodeJS.ErrnoException;
  const code = err && typeof err.code === 'string' ? err.code : 'EIO';
  const msg = err && typeof err.message === 'string' ? err.message : String(e);
  return new CaptureError(`${op} ${path} failed: ${code} (${msg})`, `ERR_${code}`);
}

/** Any failure while producing a file as a CaptureError: fs errors keep their errno code, others are source failures. */
export function asCaptureError(what: string, path: string, e: unknown): CaptureError {
  if (e instanceof CaptureError) return e;
  if (e instanceof WavebusError) return fsFailure(what, path, e);
  const err = e as NodeJS.ErrnoException;
  if (err && typeof err.code === 'string' && typeof err.syscall === 'string') return fsFailure(err.syscall, path, e);
  const msg = err && typeof err.message === 'string' ? err.message : String(e);
  return new CaptureError(`${what} failed: source error: ${msg}`, 'ERR_SOURCE');
}

/**
 * A FileWriter failure: errno errors as fsFailure (named by the failing system call when known: a
 * close(fsync) fails in fsync or close), the writer's own (ERR_SHORT_WRITE, ERR_BUSY, ...) keep their code.
 */
function writerFailure(op: string, path: string, e: unknown): CaptureError {
  const err = e as { code?: unknown; message?: unknown; syscall?: unknown };
  if (err && typeof err.code === 'string' && err.code.startsWith('ERR_')) {
    return new CaptureError(`${op} ${path} failed: ${String(err.message)}`, err.code);
  }
  return fsFailure(err && typeof err.syscall === 'string' ? err.syscall : op, path, e);
}

/** What finishInBackground() returns. */
export interface BackgroundFinish {
  /** Size and checksum of the file (final: nothing more is written). */
  result: WriteResult;
  /** Settles once the file is fsynced and closed; rejects with a CaptureError naming fsync or close. */
  durable: Promise<void>;
}

export class FileSink {
  readonly path: string;
  private readonly file: NativeFileWriter;
  private pos = 0;
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private closed = false;

  private constructor(path: string, file: NativeFileWriter) {
    this.path = path;
    this.file = file;
  }

  /** Create a new file (fails if it exists: bundles always write into a fresh temp dir). */
  static async create(path: string, mode = 0o644): Promise<FileSink> {
    if (typeof path !== 'string' || path.length === 0 || path.includes('\0')) {
      throw new CaptureError(`create ${JSON.stringify(path)} failed: path must be a non-empty string without NUL`, 'ERR_INVALID_ARG');
    }
    if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777) throw new RangeError(`mode must be an integer in 0..0o7777, got ${mode}`);
    try {
      return new FileSink(path, new native.FileWriter(path, mode, BLOCK_BYTES, WRITEBACK_BYTES));
    } catch (e) {
      throw fsFailure('create', path, e);
    }
  }

  /** Bytes accepted so far (written or gathered). */
  get offset(): number {
    return this.pos;
  }

  /** crc32c of every byte written so far (gathered bytes count once flushed). */
  get crc32c(): number {
    return this.file.crc32c;
  }

  /** Append bytes. The caller may reuse `data` once the promise resolves. */
  async write(data: Uint8Array): Promise<void> {
    await this.put(data, undefined);
  }

  /**
   * Append bytes and continue the zip CRC-32 `zipCrc` over them (computed in the same pass as the
   * file's crc32c); resolves with the new zip CRC-32.
   */
  async writeZip(data: Uint8Array, zipCrc: number): Promise<number> {
    return (await this.put(data, zipCrc)) as number;
  }

  private async put(data: Uint8Array, zipCrc: number | undefined): Promise<number | undefined> {
    this.requireOpen();
    if (data.length === 0) return zipCrc;
    if (data.length < SMALL_WRITE) {
      // Copy: the caller may reuse its buffer as soon as we return.
      const copy = Buffer.from(data);
      this.pending.push(copy);
      this.pendingBytes += copy.length;
      this.pos += copy.length;
      const z = zipCrc === undefined ? undefined : zlib.crc32(copy, zipCrc);
      if (this.pendingBytes >= SMALL_WRITE) await this.flush();
      return z;
    }
    await this.flush();
    this.pos += data.length;
    return this.native('write', () => this.file.write(data, zipCrc));
  }

  /** Push gathered small writes to the file. */
  async flush(): Promise<void> {
    if (this.pendingBytes === 0) return;
    const buf = this.pending.length === 1 ? this.pending[0] : Buffer.concat(this.pending, this.pendingBytes);
    this.pending = [];
    this.pendingBytes = 0;
    await this.native('write', () => this.file.write(buf));
  }

  private async native<T>(op: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      throw writerFailure(op, this.path, e);
    }
  }

  private requireOpen(): void {
    if (this.closed) throw new CaptureError(`write ${this.path} failed: file already closed`, 'ERR_CLOSED');
  }

  /** Flush and fsync the file's data and size. */
  async sync(): Promise<void> {
    this.requireOpen();
    await this.flush();
    await this.native('fsync', () => this.file.sync());
  }

  /** Flush, close, and report size and checksum; with { fsync: true } the file is fsynced first (one native call). */
  async close(opts: { fsync?: boolean } = {}): Promise<WriteResult> {
    this.requireOpen();
    await this.flush();
    this.closed = true;
    await this.native('close', () => this.file.close(opts.fsync === true));
    return this.result();
  }

  /**
   * Flush and take size and checksum now, then fsync + close on the writer's thread without
   * waiting: the caller can write its next file while this one's fsync runs, and await `durable`
   * before it relies on the file (a bundle does, before its rename).
   */
  async finishInBackground(): Promise<BackgroundFinish> {
    this.requireOpen();
    await this.flush();
    const result = this.result();
    this.closed = true;
    const durable = this.native('close', () => this.file.close(true));
    durable.catch(() => undefined); // the caller awaits it; never an unhandled rejection meanwhile
    return { result, durable };
  }

  /** Size and checksum of everything accepted; call flush() (or close()) first. */
  result(): WriteResult {
    if (this.pendingBytes > 0 || this.file.busy) {
      throw new CaptureError(`${this.path}: result() with ${this.pendingBytes} gathered bytes or a write in flight; flush() first`, 'ERR_SINK_STATE');
    }
    if (this.file.offset !== this.pos) {
      throw new CaptureError(`${this.path}: ${this.file.offset} bytes written but ${this.pos} accepted`, 'ERR_SHORT_WRITE');
    }
    return { bytes: this.pos, checksum: formatChecksum(this.file.crc32c) };
  }

  /** Close without flushing and remove the file (after a failure). Never throws. */
  async discard(): Promise<void> {
    this.closed = true;
    this.pending = [];
    this.pendingBytes = 0;
    try {
      this.file.abandon();
    } catch {
      /* an operation still in flight: the descriptor closes when the writer is collected */
    }
    await new Promise<void>((res) => fs.unlink(this.path, () => res()));
  }
}

/**
 * Run `body` against a fresh sink on `path`; on success close it (optionally fsynced) and return
 * size + checksum, on failure remove the partial file and rethrow as a CaptureError.
 */
export async function withSink(path: string, body: (sink: FileSink) => Promise<void>, opts: { fsync?: boolean } = {}): Promise<WriteResult> {
  const sink = await FileSink.create(path);
  try {
    await body(sink);
    return await sink.close({ fsync: opts.fsync });
  } catch (e) {
    await sink.discard();
    throw asCaptureError(`writing ${path}`, path, e);
  }
}
