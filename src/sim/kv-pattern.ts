// Deterministic KV pool contents for the simulated engine: every element is a function of
// (layer, kv, block, slot, head, dim, global rank), so a test can check any dumped byte.
// Values are finite bfloat16 / float16 / float32 numbers, so tools that load them see real data.
import type { DType } from '../artifacts/dtype';

export interface KvGeometry {
  layers: number;
  numBlocks: number;
  blockSize: number;
  /** KV heads held by this rank (total / tp). */
  kvHeads: number;
  headDim: number;
  dtype: Extract<DType, 'bfloat16' | 'float16' | 'float32'>;
}

function mix(a: number, b: number): number {
  // A cheap integer hash (xorshift-multiply), stable across processes and languages.
  let h = (Math.imul(a ^ (a >>> 16), 0x45d9f3b) ^ b) >>> 0;
  h = Math.imul(h ^ (h >>> 13), 0x27d4eb2d) >>> 0;
  return (h ^ (h >>> 15)) >>> 0;
}

/** A 32-bit hash of one element's coordinates. */
export function kvElementHash(layer: number, kv: 'k' | 'v', block: number, slot: number, head: number, dim: number, rank: number): number {
  let h = mix(layer + 1, kv === 'k' ? 0x6b : 0x76);
  h = mix(h, block);
  h = mix(h, slot);
  h = mix(h, head);
  h = mix(h, dim);
  return mix(h, rank + 7);
}

/** Bytes of one block of one layer's K or V for `rank`. */
export function kvBlockBytes(g: KvGeometry, layer: number, kv: 'k' | 'v', block: number, rank: number): Buffer {
  const per = g.blockSize * g.kvHeads * g.headDim;
  const item = g.dtype === 'float32' ? 4 : 2;
  const out = Buffer.allocUnsafe(per * item);
  let i = 0;
  for (let slot = 0; slot < g.blockSize; slot++) {
    for (let head = 0; head < g.kvHeads; head++) {
      for (let dim = 0; dim < g.headDim; dim++) {
        const h = kvElementHash(layer, kv, block, slot, head, dim, rank);
        // A value in about [-4, 4): sign, a small exponent range, random mantissa.
        const v = ((h & 0xffff) / 0x8000 - 1) * (1 + ((h >>> 16) & 3));
        if (g.dtype === 'float32') out.writeFloatLE(v, i * 4);
        else if (g.dtype === 'float16') out.writeUInt16LE(toHalfBits(v), i * 2);
        else out.writeUInt16LE(toBf16Bits(v), i * 2);
        i++;
      }
    }
  }
  return out;
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

function toBf16Bits(v: number): number {
  f32[0] = v;
  return u32[0] >>> 16; // truncation is fine: the pattern only needs to be deterministic
}

function toHalfBits(v: number): number {
  f32[0] = v;
  const x = u32[0];
  const sign = (x >>> 16) & 0x8000;
  const exp = ((x >>> 23) & 0xff) - 127 + 15;
  const mant = (x >>> 13) & 0x3ff;
  if (exp <= 0) return sign; // tiny values flush to zero
  if (exp >= 31) return sign | 0x7bff;
  return sign | (exp << 10) | mant;
}

/** Fill a whole layer's K or V pool ([numBlocks, blockSize, kvHeads, headDim]) in place. */
export function fillKvPool(dst: Buffer, g: KvGeometry, layer: number, kv: 'k' | 'v', rank: number): void {
  let off = 0;
  for (let b = 0; b < g.numBlocks; b++) {
    const bytes = kvBlockBytes(g, layer, kv, b, rank);
    bytes.copy(dst, off);
    off += bytes.length;
  }
}
