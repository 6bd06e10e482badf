// `wavebus aggregate`'s direct fetch (docs/aggregate.md): with CURVE, chunks come straight from
// each rank's own file socket (src/agent/direct-files.ts), one CURVE hop, instead of through the
// coordinator (two hops, the coordinator decrypting and re-encrypting every byte). The tool asks
// the coordinator, over its authenticated channel, where each rank serves and with which server
// key; a rank whose socket does not answer within a short bound is fetched through the relay,
// and the manifest says so. Nothing a reply says is trusted beyond its shape: the endpoint must be
// a tcp address and the key a CURVE key, and the handshake proves the agent holds that key.
import { Dealer } from 'zeromq';
import { DEFAULT_MAX_FRAME_BYTES } from '../bus/constants';
import { clientSocketOptions, isZ85Key, type CurveClientKeys } from '../bus/curve';
import { decodeAgentMessage, DropCounter, encodeCoordinatorMessage, type AgentMsg } from '../bus/frames';
import { payloadOf, withPayload } from '../bus/payload';
import { AggregateError } from '../errors';
import { type RelayClient } from '../bus/relay-client';
import { receiveLoop } from '../bus/receive-loop';
import { RequestMap } from '../bus/request-map';
import { SendQueue } from '../bus/send-queue';
import type { ChunkRequest, ChunkSource, Planned } from './aggregate-fetch';
import { connectTo } from '../client/connect';

/** How long a rank's file socket has to be named and to answer a first (empty) chunk before the relay is used. */
export const DEFAULT_DIRECT_TIMEOUT_MS = 3000;
/** Buffer acknowledgements carried by one request (the agent keeps at most 32 MiB of buffers anyway). */
const MAX_ACKS = 4096;

const ENDPOINT_RE = /^tcp:\/\/(\[[0-9A-Fa-f:.]+\]|[0-9]{1,3}(?:\.[0-9]{1,3}){3}):([0-9]{1,5})$/;

/** The endpoint and key of a FileServeReply, checked; or why it is not usable. */
export function checkFileServeReply(r: Record<string, any>): { endpoint: string; serverKey: string; ipv6: boolean } | { reason: string } {
  if (r.error) return { reason: String(r.error) };
  const endpoint = String(r.endpoint ?? '');
  const m = ENDPOINT_RE.exec(endpoint);
  if (!m || Number(m[2]) < 1 || Number(m[2]) > 65535) return { reason: `the agent named no usable endpoint (${JSON.stringify(endpoint.slice(0, 80))})` };
  const serverKey = String(r.serverKey ?? '');
  if (!isZ85Key(serverKey)) return { reason: 'the agent named no valid CURVE server key' };
  return { endpoint, serverKey, ipv6: m[1].startsWith('[') };
}

/** A DEALER on one rank's file socket: CoordinatorMessage{fileChunk} out, AgentMessage{fileChunk} [+ bytes] back. */
export class DirectClient implements ChunkSource {
  private readonly dealer: Dealer;
  private readonly pending: RequestMap<AgentMsg>;
  private readonly sends: SendQueue;
  private readonly loop: Promise<void>;
  private closed = false;
  private handshakeFailure?: string;
  /** Ids of chunk answers received whole since the last request: the agent may reuse their buffers. */
  private acks: number[] = [];
  readonly drops = new DropCounter(undefined, 'aggregate direct DEALER');

  constructor(
    readonly rank: number,
    readonly endpoint: string,
    serverKey: string,
    keys: CurveClientKeys,
    ipv6: boolean,
    private readonly maxFrameBytes = DEFAULT_MAX_FRAME_BYTES,
  ) {
    this.pending = new RequestMap<AgentMsg>((_id, _m, timeoutMs) =>
      new AggregateError(`rank ${rank}'s file socket ${endpoint} did not answer within ${timeoutMs} ms${this.handshakeFailure ? `: ${this.handshakeFailure}` : ''}`, 'ERR_TIMEOUT'),
    );
    this.dealer = new Dealer({ linger: 0, maxMessageSize: 2 * maxFrameBytes, ...(ipv6 ? { ipv6: true } : {}), ...clientSocketOptions({ ...keys, serverPublicKey: serverKey }) });
    const failed = (why: string) => {
      if (this.handshakeFailure) return;
      this.handshakeFailure = why;
      this.pending.rejectAll(() => new AggregateError(`rank ${rank}'s file socket ${endpoint}: ${why}`, 'ERR_HANDSHAKE'));
    };
    this.dealer.events.on('handshake:error:protocol', () => failed('the CURVE handshake failed (the agent does not hold the key the coordinator named)'));
    this.dealer.events.on('handshake:error:auth', () => failed("the agent refused this tool's CURVE key (not on the coordinator's allow-list)"));
    this.sends = new SendQueue(this.dealer, () => undefined);
    connectTo(this.dealer, endpoint);
    this.loop = this.receive();
  }

  private receive(): Promise<void> {
    return receiveLoop(
      this.dealer,
      {
        role: 'aggregate direct DEALER',
        what: 'a file socket reply',
        running: () => !this.closed,
        // What waits fails now (the tool falls back to the relay for this rank), not at its timeout.
        onError: (e) => this.pending.rejectAll(() => new AggregateError(`rank ${this.rank}'s file socket ${this.endpoint}: failed to handle a reply: ${String((e as Error)?.message ?? e)}`, 'ERR_DIRECT')),
      },
      (parts) => this.onReply(parts),
    );
  }

