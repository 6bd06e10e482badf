// A dead (kill -9) or frozen (SIGSTOP) agent must not stall the engine: every client call is
// bounded, the loss is detected within one bound, later calls skip the agent at once (counted),
// and a frozen agent that resumes is used again. Real coordinator and agent processes, real
// ZeroMQ sockets and shared memory; the engine is the TypeScript client in this process, the
// Python client in a python3 process, or `wavebus sim`.
import * as fs from 'fs';
import * as path from 'path';
import { WavebusClient } from '../src/client/client';
import { MailboxFeature, MailboxReader } from '../src/client/mailbox';
import { ShmSegment } from '../src/memory';
import { PYTHON, ROOT, cleanup, freePortPair, runQueueMs, spawnTracked, spawnWavebus, tmpDir, waitFor, type Spawned } from './helpers';

const BOUND_MS = 200;
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
  // Startup writes defaults <- overlay to the live file (seed): the detectors come in the overlay.
  const coordinator = spawnWavebus(['coordinator', '--port', String(port), '--world-size', String(world), '--tp', String(world), '--heartbeat-ms', '200', '--runtime-config-path', cfg,
    '--additional-config', JSON.stringify({ runtime_config: DETECTORS_ON })]);
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
  // The mailbox file exists before the agent has written its header (a loaded host can hold the
  // agent in between): connect once it is whole.
  const client = await waitFor(() => WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: bus.runDir, LOCAL_RANK: '0' } }), 'a whole agent mailbox to connect to', 30000);
  const want = MailboxFeature.BUS_ACTIVE | MailboxFeature.SNAPSHOTS;
  await waitFor(() => (client.featureFlags() & want) === want, 'bus and snapshots on in the mailbox', 30000);
  await client.register({ name: 'input0', shmName: bus.shmName, nbytes: 4096, dtype: 'int32', shape: [1024], role: 'input' });
  return client;
}

/** One engine step; the time of each call, less what this thread spent waiting for a CPU (runQueueMs). */
async function wave(client: WavebusClient, w: number) {
  const t = (): number => performance.now() - runQueueMs();
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

/** Step until a forward is captured: the agent is up and answering (a cold agent on a loaded host
 * may miss the first bound; the client then probes it again within a second). Returns the next wave. */
async function untilCaptured(client: WavebusClient, from: number): Promise<number> {
  let w = from;
  await waitFor(async () => (await wave(client, w++)).snap.captured, 'a captured forward', 20000, 20);
  return w;
}

/**
 * Waves against a lost agent: each call comes back within 5x the bound; the stall is about one bound.
 * Measured without the time a loaded host kept this thread off the CPU (wave()): that is no wait on the agent.
 */
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
    const next = await untilCaptured(client, 1);
    const lostBefore = client.stats.agentLost;
    bus.agent.child.kill('SIGKILL');
    await bus.agent.exited;
    const timeoutsBefore = client.stats.endOfWaveTimeouts;
    await lostWaves(client, next, 30);
    expect(client.agentUnavailable).toBe(true);
    expect(client.stats.agentLost - lostBefore).toBe(1);
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
    let w = await untilCaptured(client, 1);
    const lostBefore = client.stats.agentLost;
    const backBefore = client.stats.agentBack;
    bus.agent.child.kill('SIGSTOP');
    const timeoutsBefore = client.stats.endOfWaveTimeouts;
    let lost;
    try {
      lost = await lostWaves(client, w, 30);
    } finally {
      bus.agent.child.kill('SIGCONT');
    }
    w += 30;
    expect(lost.total).toBeGreaterThan(BOUND_MS * 0.9); // it did wait once, for the bound
    expect(client.stats.agentLost - lostBefore).toBe(1);
    expect(client.stats.endOfWaveTimeouts - timeoutsBefore).toBeGreaterThanOrEqual(29);
    // Resumed: the engine keeps stepping; within a probe interval the agent answers and is used again.
    let snap: { captured: boolean; callDir?: string } = { captured: false };
    await waitFor(async () => {
      snap = (await wave(client, w++)).snap;
      return snap.captured;
    }, 'a snapshot after SIGCONT', 20000, 50);
    expect(client.agentUnavailable).toBe(false);
    // Back at least once (an agent working through its backlog on a loaded host may miss a bound again, and come back again).
    expect(client.stats.agentBack - backBefore).toBeGreaterThanOrEqual(1);
    expect(fs.existsSync(path.join(snap.callDir!, 'meta.json'))).toBe(true);
    expect(fs.readFileSync(path.join(snap.callDir!, 'tensor0.npy')).subarray(-64)).toEqual(Buffer.alloc(64, 3));
    // The capture the frozen agent got to after the engine gave up was dropped whole.
    const names = bundles(bus.cacheRoot);
    expect(names.length).toBeLessThan(w - 1);
  } finally {
    await client.close();
  }
}, 60000);

