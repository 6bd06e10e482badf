// Loading a probe tree for `wavebus bisect`: every rank<g>/call<N>/ bundle that wavebus_client.probe
// wrote (snapshot layout, checked by the replay loader: sizes, checksums, dtypes, shapes), its
// records (module, call, io, split), and each module's shards grouped across ranks. Shards of a
// column/row split module are joined with the --assemble-tp concatenation (concatAlong) in tp_rank
// order; replicated ones keep every rank's copy. Modules of different PP stages come from different
// ranks: matching is by name, so a stage boundary compares like any other module.
import * as fs from 'fs';
import * as path from 'path';
import { isDType, type DType } from '../artifacts/dtype';
import { loadCallDir } from '../snapshot/loader';
import { META_FILE } from '../snapshot/meta';
import { concatAlong } from './assemble';
import { CompareInputError } from '../errors';
import { readArtifactJson } from '../artifacts/json-file';

export type SplitKind = 'column' | 'row' | 'replicated';

export interface ProbeShard {
  globalRank: number;
  tpRank: number;
  ppRank: number;
  dtype: DType;
  shape: number[];
  data: Buffer;
}

/** One module call's recorded tensor, with its shards from every TP rank. */
export interface ProbeModule {
  /** Pairing key: `<module>#<call>` for output 0, plus `:out<k>` / `:in<k>` for other outputs and inputs. */
  key: string;
  module: string;
  call: number;
  io: 'output' | 'input';
  arg: number;
  split: SplitKind;
  splitDim: number | null;
  dtype: DType;
  /** tp_rank order. */
  shards: ProbeShard[];
  /** Execution order in this tree: (pp_rank, record index). */
  order: [number, number];
}

export interface ProbeTree {
  root: string;
  callIndex: number;
  tpSize: number;
  ppSize: number;
  ranks: number[];
  modules: ProbeModule[];
}

interface RawRecord {
  index: number;
  module: string;
  call: number;
  io: 'output' | 'input';
  arg: number;
  split: SplitKind;
  split_dim: number | null;
}

const isNat = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

/** The probe bundle dirs under root (meta.json with a "probe" section), by call index. */
function findBundles(root: string): Map<number, string[]> {
  if (!fs.existsSync(root) || !fs.statSync(root).isDirectory()) throw new CompareInputError(`${root}: not a directory (a probe tree: rank<g>/call<N>/ from replay.py --probe)`);
  const out = new Map<number, string[]>();
  const walk = (dir: string, depth: number) => {
    const names = fs.readdirSync(dir).sort();
    if (names.includes(META_FILE)) {
      const file = path.join(dir, META_FILE);
      let doc: Record<string, unknown>;
      try {
        doc = readArtifactJson(file) as Record<string, unknown>;
      } catch (e) {
        throw new CompareInputError(`${file}: unreadable JSON (${(e as Error).message})`);
      }
      if (doc && typeof doc === 'object' && 'probe' in doc) {
        if (!isNat(doc.call_index)) throw new CompareInputError(`${file}: call_index must be an integer >= 0`);
        out.set(doc.call_index, [...(out.get(doc.call_index) ?? []), dir]);
      }
      return;
    }
    if (depth > 8) return;
    for (const n of names) {
      const p = path.join(dir, n);
      // Dot names are an unfinished writer's temp dirs; links are not followed.
      if (!n.startsWith('.') && fs.lstatSync(p).isDirectory()) walk(p, depth + 1);
    }
  };
  walk(root, 0);
  return out;
}