  /** [AgentMessage] or [AgentMessage carrying a chunk, the chunk's data]. */
  private onReply(parts: Buffer[]): void {
    if (parts.length !== 1 && parts.length !== 2) return this.drops.drop('frame_count', `${parts.length} frames from rank ${this.rank}'s file socket`);
    const d = decodeAgentMessage(parts[0], this.maxFrameBytes);
    if (!d.ok) return this.drops.drop(d.reason, d.detail);
    if (parts.length === 2 && this.pending.has(d.value.requestId) && this.acks.length < MAX_ACKS) this.acks.push(d.value.requestId);
    this.pending.resolve(d.value.requestId, parts.length === 2 ? withPayload(d.value, parts[1]) : d.value);
  }

  async fileChunk(rank: number, req: ChunkRequest, timeoutMs: number): Promise<Record<string, any>> {
    if (rank !== this.rank) throw new AggregateError(`rank ${this.rank}'s file socket was asked for rank ${rank}'s file`);
    if (this.closed) throw new AggregateError('direct client is closed');
    if (this.handshakeFailure) throw new AggregateError(`rank ${rank}'s file socket ${this.endpoint}: ${this.handshakeFailure}`, 'ERR_HANDSHAKE');
    const { id, reply } = this.pending.open(timeoutMs, undefined);
    const received = this.acks;
    this.acks = [];
    this.sends.push(encodeCoordinatorMessage({ requestId: id, fileChunk: { ...req, received } }), (e) =>
      this.pending.reject(id, new AggregateError(`cannot send to ${this.endpoint}: ${String((e as Error)?.message ?? e)}`, 'ERR_DIRECT')),
    );
    const m = await reply;
    if (m.body !== 'fileChunk') throw new AggregateError(`rank ${rank}'s file socket answered ${m.body} to a chunk request`, 'ERR_DIRECT');
    const inner = m.fileChunk as Record<string, any>;
    if (inner.error) throw new AggregateError(`rank ${rank}: ${inner.error}`, 'ERR_AGENT');
    const data = payloadOf(m);
    return data ? withPayload(inner, data) : inner;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.pending.rejectAll(() => new AggregateError('direct client closed'));
    // Closed first: a send still waiting for a peer (a refused handshake never gives one) ends
    // with the socket, so the queue settles; waiting for it first would never return.
    this.dealer.close();
    await this.sends.idle();
    await this.loop;
  }
}

/** How a rank's chunks travel, for the manifest. */
export interface RankTransport {
  transport: 'direct' | 'relay';
  /** Why the relay is used although direct fetch was asked for (or why direct fetch stopped). */
  direct_error?: string;
  endpoint?: string;
}

/**
 * One rank's chunk source: its file socket while that works, the relay after it fails (a timeout,
 * a refused handshake: the transport, never an agent's answer such as a missing file).
 */
export class RankSource implements ChunkSource {
  constructor(
    private direct: DirectClient | undefined,
    private readonly relay: RelayClient,
    readonly state: RankTransport,
  ) {}

  async fileChunk(rank: number, req: ChunkRequest, timeoutMs: number): Promise<Record<string, any>> {
    const d = this.direct;
    if (d) {
      try {
        return await d.fileChunk(rank, req, timeoutMs);
      } catch (e) {
        const code = (e as AggregateError).code;
        if (code !== 'ERR_TIMEOUT' && code !== 'ERR_HANDSHAKE' && code !== 'ERR_DIRECT') throw e;
        if (this.direct === d) {
          this.direct = undefined;
          this.state.transport = 'relay';
          this.state.direct_error = `switched to the relay: ${(e as Error).message}`;
          void d.close();
        }
      }
    }
    return this.relay.fileChunk(rank, req, timeoutMs);
  }

  async close(): Promise<void> {
    await this.direct?.close();
  }
}

/**
 * Ask the coordinator where `rank` serves its files, connect, and send one empty chunk request
 * for `probe` (a file it listed): a RankSource on the file socket when that answers within
 * `timeoutMs`, else on the relay with the reason.
 */
export async function openRankSource(relay: RelayClient, rank: number, keys: CurveClientKeys, probe: ChunkRequest, timeoutMs: number): Promise<RankSource> {
  let reply: Record<string, any>;
  try {
    reply = await relay.fileServe(rank, timeoutMs);
  } catch (e) {
    return new RankSource(undefined, relay, { transport: 'relay', direct_error: (e as Error).message });
  }
  const c = checkFileServeReply(reply);
  if ('reason' in c) return new RankSource(undefined, relay, { transport: 'relay', direct_error: c.reason });
  const client = new DirectClient(rank, c.endpoint, c.serverKey, keys, c.ipv6);
  try {
    await client.fileChunk(rank, { ...probe, offset: 0, length: 0 }, timeoutMs);
  } catch (e) {
    // The agent answered (its file may have gone since the listing): the socket works.
    if ((e as AggregateError).code !== 'ERR_AGENT') {
      await client.close();
      return new RankSource(undefined, relay, { transport: 'relay', direct_error: (e as Error).message, endpoint: c.endpoint });
    }
  }
  return new RankSource(client, relay, { transport: 'direct', endpoint: c.endpoint });
}

/** The plan ordered so that consecutive files come from different ranks (their first listers): ranks served directly stream side by side. */
export function interleaveByRank(plan: Planned[]): Planned[] {
  const byRank = new Map<number, Planned[]>();
  for (const f of plan) byRank.set(f.listedBy[0], [...(byRank.get(f.listedBy[0]) ?? []), f]);
  const queues = [...byRank.values()];
  const out: Planned[] = [];
  for (let i = 0; out.length < plan.length; i++) for (const q of queues) if (i < q.length) out.push(q[i]);
  return out;
}
