// What the flight recorder's bundles keep of the token ids among a forward's inputs
// (docs/recorder.md "Sensitive data"), as report.save_sensitive_info says at flush time: true, the
// bytes as recorded; false, nothing (the input is named as withheld in meta.json); "hashed", each
// id replaced by its keyed hash (token-hash.ts, the key the reports use), so two flushes of the
// same tokens hold the same values and the file alone does not give the tokens away. Which input
// holds token ids is the engine's word at registration (proto TokenIds), else its name (regions.ts).
import { itemSize, type DType } from '../artifacts/dtype';
import type { SensitiveInfo } from '../guard/recorder-config';
import { TokenHasher } from '../guard/token-hash';
import { holdsTokenIds } from './regions';

/** The dtype a hashed token-id tensor is written in: each element the 64-bit hash, two's complement. */
export const HASHED_TOKEN_DTYPE: DType = 'int64';

export interface FlushPrivacy {
  /** report.save_sensitive_info in force when the flush is written. */
  sensitive: SensitiveInfo;
  /** Whether input region `region` holds token ids (the agent's RegionTable.tokenIds). */
  tokenIds: (region: string) => boolean;
  /** The key for "hashed" (asked for only when a flush needs it). */
  hasher: () => TokenHasher;
}

/** Without an agent's word: nothing sensitive kept, token ids known by name only. */
export const DEFAULT_FLUSH_PRIVACY: FlushPrivacy = {
  sensitive: false,
  tokenIds: (region) => holdsTokenIds(region, undefined),
  hasher: (() => {
    let h: TokenHasher | undefined;
    return () => (h ??= TokenHasher.ephemeral());
  })(),
};

export interface WithheldInput {
  index: number;
  name: string;
  reason: string;
}

export interface HashedInput {
  index: number;
  name: string;
  /** The dtype the engine recorded (the file holds HASHED_TOKEN_DTYPE). */
  from_dtype: string;
  alg: string;
  key_id: string;
  key_source: string;
}

/** One input as the bundle keeps it: as recorded, hashed (new bytes and dtype), or withheld. */
export type KeptInput = { keep: 'raw' } | { keep: 'hashed'; dtype: DType; data: Buffer; note: HashedInput } | { keep: 'withheld'; note: WithheldInput };

const INT_READERS: Partial<Record<DType, (b: Buffer, off: number) => number | bigint>> = {
  int64: (b, o) => b.readBigInt64LE(o),
  uint64: (b, o) => b.readBigUInt64LE(o),
  int32: (b, o) => b.readInt32LE(o),
  uint32: (b, o) => b.readUInt32LE(o),
  int16: (b, o) => b.readInt16LE(o),
  uint16: (b, o) => b.readUInt16LE(o),
  int8: (b, o) => b.readInt8(o),
  uint8: (b, o) => b.readUInt8(o),
};

/**
 * Hash every id of `data` (`dtype`, little-endian) with `hasher`: the id's low 32 bits, as
 * TokenHasher.hash takes it (vocabularies fit), so a value here equals the hash a report with the
 * same key gives the same id. Undefined when `dtype` holds no integers.
 */
export function hashTokenIds(data: Buffer, dtype: DType, hasher: TokenHasher): Buffer | undefined {
  const read = INT_READERS[dtype];
  if (!read) return undefined;
  const size = itemSize(dtype);
  const n = Math.floor(data.length / size);
  const out = Buffer.alloc(n * 8);
  // A forward repeats few distinct ids (padding, a shared prompt): each is hashed once.
  const seen = new Map<number, bigint>();
  for (let i = 0; i < n; i++) {
    const v = read(data, i * size);
    const id = typeof v === 'bigint' ? Number(BigInt.asUintN(32, v)) : v >>> 0;
    let h = seen.get(id);
    if (h === undefined) {
      h = BigInt.asIntN(64, BigInt(`0x${hasher.hash(id)}`));
      seen.set(id, h);
    }
    out.writeBigInt64LE(h, i * 8);
  }
  return out;
}

/** What the bundle keeps of input `index` (region `name`, `dtype`, its recorded bytes `data`). */
export function keepInput(index: number, name: string, dtype: DType, data: Buffer, p: FlushPrivacy): KeptInput {
  if (p.sensitive === true || !p.tokenIds(name)) return { keep: 'raw' };
  if (p.sensitive === false) return { keep: 'withheld', note: { index, name, reason: 'save_sensitive_info is false' } };
  const hasher = p.hasher();
  const hashed = hashTokenIds(data, dtype, hasher);
  if (!hashed) return { keep: 'withheld', note: { index, name, reason: `save_sensitive_info is "hashed" and token ids in ${dtype} cannot be hashed (not integers)` } };
  return { keep: 'hashed', dtype: HASHED_TOKEN_DTYPE, data: hashed, note: { index, name, from_dtype: dtype, ...hasher.scheme } };
}
