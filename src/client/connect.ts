// The one way wavebus connects a ZeroMQ socket: the engine's client (layer 7) and every bus,
// launch and tool socket above it go through connectTo().

/** Attempts connectTo() makes while signals keep interrupting it (each returns at once). */
const CONNECT_EINTR_TRIES = 1000;

/**
 * `socket.connect(endpoint)`, retried when a signal interrupted it. zmq_connect runs the socket's
 * pending commands and fails with EINTR when a signal lands meanwhile: a sampling profiler's
 * SIGPROF in the engine's process, or the engine's own timers. zeromq.js retries EINTR for send
 * and receive but not here, and an engine's client that took it as a failure would give up on a
 * healthy agent (test/client-transport.test.ts).
 */
export function connectTo(socket: { connect(endpoint: string): void }, endpoint: string): void {
  for (let i = 1; ; i++) {
    try {
      socket.connect(endpoint);
      return;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EINTR' || i >= CONNECT_EINTR_TRIES) throw e;
    }
  }
}
