// One send in flight per ZeroMQ socket (zeromq.js refuses a second concurrent send): every bus
// socket owner queues its messages here and they go out strictly in the order queued. The first
// send starts in push() itself, not a tick later, so a request is on its way while the caller
// goes on (the aggregate tool writes a chunk while the next request travels). A socket whose sends
// never wait (the coordinator's PUB) skips the queue: see `immediate`.

/** A frame as zeromq.js sends it (a PUB topic is a string). */
export type Frame = Buffer | string;

export interface SendingSocket {
  readonly closed: boolean;
  send(parts: Frame | Frame[]): Promise<void>;
}

interface Queued {
  parts: Frame | Frame[];
  /** Called instead of the queue's onError when this message could not be sent. */
  failed?: (e: unknown) => void;
}

export class SendQueue {
  private queue: Queued[] = [];
  private draining = false;
  private pump: Promise<void> = Promise.resolve();

  /** `onError`: a message could not be sent (the owner counts or logs it; nothing is retried). */
  /**
   * `immediate`: every send of this socket completes inside send() (sendTimeout 0 on a socket that
   * never blocks: a PUB drops at its high-water mark instead). zeromq.js then never has a send
   * pending, so each message goes out in push() itself: no queue, no await, no later turn.
   */
  constructor(
    private readonly sock: SendingSocket,
    private readonly onError: (e: unknown) => void,
    private readonly immediate = false,
  ) {}

  push(parts: Frame | Frame[], failed?: (e: unknown) => void): void {
    if (this.immediate) {
      if (this.sock.closed) return;
      try {
        this.sock.send(parts).then(undefined, failed ?? this.onError);
      } catch (e) {
        (failed ?? this.onError)(e);
      }
      return;
    }
    this.queue.push({ parts, failed });
    if (!this.draining) this.pump = this.drain();
  }

  /** Messages waiting (not counting the one being sent). */
  get length(): number {
    return this.queue.length;
  }

  /** Resolves once everything queued so far was sent or failed (or the socket closed). */
  idle(): Promise<void> {
    return this.pump;
  }

  private async drain(): Promise<void> {
    this.draining = true;
    try {
      while (this.queue.length > 0 && !this.sock.closed) {
        const { parts, failed } = this.queue.shift()!;
        try {
          await this.sock.send(parts);
        } catch (e) {
          (failed ?? this.onError)(e);
        }
      }
    } finally {
      this.draining = false;
    }
  }
}