/** The mailbox's capture_waiting word (offset 56, docs/native.md), as the agent reads it. */
function captureWaiting(runDir: string): bigint {
  const b = Buffer.alloc(8);
  const fd = fs.openSync(path.join(runDir, 'mailbox-local0'), 'r');
  try {
    fs.readSync(fd, b, 0, 8, 56);
  } finally {
    fs.closeSync(fd);
  }
  return b.readBigUInt64LE(0);
}

test('a copy made after the engine stopped waiting is dropped, even inside its deadlines: the mailbox word says whether it still waits', async () => {
  const bus = await startBus();
  const client = await connect(bus);
  try {
    const w = await untilCaptured(client, 1);
    // The client cleared its word on the way out of every beforeForward.
    expect(captureWaiting(bus.runDir)).toBe(0n);
    const before = bundles(bus.cacheRoot).length;
    // The race this closes: an agent descheduled between its deadline check and its "capturing"
    // reply past the client's margin. The client gave up and cleared its word; the deadlines in the
    // request still lie ahead. Here that request is sent as such a client sent it.
    const transport = (client as unknown as { transport: { request(b: unknown, t: number, c?: number): Promise<Record<string, any>> } }).transport;
    const request = (ticket: number) => ({
      beforeForward: {
        context: { compilationHash: 'h', globalStep: w },
        inputs: [{ region: 'input0', offset: 0, dtype: 'int32', shape: [16] }],
        acceptByUnixMs: Date.now() + 60000,
        finishByUnixMs: Date.now() + 120000,
        wave: w,
        waitTicket: ticket,
      },
    });
    const gone = await transport.request(request(777), 10000, 10000);
    expect(gone).toMatchObject({ ok: false, errorCode: 'ERR_CLIENT_GONE' });
    expect(gone.error).toContain('no longer holds ticket 777');
    expect(bundles(bus.cacheRoot)).toHaveLength(before); // nothing left under a call name
    // The same request while the word holds its ticket (the client still waits) is captured.
    const reader = MailboxReader.open(path.join(bus.runDir, 'mailbox-local0'));
    try {
      reader.setCaptureWaiting(778);
      expect(captureWaiting(bus.runDir)).toBe(778n);
      const kept = await transport.request(request(778), 10000, 10000);
      expect(kept).toMatchObject({ ok: true, captured: true });
      expect(fs.existsSync(path.join(kept.callDir, 'meta.json'))).toBe(true);
    } finally {
      reader.setCaptureWaiting(0);
      reader.close();
    }
    expect(bundles(bus.cacheRoot)).toHaveLength(before + 1);
  } finally {
    await client.close();
  }
}, 60000);

