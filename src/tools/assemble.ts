// Loading captured tensors for comparison, and reassembling TP shards. A capture is a file
// (.npy/.pt/.safetensors), a bundle dir, or a tree of them; every tensor gets a pairing key
// (relative path without extension, plus the tensor's name inside a multi-tensor file).
// --assemble-tp: a KV dump wave dir's rank dirs (the seed's dp*_tp*_pp*_cp*/, or rank<g>/ of older
// dumps) are shards ([n_blocks, block_size, kv_heads_per_rank, head_dim]) concatenated along dim 2
// in tp_rank order (from dump.json identity, which the directory name must agree with).
// A rank<g>/ of an older dump is keyed by the seed's name, so old and new dumps pair up.
import * as fs from 'fs';
import * as path from 'path';
import { DType, isDType, itemSize } from '../artifacts/dtype';
import { CompareInputError } from '../errors';
import { readBytes } from '../artifacts/read-range';
import { kvDumpFileName, resolveDtype, tensorFileOf } from '../artifacts/tensor-files';
import { isTensorFormat, TENSOR_FORMATS, tensorFileExtension } from '../artifacts/tensor-format';
import { readArtifactJson } from '../artifacts/json-file';
import { checkKvDirIdentity, kvRankDirName, readKvRankDirName } from '../paths';

export interface LoadedTensor {
  key: string;
  file: string;
  dtype: DType;
  shape: number[];
  /** Row-major little-endian element bytes. */
  data: Buffer;
  /** Set by assembly: the ranks whose shards were joined, in order. */
  tpRanks?: number[];
}

const TENSOR_EXT = TENSOR_FORMATS.map(tensorFileExtension);

/**
 * dtype hints from the bundle JSON beside the files (a .npy header's |V1 cannot say which fp8),
 * by file name; a hint is taken only where the file's header allows it.
 */
function dtypeHints(dir: string): Map<string, DType> {
  const hints = new Map<string, DType>();
  try {
    const dump = path.join(dir, 'dump.json');
    if (fs.existsSync(dump)) {
      const doc = readArtifactJson(dump) as any;
      if (isTensorFormat(doc.format)) {
        for (const l of doc.layers ?? []) {
          if (typeof l.layer === 'string' && isDType(l.dtype)) for (const kv of ['k', 'v'] as const) hints.set(kvDumpFileName(l.layer, doc.format, kv), l.dtype);
        }
      }
    }
    const meta = path.join(dir, 'meta.json');
    if (fs.existsSync(meta)) {
      const doc = readArtifactJson(meta) as any;
      if (isTensorFormat(doc.format)) for (const i of doc.inputs ?? []) if (isDType(i.dtype)) hints.set(`tensor${i.index}${tensorFileExtension(doc.format)}`, i.dtype);
    }
  } catch {
    /* no hints: the file header decides, or the load says what is ambiguous */
  }
  return hints;
}

const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

/** Every tensor in one file; `base` is the key prefix ('' for a lone file). */
export function loadTensorFile(file: string, base: string, hint?: DType): LoadedTensor[] {
  const join = (name: string) => (base && name ? `${base}.${name}` : base || name);
  const format = tensorFileOf(file);
  if (!format) throw new CompareInputError(`${file}: not a tensor file (expected ${TENSOR_EXT.join(', ')})`);
  try {
    const { tensors, lone } = format.read(file);
    return tensors.map((t, i) => {
      if (t.notContiguous) throw new CompareInputError(`${file}: ${t.notContiguous}`);
      const dtype = resolveDtype(t, hint);
      if (!dtype) {
        throw new CompareInputError(
          t.candidates.length > 1 ? `${file}: descr ${t.code} may be ${t.candidates.join(' or ')}; no dump.json/meta.json beside it says which` : `${file}: dtype ${t.code} is not supported`,
        );
      }
      return { key: join(lone ? '' : t.name ?? `tensor${i}`), file, dtype, shape: t.shape, data: readBytes(file, t.offset, t.nbytes) };
    });
  } catch (e) {
    if (e instanceof CompareInputError) throw e;
    throw new CompareInputError(`${file}: unreadable (${(e as Error).message})`);
  }
}

