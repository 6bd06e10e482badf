// The agent's side of the engine client's socket (ROUTER, ipc): decodes requests, passes the
// per-step wave head's bytes on untouched, refuses a client of another protocol version or one it
// never greeted, and sends the replies through one queue (zeromq allows one send in flight).
import * as fs from 'fs';
import * as zmq from 'zeromq';
import { ConfigError, WavebusError } from '../errors';
import { staleSocketOrNothing } from '../launch/run-dir';
import type { Logger } from '../log';
import { ClientReply, ClientRequest, encode, toPlain } from '../proto';
import { oneWayWaveHead, waveHeadBytes } from '../bus/wave-head-relay';
import { wireCensus } from '../bus/wire-census';
import { CLIENT_PROTOCOL_VERSION, CLIENT_SOCKET_MAX_MESSAGE_BYTES, protocolMismatch } from '../client/protocol';

const ZMQ_ROUTER_NOTIFY = 97;

export type ClientHandler = (req: Record<string, any>, interim: () => void) => Promise<Record<string, unknown>>;

export interface ClientServerStats {
  clientRequests: number;
  badClientFrames: number;
}

/**
 * A client request the agent takes without answering (id 0): a wave head (the engine never waits
 * at the head of a wave) or a missed-wave notice (the engine already went on).
 */
export function isOneWayRequest(req: { id?: unknown; body?: unknown }): boolean {
  return req.id === 0 && (req.body === 'waveHead' || req.body === 'endOfWave');
}

const BODY_FIELDS: readonly string[] = ClientRequest.oneofs!.body.oneof;

/**
 * Whether one member of the body oneof is set. A garbled frame can carry several (protobufjs keeps
 * each one it read); which of them is "the" body then differs between the decoded message and
 * its plain form, so such a request takes the general path, where the plain form decides.
 */
function onlyBodySet(msg: Record<string, unknown>): boolean {
  let n = 0;
  for (const f of BODY_FIELDS) if (msg[f] !== undefined && msg[f] !== null) n++;
  return n === 1;
}

/**
 * The agent's ROUTER for its engine client, bound at `endpoint` (ipc, in the run dir). A socket
 * file left there by a killed agent of this rank is taken over; anything else is refused.
 */
export async function bindClientSocket(endpoint: string, notify = false): Promise<{ router: zmq.Router; notify: boolean }> {
  const sockPath = endpoint.slice('ipc://'.length);
  const there = staleSocketOrNothing(sockPath);
  if (there === 'stale') fs.unlinkSync(sockPath); // left by a killed agent of this rank
  else if (there !== 'none') throw new ConfigError(`agent socket ${sockPath}: something else is there (${there}); refusing to remove it`, 'ERR_RUN_DIR');
  const router = new zmq.Router({ linger: 0, maxMessageSize: CLIENT_SOCKET_MAX_MESSAGE_BYTES });
  try {
    // ZMQ_ROUTER_NOTIFY (draft API, in zeromq.js's build): an empty message from a peer when it
    // connects and when its connection goes, so a client's closed socket is seen (only with the
    // flight recorder on: nothing is added to the socket otherwise).
    notify = notify && routerNotify(router);
    await router.bind(endpoint);
  } catch (e) {
    router.close();
    throw e;
  }
  return { router, notify };
}

/** Turn ROUTER_NOTIFY on; false where this zeromq build lacks the draft API (no throw: the pid watch remains). */
export function routerNotify(router: zmq.Router): boolean {
  try {
    (router as unknown as { setInt32Option(o: number, v: number): void }).setInt32Option(ZMQ_ROUTER_NOTIFY, 3);
    return (router as unknown as { getInt32Option(o: number): number }).getInt32Option(ZMQ_ROUTER_NOTIFY) === 3;
  } catch {
    return false;
  }
}

export class ClientServer {
  private readonly replies: Array<{ router: zmq.Router; parts: [Buffer, Buffer] }> = [];
  private replying = false;
  /** Clients (by routing id) that said hello to this agent incarnation. */
  private readonly greeted = new Set<string>();
  /** Clients refused for their protocol version (logged once each). */
  private readonly refused = new Set<string>();
  /** With ROUTER_NOTIFY: the peers connected now, and the pid each greeted one said hello with. */
  private readonly connected = new Set<string>();
  private readonly helloPid = new Map<string, number>();

  constructor(
    private readonly stats: ClientServerStats,
    private readonly log: Logger,
    /** Does a request's work and returns the reply's fields (throws: an error reply). */
    private readonly handle: ClientHandler,
    /** The per-step one-way wave head, as the client's bytes (returns without waiting). */
    private readonly relayWaveHead: (raw: Uint8Array) => void,
    private readonly stopped: () => boolean,
    /** A greeted client's connection went without its goodbye being known here (`notify` on): its hello's pid. */
    private readonly dropped?: (pid: number) => void,
  ) {}