test("a forward the agent reaches after the engine's deadline is not captured, counted as skipped: not a failed capture, and the agent is not taken for lost", async () => {
  const bus = await startBus();
  const client = await connect(bus);
  try {
    const w = await untilCaptured(client, 1);
    const before = bundles(bus.cacheRoot).length;
    const skipped = client.stats.snapshotsSkipped;
    // The late agent is a test double of the clock: this process's wall clock (what acceptBy is
    // computed from) runs 1 s behind for this forward, so the agent (its own process, the real
    // clock) reaches the request past acceptBy while the client still waits (its wait is a timer).
    const real = Date.now.bind(Date);
    const behind = jest.spyOn(Date, 'now').mockImplementation(() => real() - 1000);
    let late: Awaited<ReturnType<WavebusClient['beforeForward']>>;
    try {
      late = await client.beforeForward({ compilationHash: 'h', globalStep: w }, [{ region: 'input0', dtype: 'int32', shape: [16] }]);
    } finally {
      behind.mockRestore();
    }
    // Offered and skipped (the agent answered ERR_CLIENT_GONE, nothing copied): not a CaptureError.
    expect(late).toEqual({ captured: false });
    expect(client.stats.snapshotsSkipped).toBe(skipped + 1);
    expect(client.lastError).toMatch(/after the engine's deadline; not captured/);
    expect(client.agentUnavailable).toBe(false);
    expect(client.stats.agentLost).toBe(0);
    expect(bundles(bus.cacheRoot)).toHaveLength(before);
  } finally {
    await client.close();
  }
}, 60000);

/** The same engine loop in python3 with clients/python's Client; the agent is killed or frozen from there. */
const PY_ENGINE = `
import json, os, signal, sys, time
from wavebus_client import Client
pid, mode, shm, bound = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
c = Client.connect()
deadline = time.monotonic() + 30
while c.features & 13 != 13:
    assert time.monotonic() < deadline, "bus and snapshots never came on"
    time.sleep(0.02)
c.register({"name": "input0", "shm_name": shm, "nbytes": 4096, "dtype": "int32", "shape": [1024]})
def now():
    # Less the time this thread waited for a CPU (/proc/thread-self/schedstat): a loaded host's stall is no wait on the agent.
    with open("/proc/thread-self/schedstat") as f:
        return time.monotonic() - int(f.read().split()[1]) / 1e9
def wave(w):
    t0 = now()
    c.wave_head(w, {"requests": [], "non_finite": []})
    t1 = now()
    cap, call_dir = c.before_forward({"compilation_hash": "h", "global_step": w}, [("input0", 0, "int32", [16])])
    t2 = now()
    r = c.end_of_wave(w)
    t3 = now()
    return cap, call_dir, r, [(t1 - t0) * 1000, (t2 - t1) * 1000, (t3 - t2) * 1000]
# Step until a forward is captured (a cold agent on a loaded host may miss the first bound).
w, deadline = 1, time.monotonic() + 20
while not wave(w)[0]:
    assert time.monotonic() < deadline, "no forward captured while the agent was up"
    w += 1
# (.get/getattr: the same script runs, and fails on its timing, against a client without these)
out = {"healthy": w, "lost_before": c.stats.get("agent_lost", 0), "back_before": c.stats.get("agent_back", 0)}
os.kill(pid, signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
if mode == "kill":
    time.sleep(0.2)  # (not our child: no waitpid) the socket sees it gone
before = c.stats["end_of_wave_timeouts"]
per_call, captured = [], 0
try:
    for w in range(w + 1, w + 31):
        cap, _, r, ms = wave(w)
        per_call += ms
        captured += cap
finally:
    if mode == "stop":
        os.kill(pid, signal.SIGCONT)
out.update(per_call=per_call, captured_while_lost=captured, unavailable=getattr(c, "agent_unavailable", None),
           timeouts=c.stats["end_of_wave_timeouts"] - before, stats=dict(c.stats))  # a copy: the counts while lost
if mode == "stop":
    w, later = w + 1, None
    deadline = time.monotonic() + 20
    while later is None and time.monotonic() < deadline:
        cap, call_dir, _, _ = wave(w)
        w += 1
        if cap:
            later = call_dir
        time.sleep(0.05)
    out.update(later=later, back=c.stats.get("agent_back", 0), unavailable_after=getattr(c, "agent_unavailable", None))
c.close()
print(json.dumps(out))
`;

async function pythonEngine(mode: 'kill' | 'stop') {
  const bus = await startBus();
  const pyEnv = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1', WAVEBUS_RUN_DIR: bus.runDir, LOCAL_RANK: '0' };
  const p = spawnTracked(PYTHON, ['-c', PY_ENGINE, String(bus.agent.child.pid), mode, bus.shmName, String(BOUND_MS)], { env: pyEnv });
  const done = await p.exited;
  if (done.code !== 0) throw new Error(`python engine exited ${done.code}: ${p.stderr()}`);
  const out = JSON.parse(p.stdout().trim().split('\n').pop()!);
  expect(out.healthy).toBeGreaterThan(0);
  expect(Math.max(...out.per_call)).toBeLessThan(5 * BOUND_MS);
  expect(out.per_call.reduce((a: number, b: number) => a + b, 0)).toBeLessThan(5 * BOUND_MS);
  expect(out.captured_while_lost).toBe(0);
  expect(out.unavailable).toBe(true);
  expect(out.stats.agent_lost - out.lost_before).toBe(1);
  expect(out.timeouts).toBeGreaterThanOrEqual(29);
  expect(out.stats.snapshots_skipped).toBeGreaterThanOrEqual(29);
  expect(p.stderr()).toContain('is not answering');
  return { bus, out };
}

test('python client: kill -9 of the agent keeps every call bounded and the run going', async () => {
  const { bus } = await pythonEngine('kill');
  bundles(bus.cacheRoot);
}, 60000);

test('python client: SIGSTOP is bounded and counted; after SIGCONT it recovers and a later snapshot is written', async () => {
  const { bus, out } = await pythonEngine('stop');
  expect(out.later).toBeTruthy();
  expect(out.back - out.back_before).toBeGreaterThanOrEqual(1); // as in the TypeScript case: back, perhaps more than once
  expect(out.unavailable_after).toBe(false);
  expect(fs.existsSync(path.join(out.later, 'meta.json'))).toBe(true);
  bundles(bus.cacheRoot);
}, 60000);

test('wavebus sim keeps stepping after its agent is killed', async () => {
  const bus = await startBus();
  const resultDir = path.join(bus.root, 'ranks');
  const steps = 400;
  const sim = spawnWavebus(['sim', '--nproc-per-node', '1', '--steps', String(steps), '--step-ms', '20', '--requests', '2', '--layers', '1', '--num-blocks', '16', '--result-dir', resultDir], {
    env: { ...process.env, WAVEBUS_RUN_DIR: bus.runDir, WAVEBUS_NNODES: '1', WAVEBUS_NODE_RANK: '0', WAVEBUS_NPROC_PER_NODE: '1', MASTER_ADDR: '127.0.0.1' },
  });
  // Kill the agent once the sim has captured a few forwards (mid-run). A call dir on disk is written
  // before its reply reaches the sim, so wait for two: the sim asked for the second only after the
  // first reply came back.
  const snaps = path.join(bus.cacheRoot, 'snapshots');
  const calls = (): number => (fs.existsSync(snaps) ? fs.readdirSync(snaps).reduce((n, h) => n + fs.readdirSync(path.join(snaps, h, 'rank0')).filter((c) => /^call\d+$/.test(c)).length, 0) : 0);
  await waitFor(() => calls() >= 2, 'the sim to capture twice', 60000);
  bus.agent.child.kill('SIGKILL');
  await bus.agent.exited;
  const done = await sim.exited;
  expect({ code: done.code, stderr: done.code === 0 ? '' : sim.stderr().slice(-2000) }).toEqual({ code: 0, stderr: '' });
  const r = JSON.parse(fs.readFileSync(path.join(resultDir, 'rank0.json'), 'utf8'));
  expect(r.steps).toBe(steps);
  expect(r.agentLost).toBe(1);
  expect(r.skippedUnavailable).toBeGreaterThan(0);
  expect(r.snapshots.length).toBeGreaterThan(0);
  expect(r.snapshots.length).toBeLessThan(steps);
}, 180000);

/**
 * The tensor path's rows when heads cannot go: a free takes effect with the head that carries it,
 * and an engine binds the freed row at once after wave_head whatever it returned. A head the agent
 * cannot take (the hello unanswered by a frozen agent; the queue to it full) must let its frees take
 * effect too, or the engine's next arrive() raises in the middle of its step.
 */
const PY_ROWS = `
import json, os, signal, sys, time
import numpy as np
from wavebus_client import Client
from wavebus_client.mailbox import FEATURE_BUS, FEATURE_HEADS
pid, rows = int(sys.argv[1]), 8
c = Client.connect()
b = c.tensor_batch(rows, vocab=1000)
deadline = time.monotonic() + 30
while c.features & (FEATURE_BUS | FEATURE_HEADS) == 0:  # heads are sent only while the bus is on
    assert time.monotonic() < deadline, "the bus never came on"
    time.sleep(0.02)
os.kill(pid, signal.SIGSTOP)  # before the first head: its hello goes unanswered
out = {}
r, toks, lps = np.arange(rows, dtype=np.int64), np.zeros(rows, dtype=np.int32), np.zeros(rows, dtype=np.float32)
nxt, w = rows, 0
def step():
    # One step's rows: one request finishes and is freed, the head, and a new request takes the
    # row at once, as a serving engine reuses its rows.
    global nxt, w
    w += 1
    row = w % rows
    b.finish(row)
    b.free(row)
    sent = b.wave_head(w, r, toks, lps)
    b.arrive(row, f"req-{nxt}")
    nxt += 1
    return sent
try:
    for i in range(rows):
        b.arrive(i, f"req-{i}")
    out["first"] = {"sent": step(), "unavailable": c.agent_unavailable}
    os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while not step():  # until the client found the agent back (its probe) and a head went
        assert time.monotonic() < deadline, "no head went after SIGCONT"
        time.sleep(0.01)
    # Frozen again: heads go into the ring's slots, then as messages it never reads, until the
    # queue to it is full and a head cannot go.
    os.kill(pid, signal.SIGSTOP)
    skipped0, n = c.stats["wave_head_skipped"], 0
    while c.stats["wave_head_skipped"] == skipped0:
        step()
        n += 1
        assert n < 200000, "the queue to the agent never filled"
    for _ in range(100):
        step()
    out.update(after_back=n, skipped=c.stats["wave_head_skipped"] - skipped0, live=b.live, inline=b.stats["inline_heads"], unavailable=c.agent_unavailable)
finally:
    os.kill(pid, signal.SIGCONT)
c.close()
print(json.dumps(out))
`;

test('python client, tensor path: heads that cannot go (hello unanswered, queue to the agent full) let their frees take effect; the engine rebinds its rows at once', async () => {
  const bus = await startBus();
  const pyEnv = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1', WAVEBUS_RUN_DIR: bus.runDir, LOCAL_RANK: '0' };
  const p = spawnTracked(PYTHON, ['-c', PY_ROWS, String(bus.agent.child.pid)], { env: pyEnv });
  const done = await p.exited;
  expect({ code: done.code, stderr: done.code === 0 ? '' : p.stderr().slice(-2000) }).toEqual({ code: 0, stderr: '' });
  const out = JSON.parse(p.stdout().trim().split('\n').pop()!);
  expect(out.first).toEqual({ sent: false, unavailable: true });
  expect(out.live).toBe(8);
  // With the agent frozen again, heads went into the ring's slots, then as messages, then the
  // queue was full: the last 100 steps (and the one that filled it) were skipped, rows rebound.
  expect(out.inline).toBeGreaterThan(0);
  expect(out.skipped).toBeGreaterThanOrEqual(100);
  expect(out.unavailable).toBe(false); // a full queue is not a lost agent: nothing asked it
}, 60000);
