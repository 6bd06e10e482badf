// registerWeights(name -> shard): the agent adds a crc32c per weight shard to this rank's
// fingerprint (docs/fingerprints.md), reading the bytes itself through the native copy path, off
// the step; the Python client's register_weights does the same. A shard already in shared memory
// (a shm segment, a CUDA IPC allocation) is read in place; host bytes are copied once into a shm
// segment that is unlinked as soon as the agent has answered (its mapping outlives the name).
import { ConfigError, WavebusError } from '../errors';
import { parseDType, itemSize } from '../artifacts/dtype';
import { ShmSegment } from '../memory';
import { RegionKind, RegionRole } from './protocol';

/** Host bytes of one shard: copied into a shm segment for the agent to read. */
export interface HostWeight {
  data: Uint8Array;
  dtype: string;
  shape: number[];
}

/** A shard already in memory the agent can open: read in place. */
export interface SharedWeight {
  kind?: 'shm' | 'cuda';
  shmName?: string;
  cudaIpcHandle?: Buffer;
  device?: number;
  offset?: number;
  nbytes: number;
  dtype: string;
  shape: number[];
}

export type WeightShard = HostWeight | SharedWeight;

let seq = 0;

/** The shard's Region message (role WEIGHT) and, for host bytes, the segment to release after. */
function weightRegion(name: string, w: WeightShard): { msg: Record<string, unknown>; seg?: ShmSegment } {
  const where = `registerWeights(): weight '${name}'`;
  if (!name) throw new ConfigError('registerWeights(): a weight name must be a non-empty string');
  if (typeof w !== 'object' || w === null) throw new ConfigError(`${where} must be { data, dtype, shape } or a shared region`);
  const dtype = parseDType(w.dtype, `${where}.dtype`);
  if (!Array.isArray(w.shape) || w.shape.some((d) => !Number.isSafeInteger(d) || d < 0)) throw new ConfigError(`${where}.shape must be a list of non-negative integers`);
  const nbytes = w.shape.reduce((a, b) => a * b, 1) * itemSize(dtype);
  const base = { name, dtype, shape: w.shape, role: RegionRole.WEIGHT, nbytes };
  if ('data' in w) {
    if (!(w.data instanceof Uint8Array)) throw new ConfigError(`${where}.data must be a Buffer or Uint8Array`);
    if (w.data.length !== nbytes) throw new ConfigError(`${where}: shape [${w.shape.join(', ')}] of ${dtype} is ${nbytes} bytes but data holds ${w.data.length}`);
    const seg = ShmSegment.create(`/wavebus-w${process.pid}-${++seq}`, Math.max(1, nbytes));
    seg.buffer().set(w.data);
    return { msg: { ...base, kind: RegionKind.SHM, shmName: seg.name, offset: 0 }, seg };
  }
  if (w.nbytes !== nbytes) throw new ConfigError(`${where}: shape [${w.shape.join(', ')}] of ${dtype} is ${nbytes} bytes but nbytes is ${w.nbytes}`);
  if (w.kind === 'cuda') {
    if (!w.cudaIpcHandle || w.cudaIpcHandle.length !== 64) throw new ConfigError(`${where}: a cuda weight needs a 64-byte cudaIpcHandle`);
    return { msg: { ...base, kind: RegionKind.CUDA, cudaIpcHandle: w.cudaIpcHandle, device: w.device ?? 0, offset: w.offset ?? 0 } };
  }
  if (!w.shmName) throw new ConfigError(`${where}: a shared weight needs shmName (or kind 'cuda'), host bytes need data`);
  return { msg: { ...base, kind: RegionKind.SHM, shmName: w.shmName, offset: w.offset ?? 0 } };
}

/** What registerWeights needs of its client. */
export interface WeightsDeps {
  enabled: () => boolean;
  unavailable: () => boolean;
  hello: () => Promise<unknown>;
  /** The answer; undefined when the agent did not answer within the bound (it is then marked unavailable). */
  request: (body: Record<string, unknown>) => Promise<Record<string, any> | undefined>;
  endpoint: string;
}

/** Sends every shard, one answer at a time (the agent reads one at a time); how many it took. */
export async function sendWeights(d: WeightsDeps, weights: Record<string, WeightShard>): Promise<number> {
  if (typeof weights !== 'object' || weights === null) throw new ConfigError('registerWeights(): expected an object name -> shard');
  const items = Object.entries(weights);
  if (!d.enabled()) return 0;
  const gone = (why: string): WavebusError => new WavebusError('ERR_AGENT_UNAVAILABLE', `registerWeights(): the agent at ${d.endpoint} ${why}`);
  if (d.unavailable()) throw gone('is not answering');
  await d.hello();
  let sent = 0;
  for (const [i, [name, w]] of items.entries()) {
    const { msg, seg } = weightRegion(name, w);
    // The last shard: the agent sends the fingerprint once, before answering it.
    msg.lastWeight = i === items.length - 1;
    let reply: Record<string, any> | undefined;
    try {
      reply = await d.request({ register: msg });
    } finally {
      if (seg) {
        seg.close();
        ShmSegment.unlink(seg.name); // the agent mapped it while answering
      }
    }
    if (!reply) throw gone(`did not answer (weight '${name}')`);
    if (!reply.ok) throw new WavebusError(reply.errorCode || 'ERR_AGENT', `registerWeights(): the agent refused weight '${name}': ${reply.error}`);
    sent++;
  }
  return sent;
}
