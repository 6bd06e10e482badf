// The receive loop every long-lived bus socket runs (agent SUB and DEALER, coordinator ROUTER,
// the agent's file ROUTER, the aggregate tool's relay and direct DEALERs): a receive error ends it
// once the socket is closed or its owner stopped, and is logged otherwise; a handler that throws is
// logged (and handed to onError) and never ends the loop, so no message from the network can take a
// process down.
import type { Logger } from '../log';

export interface ReceivingSocket {
  readonly closed: boolean;
  receive(): Promise<Buffer[]>;
}

export interface ReceiveLoopOptions {
  /** The socket's role in log lines: 'SUB', 'DEALER', 'ROUTER'. */
  role: string;
  /** What one message is, for the handler-failure log line: 'a bus frame', 'an agent message'. */
  what: string;
  /** Whether the owner is still running (a receive error after stop() ends the loop quietly). */
  running: () => boolean;
  /** Absent for a tool's client, whose failures show as its requests' errors (onError). */
  log?: Logger;
  /** A handler threw: a tool's client fails what waits on it, instead of leaving it to its timeout. */
  onError?: (e: unknown) => void;
}

export async function receiveLoop(sock: ReceivingSocket, opts: ReceiveLoopOptions, handle: (parts: Buffer[]) => void): Promise<void> {
  while (!sock.closed) {
    let parts: Buffer[];
    try {
      parts = await sock.receive();
    } catch (e) {
      if (sock.closed || !opts.running()) break;
      opts.log?.warn({ err: String(e) }, `${opts.role} receive failed`);
      continue;
    }
    try {
      handle(parts);
    } catch (e) {
      opts.log?.error({ err: String((e as Error)?.stack ?? e) }, `failed to handle ${opts.what}`);
      opts.onError?.(e);
    }
  }
}