/** dump.json's identity in `dir`, or undefined when there is none (not a KV rank dir). */
function dumpIdentity(dir: string): Record<string, unknown> | undefined {
  const f = path.join(dir, 'dump.json');
  if (!fs.existsSync(f)) return undefined;
  try {
    return (readArtifactJson(f) as any)?.identity ?? {};
  } catch (e) {
    throw new CompareInputError(`${f}: unreadable JSON (${(e as Error).message})`);
  }
}

/**
 * The key component of directory `name` (in `parent`): a KV dump rank<g>/ of an older wavebus
 * becomes the seed's dp*_tp*_pp*_cp* from its dump.json identity, so old and new dumps pair up.
 */
function keyName(parent: string, name: string): string {
  if (!/^rank\d+$/.test(name)) return name;
  try {
    const id = dumpIdentity(path.join(parent, name));
    return id ? kvRankDirName({ dpRank: id.dp_rank as number, tpRank: id.tp_rank as number, ppRank: id.pp_rank as number, cpRank: id.cp_rank as number }) : name;
  } catch {
    return name; // no readable identity with coordinates: keyed as it is named
  }
}

/** Every tensor under `input` (a file or a directory tree), keyed for pairing. */
export function loadCapture(input: string): LoadedTensor[] {
  if (!fs.existsSync(input)) throw new CompareInputError(`${input}: no such file or directory`);
  const st = fs.statSync(input);
  if (st.isFile()) return loadTensorFile(input, '', dtypeHints(path.dirname(input)).get(path.basename(input)));
  const out: LoadedTensor[] = [];
  const walk = (dir: string, keyRel: string) => {
    const hints = dtypeHints(dir);
    for (const n of fs.readdirSync(dir).sort()) {
      if (n.startsWith('.')) continue; // temp names of an unfinished writer
      const p = path.join(dir, n);
      const format = tensorFileOf(n);
      if (fs.statSync(p).isDirectory()) walk(p, keyRel ? `${keyRel}/${keyName(dir, n)}` : keyName(dir, n));
      else if (format) {
        const stem = n.slice(0, -format.extension.length);
        out.push(...loadTensorFile(p, keyRel ? `${keyRel}/${stem}` : stem, hints.get(n)));
      }
    }
  };
  walk(input, '');
  return out;
}

/** Concatenate row-major tensors along `dim` (shapes equal except at dim). */
export function concatAlong(parts: { shape: number[]; data: Buffer; dtype: DType }[], dim: number, what: string): { shape: number[]; data: Buffer } {
  const first = parts[0];
  const rank = first.shape.length;
  if (dim < 0 || dim >= rank) throw new CompareInputError(`${what}: cannot join along dim ${dim} of a rank-${rank} tensor`);
  for (const p of parts) {
    if (p.dtype !== first.dtype) throw new CompareInputError(`${what}: shards have dtypes ${first.dtype} and ${p.dtype}`);
    if (p.shape.length !== rank || p.shape.some((d, i) => i !== dim && d !== first.shape[i])) {
      throw new CompareInputError(`${what}: shard shapes [${first.shape}] and [${p.shape}] differ outside dim ${dim}`);
    }
  }
  const outer = numel(first.shape.slice(0, dim));
  const innerBytes = numel(first.shape.slice(dim + 1)) * itemSize(first.dtype);
  const shape = [...first.shape];
  shape[dim] = parts.reduce((n, p) => n + p.shape[dim], 0);
  const data = Buffer.allocUnsafe(numel(shape) * itemSize(first.dtype));
  let o = 0;
  for (let i = 0; i < outer; i++) {
    for (const p of parts) {
      const span = p.shape[dim] * innerBytes;
      p.data.copy(data, o, i * span, (i + 1) * span);
      o += span;
    }
  }
  return { shape, data };
}

interface Shard {
  dir: string;
  tpRank: number;
  group: string;
}

