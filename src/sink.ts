// A strictly sequential file sink: tracks the offset and the running crc32c of every byte written.
//
// Why there is no "patch an earlier offset": the whole-file checksum is computed as bytes go out,
// in file order, so a later pwrite would invalidate it. Every writer here is laid out so that each
// byte is final when written: npy and safetensors headers only need sizes known up front, and zip
// records whose CRC32 is not known before their data (tensor payloads) carry it in a data
// descriptor after the data (zip flag bit 3) and in the central directory. See docs/formats.md.
import * as fs from 'fs';
import { CaptureError } from './errors';
import { crc32c, formatChecksum } from './checksum';

/** Writes smaller than this are gathered into one system call. */
const SMALL_WRITE = 256 * 1024;
/** Large buffers are written in slices so hashing the next slice overlaps the kernel copy of this one. */
const SLICE = 32 * 1024 * 1024;

export interface WriteResult {
  /** Size of the file in bytes. */
  bytes: number;
  /** crc32c of the whole file, "crc32c:%08x". */
  checksum: string;
}

/** An fs error as a CaptureError naming the operation, the path and the errno code. */
export function fsFailure(op: string, path: string, e: unknown): CaptureError {
  if (e instanceof CaptureError) return e;
  const err = e as NodeJS.ErrnoException;
  const code = err && typeof err.code === 'string' ? err.code : 'EIO';
  const msg = err && typeof err.message === 'string' ? err.message : String(e);
  return new CaptureError(`${op} ${path} failed: ${code} (${msg})`, `ERR_${code}`);
}

/** Any failure while producing a file as a CaptureError: fs errors keep their errno code, others are source failures. */
export function asCaptureError(what: string, path: string, e: unknown): CaptureError {
  if (e instanceof CaptureError) return e;
  const err = e as NodeJS.ErrnoException;
  if (err && typeof err.code === 'string' && typeof err.syscall === 'string') return fsFailure(err.syscall, path, e);
  const msg = err && typeof err.message === 'string' ? err.message : String(e);
  return new CaptureError(`${what} failed: source error: ${msg}`, 'ERR_SOURCE');
}

export class FileSink {
  readonly path: string;
  private fd: number | null;
  private pos = 0;
  private crc = 0;
  private pending: Buffer[] = [];
  private pendingBytes = 0;

  private constructor(path: string, fd: number) {
    this.path = path;
    this.fd = fd;
  }

  /** Create a new file (fails if it exists: bundles always write into a fresh temp dir). */
  static async create(path: string, mode = 0o644): Promise<FileSink> {
    try {
      const fd = await new Promise<number>((res, rej) => fs.open(path, 'wx', mode, (e, fd) => (e ? rej(e) : res(fd))));
      return new FileSink(path, fd);
    } catch (e) {
      throw fsFailure('create', path, e);
    }
  }

  /** Bytes accepted so far (written or gathered). */
  get offset(): number {
    return this.pos;
  }

  /** crc32c of every byte accepted so far. */
  get crc32c(): number {
    return this.crc;
  }

  /**
   * Append bytes. `alsoHash` sees the same bytes while the kernel copy is in flight (used for the
   * zip CRC32 of a record). The caller may reuse `data` once the promise resolves.
   */
  async write(data: Uint8Array, alsoHash?: (b: Uint8Array) => void): Promise<void> {
    if (data.length === 0) return;
    if (data.length < SMALL_WRITE) {
      // Copy: the caller may reuse its buffer as soon as we return.
      const copy = Buffer.from(data);
      this.crc = crc32c(copy, this.crc);
      if (alsoHash) alsoHash(copy);
      this.pending.push(copy);
      this.pendingBytes += copy.length;
      this.pos += copy.length;
      if (this.pendingBytes >= SMALL_WRITE) await this.flush();
      return;
    }
    await this.flush();
    for (let off = 0; off < data.length; off += SLICE) {
      const slice = data.subarray(off, Math.min(data.length, off + SLICE));
      const inFlight = this.writeFully(slice);
      this.crc = crc32c(slice, this.crc);
      if (alsoHash) alsoHash(slice);
      this.pos += slice.length;
      await inFlight;
    }
  }

  /** Push gathered small writes to the file. */
  async flush(): Promise<void> {
    if (this.pendingBytes === 0) return;
    const buf = this.pending.length === 1 ? this.pending[0] : Buffer.concat(this.pending, this.pendingBytes);
    this.pending = [];
    this.pendingBytes = 0;
    await this.writeFully(buf);
  }

  private async writeFully(buf: Uint8Array): Promise<void> {
    const fd = this.requireOpen();
    let done = 0;
    while (done < buf.length) {
      let n: number;
      try {
        n = await new Promise<number>((res, rej) =>
          fs.write(fd, buf, done, buf.length - done, null, (e, written) => (e ? rej(e) : res(written))),
        );
      } catch (e) {
        throw fsFailure('write', this.path, e);
      }
      if (n <= 0) throw new CaptureError(`write ${this.path} failed: short write (${done} of ${buf.length} bytes)`, 'ERR_SHORT_WRITE');
      done += n;
    }
  }

  private requireOpen(): number {
    if (this.fd === null) throw new CaptureError(`write ${this.path} failed: file already closed`, 'ERR_CLOSED');
    return this.fd;
  }

  /** Flush and fsync the file's data and size. */
  async sync(): Promise<void> {
    await this.flush();
    const fd = this.requireOpen();
    try {
      await new Promise<void>((res, rej) => fs.fsync(fd, (e) => (e ? rej(e) : res())));
    } catch (e) {
      throw fsFailure('fsync', this.path, e);
    }
  }

  /** Flush, close, and report size and checksum. Does not fsync (call sync() first when needed). */
  async close(): Promise<WriteResult> {
    await this.flush();
    const fd = this.requireOpen();
    this.fd = null;
    try {
      await new Promise<void>((res, rej) => fs.close(fd, (e) => (e ? rej(e) : res())));
    } catch (e) {
      throw fsFailure('close', this.path, e);
    }
    return this.result();
  }

  result(): WriteResult {
    return { bytes: this.pos, checksum: formatChecksum(this.crc) };
  }

  /** Close without flushing and remove the file (after a failure). Never throws. */
  async discard(): Promise<void> {
    const fd = this.fd;
    this.fd = null;
    this.pending = [];
    if (fd !== null) await new Promise<void>((res) => fs.close(fd, () => res()));
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
    if (opts.fsync) await sink.sync();
    return await sink.close();
  } catch (e) {
    await sink.discard();
    throw asCaptureError(`writing ${path}`, path, e);
  }
}
