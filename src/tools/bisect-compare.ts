// One module of two probe trees, compared: A (the run under test) against B (the reference), with
// per-dtype tolerances (numpy.isclose: |a - b| <= atol + rtol * |b|). A split module is compared
// assembled, and each out-of-tolerance element is charged to the A rank whose shard holds it; a
// replicated module is compared rank by rank (every A rank's copy against B's tp_rank 0 copy). Also
// the first non-finite element of a tree (NaN provenance).
import type { DType } from '../artifacts/dtype';
import { CompareInputError } from '../errors';
import { decodeElements, isFloatDType, unravel } from './compare';
import { assembleModule, type ProbeModule } from './bisect-load';

export type TolClass = 'fp32' | 'bf16' | 'fp16' | 'fp8';
export interface Tolerance {
  atol: number;
  rtol: number;
}
export type Tolerances = Record<TolClass, Tolerance>;

/** Defaults: a few units in the last place of each format, so reduction-order noise passes and a wrong value does not. */
export const DEFAULT_TOLERANCES: Tolerances = {
  fp32: { atol: 1e-5, rtol: 1e-4 },
  bf16: { atol: 1e-2, rtol: 1.6e-2 },
  fp16: { atol: 1e-3, rtol: 2e-3 },
  fp8: { atol: 6.25e-2, rtol: 1.25e-1 },
};

/** The tolerance class of a dtype; undefined: compared exactly (integers, bool). */
export function tolClass(d: DType): TolClass | undefined {
  if (d === 'float32' || d === 'float64') return 'fp32';
  if (d === 'bfloat16') return 'bf16';
  if (d === 'float16') return 'fp16';
  if (d.startsWith('float8_')) return 'fp8';
  return undefined;
}

/** The looser of the two sides' tolerances (a bf16 run against an fp32 reference is held to bf16's). */
export function toleranceFor(a: DType, b: DType, tols: Tolerances): Tolerance {
  const ta = tolClass(a);
  const tb = tolClass(b);
  if (!ta && !tb) return { atol: 0, rtol: 0 };
  const pick = [ta, tb].filter((c): c is TolClass => c !== undefined).map((c) => tols[c]);
  return { atol: Math.max(...pick.map((t) => t.atol)), rtol: Math.max(...pick.map((t) => t.rtol)) };
}

export interface RankError {
  rank: number;
  tp_rank: number;
  max_abs_diff: number;
  mismatched: number;
}

export interface ModuleResult {
  key: string;
  module: string;
  call: number;
  io: 'output' | 'input';
  arg: number;
  split: string;
  dtype_a: DType;
  dtype_b: DType;
  shape: number[];
  atol: number;
  rtol: number;
  /** Largest |a - b|; Infinity where a non-finite value meets a different value. */
  max_abs_diff: number;
  /** max |a - b| / max |b| over the tensor (Infinity when b is all zero and a is not). */
  rel_err: number;
  mismatched: number;
  numel: number;
  out_of_tolerance: boolean;
  /** A's global ranks whose shard (or copy) holds an out-of-tolerance element. */
  ranks: number[];
  per_rank: RankError[];
  /** The largest difference: position in the whole tensor, the A rank holding it and the position in its shard. */
  worst?: { index: number[]; rank: number; shard_index: number[]; a: number; b: number };
}

interface Stats {
  maxAbs: number;
  at: number;
  mismatched: number;
  maxB: number;
  perOwner: Map<number, { maxAbs: number; mismatched: number }>;
}

/** isclose over the elements, charging each difference to owner(i). */
function diffStats(va: Float64Array, vb: Float64Array, tol: Tolerance, exact: boolean, owner: (i: number) => number): Stats {
  const s: Stats = { maxAbs: 0, at: -1, mismatched: 0, maxB: 0, perOwner: new Map() };
  for (let i = 0; i < va.length; i++) {
    const x = va[i];
    const y = vb[i];
    if (Number.isFinite(y) && Math.abs(y) > s.maxB) s.maxB = Math.abs(y);
    if (x === y || (Number.isNaN(x) && Number.isNaN(y))) continue;
    const d = Number.isFinite(x) && Number.isFinite(y) ? Math.abs(x - y) : Infinity;
    const close = !exact && Number.isFinite(d) && d <= tol.atol + tol.rtol * Math.abs(y);
    const o = owner(i);
    const po = s.perOwner.get(o) ?? { maxAbs: 0, mismatched: 0 };
    if (d > po.maxAbs) po.maxAbs = d;
    if (!close) po.mismatched++;
    s.perOwner.set(o, po);
    if (d > s.maxAbs || s.at < 0) {
      s.maxAbs = d;
      s.at = i;
    }
    if (!close) s.mismatched++;
  }
  return s;
}

const sameShape = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((d, i) => d === b[i]);

