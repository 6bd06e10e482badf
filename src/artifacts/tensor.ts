// A captured tensor: dtype, shape and its row-major contiguous bytes, either already in memory
// (one or more chunks) or produced lazily by an async source (streaming through bounded staging).
import { CaptureError } from '../errors';
import { DType, itemSize } from './dtype';

export type ChunkSource = AsyncIterable<Uint8Array>;

function validateShape(shape: readonly number[], what: string): number {
  if (!Array.isArray(shape)) throw new CaptureError(`${what}: shape must be an array of integers, got ${JSON.stringify(shape)}`, 'ERR_TENSOR_SHAPE');
  let numel = 1;
  shape.forEach((d, i) => {
    if (typeof d !== 'number' || !Number.isSafeInteger(d) || d < 0) {
      throw new CaptureError(`${what}: shape[${i}] must be an integer >= 0, got ${JSON.stringify(d)}`, 'ERR_TENSOR_SHAPE');
    }
    numel *= d;
  });
  if (!Number.isSafeInteger(numel)) throw new CaptureError(`${what}: shape ${JSON.stringify(shape)} has too many elements`, 'ERR_TENSOR_SHAPE');
  return numel;
}

function asBuffer(u: Uint8Array | ArrayBufferView): Buffer {
  if (Buffer.isBuffer(u)) return u;
  return Buffer.from(u.buffer, u.byteOffset, u.byteLength);
}

export class Tensor {
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly numel: number;
  readonly nbytes: number;
  private readonly memory: Buffer[] | null;
  private readonly source: ChunkSource | null;
  private consumed = false;

  private constructor(dtype: DType, shape: readonly number[], memory: Buffer[] | null, source: ChunkSource | null, nbytes: number | null) {
    this.dtype = dtype;
    this.shape = Object.freeze([...shape]);
    this.numel = validateShape(shape, `tensor(${dtype})`);
    this.nbytes = this.numel * itemSize(dtype);
    this.memory = memory;
    this.source = source;
    if (memory) {
      const got = memory.reduce((n, b) => n + b.length, 0);
      if (got !== this.nbytes) {
        throw new CaptureError(
          `tensor(${dtype}, shape ${JSON.stringify(shape)}): data has ${got} bytes, expected ${this.nbytes} (numel ${this.numel} x itemsize ${itemSize(dtype)})`,
          'ERR_TENSOR_SIZE',
        );
      }
    }
    if (nbytes !== null && nbytes !== this.nbytes) {
      throw new CaptureError(
        `tensor(${dtype}, shape ${JSON.stringify(shape)}): source announces ${nbytes} bytes, expected ${this.nbytes}`,
        'ERR_TENSOR_SIZE',
      );
    }
  }

  /** In-memory data: one buffer (or typed array) or several chunks, concatenated in order. */
  static fromBuffer(dtype: DType, shape: readonly number[], data: Uint8Array | ArrayBufferView | ReadonlyArray<Uint8Array>): Tensor {
    const chunks = Array.isArray(data) ? (data as Uint8Array[]).map(asBuffer) : [asBuffer(data as ArrayBufferView)];
    return new Tensor(dtype, shape, chunks, null, null);
  }

  /**
   * Lazily produced data (e.g. region → bounded staging → file). The source may reuse its buffer
   * after each chunk is consumed: writers finish with a chunk before asking for the next one.
   * It can be consumed once; a source yielding fewer or more than `nbytes` bytes fails the write.
   */
  static fromChunks(dtype: DType, shape: readonly number[], source: ChunkSource, nbytes: number): Tensor {
    return new Tensor(dtype, shape, null, source, nbytes);
  }

  get isLazy(): boolean {
    return this.memory === null;
  }

  /** The in-memory chunks (throws for a lazy tensor: use stream()). */
  get chunks(): Buffer[] {
    if (!this.memory) throw new CaptureError(`tensor(${this.dtype}): data is streamed, not in memory`, 'ERR_TENSOR_LAZY');
    return this.memory;
  }

  /** Element strides of the row-major contiguous layout. */
  strides(): number[] {
    const s = new Array<number>(this.shape.length);
    let acc = 1;
    for (let i = this.shape.length - 1; i >= 0; i--) {
      s[i] = acc;
      acc *= this.shape[i];
    }
    return s;
  }

  /** Yields the bytes in order; for lazy sources, checks the total against nbytes. */
  async *stream(): AsyncGenerator<Buffer> {
    if (this.memory) {
      for (const c of this.memory) if (c.length > 0) yield c;
      return;
    }
    if (this.consumed) throw new CaptureError(`tensor(${this.dtype}): lazy source already consumed`, 'ERR_TENSOR_LAZY');
    this.consumed = true;
    let seen = 0;
    for await (const c of this.source as ChunkSource) {
      const b = asBuffer(c);
      seen += b.length;
      if (seen > this.nbytes) {
        throw new CaptureError(`tensor(${this.dtype}, shape ${JSON.stringify(this.shape)}): source produced more than ${this.nbytes} bytes`, 'ERR_SOURCE');
      }
      if (b.length > 0) yield b;
    }
    if (seen !== this.nbytes) {
      throw new CaptureError(`tensor(${this.dtype}, shape ${JSON.stringify(this.shape)}): source ended after ${seen} of ${this.nbytes} bytes`, 'ERR_SOURCE');
    }
  }
}

export function isTensor(v: unknown): v is Tensor {
  return v instanceof Tensor;
}
