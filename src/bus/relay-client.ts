// The relay client of `wavebus aggregate`: a DEALER on the coordinator's ROUTER that sends
// RelayRequests and correlates the replies by request id. A chunk's data frame comes back as its
// own frame, attached to the reply (payload.ts).
import { Dealer } from 'zeromq';
import { DEFAULT_MAX_FRAME_BYTES } from './constants';
import { socketIpOptions, tcpEndpoint, type HostPort } from './endpoints';
import { DropCounter, decodeCoordinatorMessage, encodeAgentMessage, type CoordinatorMsg } from './frames';
import { payloadOf, withPayload } from './payload';
import { WavebusError } from '../errors';
import type { BusToken } from './auth';

export class AggregateError extends WavebusError {
  constructor(message: string, code = 'ERR_AGGREGATE') {
    super(code, message);
  }
}

/** A DEALER on the coordinator's ROUTER; requests correlated by request id. */
export class RelayClient {
  private readonly dealer: Dealer;
  private readonly pending = new Map<number, { resolve: (m: CoordinatorMsg) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }>();
  private nextId = 1;
  private sendQueue: Array<{ buf: Buffer; failed: (e: unknown) => void }> = [];
  private sending: Promise<void> | undefined;
  private loop: Promise<void>;
  private closed = false;
  readonly endpoint: string;
  /** What came from the coordinator and was not a well-formed reply, by reason. */
  private readonly drops = new DropCounter(undefined, 'aggregate DEALER');

  constructor(
    coordinator: HostPort,
    private readonly maxFrameBytes = DEFAULT_MAX_FRAME_BYTES,
    /** The job's bus token (bus/auth.ts): requests carry its MAC; replies without it are dropped. */
    private readonly token?: BusToken,
  ) {
    this.endpoint = tcpEndpoint(coordinator.host, coordinator.port + 1);
    this.dealer = new Dealer({ linger: 0, maxMessageSize: 2 * maxFrameBytes, ...socketIpOptions(coordinator.host) });
    this.dealer.connect(this.endpoint);
    this.loop = this.receive();
  }

  private async receive(): Promise<void> {
    while (!this.dealer.closed) {
      let parts: Buffer[];
      try {
        parts = await this.dealer.receive();
      } catch {
        if (this.dealer.closed || this.closed) break;
        continue;
      }
      // [CoordinatorMessage] or [CoordinatorMessage carrying a chunk, the chunk's data].
      if (parts.length !== 1 && parts.length !== 2) {
        this.drops.drop('frame_count', `${parts.length} frames from the coordinator`);
        continue;
      }
      const d = decodeCoordinatorMessage(parts[0], this.maxFrameBytes, this.token, parts[1]);
      if (!d.ok) {
        this.drops.drop(d.reason, d.detail);
        continue;
      }
      const p = this.pending.get(d.value.requestId);
      if (!p) continue; // a heartbeat, or an answer that came after its timeout
      this.pending.delete(d.value.requestId);
      clearTimeout(p.timer);
      p.resolve(parts.length === 2 ? withPayload(d.value, parts[1]) : d.value);
    }
  }

  /** Send an AgentMessage body (`{ status: {} }`, `{ relay: {...} }`) and resolve with the reply. */
  request(body: Record<string, unknown>, timeoutMs: number): Promise<CoordinatorMsg> {
    if (this.closed) return Promise.reject(new AggregateError('relay client is closed'));
    const requestId = this.nextId++;
    const msg = encodeAgentMessage({ requestId, ...body });
    const buf = this.token ? this.token.seal('to-coordinator', msg) : msg;
    return new Promise<CoordinatorMsg>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(requestId);
        reject(new AggregateError(`no answer from the coordinator at ${this.endpoint} within ${timeoutMs} ms`, 'ERR_TIMEOUT'));
      }, timeoutMs);
      this.pending.set(requestId, { resolve, reject, timer });
      this.sendQueue.push({
        buf,
        failed: (e) => {
          const p = this.pending.get(requestId);
          if (!p) return;
          this.pending.delete(requestId);
          clearTimeout(p.timer);
          p.reject(new AggregateError(`cannot send to ${this.endpoint}: ${String((e as Error)?.message ?? e)}`));
        },
      });
      if (!this.sending) this.sending = this.drainSends();
    });
  }

  // zeromq allows one send in flight per socket. The first send happens right here, not a tick
  // later: a request issued before a chunk is written is on its way while the write runs.
  private async drainSends(): Promise<void> {
    try {
      while (this.sendQueue.length > 0) {
        const { buf, failed } = this.sendQueue.shift()!;
        try {
          await this.dealer.send(buf);
        } catch (e) {
          failed(e);
        }
      }
    } finally {
      this.sending = undefined;
    }
  }

  get dropped(): Record<string, number> {
    return this.drops.counts;
  }

  /**
   * Relay a fileList / fileChunk request to `rank`; throws on a relay or agent error. A chunk's
   * data frame, when the reply has one, is attached to the result (payloadOf).
   */
  async relay(rank: number, kind: 'fileList' | 'fileChunk', req: Record<string, unknown>, timeoutMs: number): Promise<Record<string, any>> {
    const m = await this.request({ relay: { rank, [kind]: req, timeoutMs } }, timeoutMs + 5000);
    if (m.body !== 'relay') throw new AggregateError(`coordinator answered ${m.body} to a relay request`);
    const r = m.relay as Record<string, any>;
    if (r.error) throw new AggregateError(r.error, 'ERR_RELAY');
    if (r.reply !== kind) throw new AggregateError(`rank ${rank}: relay reply carries ${r.reply ?? 'nothing'}, expected ${kind}`);
    const inner = r[kind] as Record<string, any>;
    if (inner.error) throw new AggregateError(`rank ${rank}: ${inner.error}`, 'ERR_AGENT');
    const data = payloadOf(m);
    return data ? withPayload(inner, data) : inner;
  }

  async status(timeoutMs: number): Promise<{ liveRanks: number[]; expectedRanks: number[] }> {
    const m = await this.request({ status: {} }, timeoutMs);
    if (m.body !== 'status') throw new AggregateError(`coordinator answered ${m.body} to a status request`);
    return { liveRanks: (m.status.liveRanks ?? []).map(Number), expectedRanks: (m.status.expectedRanks ?? []).map(Number) };
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const [, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new AggregateError('relay client closed'));
    }
    this.pending.clear();
    await this.sending;
    this.dealer.close();
    await this.loop;
  }
}

