// Device regions (POSIX shm or CUDA IPC), bounded host staging, and gathers of KV-pool blocks.
// Everything is validated here, with messages that name the field; the addon only moves bytes,
// off the JS thread. See docs/native.md.
import { NativeError } from './errors';
import { native, nativeAsync, nativeCall, NativeCudaRegion, NativeShmSegment } from './native';

const SHM_NAME = /^\/?[A-Za-z0-9._-]{1,200}$/;
/** Size of cudaIpcMemHandle_t. */
export const CUDA_IPC_HANDLE_BYTES = 64;
/** Pinned chunk a CUDA region bounces copies through when the destination is not pinned. */
export const DEFAULT_CUDA_STAGING_BYTES = 8 << 20;

function invalid(message: string): NativeError {
  return new NativeError(message, 'ERR_INVALID_ARG');
}

/** A non-negative safe integer (bigint accepted when it fits), else an error naming `field`. */
export function checkCount(value: unknown, field: string): number {
  const v = typeof value === 'bigint' && value >= 0n && value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : value;
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) {
    throw invalid(`${field} must be a non-negative safe integer, got ${typeof value === 'bigint' ? `${value}n` : String(value)}`);
  }
  return v;
}

/** A POSIX shm name as shm_open takes it: one optional leading "/", then 1..200 of [A-Za-z0-9._-]. */
export function checkShmName(name: unknown, field = 'shmName'): string {
  if (typeof name !== 'string' || !SHM_NAME.test(name) || /^\/?\.{1,2}$/.test(name)) {
    throw invalid(`${field} must match /^\\/?[A-Za-z0-9._-]{1,200}$/, got ${JSON.stringify(name)}`);
  }
  return name.startsWith('/') ? name : `/${name}`;
}

function checkDst(dst: unknown, field = 'dst'): Uint8Array {
  if (!(dst instanceof Uint8Array)) throw invalid(`${field} must be a Buffer or Uint8Array`);
  return dst;
}

function checkFits(dst: Uint8Array, dstOffset: number, nbytes: number): void {
  if (dstOffset + nbytes > dst.byteLength) {
    throw new NativeError(
      `dst holds ${dst.byteLength} bytes; dstOffset + nbytes (${dstOffset} + ${nbytes} = ${dstOffset + nbytes}) does not fit`,
      'ERR_OUT_OF_RANGE',
    );
  }
}

/**
 * A POSIX shared-memory segment. Engines, simulators and tests `create` one and fill it through
 * `buffer()`; agents `open` one read-only and copy out of it (usually via DeviceRegion).
 */
export class ShmSegment {
  private constructor(private readonly seg: NativeShmSegment) {}

  /** shm_open(O_CREAT|O_EXCL|O_RDWR) + ftruncate + mmap. Fails with ERR_SHM_OPEN if the name exists. */
  static create(name: string, nbytes: number): ShmSegment {
    const n = checkShmName(name, 'name');
    const size = checkCount(nbytes, 'nbytes');
    if (size === 0) throw invalid('nbytes must be positive');
    return new ShmSegment(nativeCall(() => native.ShmSegment.create(n, size)));
  }

  /** Map an existing segment; read-only unless { readonly: false }. */
  static open(name: string, opts: { readonly?: boolean } = {}): ShmSegment {
    const n = checkShmName(name, 'name');
    return new ShmSegment(nativeCall(() => native.ShmSegment.open(n, opts.readonly ?? true)));
  }

  /** shm_unlink. Mappings stay valid, but copies from an unlinked segment fail with ERR_REGION_GONE. */
  static unlink(name: string): void {
    const n = checkShmName(name, 'name');
    nativeCall(() => native.ShmSegment.unlink(n));
  }

  get name(): string {
    return this.seg.name;
  }
  /** Bytes mapped: the segment's size when it was created or opened. */
  get size(): number {
    return this.seg.size;
  }
  get readonly(): boolean {
    return this.seg.readonly;
  }
  get closed(): boolean {
    return this.seg.closed;
  }

  /** The mapping itself (no copy). Writable segments only; it stays valid after close() until collected. */
  buffer(): Buffer {
    return nativeCall(() => this.seg.buffer());
  }

  /** The segment now (fstat): its size, and whether it still has its name. */
  stat(): { size: number; linked: boolean } {
    return nativeCall(() => this.seg.stat());
  }