function checkRecords(file: string, probe: unknown, n: number): { tpSize: number; ppSize: number; records: RawRecord[] } {
  const bad = (what: string) => new CompareInputError(`${file}: probe.${what}`);
  const p = probe as Record<string, unknown>;
  if (!p || typeof p !== 'object') throw bad('must be an object');
  if (!isNat(p.tp_size) || p.tp_size < 1) throw bad('tp_size must be an integer >= 1');
  if (!isNat(p.pp_size) || p.pp_size < 1) throw bad('pp_size must be an integer >= 1');
  if (!Array.isArray(p.records) || p.records.length !== n) throw bad(`records must be a list of ${n} (one per input of meta.json)`);
  p.records.forEach((r: Record<string, unknown>, i: number) => {
    const where = `records[${i}]`;
    if (!r || typeof r !== 'object' || r.index !== i) throw bad(`${where}.index must be ${i}`);
    if (typeof r.module !== 'string' || r.module === '') throw bad(`${where}.module must be a non-empty string`);
    if (!isNat(r.call) || !isNat(r.arg)) throw bad(`${where}: call and arg must be integers >= 0`);
    if (r.io !== 'output' && r.io !== 'input') throw bad(`${where}.io must be output or input, got ${JSON.stringify(r.io)}`);
    if (r.split !== 'column' && r.split !== 'row' && r.split !== 'replicated') throw bad(`${where}.split must be column, row or replicated, got ${JSON.stringify(r.split)}`);
    if (r.split === 'replicated' ? r.split_dim !== null : !isNat(r.split_dim)) throw bad(`${where}.split_dim must be null for replicated, else an integer >= 0`);
  });
  return { tpSize: p.tp_size, ppSize: p.pp_size, records: p.records as RawRecord[] };
}

/**
 * The tp ranks below `size` not in `present` (each below `size`), as text: the first 8, then how
 * many more. `size` comes from a file, so it is never enumerated (a tp_size of 10^9 once exhausted
 * the heap): the scan ends within the present ranks and 8 more.
 */
function absentRanks(size: number, present: Iterable<number>): string {
  const have = new Set(present);
  const first: number[] = [];
  for (let i = 0; i < size && first.length < 8; i++) if (!have.has(i)) first.push(i);
  const more = size - have.size - first.length;
  return more > 0 ? `${first.join(', ')} and ${more} more` : first.join(', ');
}

export const moduleKey = (r: Pick<RawRecord, 'module' | 'call' | 'io' | 'arg'>): string =>
  `${r.module}#${r.call}${r.io === 'input' ? `:in${r.arg}` : r.arg > 0 ? `:out${r.arg}` : ''}`;

