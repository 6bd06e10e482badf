// meta.json of one captured call: the identity tag that makes a positional tensor vector
// answerable (which graph, which rank, which forward, why it was selected), plus the per-input
// dtype/shape a replay needs to reinterpret raw bytes, and the size/checksum of every file.
// Written last (the bundle is complete only once it exists); sorted keys, indent 2.
import { isTensorFormat, TENSOR_FORMATS, tensorFileExtension } from '../artifacts/tensor-format';
import { parseArtifactJson } from '../artifacts/json-file';
import { CaptureError } from '../errors';
import type { RankIdentity } from '../layout';
import type { ForwardContext } from '../messages';
import type { SnapshotFormat } from './config';
import type { SelectionMatch, SelectionReason } from './selector';

export const META_FILE = 'meta.json';
export const META_SCHEMA = 1;

export interface MetaInput {
  index: number;
  dtype: string;
  shape: number[];
}

export interface MetaFile {
  name: string;
  bytes: number;
  checksum: string;
}

/** The part of a rank's identity a snapshot records (the path holds only the global rank). */
export type SnapshotRank = Pick<RankIdentity, 'globalRank' | 'tpRank' | 'ppRank' | 'dpRank' | 'cpRank'>;

export interface CallMeta {
  schema: number;
  hash: string;
  format: SnapshotFormat;
  global_rank: number;
  tp_rank: number;
  pp_rank: number;
  dp_rank: number;
  cp_rank: number;
  call_index: number;
  selected_by: SelectionReason[];
  inputs: MetaInput[];
  global_step: number;
  is_prompt: boolean;
  req_ids: string[];
  positions: number[];
  row_request: number[];
  num_speculative_tokens: number;
  matches: SelectionMatch[];
  /** Written by wavebus; absent in the seed's layout (then sizes and checksums cannot be checked). */
  files?: MetaFile[];
  /**
   * Flight recorder bundles (docs/recorder.md "Sensitive data"): inputs whose file was not written
   * (token ids with save_sensitive_info false), and inputs written as keyed hashes of token ids.
   */
  withheld?: { index: number; name: string; reason: string }[];
  hashed?: { index: number; name: string; from_dtype: string; alg: string; key_id: string; key_source: string }[];
}

/** The indices of the inputs meta.json says were withheld (no file). */
export function withheldIndices(meta: Pick<CallMeta, 'withheld'>): Set<number> {
  return new Set((meta.withheld ?? []).map((w) => w.index));
}

/** The file name of input i in a call dir. */
export function tensorFileName(index: number, format: SnapshotFormat): string {
  return `tensor${index}${tensorFileExtension(format)}`;
}

function fail(file: string, what: string): never {
  throw new CaptureError(`${file}: ${what}`, 'ERR_SNAPSHOT_META');
}

function need<T>(file: string, o: Record<string, unknown>, key: string, ok: (v: unknown) => boolean, kind: string): T {
  if (!(key in o)) fail(file, `missing field "${key}"`);
  if (!ok(o[key])) fail(file, `field "${key}" must be ${kind}, got ${JSON.stringify(o[key])}`);
  return o[key] as T;
}

const isNat = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
const isInt = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v);
const isStr = (v: unknown) => typeof v === 'string';
const isArr = (ok: (x: unknown) => boolean) => (v: unknown) => Array.isArray(v) && v.every(ok);
const isObj = (v: unknown) => v !== null && typeof v === 'object' && !Array.isArray(v);

/** Parse and check meta.json text; every problem names the file and the field. */
export function parseMeta(text: string, file = META_FILE): CallMeta {
  let raw: unknown;
  try {
    raw = parseArtifactJson(text);
  } catch (e) {
    fail(file, `not valid JSON (${(e as Error).message})`);
  }
  if (!isObj(raw)) fail(file, 'the top level must be an object');
  const o = raw as Record<string, unknown>;
  const schema = need<number>(file, o, 'schema', isInt, 'an integer');
  if (schema !== META_SCHEMA) fail(file, `schema ${schema} is not supported (this wavebus reads schema ${META_SCHEMA})`);
  const format = need<SnapshotFormat>(file, o, 'format', isTensorFormat, `one of ${TENSOR_FORMATS.join(', ')}`);
  const inputs = need<MetaInput[]>(file, o, 'inputs', isArr(isObj), 'a list of objects');
  inputs.forEach((inp, i) => {
    const r = inp as unknown as Record<string, unknown>;
    need(file, r, 'index', (v) => v === i, `${i} (inputs are listed in order)`);
    need(file, r, 'dtype', isStr, 'a string');
    need(file, r, 'shape', isArr(isNat), 'a list of non-negative integers');
  });
  // Optional: the seed's meta.json has no files list.
  const files = 'files' in o ? need<MetaFile[]>(file, o, 'files', isArr(isObj), 'a list of objects') : [];
  for (const f of files) {
    const r = f as unknown as Record<string, unknown>;
    need(file, r, 'name', isStr, 'a string');
    need(file, r, 'bytes', isNat, 'a non-negative integer');
    need(file, r, 'checksum', isStr, 'a string');
  }
  if ('withheld' in o) {
    for (const w of need<Record<string, unknown>[]>(file, o, 'withheld', isArr(isObj), 'a list of objects')) {
      need(file, w, 'index', (v) => isNat(v) && (v as number) < inputs.length, `an input index below ${inputs.length}`);
      need(file, w, 'reason', isStr, 'a string');
    }
  }
  need(file, o, 'hash', isStr, 'a string');
  for (const k of ['global_rank', 'tp_rank', 'call_index']) need(file, o, k, isNat, 'a non-negative integer');
  // Optional so that meta.json from the seed's layout (no pp/cp rank) still loads.
  for (const k of ['pp_rank', 'dp_rank', 'cp_rank', 'num_speculative_tokens']) if (k in o) need(file, o, k, isNat, 'a non-negative integer');
  need(file, o, 'selected_by', isArr(isStr), 'a list of strings');
  return o as unknown as CallMeta;
}

/** Everything meta.json says about one captured call, assembled in one place. */
export function buildCallMeta(a: {
  hash: string;
  format: SnapshotFormat;
  rank: SnapshotRank;
  callIndex: number;
  selectedBy: SelectionReason[];
  inputs: MetaInput[];
  ctx: ForwardContext;
  matches: SelectionMatch[];
  files: MetaFile[];
}): CallMeta {
  return {
    schema: META_SCHEMA,
    hash: a.hash,
    format: a.format,
    global_rank: a.rank.globalRank,
    tp_rank: a.rank.tpRank,
    pp_rank: a.rank.ppRank,
    dp_rank: a.rank.dpRank,
    cp_rank: a.rank.cpRank,
    call_index: a.callIndex,
    selected_by: [...a.selectedBy],
    inputs: a.inputs.map((i) => ({ index: i.index, dtype: i.dtype, shape: [...i.shape] })),
    global_step: a.ctx.globalStep,
    is_prompt: a.ctx.isPrompt,
    req_ids: [...a.ctx.reqIds],
    positions: [...a.ctx.positions],
    row_request: [...a.ctx.rowRequest],
    num_speculative_tokens: a.ctx.numSpeculativeTokens,
    matches: a.matches.map((m) => ({ ...m })),
    files: a.files.map((f) => ({ ...f })),
  };
}
