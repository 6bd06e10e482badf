// The device regions one engine client registered with its agent: KV pool layers and input buffers.
import { ConfigError } from '../errors';
import { parseDType, itemSize, type DType } from '../artifacts/dtype';
import { cudaAvailable, DeviceRegion } from '../memory';
import { RegionKind, RegionRole } from '../client/protocol';
import { enumValues } from '../proto';

const TOKEN_IDS = enumValues('TokenIds');
/** The input every engine we know names its token ids (vLLM's model runner, examples/torch-engine). */
export const TOKEN_IDS_REGION_NAME = 'input_ids';

/**
 * Whether input region `name` holds token ids: as its registration said (proto TokenIds), else by
 * its name (TOKEN_IDS_BY_NAME, or a region this agent never saw registered).
 */
export function holdsTokenIds(name: string, said: number | undefined): boolean {
  if (said === TOKEN_IDS.TOKEN_IDS_YES) return true;
  if (said === TOKEN_IDS.TOKEN_IDS_NO) return false;
  return name === TOKEN_IDS_REGION_NAME;
}

export interface RegisteredRegion {
  name: string;
  role: 'kv_pool' | 'input';
  dtype: DType;
  shape: number[];
  layer: string;
  kv: 'k' | 'v' | '';
  nbytes: number;
  /** KV pool: bytes from one block's start to the next's (block_stride; the block's own size when 0). */
  blockStride: number;
  region: DeviceRegion;
}

/** What a decoded wavebus.Region carries (camelCase, as decode() returns it). */
export interface RegionMessage {
  name: string;
  kind: number;
  shmName: string;
  offset: number;
  nbytes: number;
  cudaIpcHandle: Buffer;
  device: number;
  dtype: string;
  shape: number[];
  role: number;
  layer: string;
  kv: string;
  /** proto TokenIds; absent from older clients (then: by name). */
  tokenIds?: number;
  /** Weight: the last shard of one register_weights call. */
  lastWeight?: boolean;
  /** KV pool: bytes between blocks' starts (0 or absent: back to back). */
  blockStride?: number;
}

export class RegionTable {
  private readonly byName = new Map<string, RegisteredRegion>();
  /**
   * Input regions this agent's memory backend cannot read (a CUDA region where no CUDA runtime
   * loads), with why: capturing from them is the seed's stated no-op, not an error.
   */
  private readonly unreadableInputs = new Map<string, string>();
  /** What each input region's registration said of token ids (unreadable ones too: the recorder's ring still holds them). */
  private readonly tokenIdsSaid = new Map<string, number>();

  /** cudaStagingBytes: each CUDA region's pinned bounce chunk (memory.ts default when absent). */
  constructor(private readonly cudaStagingBytes?: number) {}

