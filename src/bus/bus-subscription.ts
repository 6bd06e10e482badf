// An agent's SUB on its coordinator's wave stream. ZeroMQ reconnects a SUB by itself after a lost
// connection, but after a ZMTP protocol error libzmq ends that endpoint's session for good instead
// of reconnecting. Whoever binds the coordinator's port after it died (any local user) could so
// cut an agent off the bus for ever, even once the coordinator is back, with one malformed
// handshake. So a SUB that has heard nothing for the liveness window while the coordinator is lost,
// and holds no handshaken connection, is replaced by a fresh one (same options, same topics): at
// most one window after the port is the coordinator's again, the stream is back. A SUB whose
// connection stands is kept, however long it is silent: a large frame still arriving would be lost
// with it.
import { Subscriber } from 'zeromq';
import { connectTo } from '../client/connect';
import type { Logger } from '../log';
import { receiveLoop } from './receive-loop';

export interface BusSubscriptionOptions {
  endpoint: string;
  /** Socket options (IP version, CURVE client keys): each replacement gets the same. */
  socketOptions: Record<string, unknown>;
  maxMessageBytes: number;
  /** The topics subscribed now (a replacement subscribes these before it connects). */
  topics: () => string[];
  onMessage: (parts: Buffer[]) => void;
  running: () => boolean;
  log: Logger;
}

export class BusSubscription {
  private sock?: Subscriber;
  /** The receive loops of this SUB and of the ones it replaced (each ends once its socket closes). */
  private loops: Promise<void> = Promise.resolve();
  private heardAt = 0;
  private openedAt = 0;
  /** The live SUB has a connection past its ZMTP handshake (libzmq's socket events). */
  private connected = false;
  /** SUBs replaced after a silent window (counted in the agent's bus stats). */
  renewals = 0;

  constructor(private readonly o: BusSubscriptionOptions) {}

  /** Subscribe first, then connect: frames published after the snapshot must not be missed. */
  open(now = Date.now()): void {
    const sub = new Subscriber({ linger: 0, maxMessageSize: this.o.maxMessageBytes, receiveHighWaterMark: 100000, ...this.o.socketOptions });
    const topics = this.o.topics();
    if (topics.length > 0) sub.subscribe(...topics);
    const up = (live: boolean) => () => {
      if (this.sock === sub) this.connected = live;
    };
    sub.events.on('handshake', up(true));
    for (const down of ['disconnect', 'handshake:error:protocol', 'handshake:error:auth', 'handshake:error:other'] as const) sub.events.on(down, up(false));
    connectTo(sub, this.o.endpoint);
    this.sock = sub;
    this.connected = false;
    this.openedAt = now;
    const loop = receiveLoop(sub, { role: 'SUB', what: 'a bus frame', running: this.o.running, log: this.o.log }, (parts) => {
      this.heardAt = Date.now();
      this.o.onMessage(parts);
    });
    const before = this.loops;
    this.loops = Promise.all([before, loop]).then(() => undefined);
  }

  /** Move the live SUB's subscriptions from `off` to `on` (a replacement takes topics() anyway). */
  retopic(off: string[], on: string[]): void {
    if (!this.sock) return;
    if (off.length > 0) this.sock.unsubscribe(...off);
    if (on.length > 0) this.sock.subscribe(...on);
  }

  /**
   * The coordinator is lost: a SUB without a handshaken connection that heard nothing for
   * `windowMs` (since it was opened or last heard) is replaced. True when it was.
   */
  renewIfSilent(now: number, windowMs: number): boolean {
    if (!this.sock || this.connected || now - Math.max(this.heardAt, this.openedAt) <= windowMs) return false;
    const old = this.sock;
    this.open(now);
    old.close();
    this.renewals++;
    return true;
  }

  async close(): Promise<void> {
    this.sock?.close();
    this.sock = undefined;
    await this.loops;
  }
}
