// How many connections the /healthz and /metrics server keeps: a scraper needs one or two, and each
// one held is a file descriptor of the coordinator, so 10 000 idle ones from a local user took all
// of them (issue 28): its bus could accept nothing more. A connection beyond the caps takes the
// place of the oldest idle one (of its address, or of all), or is closed at once when every one
// is busy, so a real client always gets in and an idle flood costs the caps' worth of descriptors.
import type * as http from 'http';
import type { Socket } from 'net';
import type { Counter } from 'prom-client';

/** Connections kept in all, and per client address. */
export const MAX_METRICS_CONNECTIONS = 128;
export const MAX_METRICS_CONNECTIONS_PER_CLIENT = 32;
/** A connection that sends nothing for this long is closed; also the bound on a request's headers. */
export const METRICS_IDLE_TIMEOUT_MS = 10_000;

interface Conn {
  socket: Socket;
  address: string;
  busy: boolean;
}

/** Apply the caps and idle timeouts to `server` (before it listens); `closed` counts what they close, by reason. */
export function capConnections(server: http.Server, closed: Counter<'reason'>, caps = { total: MAX_METRICS_CONNECTIONS, perClient: MAX_METRICS_CONNECTIONS_PER_CLIENT }): void {
  for (const reason of ['total', 'per_client', 'idle']) closed.inc({ reason }, 0);
  // Insertion order is age: the first idle one found is the oldest.
  const conns = new Map<Socket, Conn>();
  const perAddress = new Map<string, number>();
  server.headersTimeout = METRICS_IDLE_TIMEOUT_MS;
  server.requestTimeout = METRICS_IDLE_TIMEOUT_MS;
  server.keepAliveTimeout = Math.min(5000, METRICS_IDLE_TIMEOUT_MS);
  server.setTimeout(METRICS_IDLE_TIMEOUT_MS, (socket: Socket) => {
    closed.inc({ reason: 'idle' });
    socket.destroy();
  });

  const oldestIdle = (address?: string): Conn | undefined => {
    for (const c of conns.values()) if (!c.busy && (address === undefined || c.address === address)) return c;
    return undefined;
  };

  server.on('connection', (socket: Socket) => {
    const address = socket.remoteAddress ?? '';
    const mine = perAddress.get(address) ?? 0;
    const over: 'per_client' | 'total' | undefined = mine >= caps.perClient ? 'per_client' : conns.size >= caps.total ? 'total' : undefined;
    if (over) {
      closed.inc({ reason: over });
      const victim = oldestIdle(over === 'per_client' ? address : undefined);
      if (!victim) {
        socket.destroy();
        return;
      }
      victim.socket.destroy();
      forget(victim.socket);
    }
    conns.set(socket, { socket, address, busy: false });
    perAddress.set(address, (perAddress.get(address) ?? 0) + 1);
    socket.once('close', () => forget(socket));
  });

  function forget(socket: Socket): void {
    const c = conns.get(socket);
    if (!c) return;
    conns.delete(socket);
    const n = (perAddress.get(c.address) ?? 1) - 1;
    if (n > 0) perAddress.set(c.address, n);
    else perAddress.delete(c.address);
  }

  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const c = conns.get(req.socket);
    if (!c) return;
    c.busy = true;
    res.once('close', () => (c.busy = false));
  });
}
