// Prometheus metrics and the coordinator's tiny HTTP endpoint: GET /healthz (JSON) and
// GET /metrics (Prometheus text). One registry for the process; other modules (the runtime
// guard) add their own counters to it with counter() / gauge(), which are idempotent.
import * as http from 'http';
import type { Socket } from 'net';
import { Counter, Gauge, Registry } from 'prom-client';
import { ConfigError } from './errors';

export const registry = new Registry();

/** Get or create a counter on the shared registry (same name → same counter). */
export function counter<L extends string = string>(name: string, help: string, labelNames: readonly L[] = []): Counter<L> {
  const existing = registry.getSingleMetric(name);
  if (existing) {
    if (!(existing instanceof Counter)) throw new ConfigError(`metric ${name} already exists and is not a counter`);
    return existing as Counter<L>;
  }
  return new Counter<L>({ name, help, labelNames: [...labelNames], registers: [registry] });
}

/** Get or create a gauge on the shared registry. */
export function gauge<L extends string = string>(name: string, help: string, labelNames: readonly L[] = []): Gauge<L> {
  const existing = registry.getSingleMetric(name);
  if (existing) {
    if (!(existing instanceof Gauge)) throw new ConfigError(`metric ${name} already exists and is not a gauge`);
    return existing as Gauge<L>;
  }
  return new Gauge<L>({ name, help, labelNames: [...labelNames], registers: [registry] });
}

/** The bus's own metrics. Created lazily so that importing this module registers nothing. */
export function busMetrics() {
  const m = {
    waves: counter('wavebus_waves_total', 'Wave heads published by the coordinator'),
    lanes: counter('wavebus_lanes_total', 'Due lanes published, by lane (config, dump)', ['lane'] as const),
    liveAgents: gauge('wavebus_live_agents', 'Agents whose heartbeats arrive within the liveness bound'),
    dropped: counter('wavebus_dropped_frames_total', 'Frames dropped by the coordinator, by reason', ['reason'] as const),
    dumps: counter('wavebus_dumps_total', 'Per-rank dump outcomes (ok, error, skipped, timeout)', ['result'] as const),
    replicaWaves: counter('wavebus_replica_waves_total', 'Wave heads published by the coordinator, by DP replica (waves per second: rate())', ['dp'] as const),
  };
  memoryGauge();
  // Zero-valued series, so dashboards see every label from the start.
  for (const lane of ['config', 'dump']) m.lanes.inc({ lane }, 0);
  for (const reason of ['frame_count', 'oversized', 'truncated', 'undecodable', 'empty', 'unknown_request', 'no_mac', 'bad_mac', 'wrong_connection', 'protocol_version', 'not_head', 'bad_telemetry', 'rank_out_of_range', 'over_limit']) m.dropped.inc({ reason }, 0);
  return m;
}

/** The coordinator's memory, read at each scrape (no timer): rss, heap_used, heap_total, external, array_buffers. */
function memoryGauge(): void {
  const name = 'wavebus_coordinator_memory_bytes';
  if (registry.getSingleMetric(name)) return;
  new Gauge({
    name,
    help: "The coordinator process's memory in bytes, by kind (rss, heap_used, heap_total, external, array_buffers)",
    labelNames: ['kind'],
    registers: [registry],
    collect() {
      const m = process.memoryUsage();
      this.set({ kind: 'rss' }, m.rss);
      this.set({ kind: 'heap_used' }, m.heapUsed);
      this.set({ kind: 'heap_total' }, m.heapTotal);
      this.set({ kind: 'external' }, m.external);
      this.set({ kind: 'array_buffers' }, m.arrayBuffers);
    },
  });
}

// ------------------------------------------------------------------ the server's connections

// How many connections the /healthz and /metrics server keeps: a scraper needs one or two, and each
// one held is a file descriptor of the coordinator, so 10 000 idle ones from a local user took all
// of them (issue 28): its bus could accept nothing more. A connection beyond the caps takes the
// place of the oldest idle one (of its address, or of all), or is closed at once when every one
// is busy, so a real client always gets in and an idle flood costs the caps' worth of descriptors.

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

/** Headers of one request to /healthz or /metrics (a scraper sends a few hundred bytes; Node's default is 16 KiB). */
export const METRICS_MAX_HEADER_BYTES = 8192;

function hasBody(req: http.IncomingMessage): boolean {
  const len = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (len !== undefined && len !== '0');
}

export interface MetricsServer {
  host: string;
  port: number;
  close(): Promise<void>;
}

/**
 * Serve /healthz and /metrics on host:port (port 0 picks a free one). `health` is called per
 * request; it must be cheap and must not throw. Connections are capped (capConnections above).
 */
export async function startMetricsServer(opts: { host?: string; port: number; health: () => Record<string, unknown> }): Promise<MetricsServer> {
  const host = opts.host ?? '127.0.0.1';
  // Timeouts are checked this often (Node's default, 30 s, let idle connections pile up that long).
  const server = http.createServer({ connectionsCheckingInterval: Math.min(1000, METRICS_IDLE_TIMEOUT_MS), maxHeaderSize: METRICS_MAX_HEADER_BYTES }, (req, res) => {
    const url = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD', connection: 'close' }).end();
      return;
    }
    // A GET has no body. Node would read and discard one, however long, to reach the next request
    // on the connection: answer 413 and close it instead.
    if (hasBody(req)) {
      res.writeHead(413, { 'content-type': 'text/plain', connection: 'close' }).end('a request to /healthz or /metrics has no body\n');
      return;
    }
    if (url === '/healthz') {
      let body: string;
      try {
        body = JSON.stringify(opts.health());
      } catch (e) {
        res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ error: String(e) }));
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(body);
    } else if (url === '/metrics') {
      registry.metrics().then(
        (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
        (e) => res.writeHead(500).end(String(e)),
      );
    } else {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: try /healthz or /metrics\n');
    }
  });
  capConnections(server, counter('wavebus_metrics_connections_closed_total', 'Connections to /healthz and /metrics closed by the caps (total, per_client) or for being idle', ['reason'] as const));
  await new Promise<void>((resolve, reject) => {
    server.once('error', (e: NodeJS.ErrnoException) => {
      reject(
        e.code === 'EADDRINUSE'
          ? new ConfigError(`--metrics-port ${opts.port}: port is already in use on ${host}`, 'ERR_PORT_IN_USE')
          : new ConfigError(`--metrics-port ${opts.port}: cannot listen on ${host}: ${e.message}`),
      );
    });
    server.listen(opts.port, host, () => resolve());
  });
  const port = (server.address() as { port: number }).port;
  return {
    host,
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections?.();
      }),
  };
}