  /** Validates the message, maps the memory, and records the region; null: an input region this backend cannot read (see unreadable). */
  register(msg: RegionMessage): RegisteredRegion | null {
    if (!msg.name) throw new ConfigError('region.name is empty');
    const known = this.byName.get(msg.name);
    if (known) {
      // A client that says hello again (after an agent restart, or a feature change) re-sends its
      // regions: the same description is accepted as is; a different one under the same name is not.
      const same = known.dtype === parseDType(msg.dtype, `region '${msg.name}'.dtype`) && known.nbytes === msg.nbytes && known.blockStride === Number(msg.blockStride ?? 0) && known.shape.join(',') === msg.shape.map(Number).join(',') && known.layer === msg.layer;
      if (same) return known;
      throw new ConfigError(`region.name '${msg.name}' is already registered with a different description`);
    }
    const dtype = parseDType(msg.dtype, `region '${msg.name}'.dtype`);
    const role = msg.role === RegionRole.INPUT ? 'input' : 'kv_pool';
    const numel = msg.shape.reduce((a, b) => a * b, 1);
    const stride = Number(msg.blockStride ?? 0);
    const blockBytes = msg.shape.length === 4 ? numel / Math.max(1, Number(msg.shape[0])) * itemSize(dtype) : 0;
    if (stride !== 0 && role !== 'kv_pool') throw new ConfigError(`region '${msg.name}'.block_stride is only for kv_pool regions`);
    if (stride !== 0 && stride < blockBytes) throw new ConfigError(`region '${msg.name}'.block_stride ${stride} is below one block (${blockBytes} bytes)`);
    // Strided: the last block needs only its own bytes after (num_blocks - 1) strides.
    const want = stride !== 0 && Number(msg.shape[0]) > 0 ? (Number(msg.shape[0]) - 1) * stride + blockBytes : numel * itemSize(dtype);
    if (want > msg.nbytes) {
      throw new ConfigError(`region '${msg.name}': shape [${msg.shape.join(', ')}] of ${dtype} needs ${want} bytes but region.nbytes is ${msg.nbytes}`);
    }
    if (role === 'kv_pool') {
      if (msg.shape.length !== 4) throw new ConfigError(`region '${msg.name}'.shape must be [num_blocks, block_size, num_kv_heads, head_dim]`);
      if (msg.kv !== 'k' && msg.kv !== 'v') throw new ConfigError(`region '${msg.name}'.kv must be 'k' or 'v', got '${msg.kv}'`);
      if (!msg.layer) throw new ConfigError(`region '${msg.name}'.layer is empty`);
    }
    if (role === 'input') {
      const said = Number(msg.tokenIds ?? TOKEN_IDS.TOKEN_IDS_BY_NAME);
      if (!Object.values(TOKEN_IDS).includes(said)) throw new ConfigError(`region '${msg.name}'.token_ids: unknown TokenIds ${said}`);
      this.tokenIdsSaid.set(msg.name, said);
    }
    if (msg.kind === RegionKind.CUDA && role === 'input') {
      const cuda = cudaAvailable();
      if (!cuda.available) {
        this.unreadableInputs.set(msg.name, `CUDA region '${msg.name}' cannot be read: no CUDA runtime can be loaded here (${cuda.reason})`);
        return null;
      }
    }
    const region = DeviceRegion.open(
      msg.kind === RegionKind.CUDA
        ? { kind: 'cuda', cudaIpcHandle: msg.cudaIpcHandle, device: msg.device, offset: msg.offset, nbytes: msg.nbytes }
        : { kind: 'shm', shmName: msg.shmName, offset: msg.offset, nbytes: msg.nbytes },
      { field: `region '${msg.name}'`, stagingBytes: this.cudaStagingBytes },
    );
    const r: RegisteredRegion = {
      name: msg.name,
      role,
      dtype,
      shape: msg.shape.map(Number),
      layer: msg.layer,
      kv: role === 'kv_pool' ? (msg.kv as 'k' | 'v') : '',
      nbytes: msg.nbytes,
      blockStride: stride,
      region,
    };
    this.byName.set(r.name, r);
    return r;
  }

  get(name: string): RegisteredRegion | undefined {
    return this.byName.get(name);
  }

  /** Whether input region `name` holds token ids (holdsTokenIds). */
  tokenIds(name: string): boolean {
    return holdsTokenIds(name, this.tokenIdsSaid.get(name));
  }

  /** Why input region `name` cannot be read here, or undefined when it can (or is unknown). */
  unreadable(name: string): string | undefined {
    return this.unreadableInputs.get(name);
  }

  /** KV pool layers in registration order, each with its K and V region. */
  kvLayers(): { layer: string; k?: RegisteredRegion; v?: RegisteredRegion }[] {
    const layers = new Map<string, { layer: string; k?: RegisteredRegion; v?: RegisteredRegion }>();
    for (const r of this.byName.values()) {
      if (r.role !== 'kv_pool') continue;
      const entry = layers.get(r.layer) ?? { layer: r.layer };
      entry[r.kv as 'k' | 'v'] = r;
      layers.set(r.layer, entry);
    }
    return [...layers.values()];
  }

  closeAll(): void {
    for (const r of this.byName.values()) {
      try {
        r.region.close();
      } catch {
        /* already closed */
      }
    }
    this.byName.clear();
    this.unreadableInputs.clear();
    this.tokenIdsSaid.clear();
  }
}
