// The client's socket to its agent: one DEALER, the one send queue (zeromq allows one send in
// flight per socket), and the one map of requests awaiting an answer, each with its timeout.
import * as zmq from 'zeromq';
import { WavebusError } from '../errors';
import { ClientReply, ClientRequest, decode, encode } from '../proto';
import { wireCensus } from '../bus/wire-census';
import { connectTo } from './connect';
import { CLIENT_SOCKET_MAX_MESSAGE_BYTES } from './protocol';

export type Reply = Record<string, any>;

interface Pending {
  resolve: (r: Reply) => void;
  reject: (e: Error) => void;
  /** before_forward's interim answer: the capture has begun. */
  capturing?: () => void;
}

export interface TransportHooks {
  /** Any decodable answer arrived (it proves the agent alive). */
  heard(): void;
  /** Runs before a request or one-way message is queued (the deferred wave head goes first). */
  beforeSend(): void;
  /** A one-way frame could not be sent (the agent's queue is full, or the socket failed). */
  oneWayFailed(what: string, e: Error): void;
}

export class AgentTransport {
  private socket: zmq.Dealer | undefined;
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private sendChain: Promise<void> = Promise.resolve();
  closed = false;

  constructor(
    private readonly endpoint: string,
    private readonly stats: { sent: number },
    private readonly hooks: TransportHooks,
  ) {}

  /**
   * A request answered by the agent within `timeoutMs`. `capturingMs`: a before_forward whose
   * interim answer (capture begun) gives the agent that long again to finish (ERR_CAPTURE_TIMEOUT);
   * `begun` is called when that interim answer comes.
   */
  request(body: Record<string, unknown>, timeoutMs: number, capturingMs?: number, begun?: () => void): Promise<Reply> {
    if (this.closed && !('close' in body)) return Promise.reject(new WavebusError('ERR_CLOSED', 'client closed'));
    this.hooks.beforeSend();
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      let timer = setTimeout(() => this.expire(id, () => reject(new WavebusError('ERR_TIMEOUT', `agent did not answer within ${timeoutMs} ms`))), timeoutMs);
      this.pending.set(id, {
        capturing:
          capturingMs === undefined
            ? undefined
            : () => {
                begun?.();
                clearTimeout(timer);
                timer = setTimeout(() => this.expire(id, () => reject(new WavebusError('ERR_CAPTURE_TIMEOUT', `the agent began the capture but did not finish it within ${capturingMs} ms`))), capturingMs);
              },
        resolve: (r) => {
          clearTimeout(timer);
          resolve(r);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      this.enqueue(encode(ClientRequest, { id, ...body }), (e) => {
        clearTimeout(timer);
        this.pending.delete(id);
        // The agent's queue is full (it stopped reading): the same as no answer.
        reject(new WavebusError('ERR_TIMEOUT', `cannot send to the agent: ${e.message}`));
      });
    });
  }

  /**
   * A request's time is up. Timers run before the event loop reads its sockets, so a process that
   * was not scheduled for a while (a busy host) finds both the timer and the answer ready at once:
   * the answer already in the socket is read first (setImmediate runs after the loop's I/O), and
   * only a request still unanswered then has timed out. The wait is no longer than the bound.
   */
  private expire(id: number, fail: () => void): void {
    setImmediate(() => {
      if (!this.pending.delete(id)) return;
      fail();
    });
  }

  /** A request the agent does not answer (after any queued wave head): no id, no timer, nothing pending. */
  oneWay(body: Record<string, unknown>): void {
    if (this.closed) return;
    this.hooks.beforeSend();
    this.oneWayFrame(encode(ClientRequest, { id: 0, ...body }), Object.keys(body)[0]);
  }

  /** An already encoded one-way frame (the wave head), queued as is. */
  oneWayFrame(frame: Buffer, what: string): void {
    this.enqueue(frame, (e) => this.hooks.oneWayFailed(what, e));
  }

  /** Says goodbye (if the socket was ever opened), closes it and fails whatever still waits. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.socket) {
      this.request({ close: {} }, 200).catch(() => undefined);
      await new Promise((r) => setTimeout(r, 5));
      this.socket.close();
    }
    for (const p of this.pending.values()) p.reject(new WavebusError('ERR_CLOSED', 'client closed'));
    this.pending.clear();
  }

  /** The one send queue: frames go out one at a time, in call order. */
  private enqueue(frame: Buffer, failed: (e: Error) => void): void {
    const s = this.socketOrOpen();
    this.stats.sent++;
    this.sendChain = this.sendChain.then(() => s.send(frame)).catch(failed);
  }

  private socketOrOpen(): zmq.Dealer {
    if (this.socket) return this.socket;
    // sendTimeout 0: a send to an agent that stopped reading fails at once instead of parking every later send.
    const s = new zmq.Dealer({ linger: 0, sendHighWaterMark: 1000, sendTimeout: 0, maxMessageSize: CLIENT_SOCKET_MAX_MESSAGE_BYTES });
    connectTo(s, this.endpoint);
    this.socket = s;
    void this.receiveLoop(s);
    return s;
  }

  private async receiveLoop(s: zmq.Dealer): Promise<void> {
    try {
      for await (const [frame] of s) {
        let reply: Reply;
        try {
          if (wireCensus(ClientReply, frame)) continue; // more elements than any reply has: not decoded
          reply = decode(ClientReply, frame);
        } catch {
          continue; // garbage from the agent socket is ignored
        }
        this.hooks.heard();
        const p = this.pending.get(reply.id);
        if (p && reply.capturing) {
          p.capturing?.();
        } else if (p) {
          this.pending.delete(reply.id);
          p.resolve(reply);
        }
      }
    } catch {
      /* socket closed */
    }
  }
}
