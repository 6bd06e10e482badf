// A dead (kill -9) or frozen (SIGSTOP) agent must not stall the engine: every client call is
// bounded, the loss is detected within one bound, later calls skip the agent at once (counted),
// and a frozen agent that resumes is used again. Real coordinator and agent processes, real
// ZeroMQ sockets and shared memory; the engine is the TypeScript client in this process, the
// Python client in a python3 process, or `wavebus sim`.
import * as fs from 'fs';
import * as path from 'path';
import { WavebusClient } from '../src/client';
import { MailboxFeature } from '../src/mailbox';
import { ShmSegment } from '../src/memory';
import { PYTHON, ROOT, cleanup, freePortPair, spawnTracked, spawnWavebus, tmpDir, waitFor, type Spawned } from './helpers';

const BOUND_MS = 100;
const DETECTORS_ON = { detector: { token_repeat: { enabled: true, on_trigger: ['report'] } } };
const segments: string[] = [];

afterAll(async () => {
  await cleanup();
  for (const s of segments) {
    try {
      ShmSegment.unlink(s);
    } catch {
      /* gone */
    }
  }
});

interface Bus {
  root: string;
  runDir: string;
  cacheRoot: string;
  coordinator: Spawned;
  agent: Spawned;
  shmName: string;
}

/** A coordinator with a detector on and one agent with snapshots on (every call captured). */
async function startBus(world = 1): Promise<Bus> {
  const root = tmpDir('wavebus-agent-loss-');
  const runDir = path.join(root, 'run');
  const cacheRoot = path.join(root, 'cache');
  const cfg = path.join(root, 'runtime_config.json');
  fs.writeFileSync(cfg, JSON.stringify(DETECTORS_ON));
  const port = await freePortPair();
  const coordinator = spawnWavebus(['coordinator', '--port', String(port), '--world-size', String(world), '--tp', String(world), '--heartbeat-ms', '200', '--runtime-config-path', cfg]);
  const env = { ...process.env, WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '-1', WAVEBUS_SNAPSHOT_MAX_CAPTURES: '100000', WAVEBUS_CACHE_ROOT: cacheRoot, WAVEBUS_SNAPSHOT_FORMAT: 'npy' };
  const agent = spawnWavebus(
    ['agent', '--coordinator', `127.0.0.1:${port}`, '--rank', '0', '--local-rank', '0', '--world-size', String(world), '--local-world-size', String(world), '--tp', String(world),
      '--run-dir', runDir, '--heartbeat-ms', '200', '--end-of-wave-timeout-ms', String(BOUND_MS)],
    { env },
  );
  const mbox = path.join(runDir, 'mailbox-local0');
  await waitFor(() => fs.existsSync(mbox), 'the agent mailbox', 30000);
  const shmName = `/wavebus-agent-loss-${process.pid}-${port}`;
  const seg = ShmSegment.create(shmName, 4096);
  seg.buffer().fill(3);
  seg.close();
  segments.push(shmName);
  return { root, runDir, cacheRoot, coordinator, agent, shmName };
}

async function connect(bus: Bus): Promise<WavebusClient> {
  const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: bus.runDir, LOCAL_RANK: '0' } });
  const want = MailboxFeature.BUS_ACTIVE | MailboxFeature.SNAPSHOTS;
  await waitFor(() => (client.featureFlags() & want) === want, 'bus and snapshots on in the mailbox', 30000);
  await client.register({ name: 'input0', shmName: bus.shmName, nbytes: 4096, dtype: 'int32', shape: [1024], role: 'input' });
  return client;
}

/** One engine step; the wall time of each call. */
async function wave(client: WavebusClient, w: number) {
  const t = (): number => performance.now();
  const t0 = t();
  await client.waveHead(w, { requests: [], nonFinite: [] });
  const t1 = t();
  const snap = await client.beforeForward({ compilationHash: 'h', globalStep: w }, [{ region: 'input0', dtype: 'int32', shape: [16] }]);
  const t2 = t();
  const end = await client.endOfWave(w);
  const t3 = t();
  return { snap, end, ms: [t1 - t0, t2 - t1, t3 - t2] };
}

