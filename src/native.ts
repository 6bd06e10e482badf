// The whole native surface of wavebus, declared in one place. Everything else imports from here.
// Arguments are validated in TypeScript before these are called; C++ only moves bytes.
// Errors thrown by the addon carry `code` (ERR_*); `nativeCall` / `nativeAsync` rewrap them
// as NativeError with the same code.
import * as path from 'path';
import { NativeError } from './errors';
import { packageRoot } from './paths';

/** A POSIX shared-memory segment mapped into this process (native/shm_segment.cc). */
export interface NativeShmSegment {
  /** Bytes mapped (the segment's size when it was opened or created). */
  readonly size: number;
  /** The name as given to shm_open, with the leading "/". */
  readonly name: string;
  readonly readonly: boolean;
  readonly closed: boolean;
  /** The mapping as an external Buffer (no copy). Writable mappings only; it keeps the mapping alive until collected. */
  buffer(): Buffer;
  /** The segment's current size from fstat, and whether it still has a name (nlink > 0). */
  stat(): { size: number; linked: boolean };
  /** Copy [srcOffset, srcOffset + nbytes) into dst[dstOffset..], off the JS thread. */
  copyTo(dst: Uint8Array, dstOffset: number, srcOffset: number, nbytes: number): Promise<void>;
  /** Copy blockBytes of each block b from baseOffset + b * blockStride (default blockBytes), in order, contiguously into dst[dstOffset..]. */
  gatherTo(dst: Uint8Array, dstOffset: number, blockIds: Uint32Array, blockBytes: number, baseOffset: number, blockStride?: number): Promise<void>;
  /** Unmap (once every buffer handed out is collected) and close the descriptor. Idempotent. */
  close(): void;
}

export interface NativeShmSegmentStatic {
  create(name: string, nbytes: number): NativeShmSegment;
  open(name: string, readonly: boolean): NativeShmSegment;
  unlink(name: string): void;
}

/** A CUDA IPC allocation opened in this process (native/cuda_region.cc). */
export interface NativeCudaRegion {
  readonly device: number;
  readonly closed: boolean;
  copyTo(dst: Uint8Array, dstOffset: number, srcOffset: number, nbytes: number): Promise<void>;
  gatherTo(dst: Uint8Array, dstOffset: number, blockIds: Uint32Array, blockBytes: number, baseOffset: number, blockStride?: number): Promise<void>;
  close(): void;
}

export interface NativeCudaRegionStatic {
  /**
   * handle: the 64-byte cudaIpcMemHandle_t; limitBytes: copies must end at or before this offset
   * from the allocation's base; stagingBytes: the bounded pinned chunk for copies into unpinned memory.
   * Throws ERR_CUDA_UNAVAILABLE ("CUDA backend unavailable: <dlerror>") where libcudart cannot be loaded.
   */
  open(handle: Uint8Array, device: number, limitBytes: number, stagingBytes: number): NativeCudaRegion;
}

export type MailboxVector = [number, number, number, number, number];

export interface NativeMailboxWriter {
  /** With `floor`: the header's floor is stored after the slot (one wake for both). */
  publish(wave: number, configDue: number, dumpDue: number, snapshotDue: number, floor?: number, wake?: boolean): void;
  /** Bump `published` and wake its sleepers (after publishes made with wake false). */
  announce(): void;
  setFeatures(bits: number): void;
  setEpoch(epoch: number): void;
  setFloor(floor: number): void;
  /** Global rank + 1 of the file's creator (0: not said). */
  owner(): number;
  /** The engine client's capture_waiting word (seq-cst load): the ticket it waits on, 0: none. */
  captureWaiting(): number;
  close(): void;
}