/** Compare module `a` (of tree A) with its match `b` (of tree B). */
export function compareModule(a: ProbeModule, b: ProbeModule, tols: Tolerances): ModuleResult {
  const A = assembleModule(a, 'A');
  const B = assembleModule(b, 'B');
  if (!sameShape(A.shape, B.shape)) {
    throw new CompareInputError(`${a.key}: A is [${A.shape}] (${a.split}, ${a.shards.length} shard(s)), B is [${B.shape}] (${b.split}, ${b.shards.length} shard(s)); a split declared wrong, or different models`);
  }
  const tol = toleranceFor(a.dtype, b.dtype, tols);
  const exact = !isFloatDType(a.dtype) && !isFloatDType(b.dtype);
  const vb = decodeElements(b.dtype, B.data);
  const numel = vb.length;
  let s: Stats;
  let worstTp = 0;
  let va: Float64Array; // the values the worst position is read from (the worst rank's copy, or A assembled)
  // Where A's shard of element i lies: the index inside that shard.
  let locate: (i: number, tp: number) => number[];
  if (a.split === 'replicated' || a.shards.length === 1) {
    // Every rank's copy against the reference; counts are of elements (the worst copy's), not copies.
    s = { maxAbs: 0, at: -1, mismatched: 0, maxB: 0, perOwner: new Map() };
    va = new Float64Array(0);
    for (const sh of a.shards) {
      const v = decodeElements(sh.dtype, sh.data);
      const one = diffStats(v, vb, tol, exact, () => sh.tpRank);
      s.perOwner.set(sh.tpRank, one.perOwner.get(sh.tpRank) ?? { maxAbs: 0, mismatched: 0 });
      s.maxB = one.maxB;
      s.mismatched = Math.max(s.mismatched, one.mismatched);
      if (one.at >= 0 && (s.at < 0 || one.maxAbs > s.maxAbs)) {
        s.maxAbs = one.maxAbs;
        s.at = one.at;
        worstTp = sh.tpRank;
        va = v;
      }
    }
    locate = (i) => unravel(i, A.shape);
  } else {
    const dim = a.splitDim!;
    const inner = A.shape.slice(dim + 1).reduce((x, y) => x * y, 1);
    const tpOf = (i: number) => {
      const c = Math.floor(i / inner) % A.shape[dim];
      return A.bounds.findIndex((end) => c < end);
    };
    va = decodeElements(a.dtype, A.data);
    s = diffStats(va, vb, tol, exact, tpOf);
    if (s.at >= 0) worstTp = tpOf(s.at);
    locate = (i, tp) => {
      const idx = unravel(i, A.shape);
      idx[dim] -= tp === 0 ? 0 : A.bounds[tp - 1];
      return idx;
    };
  }
  const owners = a.shards.map((sh) => ({ rank: sh.globalRank, tp_rank: sh.tpRank }));
  const perRank: RankError[] = owners.map((o) => ({ ...o, max_abs_diff: s.perOwner.get(o.tp_rank)?.maxAbs ?? 0, mismatched: s.perOwner.get(o.tp_rank)?.mismatched ?? 0 }));
  const r: ModuleResult = {
    key: a.key,
    module: a.module,
    call: a.call,
    io: a.io,
    arg: a.arg,
    split: a.split,
    dtype_a: a.dtype,
    dtype_b: b.dtype,
    shape: A.shape,
    atol: tol.atol,
    rtol: tol.rtol,
    max_abs_diff: s.maxAbs,
    rel_err: s.maxAbs === 0 ? 0 : s.maxB === 0 ? Infinity : s.maxAbs / s.maxB,
    mismatched: s.mismatched,
    numel,
    out_of_tolerance: s.mismatched > 0,
    ranks: perRank.filter((p) => p.mismatched > 0).map((p) => p.rank),
    per_rank: perRank,
  };
  if (s.at >= 0) {
    r.worst = { index: unravel(s.at, A.shape), rank: a.shards[worstTp].globalRank, shard_index: locate(s.at, worstTp), a: va[s.at], b: vb[s.at] };
  }
  return r;
}

export interface NonFinite {
  tree: 'a' | 'b';
  key: string;
  module: string;
  rank: number;
  tp_rank: number;
  pp_rank: number;
  /** Position in that rank's shard (its own tensor, as the rank saw it). */
  index: number[];
  value: number;
}

/** The first non-finite element of a tree, in its execution order, ranks in tp_rank order. */
export function firstNonFinite(modules: ProbeModule[], tree: 'a' | 'b'): NonFinite | undefined {
  for (const m of modules) {
    if (!isFloatDType(m.dtype)) continue;
    for (const sh of m.shards) {
      const v = decodeElements(sh.dtype, sh.data);
      for (let i = 0; i < v.length; i++) {
        if (!Number.isFinite(v[i])) {
          return { tree, key: m.key, module: m.module, rank: sh.globalRank, tp_rank: sh.tpRank, pp_rank: sh.ppRank, index: unravel(i, sh.shape), value: v[i] };
        }
      }
    }
  }
  return undefined;
}