/** Call dirs under the cache root: every one whole (meta.json), and no temp dir left behind. */
function bundles(cacheRoot: string): string[] {
  const rankDir = path.join(cacheRoot, 'snapshots', 'h', 'rank0');
  if (!fs.existsSync(rankDir)) return [];
  const names = fs.readdirSync(rankDir);
  expect(names.filter((n) => !/^call\d+$/.test(n))).toEqual([]);
  for (const n of names) expect(fs.existsSync(path.join(rankDir, n, 'meta.json'))).toBe(true);
  return names;
}

async function healthyWaves(client: WavebusClient, from: number, n: number): Promise<number> {
  let captured = 0;
  for (let w = from; w < from + n; w++) {
    const r = await wave(client, w);
    if (r.snap.captured) captured++;
  }
  return captured;
}

/** Waves against a lost agent: each call comes back within 5x the bound; the stall is about one bound. */
async function lostWaves(client: WavebusClient, from: number, n: number) {
  const perCall: number[] = [];
  for (let w = from; w < from + n; w++) {
    const r = await wave(client, w);
    perCall.push(...r.ms);
    expect(r.snap.captured).toBe(false);
  }
  const total = perCall.reduce((a, b) => a + b, 0);
  expect(Math.max(...perCall)).toBeLessThan(5 * BOUND_MS);
  expect(total).toBeLessThan(5 * BOUND_MS); // one bound to notice, then nothing waits
  return { total, perCall };
}

test('kill -9 of the agent (snapshots and detectors on): calls stay bounded, the loss is seen once, the run goes on', async () => {
  const bus = await startBus();
  const client = await connect(bus);
  try {
    expect(await healthyWaves(client, 1, 5)).toBeGreaterThan(0);
    bus.agent.child.kill('SIGKILL');
    await bus.agent.exited;
    const timeoutsBefore = client.stats.endOfWaveTimeouts;
    await lostWaves(client, 6, 30);
    expect(client.agentUnavailable).toBe(true);
    expect(client.stats.agentLost).toBe(1);
    expect(client.stats.snapshotsSkipped).toBeGreaterThanOrEqual(29);
    expect(client.stats.endOfWaveTimeouts - timeoutsBefore).toBeGreaterThanOrEqual(29);
    bundles(bus.cacheRoot);
  } finally {
    await client.close();
  }
}, 60000);

test('SIGSTOP of the agent: bounded and counted; after SIGCONT the client uses it again and a later snapshot is written', async () => {
  const bus = await startBus();
  const client = await connect(bus);
  try {
    expect(await healthyWaves(client, 1, 3)).toBe(3);
    bus.agent.child.kill('SIGSTOP');
    const timeoutsBefore = client.stats.endOfWaveTimeouts;
    let lost;
    try {
      lost = await lostWaves(client, 4, 30);
    } finally {
      bus.agent.child.kill('SIGCONT');
    }
    expect(lost.total).toBeGreaterThan(BOUND_MS * 0.9); // it did wait once, for the bound
    expect(client.stats.agentLost).toBe(1);
    expect(client.stats.endOfWaveTimeouts - timeoutsBefore).toBeGreaterThanOrEqual(29);
    // Resumed: the engine keeps stepping; within a probe interval the agent answers and is used again.
    let w = 34;
    let snap: { captured: boolean; callDir?: string } = { captured: false };
    await waitFor(async () => {
      snap = (await wave(client, w++)).snap;
      return snap.captured;
    }, 'a snapshot after SIGCONT', 20000, 50);
    expect(client.agentUnavailable).toBe(false);
    expect(client.stats.agentBack).toBe(1);
    expect(fs.existsSync(path.join(snap.callDir!, 'meta.json'))).toBe(true);
    expect(fs.readFileSync(path.join(snap.callDir!, 'tensor0.npy')).subarray(-64)).toEqual(Buffer.alloc(64, 3));
    // The capture the frozen agent got to after the engine gave up was dropped whole.
    const names = bundles(bus.cacheRoot);
    expect(names.length).toBeLessThan(w - 1);
  } finally {
    await client.close();
  }
}, 60000);
