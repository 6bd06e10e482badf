// The agent's DEALER to the coordinator's ROUTER. With a bus token, a connection carries nothing
// but a challenge until its peer has proven the token (BusChallenge answered by a MACed
// CoordinatorMessage.proof with the same nonce): a process that squats the port after the
// coordinator died never receives a Hello, a heartbeat, a dump ack or a wave head (request ids,
// token ids). A ZeroMQ socket reconnects on its own, to whoever holds the port then, and says
// nothing about it in band; so each socket here never reconnects (reconnect interval -1): once
// its connection is gone it is replaced by a new socket, which is challenged again.
// Without a token (CURVE authenticates the coordinator at the handshake; plain text authenticates
// nothing) there is one socket that reconnects as ZeroMQ does, and everything is sent at once.
import { randomBytes } from 'crypto';
import { Dealer } from 'zeromq';
import type { Logger } from '../log';
import type { BusToken } from './auth';
import { NONCE_BYTES } from './constants';
import { tcpEndpoint } from './endpoints';
import { encodeAgentMessage } from './frames';
import { receiveLoop } from './receive-loop';
import { SendQueue } from './send-queue';
import { connectTo } from '../client/connect';

export interface CoordinatorLinkOptions {
  host: string;
  port: number;
  /** Socket options (address family, CURVE client keys). */
  socketOptions: Record<string, unknown>;
  maxFrameBytes: number;
  token?: BusToken;
  rank: number;
  /** A connection whose peer has not proven the token within this long is replaced. */
  retryMs: number;
  log: Logger;
  running: () => boolean;
  /** A message from the coordinator, with the generation of the socket it came on. */
  onMessage: (parts: Buffer[], generation: number) => void;
  /** The peer of a new connection proved the token (with a token only). */
  onProven: () => void;
  /** A message that could not be queued. */
  onUnsent: () => void;
}

export class CoordinatorLink {
  /** Messages not sent because the connection's peer had not proven the token (yet). */
  unproven = 0;
  /** Connections opened (with a token: each one challenged). */
  connections = 0;
  private dealer?: Dealer;
  private queue?: SendQueue;
  private generation = 0;
  private nonce = Buffer.alloc(0);
  private openedAt = 0;
  private proven = false;
  private gone = false;
  /** Connections replaced without a proof. */
  private unanswered = 0;
  private readonly loops: Promise<void>[] = [];

  constructor(private readonly o: CoordinatorLinkOptions) {}

  /** Whether messages go out: the peer proved the token on this connection, or there is no token. */
  get trusted(): boolean {
    return !this.o.token || this.proven;
  }

  start(): void {
    this.open();
  }

  /** A message for the coordinator (sealed already); dropped and counted while the peer is unproven. */
  send(parts: Buffer | Buffer[]): void {
    if (!this.trusted) {
      this.unproven++;
      return;
    }
    this.queue?.push(parts);
  }

  /** Called on every heartbeat: a connection that is gone, or unproven for too long, is replaced. */
  tick(now: number): void {
    if (!this.o.token) return;
    if (!this.proven && now - this.openedAt > this.o.retryMs) {
      // Said once, then every 100th time: a dead coordinator would otherwise log every heartbeat.
      if (this.unanswered++ % 100 === 0) {
        this.o.log.warn({ rank: this.o.rank, unanswered: this.unanswered }, 'no proof of the bus token on a new connection: the coordinator is dead, restarting, of a protocol older than 7, or not this job\'s (a process on its port); sending it nothing');
      }
      this.open();
    } else if (this.gone) {
      this.open();
    }
  }

  /**
   * The coordinator is lost or was replaced (a new epoch), or does not answer: a new socket (with a
   * token, challenged again). Without a token too: after a ZMTP protocol error (a process on the
   * port that broke the handshake) libzmq never reconnects the old one.
   */
  renew(): void {
    this.open();
  }

  /** A proof arrived (already MAC-checked by the caller): believed only for this socket's nonce. */
  proof(nonce: Uint8Array | undefined, generation: number): boolean {
    if (!this.o.token || generation !== this.generation || this.proven || this.gone) return false;
    if (!nonce || nonce.length !== NONCE_BYTES || !this.nonce.equals(Buffer.from(nonce))) return false;
    this.proven = true;
    this.o.log.info({ rank: this.o.rank, connection: this.connections }, 'coordinator proved the bus token on a new connection');
    this.o.onProven();
    return true;
  }

  /** Whether a message from socket `generation` may be acted on (a proven, current connection). */
  current(generation: number): boolean {
    return generation === this.generation && this.trusted;
  }

  async stop(): Promise<void> {
    await this.queue?.idle();
    this.dealer?.close();
    await Promise.all(this.loops);
  }

  private open(): void {
    this.dealer?.close();
    const gen = ++this.generation;
    this.connections++;
    this.proven = false;
    this.gone = false;
    this.openedAt = Date.now();
    // sendTimeout 0: a message that cannot be queued is counted and dropped; the heartbeat timer
    // re-sends what matters (Hello, SnapshotRequest), so nothing here ever blocks.
    const dealer = new Dealer({
      linger: 0,
      sendTimeout: 0,
      maxMessageSize: 2 * this.o.maxFrameBytes,
      ...(this.o.token ? { reconnectInterval: -1 } : {}),
      ...this.o.socketOptions,
    });
    if (this.o.token) {
      // Never reconnected (above): once this connection is gone the socket is useless; replace it.
      dealer.events.on('disconnect', () => {
        if (gen === this.generation) this.gone = true;
      });
    }
    connectTo(dealer, tcpEndpoint(this.o.host, this.o.port + 1));
    this.dealer = dealer;
    // sendTimeout 0: each send completes inside send(), so nothing is ever queued (send-queue.ts).
    this.queue = new SendQueue(dealer, () => this.o.onUnsent(), true);
    const loop = receiveLoop(dealer, { role: 'DEALER', what: 'a coordinator message', running: this.o.running, log: this.o.log }, (parts) => this.o.onMessage(parts, gen));
    this.loops.push(loop);
    void loop.then(() => this.loops.splice(this.loops.indexOf(loop), 1));
    if (this.o.token) {
      this.nonce = randomBytes(NONCE_BYTES);
      const msg = this.o.token.seal('to-coordinator', encodeAgentMessage({ globalRank: this.o.rank, challenge: { nonce: this.nonce } }));
      this.queue.push(msg);
    }
  }
}