  /** `notify`: the router was bound with ROUTER_NOTIFY, whose empty messages say a peer came or went. */
  async serve(router: zmq.Router, notify = false): Promise<void> {
    try {
      for await (const [peer, frame] of router) {
        if (!frame) {
          this.stats.badClientFrames++;
          continue;
        }
        if (notify && frame.length === 0 && peer) {
          this.peerNotice(peer.toString('hex'));
          continue;
        }
        // The per-step one-way wave head: its bytes go on to the coordinator as they came, undecoded.
        const head = oneWayWaveHead(frame);
        if (head) {
          this.stats.clientRequests++;
          this.relayWaveHead(head);
          continue;
        }
        let msg: ReturnType<typeof ClientRequest.decode> & { id?: unknown; body?: string; waveHead?: { wave?: unknown } };
        // Counted before decoding: a frame of millions of empty elements is refused, not turned into objects.
        const refused = wireCensus(ClientRequest, frame);
        if (refused) {
          this.stats.badClientFrames++;
          this.log.warn({ reason: refused.reason, detail: refused.detail, total: this.stats.badClientFrames }, 'dropped a client frame');
          continue;
        }
        try {
          msg = ClientRequest.decode(frame);
        } catch {
          this.stats.badClientFrames++;
          continue;
        }
        this.stats.clientRequests++;
        // A wave head the walk above left (e.g. wave_head repeated): its bytes if they can be taken.
        // The body decides (the oneof's last field), never a wave_head field that a later one
        // replaced: a request whose body is another kind is answered like any other.
        if (msg.body === 'waveHead' && Number(msg.id ?? 0) === 0 && onlyBodySet(msg as unknown as Record<string, unknown>)) {
          const raw = waveHeadBytes(frame);
          if (raw) {
            this.relayWaveHead(raw);
            continue;
          }
        }
        const req = toPlain<Record<string, any>>(ClientRequest, msg);
        if (isOneWayRequest(req)) {
          // Nothing is answered, and nothing here needs the client's regions: no hello is asked for.
          this.handle(req, () => undefined).catch((err: Error) => this.log.warn({ err: String(err?.message ?? err), body: req.body }, 'one-way message from the client failed'));
          continue;
        }
        // A selected capture tells the client it has begun (same id, capturing) before it copies.
        const interim = (): void => this.reply(router, peer, () => encode(ClientReply, { id: req.id, ok: true, capturing: true }));
        // A hello's reply (refused or not) carries this agent's protocol version.
        const version = req.body === 'hello' ? { protocolVersion: CLIENT_PROTOCOL_VERSION } : {};
        void this.handleFrom(peer, req, interim).then(
          (reply) => this.reply(router, peer, () => encode(ClientReply, { id: req.id, ok: true, ...version, ...reply })),
          (err: Error) =>
            this.reply(router, peer, () =>
              encode(ClientReply, { id: req.id, ok: false, error: String(err?.message ?? err), errorCode: (err as WavebusError)?.code ?? 'ERR_AGENT', ...version }),
            ),
        );
      }
    } catch (e) {
      if (!this.stopped()) this.log.error({ err: e }, 'client socket failed');
    }
  }

  /**
   * A hello of another protocol version is refused at once (naming both versions). Work that needs
   * the client's regions is refused from a client this agent never greeted: after an agent restart
   * the engine's client reconnects with its regions unknown here. ERR_NO_HELLO makes the client say
   * hello and register again, then retry.
   */
  private async handleFrom(peer: Buffer, req: Record<string, any>, interim: () => void): Promise<Record<string, unknown>> {
    const key = peer.toString('hex');
    if (req.body === 'hello') {
      const mismatch = protocolMismatch('agent', req.hello.protocolVersion, `hello from a ${req.hello.language || 'client'} client (pid ${req.hello.pid})`);
      if (mismatch) {
        this.greeted.delete(key);
        if (!this.refused.has(key)) this.log.error({ pid: req.hello.pid, language: req.hello.language }, mismatch.message);
        this.refused.add(key);
        throw mismatch;
      }
      this.greeted.add(key);
      this.helloPid.set(key, Number(req.hello.pid));
    } else if ((req.body === 'endOfWave' || req.body === 'beforeForward' || req.body === 'register' || req.body === 'dueDumps') && !this.greeted.has(key)) {
      throw new WavebusError('ERR_NO_HELLO', 'this agent has not met this client (the agent restarted?): say hello and register again');
    }
    return this.handle(req, interim);
  }

  /**
   * Engine clients that said hello to this agent (less those whose connection went, where
   * ROUTER_NOTIFY tells): the heartbeat's engine_clients. With everything off a client says hello
   * only at its first step after a wake; an engine still loading its model has said none.
   */
  get engineClients(): number {
    return this.greeted.size;
  }

  /** ROUTER_NOTIFY's empty message: the first from a peer is its connect, the second its disconnect (routing ids are not reused). */
  private peerNotice(key: string): void {
    if (!this.connected.has(key)) {
      this.connected.add(key);
      return;
    }
    this.connected.delete(key);
    this.greeted.delete(key);
    this.refused.delete(key);
    const pid = this.helloPid.get(key);
    this.helloPid.delete(key);
    if (pid !== undefined) this.dropped?.(pid);
  }

  // zeromq allows one send in flight per socket (a second one throws EBUSY, synchronously):
  // replies to concurrent requests go out one at a time, in the order they were ready.
  private reply(router: zmq.Router, peer: Buffer, make: () => Buffer): void {
    let body: Buffer;
    try {
      body = make();
    } catch (e) {
      this.log.error({ err: String(e) }, 'cannot encode a client reply');
      return;
    }
    this.replies.push({ router, parts: [peer, body] });
    if (!this.replying) void this.drain();
  }

  private async drain(): Promise<void> {
    this.replying = true;
    try {
      while (this.replies.length > 0) {
        const { router, parts } = this.replies.shift()!;
        if (router.closed) continue;
        try {
          await router.send(parts);
        } catch {
          /* the client went away; ROUTER drops replies to unknown peers anyway */
        }
      }
    } finally {
      this.replying = false;
    }
  }
}
