// Issue 28, lower: idle TCP connections to the metrics port must not take the coordinator's file
// descriptors. The /healthz server keeps at most MAX_METRICS_CONNECTIONS in all and
// MAX_METRICS_CONNECTIONS_PER_CLIENT per address (a new one takes the place of the oldest idle
// one), and closes a connection idle for METRICS_IDLE_TIMEOUT_MS (src/metrics.ts).
import * as fs from 'fs';
import * as http from 'http';
import * as net from 'net';
import * as path from 'path';
import { BusToken, createTokenFile } from '../src/bus/auth';
import { requestStatus } from '../src/bus/status-client';
import { PROTOCOL_VERSION } from '../src/bus/protocol-version';
import { startMetricsServer } from '../src/metrics';
import { MAX_METRICS_CONNECTIONS, MAX_METRICS_CONNECTIONS_PER_CLIENT } from '../src/metrics';
import { attackScript, cleanup, cleanupUsers, CLI, describeAsRoot, freePortPair, jsonEvents, otherUser, spawnAs, spawnTracked, tmpDir, waitFor } from './helpers';

afterAll(async () => {
  await cleanup();
  cleanupUsers();
});

function get(port: number, url: string): Promise<{ ms: number; status: number; body: string }> {
  const t0 = Date.now();
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path: url, timeout: 5000, agent: false }, (res) => {
      let s = '';
      res.on('data', (b) => (s += b));
      res.on('end', () => resolve({ ms: Date.now() - t0, status: res.statusCode ?? 0, body: s }));
    });
    req.on('timeout', () => req.destroy(new Error(`${url}: no answer within 5 s`)));
    req.on('error', reject);
  });
}

test('200 idle connections from one address: the server keeps the per-client cap of them, the newest first, and still answers', async () => {
  const server = await startMetricsServer({ port: 0, health: () => ({ ok: true }) });
  const socks: net.Socket[] = [];
  try {
    let closed = 0;
    for (let i = 0; i < 200; i++) {
      const s = net.connect(server.port, '127.0.0.1');
      s.on('error', () => undefined);
      s.on('close', () => closed++);
      socks.push(s);
      await new Promise((r) => s.once('connect', r));
    }
    await waitFor(() => closed >= 200 - MAX_METRICS_CONNECTIONS_PER_CLIENT, 'the server to close the oldest idle connections');
    // The newest ones are those kept.
    expect(socks.slice(-MAX_METRICS_CONNECTIONS_PER_CLIENT).every((s) => !s.destroyed)).toBe(true);
    const h = await get(server.port, '/healthz');
    expect(h).toMatchObject({ status: 200, body: '{"ok":true}' });
    const m = await get(server.port, '/metrics');
    expect(m.body).toMatch(new RegExp(`^wavebus_metrics_connections_closed_total\\{reason="per_client"\\} (\\d+)$`, 'm'));
    expect(Number(/^wavebus_metrics_connections_closed_total\{reason="per_client"\} (\d+)$/m.exec(m.body)![1])).toBeGreaterThanOrEqual(200 - MAX_METRICS_CONNECTIONS_PER_CLIENT);
  } finally {
    for (const s of socks) s.destroy();
    await server.close();
  }
});