  /** Copy [srcOffset, srcOffset + nbytes) of the segment into dst at dstOffset, off the JS thread. */
  async copyTo(dst: Uint8Array, dstOffset: number, srcOffset: number, nbytes: number): Promise<void> {
    checkDst(dst);
    const d = checkCount(dstOffset, 'dstOffset');
    const s = checkCount(srcOffset, 'srcOffset');
    const n = checkCount(nbytes, 'nbytes');
    checkFits(dst, d, n);
    if (s + n > this.size) {
      throw new NativeError(`srcOffset + nbytes (${s} + ${n} = ${s + n}) exceeds segment size (${this.size}) of ${this.name}`, 'ERR_OUT_OF_RANGE');
    }
    await nativeAsync(() => this.seg.copyTo(dst, d, s, n));
  }

  /** Copy blocks b of blockBytes at baseOffset + b * blockBytes, in order, contiguously into dst at dstOffset. */
  async gatherTo(dst: Uint8Array, dstOffset: number, blockIds: ArrayLike<number>, blockBytes: number, baseOffset = 0): Promise<void> {
    checkDst(dst);
    const d = checkCount(dstOffset, 'dstOffset');
    const bb = checkCount(blockBytes, 'blockBytes');
    const base = checkCount(baseOffset, 'baseOffset');
    if (bb === 0) throw invalid('blockBytes must be positive');
    const nblocks = base > this.size ? 0 : Math.floor((this.size - base) / bb);
    const ids = blockIdArray(blockIds, nblocks, `${this.name} holds ${nblocks} blocks of ${bb} bytes after baseOffset ${base}`);
    checkFits(dst, d, ids.length * bb);
    await nativeAsync(() => this.seg.gatherTo(dst, d, ids, bb, base));
  }

  /** Unmap (once buffers handed out are collected) and close. Later calls throw ERR_CLOSED. */
  close(): void {
    this.seg.close();
  }

  /** @internal the native object, for DeviceRegion. */
  get handle(): NativeShmSegment {
    return this.seg;
  }
}

export type RegionKind = 'shm' | 'cuda';

/** Where a region lives, as a client registers it (proto Region). */
export interface RegionSpec {
  kind: RegionKind;
  /** kind 'shm': the POSIX shm name, e.g. "/wavebus-kv-rank0". */
  shmName?: string;
  /** Byte offset of the region inside the segment / IPC allocation. */
  offset: number;
  nbytes: number;
  /** kind 'cuda': the 64-byte cudaIpcMemHandle_t. */
  cudaIpcHandle?: Uint8Array;
  /** kind 'cuda': the device ordinal, default 0. */
  device?: number;
}

export interface RegionOpenOptions {
  /** Prefix for field names in error messages, default "region" (e.g. "regions[3]"). */
  field?: string;
  /** CUDA only: the bounded pinned chunk for copies into unpinned memory. */
  stagingBytes?: number;
}

/**
 * A byte range of device memory an engine shared with its agent: part of a POSIX shm segment
 * or of a CUDA allocation exported over IPC. Offsets passed to copyTo / gatherTo are relative
 * to the region's start. Copies run off the JS thread; the destination stays referenced
 * until they finish.
 */
export class DeviceRegion {
  private closedFlag = false;

  private constructor(
    readonly kind: RegionKind,
    readonly offset: number,
    readonly nbytes: number,
    readonly describe: string,
    private readonly src: NativeShmSegment | NativeCudaRegion,
  ) {}

  static open(spec: RegionSpec, opts: RegionOpenOptions = {}): DeviceRegion {
    const f = opts.field ?? 'region';
    if (spec === null || typeof spec !== 'object') throw invalid(`${f} must be an object`);
    const offset = checkCount(spec.offset, `${f}.offset`);
    const nbytes = checkCount(spec.nbytes, `${f}.nbytes`);
    if (!Number.isSafeInteger(offset + nbytes)) throw invalid(`${f}.offset + ${f}.nbytes (${offset} + ${nbytes}) overflows`);
    if (spec.kind === 'shm') {
      const name = checkShmName(spec.shmName, `${f}.shmName`);
      const seg = nativeCall(() => native.ShmSegment.open(name, true));
      if (offset + nbytes > seg.size) {
        seg.close();
        throw new NativeError(
          `${f}.offset + ${f}.nbytes (${offset} + ${nbytes} = ${offset + nbytes}) exceeds segment size (${seg.size}) of ${name}`,
          'ERR_OUT_OF_RANGE',
        );
      }
      return new DeviceRegion('shm', offset, nbytes, `shm ${name} [${offset}, ${offset + nbytes})`, seg);
    }
    if (spec.kind === 'cuda') {
      const h = spec.cudaIpcHandle;
      if (!(h instanceof Uint8Array) || h.byteLength !== CUDA_IPC_HANDLE_BYTES) {
        throw invalid(`${f}.cudaIpcHandle must be exactly ${CUDA_IPC_HANDLE_BYTES} bytes, got ${h instanceof Uint8Array ? `${h.byteLength} bytes` : typeof h}`);
      }
      const device = checkCount(spec.device ?? 0, `${f}.device`);
      const staging = checkCount(opts.stagingBytes ?? DEFAULT_CUDA_STAGING_BYTES, 'stagingBytes');
      if (staging === 0) throw invalid('stagingBytes must be positive');
      const cuda = nativeCall(() => native.CudaRegion.open(h, device, offset + nbytes, staging));
      return new DeviceRegion('cuda', offset, nbytes, `cuda device ${device} [${offset}, ${offset + nbytes})`, cuda);
    }
    throw invalid(`${f}.kind must be "shm" or "cuda", got ${JSON.stringify((spec as { kind?: unknown }).kind)}`);
  }