export interface NativeMailboxReader {
  /**
   * [wave, configDue, dumpDue, snapshotDue, implied] when slot wave % 8 holds `wave` (implied 0), or
   * [wave, 0, 0, 0, 1] when `wave` is below the floor and its slot does not hold it; else undefined.
   */
  read(wave: number): MailboxVector | undefined;
  features(): number;
  epoch(): number;
  floor(): number;
  /**
   * Sleeps (on the libuv pool, futex on the header's `published` word) until the slot holds `wave`:
   * the vector; false when timeoutMs ran out; undefined when the slot moved past `wave`.
   */
  waitFor(wave: number, timeoutMs: number): Promise<MailboxVector | false | undefined>;
  /** Stores capture_waiting (seq-cst, then a fence): the before_forward ticket waited on, 0: none. */
  setCaptureWaiting(ticket: number): void;
  /**
   * The mapping itself (the 576-byte header and slots) as a Buffer that keeps it mapped while it
   * lives: the client loads the header's words and reads the slots' seqlock with Atomics on it
   * (src/client/mailbox.ts), no addon call per read. Never written through.
   */
  view(): Buffer;
  close(): void;
}

/**
 * A new file written sequentially off the JS thread (native/file_writer.cc): each write checksums
 * the bytes (CRC-32C of the file; the zip CRC-32 too when `zipPrev` is given) in cache-sized blocks
 * and writes each block while it is still in cache. One operation at a time (ERR_BUSY otherwise).
 * Failures carry `code` = the errno name (EFBIG, ENOSPC, ...) and `syscall`, like fs errors.
 */
export interface NativeFileWriter {
  /** Resolves with the zip CRC-32 continued over `data` when `zipPrev` is given, else undefined. */
  write(data: Uint8Array, zipPrev?: number): Promise<number | undefined>;
  sync(): Promise<void>;
  /** fsync first when `fsync` (on the writer's thread, after the last write), then close(2); the descriptor is closed even if the fsync fails. */
  close(fsync?: boolean): Promise<void>;
  /** Close the descriptor now (failure paths). Idempotent; throws ERR_BUSY while an operation is in flight. */
  abandon(): void;
  /** Bytes written so far. */
  readonly offset: number;
  /** CRC-32C of every byte written so far. */
  readonly crc32c: number;
  readonly closed: boolean;
  readonly busy: boolean;
}

export interface NativeFileWriterCtor {
  /**
   * Opens `path` O_WRONLY|O_CREAT|O_EXCL (mode <= 0o7777) and starts the writer's own thread;
   * blockBytes (4096..2^30): checksum-then-write granularity; writebackBytes (0 = off, else
   * 65536..2^40): start the device writeback (sync_file_range) every this many bytes written.
   */
  new (path: string, mode: number, blockBytes: number, writebackBytes?: number): NativeFileWriter;
}

/** Word offsets of a detector's header (float64 fields at even words), and its size. */
export type HeaderLayout<K extends string> = Readonly<Record<K | 'headerWords', number>>;

/**
 * The detector pass's layout as native/detector_pass.cc exports it. Which detectors, parameters and
 * header words there are is the pass's business: each detector's file asks for the names it uses
 * (guard/detectors/kernel.ts checks them at load), so a new detector changes nothing here.
 */
export interface NativeDetectorLayout {
  /** Parameter slots (kParamNames), by name. */
  params: Readonly<Record<string, number>>;
  paramCount: number;
  /** Doubles per hit: row, type (index into hitTypes), then the type's figures. */
  hitWords: number;
  /** The detector names a hit's type indexes. */
  hitTypes: readonly string[];
  /** Each detector's bit in a request's muted mask, by detector name. */
  muteBits: Readonly<Record<string, number>>;
  /** Each per-step detector's header layout, under its key (tokenRepeat, specAcceptance, garbled). */
  readonly [detectorHeader: string]: unknown;
}