// Issue 45 item 1: the server takes what a scrape sends (a GET's headers) and no more.
test('a GET with a 1 GiB body is answered 413 and its connection closed; headers past 8 KiB get 431', async () => {
  const server = await startMetricsServer({ port: 0, health: () => ({ ok: true }) });
  try {
    const s = net.connect(server.port, '127.0.0.1');
    let reply = '';
    let closed = false;
    s.on('data', (b) => (reply += b.toString('latin1')));
    s.on('error', () => undefined);
    s.on('close', () => (closed = true));
    await new Promise((r) => s.once('connect', r));
    s.write(`GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: ${2 ** 30}\r\n\r\n`);
    // Send the body 1 MiB at a time while the connection stands, 64 MiB at most.
    const chunk = Buffer.alloc(2 ** 20, 0x61);
    let sent = 0;
    while (!closed && sent < 64 * 2 ** 20) {
      if (!s.write(chunk)) await new Promise((r) => setTimeout(r, 5));
      sent += chunk.length;
    }
    await waitFor(() => closed, 'the server to close the connection', 5000).catch(() => undefined);
    s.destroy();
    expect(reply).toMatch(/^HTTP\/1\.1 413 /);
    expect(closed).toBe(true);
    const big = await new Promise<string>((resolve) => {
      const c = net.connect(server.port, '127.0.0.1', () => c.write(`GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ${'a'.repeat(9000)}\r\n\r\n`));
      let r = '';
      c.on('data', (b) => (r += b.toString('latin1')));
      c.on('error', () => undefined);
      c.on('close', () => resolve(r));
    });
    expect(big).toMatch(/^HTTP\/1\.1 431 /);
    expect(await get(server.port, '/healthz')).toMatchObject({ status: 200, body: '{"ok":true}' });
  } finally {
    await server.close();
  }
});

describeAsRoot('a local user opens 2000 idle connections to the metrics port of a coordinator limited to 1024 descriptors', () => {
  test('the coordinator keeps a bounded number, /healthz answers, its bus accepts a new client', async () => {
    const user = otherUser('idle');
    const { dir, script } = attackScript('idle-connections.js', 'wavebus-idle-', 'idle.js');
    const tokenFile = createTokenFile(tmpDir('wavebus-idle-token-'));
    const port = await freePortPair();
    // 1024 descriptors: without the caps, 2000 idle connections would take every one.
    const c = spawnTracked('prlimit', ['--nofile=1024:1024', process.execPath, CLI, 'coordinator', '--port', String(port), '--world-size', '1', '--metrics-port', '0', '--bus-token-file', tokenFile, '--runtime-config-path', path.join(dir, 'none.json')], {
      env: { ...process.env, WAVEBUS_LOG_LEVEL: 'warn' },
    });
    const started = await waitFor(() => c.stdout().split('\n').find((l) => l.includes('"started"')), 'the coordinator to start', 20000);
    const metricsPort: number = JSON.parse(started).metrics.port;
    const fds = () => fs.readdirSync(`/proc/${c.child.pid}/fd`).length;
    const before = fds();
    const attacker = spawnAs(user, process.execPath, [script, '127.0.0.1', String(metricsPort), '2000'], { stdio: ['pipe', 'pipe', 'pipe'] });
    const events = () => jsonEvents(attacker);
    try {
      const opened = await waitFor(() => events().find((e) => e.event === 'opened'), 'the 2000 connections to be answered', 60000);
      expect(opened.connected + opened.failed).toBe(2000);
      const during = fds();
      expect(during - before).toBeLessThanOrEqual(MAX_METRICS_CONNECTIONS + 16);
      const h = await get(metricsPort, '/healthz');
      expect(h.status).toBe(200);
      expect(h.ms).toBeLessThan(1000); // generous: a refusal would be an error, a hang the 5 s timeout
      const st = await requestStatus({ host: '127.0.0.1', port }, 3000, undefined, BusToken.load(tokenFile, 'token'));
      expect(st.protocolVersion).toBe(PROTOCOL_VERSION);
      const m = await get(metricsPort, '/metrics');
      expect(Number(/^wavebus_metrics_connections_closed_total\{reason="per_client"\} (\d+)$/m.exec(m.body)?.[1])).toBeGreaterThan(1000);
      expect(c.child.exitCode).toBeNull();
      // eslint-disable-next-line no-console
      console.log(`idle flood: ${opened.connected} connected, coordinator fds ${before} before, ${during} during`);
    } finally {
      attacker.child.stdin?.end();
      await attacker.exited;
    }
    c.child.kill('SIGTERM');
    await c.exited;
  }, 120000);
});