  get closed(): boolean {
    return this.closedFlag;
  }

  private live(): NativeShmSegment | NativeCudaRegion {
    if (this.closedFlag) throw new NativeError(`region ${this.describe} is closed`, 'ERR_CLOSED');
    return this.src;
  }

  /** Copy region bytes [srcOffset, srcOffset + nbytes) into dst at dstOffset. */
  async copyTo(dst: Uint8Array, dstOffset = 0, srcOffset = 0, nbytes?: number): Promise<void> {
    const src = this.live();
    checkDst(dst);
    const d = checkCount(dstOffset, 'dstOffset');
    const s = checkCount(srcOffset, 'srcOffset');
    const n = checkCount(nbytes ?? Math.max(0, this.nbytes - s), 'nbytes');
    if (s + n > this.nbytes) {
      throw new NativeError(`srcOffset + nbytes (${s} + ${n} = ${s + n}) exceeds region.nbytes (${this.nbytes}) of ${this.describe}`, 'ERR_OUT_OF_RANGE');
    }
    checkFits(dst, d, n);
    await nativeAsync(() => src.copyTo(dst, d, this.offset + s, n));
  }

  /**
   * Gather blocks of a paged KV pool: block b is the blockBytes at baseOffset + b * blockStride
   * (relative to the region; blockStride defaults to blockBytes, blocks back to back; a larger one
   * skips the other layers' pages of an interleaved pool). Blocks land in dst contiguously, in the
   * order given, from dstOffset.
   */
  async gatherTo(dst: Uint8Array, dstOffset: number, blockIds: ArrayLike<number>, blockBytes: number, baseOffset = 0, blockStride?: number): Promise<void> {
    const src = this.live();
    checkDst(dst);
    const d = checkCount(dstOffset, 'dstOffset');
    const bb = checkCount(blockBytes, 'blockBytes');
    const base = checkCount(baseOffset, 'baseOffset');
    if (bb === 0) throw invalid('blockBytes must be positive');
    const stride = blockStride === undefined ? bb : checkCount(blockStride, 'blockStride');
    if (stride < bb) throw invalid(`blockStride (${stride}) must be at least blockBytes (${bb})`);
    if (base > this.nbytes) throw new NativeError(`baseOffset (${base}) exceeds region.nbytes (${this.nbytes})`, 'ERR_OUT_OF_RANGE');
    // The last block needs only its own bytes, not a whole stride.
    const nblocks = this.nbytes - base < bb ? 0 : Math.floor((this.nbytes - base - bb) / stride) + 1;
    const ids = blockIdArray(blockIds, nblocks, `the region holds ${nblocks} blocks of ${bb} bytes (stride ${stride}) after baseOffset ${base}`);
    checkFits(dst, d, ids.length * bb);
    await nativeAsync(() => src.gatherTo(dst, d, ids, bb, this.offset + base, stride));
  }

  /** Release the mapping / IPC handle (after copies in flight finish). Later copies throw ERR_CLOSED. */
  close(): void {
    if (this.closedFlag) return;
    this.closedFlag = true;
    this.src.close();
  }
}

/** Validate block ids (integers in [0, nblocks)) into a Uint32Array; errors name the index. */
export function blockIdArray(blockIds: ArrayLike<number>, nblocks: number, context: string): Uint32Array {
  if (blockIds === null || typeof blockIds !== 'object' || typeof blockIds.length !== 'number') {
    throw invalid('blockIds must be an array of block ids');
  }
  const out = new Uint32Array(blockIds.length);
  for (let i = 0; i < blockIds.length; i++) {
    const b = blockIds[i];
    if (typeof b !== 'number' || !Number.isInteger(b) || b < 0 || b >= nblocks) {
      throw new NativeError(`blockIds[${i}] = ${String(b)} is out of range: ${context}`, 'ERR_OUT_OF_RANGE');
    }
    out[i] = b;
  }
  return out;
}

