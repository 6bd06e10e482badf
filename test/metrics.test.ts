// /healthz and /metrics served by a real coordinator over real HTTP, fed by real bus traffic.
import { Dealer } from 'zeromq';
import { AgentBus } from '../src/bus/agent-bus';
import { Coordinator } from '../src/bus/coordinator';
import type { CoordinatorPolicy, DueLanes } from '../src/bus/policy';
import { ConfigError } from '../src/errors';
import { agentConfig } from '../src/guard/agent-config';
import { defaultConfig } from '../src/guard/config';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { counter, gauge, registry, startMetricsServer } from '../src/metrics';
import { cleanup, freePortPair, waitFor } from './helpers';

const quiet = createLogger('metrics-test', 'error');

/** Value of one sample in Prometheus text, e.g. sample(text, 'wavebus_lanes_total{lane="dump"}'). */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

class StatusPolicy implements CoordinatorPolicy {
  onWaveHead(): DueLanes {
    return { dumps: [] };
  }
  onDumpResult(): void {}
  status(): Record<string, unknown> {
    return { quotas: { auto_dumps_left: 3 }, manual_dump_done: 1 };
  }
  snapshotState() {
    return { configVersion: 0, config: null, manualDumpDone: 1 };
  }
}

let coordinator: Coordinator | undefined;
let agent: AgentBus | undefined;

afterAll(async () => {
  await agent?.stop();
  await coordinator?.stop();
  await cleanup();
});

test('/healthz, /metrics and 404 on a running coordinator', async () => {
  const port = await freePortPair();
  coordinator = new Coordinator({ port, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, metricsPort: 0, policy: new StatusPolicy(), logger: quiet, heartbeatMs: 200, deadAfterMs: 5000 });
  await coordinator.start();
  const addr = coordinator.metricsAddress!;
  expect(addr.host).toBe('127.0.0.1');
  const base = `http://127.0.0.1:${addr.port}`;
  const before = await (await fetch(`${base}/metrics`)).text();
  const waves0 = sample(before, 'wavebus_waves_total') ?? 0;
  const cfg0 = sample(before, 'wavebus_lanes_total{lane="config"}') ?? 0;
  const dump0 = sample(before, 'wavebus_lanes_total{lane="dump"}') ?? 0;
  const und0 = sample(before, 'wavebus_dropped_frames_total{reason="undecodable"}') ?? 0;
  const ok0 = sample(before, 'wavebus_dumps_total{result="ok"}') ?? 0;

  agent = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity: resolveIdentity({}, { rank: 0, worldSize: 1 }), heartbeatMs: 200, logger: quiet });
  await agent.start();
  await waitFor(() => coordinator!.ready, 'ready');

  coordinator.setConfig(2, agentConfig(defaultConfig(), { hotReload: false, dumpRoot: '' }));
  coordinator.beginWave(1, null);
  coordinator.armDumps([{ incidentType: 'manual_trigger', reqId: 'r', blockIds: [], detectWave: 1, armWave: 0, dumpDir: '', requestFinishedAtDump: false, jobId: '', replica: 0, ranks: [] }]);
  coordinator.beginWave(2, null); // the head of wave 2 publishes the vector of wave 3 (a wave ahead)
  await waitFor(() => agent!.latest()?.wave === 3, 'agent at wave 3');
  agent.sendDumpResult({ globalRank: 0, jobId: '3/manual_trigger/r', wave: 3, files: [], bytes: 0, error: '', skippedReason: '' });
  await waitFor(() => coordinator!.pendingDumpLanes().length === 0, 'dump acked');
  const rogue = new Dealer({ linger: 0 });
  rogue.connect(`tcp://127.0.0.1:${port + 1}`);
  await rogue.send(Buffer.from('this is not protobuf \xff\xff\xff\xff', 'latin1'));
  await waitFor(() => coordinator!.stats.dropped.undecodable === 1, 'garbage counted');
  rogue.close();

  const h = await fetch(`${base}/healthz`);
  expect(h.status).toBe(200);
  expect(h.headers.get('content-type')).toMatch(/application\/json/);
  const health = (await h.json()) as Record<string, any>;
  expect(health).toMatchObject({
    epoch: coordinator.epoch,
    wave: 2,
    live_ranks: [0],
    expected_ranks: [0],
    ready: true,
    config_version: 2,
    quotas: { auto_dumps_left: 3 },
    manual_dump_done: 1,
  });
  expect(health.seq).toBeGreaterThanOrEqual(5);
  // This process's memory (the coordinator runs in it here), in bytes.
  const mem = health.memory as Record<string, number>;
  expect(Object.keys(mem).sort()).toEqual(['array_buffers', 'external', 'heap_total', 'heap_used', 'new_space', 'old_space', 'rss']);
  expect(mem.rss).toBeGreaterThan(mem.heap_used);
  expect(mem.heap_used).toBeGreaterThan(0);
  expect(mem.heap_used).toBeLessThanOrEqual(mem.heap_total);
  expect(mem.new_space + mem.old_space).toBeLessThanOrEqual(mem.heap_total);
  expect(mem.new_space).toBeGreaterThan(0);
  expect(mem.array_buffers).toBeLessThanOrEqual(mem.external);

  const m = await fetch(`${base}/metrics`);
  expect(m.status).toBe(200);
  const text = await m.text();
  expect(sample(text, 'wavebus_waves_total')).toBe(waves0 + 2);
  expect(sample(text, 'wavebus_lanes_total{lane="config"}')).toBe(cfg0 + 1);
  expect(sample(text, 'wavebus_lanes_total{lane="dump"}')).toBe(dump0 + 1);
  expect(sample(text, 'wavebus_live_agents')).toBe(1);
  expect(sample(text, 'wavebus_dropped_frames_total{reason="undecodable"}')).toBe(und0 + 1);
  expect(sample(text, 'wavebus_dumps_total{result="ok"}')).toBe(ok0 + 1);
  expect(sample(text, 'wavebus_dumps_total{result="timeout"}')).toBe(0);

  expect((await fetch(`${base}/nothing-here`)).status).toBe(404);
});

test('counter() and gauge() are idempotent, land on the shared registry, and refuse a type clash', async () => {
  const a = counter('wavebus_test_incidents_total', 'incidents in this test', ['incident_type']);
  const b = counter('wavebus_test_incidents_total', 'incidents in this test', ['incident_type']);
  expect(a).toBe(b);
  a.inc({ incident_type: 'token_repeat' }, 3);
  const g = gauge('wavebus_test_queue_depth', 'depth');
  g.set(4);
  expect(gauge('wavebus_test_queue_depth', 'depth')).toBe(g);
  const text = await registry.metrics();
  expect(sample(text, 'wavebus_test_incidents_total{incident_type="token_repeat"}')).toBe(3);
  expect(sample(text, 'wavebus_test_queue_depth')).toBe(4);
  expect(() => gauge('wavebus_test_incidents_total', 'x')).toThrow(ConfigError);
});

test('a metrics port in use is a clear error naming the flag and port', async () => {
  const s = await startMetricsServer({ port: 0, health: () => ({}) });
  const err = await startMetricsServer({ port: s.port, health: () => ({}) }).then(() => null, (e) => e);
  await s.close();
  expect(err).toBeInstanceOf(ConfigError);
  expect(err.code).toBe('ERR_PORT_IN_USE');
  expect(err.message).toContain(`--metrics-port ${s.port}`);
});