/** Load probe tree `root` (`which` names it in errors: A or B); `call` picks a call when it holds several. */
export async function loadProbeTree(root: string, which: string, call?: number): Promise<ProbeTree> {
  const calls = findBundles(root);
  if (calls.size === 0) throw new CompareInputError(`${which} ${root}: no probe bundle under it (rank<g>/call<N>/meta.json with a "probe" section; record one with replay.py --probe)`);
  let callIndex: number;
  if (call !== undefined) {
    if (!calls.has(call)) throw new CompareInputError(`${which} ${root}: no probe bundle of call ${call} (it holds call ${[...calls.keys()].join(', ')})`);
    callIndex = call;
  } else if (calls.size > 1) {
    throw new CompareInputError(`${which} ${root}: holds probe bundles of calls ${[...calls.keys()].sort((x, y) => x - y).join(', ')}; pick one with --call`);
  } else callIndex = [...calls.keys()][0];

  const byKey = new Map<string, ProbeModule>();
  const stages = new Map<number, Set<number>>(); // pp_rank -> tp_ranks present
  let tpSize = 0;
  let ppSize = 0;
  const ranks: number[] = [];
  for (const dir of calls.get(callIndex)!) {
    const { meta, tensors } = await loadCallDir(dir);
    const file = path.join(dir, META_FILE);
    const { tpSize: tp, ppSize: pp, records } = checkRecords(file, (meta as unknown as { probe: unknown }).probe, meta.inputs.length);
    if ((tpSize && tp !== tpSize) || (ppSize && pp !== ppSize)) throw new CompareInputError(`${file}: tp_size ${tp} / pp_size ${pp}, but other ranks of ${which} say ${tpSize} / ${ppSize}`);
    tpSize = tp;
    ppSize = pp;
    const tpRank = meta.tp_rank;
    const ppRank = meta.pp_rank ?? 0;
    if (tpRank >= tp || ppRank >= pp) throw new CompareInputError(`${file}: tp_rank ${tpRank} / pp_rank ${ppRank} outside tp_size ${tp} / pp_size ${pp}`);
    const seen = stages.get(ppRank) ?? new Set<number>();
    if (seen.has(tpRank)) throw new CompareInputError(`${which} ${root}: two bundles of call ${callIndex} for tp_rank ${tpRank}, pp_rank ${ppRank} (one DP/CP replica per tree), the second ${dir}`);
    stages.set(ppRank, seen.add(tpRank));
    ranks.push(meta.global_rank);
    for (const r of records) {
      const t = tensors[r.index];
      if (!isDType(t.dtype)) throw new CompareInputError(`${file}: inputs[${r.index}]: unknown dtype`);
      if (r.split_dim !== null && r.split_dim >= t.shape.length) throw new CompareInputError(`${file}: records[${r.index}].split_dim ${r.split_dim} outside shape [${t.shape}]`);
      const key = moduleKey(r);
      let m = byKey.get(key);
      if (!m) {
        m = { key, module: r.module, call: r.call, io: r.io, arg: r.arg, split: r.split, splitDim: r.split_dim, dtype: t.dtype, shards: [], order: [ppRank, r.index] };
        byKey.set(key, m);
      } else if (m.split !== r.split || m.splitDim !== r.split_dim) {
        throw new CompareInputError(`${file}: ${key} is split ${r.split} (dim ${r.split_dim}) here, ${m.split} (dim ${m.splitDim}) on another rank`);
      }
      if (m.shards.some((s) => s.tpRank === tpRank)) throw new CompareInputError(`${file}: ${key} recorded twice for tp_rank ${tpRank} (two PP stages ran the same module?)`);
      m.shards.push({ globalRank: meta.global_rank, tpRank, ppRank, dtype: t.dtype, shape: t.shape, data: t.data });
      if (tpRank === 0) m.order = [ppRank, r.index];
    }
  }
  for (let p = 0; p < ppSize; p++) {
    const have = stages.get(p) ?? new Set<number>();
    const missing = absentRanks(tpSize, have);
    if (missing) throw new CompareInputError(`${which} ${root}: call ${callIndex}, pp_rank ${p}: no bundle for tp_rank ${missing} of tp_size ${tpSize} (a rank is missing)`);
  }
  const modules = [...byKey.values()];
  for (const m of modules) {
    m.shards.sort((x, y) => x.tpRank - y.tpRank);
    if (m.shards.length !== tpSize) {
      const lacking = absentRanks(tpSize, m.shards.map((s) => s.tpRank));
      throw new CompareInputError(`${which} ${root}: ${m.key} was recorded by tp_rank ${m.shards.map((s) => s.tpRank).join(', ')} but not by tp_rank ${lacking}`);
    }
    if (m.shards.some((s) => s.dtype !== m.dtype)) throw new CompareInputError(`${which} ${root}: ${m.key}: shards have dtypes ${[...new Set(m.shards.map((s) => s.dtype))].join(', ')}`);
  }
  modules.sort((x, y) => x.order[0] - y.order[0] || x.order[1] - y.order[1]);
  return { root, callIndex, tpSize, ppSize, ranks: ranks.sort((x, y) => x - y), modules };
}

/** The whole tensor of a split module (its shards joined as --assemble-tp joins KV shards), with each shard's extent along the split dim. */
export function assembleModule(m: ProbeModule, which: string): { shape: number[]; data: Buffer; bounds: number[] } {
  if (m.split === 'replicated' || m.shards.length === 1) return { shape: m.shards[0].shape, data: m.shards[0].data, bounds: [] };
  const dim = m.splitDim!;
  const joined = concatAlong(m.shards, dim, `${which} ${m.key}`);
  const bounds: number[] = [];
  let end = 0;
  for (const s of m.shards) bounds.push((end += s.shape[dim]));
  return { ...joined, bounds };
}
