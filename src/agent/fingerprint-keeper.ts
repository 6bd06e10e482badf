// This rank's fingerprint in the agent: what its client said in the hello, plus a crc32c per weight
// shard the engine registered (register_weights), which the agent reads itself through the native
// copy path, once, off the step. Sent to the coordinator through the bus (AgentBus.setFingerprint).
import { ConfigError } from '../errors';
import { parseDType, itemSize } from '../artifacts/dtype';
import { crc32c, formatChecksum } from '../artifacts/checksum';
import { DeviceRegion, Staging, DEFAULT_CUDA_STAGING_BYTES } from '../memory';
import { RegionKind } from '../client/protocol';
import { LIMITS, sanitizeFingerprint, type Fingerprint, type WeightChecksum } from '../guard/fingerprint';
import type { RegionMessage } from './regions';


/**
 * How long after a weight shard with no shard queued behind it the fingerprint goes out anyway,
 * when no shard said it was its call's last (a client that died mid-call, an older client).
 * Sending on every shard would send the whole list once per shard: bytes growing with the square
 * of the shard count.
 */
export const WEIGHTS_SETTLE_MS = 1000;

export class FingerprintKeeper {
  private client: Fingerprint | null = null;
  private settle?: NodeJS.Timeout;
  private readonly weights = new Map<string, WeightChecksum>();
  private staging: Staging | null = null;
  /** Weight shards are read one at a time (one staging buffer); the fingerprint goes out when none is left queued. */
  private queue: Promise<unknown> = Promise.resolve();
  private queued = 0;

  constructor(
    private readonly publish: (fp: Record<string, unknown>) => void,
    private readonly stagingBytes = DEFAULT_CUDA_STAGING_BYTES,
  ) {}

  /** The client's hello: its fingerprint (cut to local limits), sent at once. */
  hello(raw: unknown): void {
    this.client = sanitizeFingerprint(raw);
    this.client.weights = []; // only the agent says what the weights are
    this.send();
  }

  /** What the coordinator gets: the client's part and the weights checksummed so far; null before a hello. */
  current(): Record<string, unknown> | null {
    if (!this.client) return null;
    return { ...this.client, weights: [...this.weights.values()] };
  }

  /**
   * A weight shard (Region, role WEIGHT): read it whole, checksum it, let it go. The fingerprint
   * goes to the coordinator once per register_weights call: before the answer to the shard that
   * says it is the call's last (an engine whose call returned has its checksums on their way), or
   * WEIGHTS_SETTLE_MS after the last shard when none said so.
   */
  addWeight(msg: RegionMessage): Promise<Record<string, unknown>> {
    this.queued++;
    clearTimeout(this.settle);
    this.settle = undefined;
    const run = this.queue.then(() => this.checksum(msg));
    this.queue = run.catch(() => undefined);
    return run.finally(() => {
      if (--this.queued > 0) return;
      if (msg.lastWeight) {
        this.send();
        return;
      }
      this.settle = setTimeout(() => {
        this.settle = undefined;
        this.send();
      }, WEIGHTS_SETTLE_MS);
      this.settle.unref();
    });
  }

  private async checksum(msg: RegionMessage): Promise<Record<string, unknown>> {
    const field = `weight '${String(msg.name).slice(0, 80)}'`;
    if (!msg.name || msg.name.length > LIMITS.weightName) throw new ConfigError(`${field}: region.name must be 1..${LIMITS.weightName} characters`);
    if (!this.weights.has(msg.name) && this.weights.size >= LIMITS.weights) throw new ConfigError(`${field}: more than ${LIMITS.weights} weight shards`);
    const dtype = parseDType(msg.dtype, `${field}.dtype`);
    const want = msg.shape.reduce((a, b) => a * Number(b), 1) * itemSize(dtype);
    if (want !== Number(msg.nbytes)) throw new ConfigError(`${field}: shape [${msg.shape.join(', ')}] of ${dtype} is ${want} bytes but region.nbytes is ${msg.nbytes}`);
    const region = DeviceRegion.open(
      msg.kind === RegionKind.CUDA
        ? { kind: 'cuda', cudaIpcHandle: msg.cudaIpcHandle, device: msg.device, offset: Number(msg.offset), nbytes: Number(msg.nbytes) }
        : { kind: 'shm', shmName: msg.shmName, offset: Number(msg.offset), nbytes: Number(msg.nbytes) },
      { field, stagingBytes: this.stagingBytes },
    );
    try {
      let crc = 0;
      if (region.nbytes > 0) {
        this.staging ??= new Staging(this.stagingBytes);
        for await (const chunk of this.staging.stream(region)) crc = crc32c(chunk, crc);
      }
      const sum = { name: msg.name, checksum: formatChecksum(crc), bytes: region.nbytes, dtype };
      this.weights.set(msg.name, sum);
      return {};
    } finally {
      region.close();
    }
  }

  /** The staging buffer; a fingerprint still settling goes out now. */
  close(): void {
    if (this.settle) {
      clearTimeout(this.settle);
      this.settle = undefined;
      this.send();
    }
    this.staging = null;
  }

  private send(): void {
    const fp = this.current();
    if (fp) this.publish(fp);
  }
}