/** One step of a staged copy: a byte range of the region, or a run of whole blocks. */
export type StagingChunk =
  | { kind: 'range'; srcOffset: number; nbytes: number }
  | { kind: 'blocks'; blockIds: number[]; blockBytes: number; baseOffset: number; nbytes: number };

/**
 * Bounded host staging memory. A dump larger than the staging area streams through it one
 * chunk at a time: `stream(region, plan)` fills the buffer, yields it, and refills it only when
 * the consumer asks for the next chunk, i.e. once it is done with the previous one.
 * Pinned (cudaHostAlloc) when `pinned` is asked for and CUDA is available, so CUDA copies DMA
 * straight into it; plain memory otherwise.
 */
export class Staging {
  readonly buffer: Buffer;
  readonly capacity: number;
  readonly pinned: boolean;
  private busy = false;

  constructor(capacityBytes: number, opts: { pinned?: boolean } = {}) {
    this.capacity = checkCount(capacityBytes, 'capacityBytes');
    if (this.capacity === 0) throw invalid('capacityBytes must be positive');
    const got = nativeCall(() => native.allocHost(this.capacity, opts.pinned ?? false));
    this.buffer = got.buffer;
    this.pinned = got.pinned;
  }

  /** Split region bytes [startOffset, startOffset + totalBytes) into ranges of at most `capacity`. */
  chunks(totalBytes: number, startOffset = 0): StagingChunk[] {
    const total = checkCount(totalBytes, 'totalBytes');
    const start = checkCount(startOffset, 'startOffset');
    const out: StagingChunk[] = [];
    for (let off = 0; off < total; off += this.capacity) {
      out.push({ kind: 'range', srcOffset: start + off, nbytes: Math.min(this.capacity, total - off) });
    }
    return out;
  }

  /**
   * Plan a gather: runs of as many whole blocks as fit in `capacity`, in the order given.
   * A block larger than the staging area becomes a series of ranges.
   */
  gatherChunks(blockIds: ArrayLike<number>, blockBytes: number, baseOffset = 0): StagingChunk[] {
    const bb = checkCount(blockBytes, 'blockBytes');
    const base = checkCount(baseOffset, 'baseOffset');
    if (bb === 0) throw invalid('blockBytes must be positive');
    const ids = blockIdArray(blockIds, Number.MAX_SAFE_INTEGER, 'block ids must be non-negative integers');
    const out: StagingChunk[] = [];
    if (bb > this.capacity) {
      for (const b of ids) out.push(...this.chunks(bb, base + b * bb));
      return out;
    }
    const per = Math.floor(this.capacity / bb);
    for (let i = 0; i < ids.length; i += per) {
      const run = Array.from(ids.subarray(i, i + per));
      out.push({ kind: 'blocks', blockIds: run, blockBytes: bb, baseOffset: base, nbytes: run.length * bb });
    }
    return out;
  }

  /**
   * Copy each chunk of `plan` into the staging buffer and yield a view of the filled part.
   * The view is valid until the consumer asks for the next chunk (the buffer is then reused).
   */
  async *stream(region: DeviceRegion, plan: StagingChunk[] = this.chunks(region.nbytes)): AsyncGenerator<Buffer, void, undefined> {
    if (this.busy) throw new NativeError('staging buffer is already streaming; use one Staging per concurrent dump', 'ERR_BUSY');
    for (let i = 0; i < plan.length; i++) {
      if (plan[i].nbytes > this.capacity) {
        throw invalid(`plan[${i}].nbytes (${plan[i].nbytes}) exceeds staging capacity (${this.capacity})`);
      }
    }
    this.busy = true;
    try {
      for (const c of plan) {
        if (c.kind === 'range') await region.copyTo(this.buffer, 0, c.srcOffset, c.nbytes);
        else await region.gatherTo(this.buffer, 0, c.blockIds, c.blockBytes, c.baseOffset);
        yield this.buffer.subarray(0, c.nbytes);
      }
    } finally {
      this.busy = false;
    }
  }
}

/** Whether the CUDA backend can be used here, and why not (the dlopen / driver error). */
export function cudaAvailable(): { available: boolean; reason: string } {
  return native.cudaAvailable();
}