export interface NativeBinding {
  abiVersion: number;
  crc32c(data: Uint8Array, prev?: number): number;
  /** The table path, whatever the CPU; exposed so tests can check it against the hardware path. */
  crc32cSoftware(data: Uint8Array, prev?: number): number;
  crc32cHardware(): boolean;
  /** Zip (IEEE) CRC-32, same convention as zlib.crc32(data, prev). */
  crc32(data: Uint8Array, prev?: number): number;
  /** The table path of crc32, for tests. */
  crc32Software(data: Uint8Array, prev?: number): number;
  /** [crc32c, zip crc32] continued over `data` in one pass. */
  crcPair(data: Uint8Array, prevCrc32c: number, prevZip: number): [number, number];
  /** Whether crc32 / crcPair use the carry-less-multiply (PCLMULQDQ) path. */
  crcFoldHardware(): boolean;
  FileWriter: NativeFileWriterCtor;
  ShmSegment: NativeShmSegmentStatic;
  CudaRegion: NativeCudaRegionStatic;
  cudaAvailable(): { available: boolean; reason: string };
  /** Host memory for staging: pinned (cudaHostAlloc) when asked and CUDA is there, else plain. */
  allocHost(nbytes: number, pinned: boolean): { buffer: Buffer; pinned: boolean };
  MailboxWriter: { create(path: string, owner?: number): NativeMailboxWriter; attach(path: string): NativeMailboxWriter; holdLock(path: string): number };
  MailboxReader: { open(path: string): NativeMailboxReader };
  mailboxLayout: { headerBytes: number; slotBytes: number; slots: number; fileBytes: number; magic: string; version: number };
  /** The detector pass's record layout, defined in native/detector_pass.cc (read by guard/detectors/kernel.ts). */
  detectorLayout: NativeDetectorLayout;
  /**
   * The guard's per-step detector pass over one step's rows (native/detector_pass.cc): updates
   * the records in `state` in place and writes HIT_WORDS doubles per hit into `hits` (room for
   * three per row); returns the number of hits. Layouts: src/guard/detectors/kernel.ts.
   */
  detectStep(
    state: Int32Array,
    params: Float64Array,
    ignore: Uint32Array,
    rowRecord: Int32Array,
    rowMuted: Int32Array,
    tokenCount: Uint32Array,
    tokenIds: Uint32Array,
    tokenLogprobs: Float32Array,
    tokenRanks: Uint32Array,
    draftLen: Uint32Array,
    accepted: Uint32Array,
    hits: Float64Array,
  ): number;
  /**
   * A regular file mapped read-write and shared (native/mapped_file.cc): opened O_NOFOLLOW (a link:
   * ERR_PATH_LINK), ERR_NOT_REGULAR / ERR_MAP_FILE otherwise. The Buffer holds the mapping: it is
   * unmapped when the Buffer is collected. The engine client's view of its recorder ring.
   */
  mapFile(path: string): Buffer;
  /** glibc mallopt(M_MMAP_THRESHOLD, M_TRIM_THRESHOLD) (native/malloc_tuning.cc); false elsewhere. */
  tuneMalloc(mmapThresholdBytes: number, trimThresholdBytes: number): boolean;
}


/** Path of the built addon. */
export function addonPath(): string {
  return path.join(packageRoot(), 'build', 'Release', 'wavebus_native.node');
}

function load(): NativeBinding {
  const file = addonPath();
  try {
    // eslint-disable-next-line @typescript-eslint/no-var-requires
    return require(file) as NativeBinding;
  } catch (e) {
    throw new NativeError(
      `cannot load the native addon ${file} (build it with \`npm run install\`, i.e. node-gyp rebuild): ${(e as Error).message}`,
      'ERR_NATIVE_LOAD',
    );
  }
}

export const native: NativeBinding = load();

/** Turn an error thrown by the addon into a NativeError that keeps its code. */
export function toNativeError(e: unknown): Error {
  if (e instanceof NativeError) return e;
  // Duck-typed, not instanceof Error: the addon's errors come from the main realm, which is not
  // the realm of code run in a vm context (jest, for one).
  if (typeof e === 'object' && e !== null && typeof (e as { message?: unknown }).message === 'string') {
    const { message, code } = e as { message: string; code?: unknown };
    if (typeof code === 'string' && code.startsWith('ERR_')) return new NativeError(message, code);
    return e instanceof Error ? e : new NativeError(message);
  }
  return new NativeError(String(e));
}

/** Run a synchronous native call, rewrapping coded errors as NativeError. */
export function nativeCall<T>(fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    throw toNativeError(e);
  }
}

/** Await a native promise, rewrapping coded errors as NativeError. */
export async function nativeAsync<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    throw toNativeError(e);
  }
}