/**
 * The KV dump rank dirs under `input` (a wave dir, or a tree holding some), grouped by everything
 * but tp_rank: the seed's "shards from the tp* directories under the same req_id". Each dir's name
 * (dp*_tp*_pp*_cp*, or rank<g> of an older dump) must agree with its dump.json identity.
 */
function findShards(input: string): Map<string, Shard[]> {
  const groups = new Map<string, Shard[]>();
  const walk = (dir: string) => {
    const names = fs.readdirSync(dir);
    const id = names.includes('dump.json') ? (dumpIdentity(dir) as any) : undefined;
    if (id) {
      if (!Number.isInteger(id.tp_rank)) throw new CompareInputError(`${path.join(dir, 'dump.json')}: identity.tp_rank is missing`);
      const where = `${path.dirname(dir)}: KV dump directory`;
      checkKvDirIdentity(readKvRankDirName(path.basename(dir), where), id, where);
      // Shards of one tensor: same wave dir, same PP/DP/CP coordinates.
      const waveRel = path.relative(input, path.dirname(dir)).split(path.sep).join('/');
      const coords = `pp${id.pp_rank ?? 0}.dp${id.dp_rank ?? 0}.cp${id.cp_rank ?? 0}`;
      const group = `${waveRel}|${coords}`;
      if (!groups.has(group)) groups.set(group, []);
      groups.get(group)!.push({ dir, tpRank: id.tp_rank, group });
      return;
    }
    for (const n of names.sort()) {
      const p = path.join(dir, n);
      if (!n.startsWith('.') && fs.statSync(p).isDirectory()) walk(p);
    }
  };
  walk(input);
  return groups;
}

/**
 * Load a KV dump capture with its TP shards joined along the head dimension (dim 2). Keys are
 * `<wave dir>/<layer file stem>.<k|v>`, without the rank dir, so a TP=4 and a TP=2 dump pair up.
 */
export function loadAssembled(input: string): LoadedTensor[] {
  if (!fs.existsSync(input) || !fs.statSync(input).isDirectory()) throw new CompareInputError(`${input}: --assemble-tp needs a KV dump wave directory (with dp<d>_tp<t>_pp<p>_cp<c>/dump.json)`);
  const groups = findShards(input);
  if (groups.size === 0) throw new CompareInputError(`${input}: no dp<d>_tp<t>_pp<p>_cp<c>/dump.json (or rank<g>/dump.json of an older dump) under it; --assemble-tp joins KV dump shards`);
  const multi = new Set([...groups.keys()].map((g) => g.split('|')[1])).size > 1;
  const out: LoadedTensor[] = [];
  for (const [group, shards] of groups) {
    shards.sort((a, b) => a.tpRank - b.tpRank);
    const seen = shards.map((s) => s.tpRank);
    if (new Set(seen).size !== seen.length || seen.some((r, i) => r !== i)) {
      throw new CompareInputError(`${input}: TP shards of ${group.replace('|', ' ')} have tp_rank ${JSON.stringify(seen)}; need 0..${seen.length - 1} once each (a rank is missing?)`);
    }
    const [waveRel, coords] = group.split('|');
    const prefix = [waveRel, multi ? coords : ''].filter(Boolean).join('/');
    const perShard = shards.map((s) => new Map(loadCapture(s.dir).map((t) => [t.key, t])));
    for (const key of perShard[0].keys()) {
      const parts = perShard.map((m, i) => {
        const t = m.get(key);
        if (!t) throw new CompareInputError(`${shards[i].dir}: has no tensor ${key} (tp_rank 0 has it)`);
        return t;
      });
      const what = `${prefix ? `${prefix}/` : ''}${key}`;
      if (parts[0].shape.length !== 4) throw new CompareInputError(`${parts[0].file}: ${key} has shape [${parts[0].shape}]; KV shards are [n_blocks, block_size, num_kv_heads, head_dim]`);
      const joined = concatAlong(parts, 2, what);
      out.push({ key: what, file: shards.map((s) => s.dir).join(' + '), dtype: parts[0].dtype, shape: joined.shape, data: joined.data, tpRanks: seen });
    }
  }
  return out;
}
