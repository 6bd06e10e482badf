// A region the engine registers (KV pool layer or input buffer): its checks and its wire form.
import { ConfigError } from '../errors';
import { enumValues } from '../proto';
import { RegionKind, RegionRole } from './protocol';

const TOKEN_IDS = enumValues('TokenIds');

export interface ClientRegion {
  name: string;
  kind?: 'shm' | 'cuda';
  shmName?: string;
  offset?: number;
  nbytes: number;
  cudaIpcHandle?: Buffer;
  device?: number;
  dtype: string;
  shape: number[];
  role: 'kv_pool' | 'input';
  layer?: string;
  kv?: 'k' | 'v';
  /** Input regions: whether it holds token ids (docs/recorder.md "Sensitive data"); unset: the name "input_ids" decides. */
  tokenIds?: boolean;
  /** KV pool: bytes from one block's start to the next's, for a pool whose blocks are not back to back (proto Region.block_stride). */
  blockStride?: number;
}

/** The wire form of a registered region (proto Region). */
export function regionMessage(r: ClientRegion): Record<string, unknown> {
  return {
    name: r.name,
    kind: r.kind === 'cuda' ? RegionKind.CUDA : RegionKind.SHM,
    shmName: r.shmName ?? '',
    offset: r.offset ?? 0,
    nbytes: r.nbytes,
    cudaIpcHandle: r.cudaIpcHandle ?? Buffer.alloc(0),
    device: r.device ?? 0,
    dtype: r.dtype,
    shape: r.shape,
    role: r.role === 'input' ? RegionRole.INPUT : RegionRole.KV_POOL,
    layer: r.layer ?? '',
    kv: r.kv ?? '',
    tokenIds: r.tokenIds === undefined ? TOKEN_IDS.TOKEN_IDS_BY_NAME : r.tokenIds ? TOKEN_IDS.TOKEN_IDS_YES : TOKEN_IDS.TOKEN_IDS_NO,
    blockStride: r.blockStride ?? 0,
  };
}

export function validateRegion(r: ClientRegion): void {
  if (!r.name || typeof r.name !== 'string') throw new ConfigError('register(): region.name must be a non-empty string');
  const kind = r.kind ?? 'shm';
  if (kind !== 'shm' && kind !== 'cuda') throw new ConfigError(`register(): region.kind '${String(kind)}' must be 'shm' or 'cuda'`);
  if (kind === 'shm' && !r.shmName) throw new ConfigError(`register(): region '${r.name}' of kind shm needs shmName`);
  if (kind === 'cuda' && (!r.cudaIpcHandle || r.cudaIpcHandle.length !== 64)) {
    throw new ConfigError(`register(): region '${r.name}' of kind cuda needs a 64-byte cudaIpcHandle`);
  }
  if (!Number.isSafeInteger(r.nbytes) || r.nbytes < 0) throw new ConfigError(`register(): region '${r.name}'.nbytes ${r.nbytes} is not a non-negative integer`);
  if (r.offset !== undefined && (!Number.isSafeInteger(r.offset) || r.offset < 0)) {
    throw new ConfigError(`register(): region '${r.name}'.offset ${r.offset} is not a non-negative integer`);
  }
  r.shape.forEach((d, i) => {
    if (!Number.isSafeInteger(d) || d < 0) throw new ConfigError(`register(): region '${r.name}'.shape[${i}] = ${d} is not a non-negative integer`);
  });
  if (r.role !== 'kv_pool' && r.role !== 'input') throw new ConfigError(`register(): region '${r.name}'.role '${String(r.role)}' must be 'kv_pool' or 'input'`);
  if (r.tokenIds !== undefined && (typeof r.tokenIds !== 'boolean' || r.role !== 'input')) throw new ConfigError(`register(): region '${r.name}'.tokenIds must be a boolean, and only on an input region`);
  if (r.role === 'kv_pool') {
    if (!r.layer) throw new ConfigError(`register(): KV region '${r.name}' needs layer`);
    if (r.kv !== 'k' && r.kv !== 'v') throw new ConfigError(`register(): KV region '${r.name}'.kv must be 'k' or 'v'`);
    if (r.shape.length !== 4) throw new ConfigError(`register(): KV region '${r.name}'.shape must be [num_blocks, block_size, num_kv_heads, head_dim]`);
  }
  if (r.blockStride !== undefined && (!Number.isSafeInteger(r.blockStride) || r.blockStride < 0 || r.role !== 'kv_pool')) {
    throw new ConfigError(`register(): region '${r.name}'.blockStride must be a non-negative integer, and only on a kv_pool region`);
  }
}
