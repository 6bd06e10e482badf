// Tensor-by-tensor comparison of two captures (snapshot calls, KV dumps, ranks). Floating
// dtypes (bf16, fp16, fp8 e4m3fn / e5m2 included) are decoded to float64 and compared with
// numpy.isclose semantics: |a - b| <= atol + rtol * |b|; positions where both are NaN are equal,
// one NaN is a difference; infinities are equal only to the same infinity. Integer and bool
// dtypes are compared exactly (tolerances do not apply).
import { ConfigError } from '../errors';
import { DType, itemSize } from '../artifacts/dtype';
import { loadAssembled, loadCapture, type LoadedTensor } from './assemble';

// ---------------------------------------------------------------- element decoding

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** bfloat16 bits → value: the upper 16 bits of a float32. */
export function bf16ToFloat(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0];
}

/** IEEE binary16 bits → value. */
export function halfToFloat(bits: number): number {
  const s = bits & 0x8000 ? -1 : 1;
  const e = (bits >> 10) & 0x1f;
  const m = bits & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m === 0 ? s * Infinity : NaN;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

/** OCP FP8 E4M3FN: bias 7, no infinities, S.1111.111 is NaN, max 448. */
export function fp8e4m3fnToFloat(bits: number): number {
  const s = bits & 0x80 ? -1 : 1;
  const e = (bits >> 3) & 0xf;
  const m = bits & 0x7;
  if (e === 0xf && m === 0x7) return NaN;
  if (e === 0) return s * m * 2 ** -9; // subnormal: m/8 * 2^-6
  return s * (1 + m / 8) * 2 ** (e - 7);
}

/** OCP FP8 E5M2: bias 15, IEEE-like (exponent 31: infinity or NaN); the top byte of a binary16. */
export function fp8e5m2ToFloat(bits: number): number {
  return halfToFloat((bits & 0xff) << 8);
}

const FP8_E4M3FN = Float64Array.from({ length: 256 }, (_, i) => fp8e4m3fnToFloat(i));
const FP8_E5M2 = Float64Array.from({ length: 256 }, (_, i) => fp8e5m2ToFloat(i));
let HALF: Float64Array | undefined;
let BF16: Float64Array | undefined;

export const FLOAT_DTYPES: readonly DType[] = ['float64', 'float32', 'float16', 'bfloat16', 'float8_e4m3fn', 'float8_e5m2'];
export const isFloatDType = (d: DType) => FLOAT_DTYPES.includes(d);

/** Decode row-major little-endian elements to float64 (int64 beyond 2^53 loses precision here; equality uses the bytes). */
export function decodeElements(dtype: DType, data: Buffer): Float64Array {
  const n = data.length / itemSize(dtype);
  const out = new Float64Array(n);
  switch (dtype) {
    case 'float64':
      for (let i = 0; i < n; i++) out[i] = data.readDoubleLE(i * 8);
      break;
    case 'float32':
      for (let i = 0; i < n; i++) out[i] = data.readFloatLE(i * 4);
      break;
    case 'float16':
      HALF ??= Float64Array.from({ length: 65536 }, (_, i) => halfToFloat(i));
      for (let i = 0; i < n; i++) out[i] = HALF[data.readUInt16LE(i * 2)];
      break;
    case 'bfloat16':
      BF16 ??= Float64Array.from({ length: 65536 }, (_, i) => bf16ToFloat(i));
      for (let i = 0; i < n; i++) out[i] = BF16[data.readUInt16LE(i * 2)];
      break;
    case 'float8_e4m3fn':
      for (let i = 0; i < n; i++) out[i] = FP8_E4M3FN[data[i]];
      break;
    case 'float8_e5m2':
      for (let i = 0; i < n; i++) out[i] = FP8_E5M2[data[i]];
      break;
    case 'int64':
      for (let i = 0; i < n; i++) out[i] = Number(data.readBigInt64LE(i * 8));
      break;
    case 'int32':
      for (let i = 0; i < n; i++) out[i] = data.readInt32LE(i * 4);
      break;
    case 'int16':
      for (let i = 0; i < n; i++) out[i] = data.readInt16LE(i * 2);
      break;
    case 'int8':
      for (let i = 0; i < n; i++) out[i] = data.readInt8(i);
      break;
    case 'uint8':
    case 'bool':
      for (let i = 0; i < n; i++) out[i] = data[i];
      break;
    case 'uint16':
      for (let i = 0; i < n; i++) out[i] = data.readUInt16LE(i * 2);
      break;
    case 'uint32':
      for (let i = 0; i < n; i++) out[i] = data.readUInt32LE(i * 4);
      break;
    case 'uint64':
      for (let i = 0; i < n; i++) out[i] = Number(data.readBigUInt64LE(i * 8));
      break;
    default:
      // complex and fp8 fnuz tensors are captured (.pt takes any dtype) but have no scalar decoding here.
      throw new ConfigError(`compare: no numeric decoding for dtype ${dtype}; such tensors can only be compared byte for byte`);
  }
  return out;
}

// ---------------------------------------------------------------- comparison

export interface CompareOptions {
  atol?: number;
  rtol?: number;
  assembleTp?: boolean;
}

export type PairStatus = 'equal' | 'within_tolerance' | 'differs' | 'shape_mismatch' | 'only_in_a' | 'only_in_b';

export interface TensorComparison {
  key: string;
  status: PairStatus;
  dtype_a?: DType;
  dtype_b?: DType;
  shape_a?: number[];
  shape_b?: number[];
  numel?: number;
  /** Largest |a - b| over positions where both are finite or equal infinities; Infinity when an infinity meets a finite value. */
  max_abs_diff?: number;
  /** Largest |a - b| / |b| (Infinity where b is 0 and a is not). */
  max_rel_diff?: number;
  /** Elements failing |a - b| <= atol + rtol * |b| (NaN vs NaN passes; NaN vs a number fails). */
  mismatched?: number;
  nan_mismatched?: number;
  first_diff_index?: number[];
  first_diff_values?: [number, number];
  /** KV layout [n_blocks, block_size, heads, head_dim]: max |a - b| per head (the heatmap's columns). */
  per_head_max_abs?: number[];
}

export interface CompareResult {
  a: string;
  b: string;
  atol: number;
  rtol: number;
  assemble_tp: boolean;
  tensors: TensorComparison[];
  /** True when every tensor pairs up and is within tolerance. */
  ok: boolean;
  summary: Record<PairStatus, number>;
}

/** Row-major flat index → multi-index. */
export function unravel(flat: number, shape: readonly number[]): number[] {
  const idx = new Array<number>(shape.length);
  for (let i = shape.length - 1; i >= 0; i--) {
    idx[i] = shape[i] === 0 ? 0 : flat % shape[i];
    flat = shape[i] === 0 ? 0 : Math.floor(flat / shape[i]);
  }
  return idx;
}

const sameShape = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((d, i) => d === b[i]);

/** Compare two loaded tensors of the same key. */
export function compareTensors(a: LoadedTensor, b: LoadedTensor, atol: number, rtol: number): TensorComparison {
  const r: TensorComparison = { key: a.key, status: 'equal', dtype_a: a.dtype, dtype_b: b.dtype, shape_a: a.shape, shape_b: b.shape };
  if (!sameShape(a.shape, b.shape)) return { ...r, status: 'shape_mismatch' };
  const n = a.shape.reduce((x, y) => x * y, 1);
  r.numel = n;
  const exact = !isFloatDType(a.dtype) && !isFloatDType(b.dtype);
  const va = decodeElements(a.dtype, a.data);
  const vb = decodeElements(b.dtype, b.data);
  const kv = a.shape.length === 4;
  const heads = kv ? a.shape[2] : 0;
  const headDim = kv ? a.shape[3] : 1;
  const perHead = kv ? new Array<number>(heads).fill(0) : undefined;
  const isz = itemSize(a.dtype);
  let maxAbs = 0;
  let maxRel = 0;
  let mismatched = 0;
  let nanMismatched = 0;
  let first = -1;
  let anyDiff = false;
  for (let i = 0; i < n; i++) {
    const x = va[i];
    const y = vb[i];
    let close: boolean;
    let d: number;
    if (exact) {
      // Integers: the bytes decide (int64 beyond 2^53 included); the difference is for display.
      close = a.dtype === b.dtype ? a.data.compare(b.data, i * isz, (i + 1) * isz, i * isz, (i + 1) * isz) === 0 : x === y;
      d = Math.abs(x - y);
    } else if (Number.isNaN(x) || Number.isNaN(y)) {
      close = Number.isNaN(x) && Number.isNaN(y);
      if (!close) nanMismatched++;
      d = 0; // not a magnitude: counted in nan_mismatched
    } else if (x === y) {
      close = true; // equal infinities too
      d = 0;
    } else {
      d = Math.abs(x - y);
      close = Number.isFinite(d) && d <= atol + rtol * Math.abs(y);
      const rel = y === 0 ? Infinity : d / Math.abs(y);
      if (rel > maxRel) maxRel = rel;
    }
    if (exact && !close && y !== 0) maxRel = Math.max(maxRel, d / Math.abs(y));
    if (exact && !close && y === 0) maxRel = Infinity;
    if (d > maxAbs) maxAbs = d;
    if (perHead && d > perHead[Math.floor(i / headDim) % heads]) perHead[Math.floor(i / headDim) % heads] = d;
    if (!close) {
      mismatched++;
      if (first < 0) first = i;
    }
    if (x !== y && !(Number.isNaN(x) && Number.isNaN(y))) anyDiff = true;
  }
  r.max_abs_diff = maxAbs;
  r.max_rel_diff = maxRel;
  r.mismatched = mismatched;
  r.nan_mismatched = nanMismatched;
  if (perHead) r.per_head_max_abs = perHead;
  if (first >= 0) {
    r.first_diff_index = unravel(first, a.shape);
    r.first_diff_values = [va[first], vb[first]];
  }
  r.status = mismatched > 0 ? 'differs' : anyDiff || a.dtype !== b.dtype ? 'within_tolerance' : 'equal';
  return r;
}

export function checkTolerance(v: number, flag: string): number {
  if (!Number.isFinite(v) || v < 0) throw new RangeError(`${flag}: expected a finite number >= 0, got ${v}`);
  return v;
}

/** Compare capture `a` with capture `b` (files, bundle dirs, trees; or KV dump wave dirs with assembleTp). */
export function compareCaptures(a: string, b: string, opts: CompareOptions = {}): CompareResult {
  const atol = checkTolerance(opts.atol ?? 0, '--atol');
  const rtol = checkTolerance(opts.rtol ?? 0, '--rtol');
  const load = opts.assembleTp ? loadAssembled : loadCapture;
  const ta = load(a);
  const tb = load(b);
  const mb = new Map(tb.map((t) => [t.key, t]));
  const ma = new Map(ta.map((t) => [t.key, t]));
  const tensors: TensorComparison[] = [];
  for (const t of ta) {
    const u = mb.get(t.key);
    tensors.push(u ? compareTensors(t, u, atol, rtol) : { key: t.key, status: 'only_in_a', dtype_a: t.dtype, shape_a: t.shape });
  }
  for (const u of tb) if (!ma.has(u.key)) tensors.push({ key: u.key, status: 'only_in_b', dtype_b: u.dtype, shape_b: u.shape });
  const summary: Record<PairStatus, number> = { equal: 0, within_tolerance: 0, differs: 0, shape_mismatch: 0, only_in_a: 0, only_in_b: 0 };
  for (const t of tensors) summary[t.status]++;
  const ok = tensors.length > 0 && tensors.every((t) => t.status === 'equal' || t.status === 'within_tolerance');
  return { a, b, atol, rtol, assemble_tp: opts.assembleTp ?? false, tensors, ok, summary };
}

/** JSON cannot hold Infinity / NaN: they become "inf", "-inf", "nan". */
export function jsonSafe(v: unknown): unknown {
  return JSON.parse(JSON.stringify(v, (_k, x) => (typeof x === 'number' && !Number.isFinite(x) ? (Number.isNaN(x) ? 'nan' : x > 0 ? 'inf' : '-inf') : x)));
}
