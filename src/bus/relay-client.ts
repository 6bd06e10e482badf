// The relay client of `wavebus aggregate`: a DEALER on the coordinator's ROUTER that sends
// RelayRequests and correlates the replies by request id. A chunk's data frame comes back as its
// own frame, attached to the reply (payload.ts).
import { Dealer } from 'zeromq';
import { DEFAULT_MAX_FRAME_BYTES } from './constants';
import { socketIpOptions, tcpEndpoint, type HostPort } from './endpoints';
import { DropCounter, decodeCoordinatorMessage, encodeAgentMessage, type CoordinatorMsg } from './frames';
import { payloadOf, withPayload } from './payload';
import { AggregateError } from '../errors';
import type { BusToken } from './auth';
import { clientSocketOptions, type CurveClientKeys } from './curve';
import { receiveLoop } from './receive-loop';
import { RequestMap } from './request-map';
import { SendQueue } from './send-queue';
import { PROTOCOL_VERSION, versionMismatch } from './protocol-version';
import type { WorldLayout } from '../layout';
import { readLayoutJson } from '../paths';
import { connectTo } from '../client/connect';

/** A DEALER on the coordinator's ROUTER; requests correlated by request id. */
export class RelayClient {
  private readonly dealer: Dealer;
  private readonly pending: RequestMap<CoordinatorMsg>;
  private readonly sends: SendQueue;
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
    /** CURVE client keys, for a coordinator that runs with CURVE (docs/security.md). */
    private readonly curve?: CurveClientKeys,
  ) {
    this.endpoint = tcpEndpoint(coordinator.host, coordinator.port + 1);
    this.pending = new RequestMap<CoordinatorMsg>((_id, _m, timeoutMs) => new AggregateError(`no answer from the coordinator at ${this.endpoint} within ${timeoutMs} ms${this.handshakeHint()}`, 'ERR_TIMEOUT'));
    this.dealer = new Dealer({ linger: 0, maxMessageSize: 2 * maxFrameBytes, ...socketIpOptions(coordinator.host), ...clientSocketOptions(curve) });
    this.sends = new SendQueue(this.dealer, () => undefined);
    this.watchHandshakes();
    connectTo(this.dealer, this.endpoint);
    this.loop = this.receive();
  }

  private handshakeFailure?: string;

  /**
   * A coordinator with CURVE never answers a peer without keys (or with a key it does not
   * admit): the handshake fails and requests would only time out. Say why instead.
   */
  private watchHandshakes(): void {
    const failed = (why: string) => {
      if (this.handshakeFailure) return;
      this.handshakeFailure = why;
      this.pending.rejectAll(() => new AggregateError(`${this.endpoint}: ${why}`, 'ERR_HANDSHAKE'));
    };
    this.dealer.events.on('handshake:error:protocol', () =>
      failed(this.curve
        ? 'the CURVE handshake failed (is the server key coordinator.pub the one this coordinator runs with?)'
        : 'the coordinator refused a plain-text connection: it runs with CURVE, and this tool has no CURVE keys (pass --curve-dir DIR with coordinator.pub and agent.key, or --curve-server-key FILE --curve-key FILE)'),
    );
    this.dealer.events.on('handshake:error:auth', () =>
      failed('the coordinator refused this tool\'s CURVE key (its public key is not on the coordinator\'s allow-list)'),
    );
  }

  private handshakeHint(): string {
    if (this.handshakeFailure) return `: ${this.handshakeFailure}`;
    return this.curve ? '' : ' (if it runs with CURVE, pass --curve-dir DIR, or --curve-server-key FILE --curve-key FILE)';
  }

  private receive(): Promise<void> {
    return receiveLoop(
      this.dealer,
      {
        role: 'aggregate DEALER',
        what: 'a coordinator reply',
        running: () => !this.closed,
        // No logger in a tool's client: what waits fails now, naming why, not at its timeout.
        onError: (e) => this.pending.rejectAll(() => new AggregateError(`${this.endpoint}: failed to handle a coordinator reply: ${String((e as Error)?.message ?? e)}`, 'ERR_RELAY')),
      },
      (parts) => this.onReply(parts),
    );
  }

  /** [CoordinatorMessage] or [CoordinatorMessage carrying a chunk, the chunk's data]. */
  private onReply(parts: Buffer[]): void {
    if (parts.length !== 1 && parts.length !== 2) return this.drops.drop('frame_count', `${parts.length} frames from the coordinator`);
    const d = decodeCoordinatorMessage(parts[0], this.maxFrameBytes, this.token, parts[1]);
    if (!d.ok) return this.drops.drop(d.reason, d.detail);
    // Nothing waiting on it: a heartbeat, or an answer that came after its timeout.
    this.pending.resolve(d.value.requestId, parts.length === 2 ? withPayload(d.value, parts[1]) : d.value);
  }

  /** Send an AgentMessage body (`{ status: {} }`, `{ relay: {...} }`) and resolve with the reply. */
  request(body: Record<string, unknown>, timeoutMs: number): Promise<CoordinatorMsg> {
    if (this.closed) return Promise.reject(new AggregateError('relay client is closed'));
    if (this.handshakeFailure) return Promise.reject(new AggregateError(`${this.endpoint}: ${this.handshakeFailure}`, 'ERR_HANDSHAKE'));
    const { id, reply } = this.pending.open(timeoutMs, undefined);
    const msg = encodeAgentMessage({ requestId: id, ...body });
    this.sends.push(this.token ? this.token.seal('to-coordinator', msg) : msg, (e) =>
      this.pending.reject(id, new AggregateError(`cannot send to ${this.endpoint}: ${String((e as Error)?.message ?? e)}`)),
    );
    return reply;
  }

  get dropped(): Record<string, number> {
    return this.drops.counts;
  }

  /**
   * Relay a fileList / fileChunk / fileServe request to `rank`; throws on a relay or agent error. A chunk's
   * data frame, when the reply has one, is attached to the result (payloadOf).
   */
  async relay(rank: number, kind: 'fileList' | 'fileChunk' | 'fileServe', req: Record<string, unknown>, timeoutMs: number): Promise<Record<string, any>> {
    const m = this.checkVersion(await this.request({ relay: { rank, [kind]: req, timeoutMs, protocolVersion: PROTOCOL_VERSION } }, timeoutMs + 5000));
    if (m.body !== 'relay') throw new AggregateError(`coordinator answered ${m.body} to a relay request`);
    const r = m.relay as Record<string, any>;
    if (r.error) throw new AggregateError(r.error, 'ERR_RELAY');
    if (r.reply !== kind) throw new AggregateError(`rank ${rank}: relay reply carries ${r.reply ?? 'nothing'}, expected ${kind}`);
    const inner = r[kind] as Record<string, any>;
    if (inner.error) throw new AggregateError(`rank ${rank}: ${inner.error}`, 'ERR_AGENT');
    const data = payloadOf(m);
    return data ? withPayload(inner, data) : inner;
  }

  /** A chunk of `rank`'s file through the coordinator (a ChunkSource of aggregate-fetch.ts). */
  fileChunk(rank: number, req: Record<string, unknown>, timeoutMs: number): Promise<Record<string, any>> {
    return this.relay(rank, 'fileChunk', req, timeoutMs);
  }

  /** Ask `rank` to serve its files directly (FileServeRequest; the coordinator fills the allow-list). */
  fileServe(rank: number, timeoutMs: number): Promise<Record<string, any>> {
    return this.relay(rank, 'fileServe', {}, timeoutMs);
  }

  /** `layout`: the job's, from the status JSON; undefined when it carries none or a malformed one. */
  async status(timeoutMs: number): Promise<{ liveRanks: number[]; expectedRanks: number[]; layout?: WorldLayout }> {
    const m = this.checkVersion(await this.request({ status: { protocolVersion: PROTOCOL_VERSION } }, timeoutMs));
    if (m.body !== 'status') throw new AggregateError(`coordinator answered ${m.body} to a status request`);
    let layout: WorldLayout | undefined;
    try {
      const r = readLayoutJson(JSON.parse(String(m.status.statusJson ?? '{}')).layout);
      if ('layout' in r) layout = r.layout;
    } catch {
      /* unparseable status JSON: no layout, only rank<g> dirs are told apart */
    }
    return { liveRanks: (m.status.liveRanks ?? []).map(Number), expectedRanks: (m.status.expectedRanks ?? []).map(Number), layout };
  }

  /** A coordinator of another protocol version refuses (or, when older, answers without one): say so. */
  private checkVersion(m: CoordinatorMsg): CoordinatorMsg {
    if (m.body === 'refused') throw new AggregateError(`${this.endpoint}: ${m.refused.error}`, 'ERR_PROTOCOL_VERSION');
    const reply = m.body === 'relay' ? m.relay : m.body === 'status' ? m.status : undefined;
    const v = Number(reply?.protocolVersion ?? 0);
    if (reply && v !== PROTOCOL_VERSION) throw new AggregateError(`${this.endpoint}: ${versionMismatch('coordinator', v, 'aggregate tool', PROTOCOL_VERSION)}`, 'ERR_PROTOCOL_VERSION');
    return m;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.pending.rejectAll(() => new AggregateError('relay client closed'));
    // Closed first: a send still waiting for a peer (a refused handshake never gives one) ends
    // with the socket, so the queue settles; waiting for it first would never return.
    this.dealer.close();
    await this.sends.idle();
    await this.loop;
  }
}

