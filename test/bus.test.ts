// The wave bus end to end: real ZeroMQ sockets, real `wavebus agent` processes, real restarts.
import * as path from 'path';
import { Dealer, Publisher, Router } from 'zeromq';
import { AgentBus, type SnapshotReplyMsg, type WaveEvent } from '../src/bus/agent-bus';
import { Coordinator, requestStatus, type CoordinatorOptions } from '../src/bus/coordinator';
import { PROTOCOL_VERSION } from '../src/bus/protocol-version';
import { encodeAgentMessage, encodeBusFrame, encodeCoordinatorMessage, decodeAgentMessage } from '../src/bus/frames';
import { isLoopback, parseHostPort } from '../src/bus/endpoints';
import type { CoordinatorPolicy, DueLanes } from '../src/bus/policy';
import { DEFAULT_LOOKAHEAD_WAVES, decideAheadWaves } from '../src/bus/constants';
import { ConfigError } from '../src/errors';
import { agentConfig } from '../src/guard/agent-config';
import { configFromRaw, defaultConfig } from '../src/guard/config';
import { resolveIdentity } from '../src/launch/identity';
import type { WorldLayout } from '../src/layout';
import { createLogger } from '../src/log';
import type { DumpJob, DumpResult, StepTelemetry } from '../src/messages';
import { cleanup, freePortPair, portFree, runWavebus, spawnWavebus, tmpDir, waitFor, type Spawned } from './helpers';

// Typed configs as the guard builds them (src/guard/agent-config.ts), told apart by their fields.
const LANE_CONFIG = agentConfig(defaultConfig(), { hotReload: true, dumpRoot: '' });
const POLICY_CONFIG = agentConfig(configFromRaw({ dump: { manual_dump: 2, format: 'npy' } }, 'test policy'), { hotReload: false, dumpRoot: '/policy-root' });

const quiet = createLogger('bus-test', 'error');

const layoutOf = (worldSize: number, tp = worldSize, pp = 1): WorldLayout => ({ worldSize, tp, pp, dp: 1, cp: 1 });

const coordinators: Coordinator[] = [];
const agents: AgentBus[] = [];

async function startCoordinator(opts: Partial<CoordinatorOptions> & { layout: WorldLayout; port: number }): Promise<Coordinator> {
  const c = new Coordinator({ logger: quiet, heartbeatMs: 200, deadAfterMs: 5000, ...opts });
  coordinators.push(c);
  await c.start();
  return c;
}

type Ev = { kind: 'wave'; w: WaveEvent } | { kind: 'snapshot'; s: SnapshotReplyMsg } | { kind: 'resync'; reason: string };

function makeAgent(rank: number, layout: WorldLayout, port: number, extra: Partial<ConstructorParameters<typeof AgentBus>[0]> = {}) {
  const identity = resolveIdentity({}, { rank, worldSize: layout.worldSize, tp: layout.tp, pp: layout.pp });
  const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity, heartbeatMs: 200, deadAfterMs: 5000, logger: quiet, ...extra });
  const events: Ev[] = [];
  bus.on('wave', (w: WaveEvent) => events.push({ kind: 'wave', w }));
  bus.on('snapshot', (s: SnapshotReplyMsg) => events.push({ kind: 'snapshot', s }));
  bus.on('resync', (r: { reason: string }) => events.push({ kind: 'resync', reason: r.reason }));
  agents.push(bus);
  const waves = () => events.flatMap((e) => (e.kind === 'wave' ? [e.w] : []));
  return { bus, events, waves };
}

/**
 * The delivery invariant: every wave is emitted at most once, in increasing order, and a wave
 * that was not emitted is covered by a snapshot taken at or after it (a snapshot's wave is the
 * last head's: it covers the vectors up to wave + DEFAULT_LOOKAHEAD_WAVES).
 */
function checkDelivery(emitted: number[], snapshotWaves: number[], upTo: number, from = 1, ahead = DEFAULT_LOOKAHEAD_WAVES): void {
  const seen = new Set<number>();
  for (let i = 0; i < emitted.length; i++) {
    expect(seen.has(emitted[i])).toBe(false);
    seen.add(emitted[i]);
    if (i > 0) expect(emitted[i]).toBeGreaterThan(emitted[i - 1]);
  }
  const maxSnap = snapshotWaves.length > 0 ? Math.max(...snapshotWaves) + ahead : 0;
  for (let w = from; w <= upTo; w++) {
    if (!seen.has(w)) expect(maxSnap).toBeGreaterThanOrEqual(w);
  }
}

function spawnAgent(rank: number, layout: WorldLayout, port: number, extraEnv: NodeJS.ProcessEnv = {}): Spawned {
  return spawnWavebus(
    // A run dir of the test's own: one of these agents is killed with SIGKILL, which no process can clean up after.
    ['agent', '--rank', String(rank), '--world-size', String(layout.worldSize), '--tp', String(layout.tp), '--pp', String(layout.pp), '--coordinator', `127.0.0.1:${port}`, '--run-dir', path.join(tmpDir(), 'run')],
    { env: { ...process.env, WAVEBUS_LOG_LEVEL: 'debug', ...extraEnv } },
  );
}

function logLines(text: string): Array<Record<string, any>> {
  return text
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => {
      try {
        return JSON.parse(l);
      } catch {
        return {};
      }
    });
}

function job(reqId: string, over: Partial<DumpJob> = {}): DumpJob {
  return { incidentType: 'token_repeat', reqId, blockIds: [1, 2, 3], detectWave: 0, armWave: 0, dumpDir: `/tmp/x/${reqId}`, requestFinishedAtDump: false, jobId: '', replica: 0, ranks: [], ...over };
}

/** A small real policy: arms a dump when the telemetry shows a finished request; records what it is told. */
class RecordingPolicy implements CoordinatorPolicy {
  /** decideAheadWaves(pp) of the job's layout: pp - 1 waves more than DEFAULT_LOOKAHEAD_WAVES in a pipeline. */
  constructor(private readonly ahead = DEFAULT_LOOKAHEAD_WAVES) {}
  heads: Array<{ wave: number; telemetry: StepTelemetry | null }> = [];
  results: DumpResult[] = [];
  timeouts: Array<{ jobId: string; missing: number[] }> = [];
  onWaveHead(_replica: number, wave: number, telemetry: StepTelemetry | null): DueLanes {
    this.heads.push({ wave, telemetry });
    const finished = telemetry?.requests?.filter((r) => r.finished) ?? [];
    // Decided ahead: the head of `wave` publishes the vector of wave + ahead.
    return { dumps: finished.map((r) => job(r.reqId, { detectWave: wave - 1, armWave: wave + this.ahead, blockIds: r.blockIds })) };
  }
  onDumpResult(r: DumpResult): void {
    this.results.push(r);
  }
  onDumpTimeout(jobId: string, missing: number[]): void {
    this.timeouts.push({ jobId, missing });
  }
  status(): Record<string, unknown> {
    return { policy_heads: this.heads.length };
  }
  snapshotState() {
    return { configVersion: 7, config: POLICY_CONFIG, manualDumpDone: 2 };
  }
}

afterEach(async () => {
  await Promise.all(agents.splice(0).map((a) => a.stop()));
  await Promise.all(coordinators.splice(0).map((c) => c.stop()));
  await cleanup();
});

describe('endpoints', () => {
  test('parses HOST:PORT and names the flag on bad input', () => {
    expect(parseHostPort('10.0.0.5:29600')).toEqual({ host: '10.0.0.5', port: 29600 });
    expect(parseHostPort('[::1]:29600')).toEqual({ host: '::1', port: 29600 });
    expect(() => parseHostPort('nohost', '--coordinator')).toThrow(/--coordinator.*HOST:PORT.*nohost/);
    expect(() => parseHostPort('h:65535', 'WAVEBUS_COORDINATOR')).toThrow(/WAVEBUS_COORDINATOR.*port\+1/);
    expect(isLoopback('127.0.0.1')).toBe(true);
    expect(isLoopback('127.8.9.10')).toBe(true);
    expect(isLoopback('localhost')).toBe(true);
    expect(isLoopback('::1')).toBe(true);
    expect(isLoopback('0.0.0.0')).toBe(false);
    expect(isLoopback('10.1.2.3')).toBe(false);
  });
});

describe('wave bus', () => {
  test('waves and due lanes reach agent processes and in-process agents, in order; every rank joins its replica stream, only last-PP ranks are awaited', async () => {
    const port = await freePortPair();
    const layout = layoutOf(4, 2, 2); // last PP stage = ranks 2, 3
    const AHEAD = decideAheadWaves(layout.pp); // a pipeline decides pp waves ahead (every stage learns in time)
    const policy = new RecordingPolicy(AHEAD);
    const c = await startCoordinator({ port, layout, policy });
    expect(c.expectedRanks).toEqual([2, 3]);
    const notLast = spawnAgent(0, layout, port);
    const cli = spawnAgent(3, layout, port);
    const inproc = makeAgent(2, layout, port); // the replica's head (last-PP TP0)
    await inproc.bus.start();
    await waitFor(async () => (await requestStatus({ host: '127.0.0.1', port })).ready, 'bus ready');

    // The first head is wave 0, so the first vector is wave AHEAD (the pipeline's depth).
    c.setConfig(1, LANE_CONFIG);
    c.beginWave(0, null);
    c.armDumps([job('req-a')]);
    c.beginWave(1, null);
    for (let w = AHEAD + 2; w <= 9; w++) c.beginWave(w - AHEAD, null);
    // TP0's agent sends the head of wave 9 with telemetry of wave 8; the policy arms a dump from it,
    // due in the vector that head publishes: wave 10.
    const telemetry = { wave: 8, requests: [{ reqId: 'req-b', newTokenIds: [5], finished: true, blockIds: [7, 8] }] } as unknown as StepTelemetry;
    inproc.bus.sendWaveHead(10 - AHEAD, telemetry);

    await waitFor(() => inproc.bus.latest()?.wave === 10, 'in-process agent at wave 10');
    const got = inproc.waves();
    checkDelivery(got.map((w) => w.head.wave), inproc.events.flatMap((e) => (e.kind === 'snapshot' ? [e.s.wave] : [])), 10, AHEAD, AHEAD);
    const w1 = got.find((w) => w.head.wave === AHEAD);
    if (w1) expect(w1.config).toEqual({ wave: AHEAD, version: 1, config: LANE_CONFIG });
    const w2 = got.find((w) => w.head.wave === AHEAD + 1);
    if (w2) expect(w2.dump?.jobs.map((j) => j.jobId)).toEqual([`${AHEAD + 1}/token_repeat/req-a`]);
    const w10 = got.find((w) => w.head.wave === 10)!;
    expect(w10.head.dumpDue).toBe(true);
    expect(w10.dump!.jobs[0]).toMatchObject({ reqId: 'req-b', blockIds: [7, 8], armWave: 10, detectWave: 10 - AHEAD - 1 });
    expect(policy.heads.map((h) => h.wave)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8].filter((w) => w <= 10 - AHEAD));
    expect(policy.heads[policy.heads.length - 1].telemetry?.requests?.[0].reqId).toBe('req-b');
    for (const w of got) {
      expect(w.head.configDue).toBe(w.config !== undefined);
      expect(w.head.dumpDue).toBe(w.dump !== undefined);
    }

    // The agent process logs every wave it emits (debug) and every snapshot it applies.
    await waitFor(() => logLines(cli.stderr()).some((l) => l.msg === 'wave' && l.wave === 10), 'agent process at wave 10');
    const lines = logLines(cli.stderr());
    checkDelivery(
      lines.filter((l) => l.msg === 'wave').map((l) => l.wave),
      lines.filter((l) => l.msg === 'snapshot').map((l) => l.wave),
      10,
      AHEAD,
      AHEAD,
    );
    const cliW2 = lines.find((l) => l.msg === 'wave' && l.wave === AHEAD + 1);
    if (cliW2) expect(cliW2.dumps).toEqual([`${AHEAD + 1}/token_repeat/req-a`]);
    // Its heartbeats tell the coordinator where it is.
    await waitFor(async () => JSON.parse((await requestStatus({ host: '127.0.0.1', port })).statusJson).ranks['3']?.wave === 10, 'rank 3 heartbeat at wave 10');

    // The non-last-PP rank joins its replica's stream too (dump.pp_stages "all" needs it), but
    // readiness waits only for the last-PP ranks; a wave head from a rank that is not the
    // replica's head is dropped.
    await waitFor(() => c.liveRanks().includes(0), 'rank 0 on the bus');
    expect(notLast.child.exitCode).toBeNull();
    // Each agent's startup log says what it does there (src/agent/bus-role.ts).
    await waitFor(() => logLines(notLast.stderr()).some((l) => /^joins the wave bus as pp stage 0 of 2 \(not the last\): .*only while dump\.pp_stages is "all"/.test(l.msg)), 'rank 0 says its role');
    expect(logLines(cli.stderr()).find((l) => /^joins the wave bus as/.test(l.msg))).toMatchObject({ ppRank: 1, pp: 2, lastPp: true, msg: expect.stringContaining('pp stage 1 of 2 (the last)') });
    const st = await requestStatus({ host: '127.0.0.1', port });
    expect(st.liveRanks).toEqual([0, 2, 3]);
    expect(st.expectedRanks).toEqual([2, 3]);
    const notHead = makeAgent(1, layout, port);
    await notHead.bus.start();
    await waitFor(() => notHead.bus.synced, 'rank 1 synced');
    notHead.bus.sendWaveHead(11, null);
    await waitFor(() => (c.stats.dropped.not_head ?? 0) === 1, 'wave head from rank 1 dropped');
    expect(c.wave).toBe(10 - AHEAD); // the engine's last head; its vector is wave 10
    expect(st.epoch).toBe(c.epoch);
    expect(JSON.parse(st.statusJson).policy_heads).toBe(policy.heads.length); // heads 0 .. 10 - AHEAD

    // Killing an agent process makes its rank lost.
    const lost = new Promise<number>((resolve) => c.on('agent-lost', resolve));
    cli.child.kill('SIGKILL');
    expect(await lost).toBe(3);
    expect(c.ready).toBe(false);
  });

  test('readiness: ready only once every expected rank has subscribed (Hello, frame seen, snapshot asked)', async () => {
    const port = await freePortPair();
    const layout = layoutOf(2);
    const c = await startCoordinator({ port, layout });
    let readyEvents = 0;
    c.on('ready', () => readyEvents++);
    const a0 = makeAgent(0, layout, port);
    await a0.bus.start();
    await waitFor(() => a0.bus.synced, 'agent 0 synced');
    await waitFor(() => (c.status().ranks as any)['0']?.subscribed === true, 'rank 0 subscribed');
    const st = await requestStatus({ host: '127.0.0.1', port });
    expect(st.ready).toBe(false);
    expect(st.liveRanks).toEqual([0]);
    expect(readyEvents).toBe(0);

    const readyP = new Promise<void>((r) => c.once('ready', r));
    const a1 = makeAgent(1, layout, port);
    await a1.bus.start();
    await readyP;
    expect((await requestStatus({ host: '127.0.0.1', port })).ready).toBe(true);
    // Waves published right after 'ready' reach both: nobody slept, nobody missed them.
    c.beginWave(1 - DEFAULT_LOOKAHEAD_WAVES, null);
    await waitFor(() => a0.bus.latest()?.wave === 1 && a1.bus.latest()?.wave === 1, 'both at wave 1');
    expect(a0.waves().map((w) => w.head.wave)).toEqual([1]);
    expect(a1.waves().map((w) => w.head.wave)).toEqual([1]);
    expect(readyEvents).toBe(1);
  });

  test('gap recovery: lost frames trigger a snapshot; every wave is delivered once or covered by it', async () => {
    const port = await freePortPair();
    const layout = layoutOf(1);
    const c = await startCoordinator({ port, layout, dumpAckTimeoutMs: 60000 });
    let dropping = false;
    const dropped: number[] = [];
    const a = makeAgent(0, layout, port, {
      dropSeqs: (seq) => {
        if (dropping && seq % 7 === 0) {
          dropped.push(seq);
          return true;
        }
        return false;
      },
    });
    await a.bus.start();
    await waitFor(() => c.ready, 'ready');
    dropping = true;
    const jobsArmed: string[] = [];
    for (let w = 1; w <= 60; w++) {
      if (w % 10 === 0) c.setConfig(w, { ...LANE_CONFIG, freeHeadroomBytes: w });
      if (w % 4 === 0) c.armDumps([job(`r${w}`)]);
      if (w % 4 === 0) jobsArmed.push(`${w}/token_repeat/r${w}`);
      c.beginWave(w - DEFAULT_LOOKAHEAD_WAVES, null);
      if (w % 15 === 0) await new Promise((r) => setTimeout(r, 20)); // let some frames arrive mid-stream
    }
    await waitFor(() => dropped.length > 0 && a.bus.stats.resyncs > 0 && a.bus.synced, 'a gap seen and resynced');
    dropping = false;
    c.beginWave(61 - DEFAULT_LOOKAHEAD_WAVES, null);
    await waitFor(() => a.bus.latest()?.wave === 61, 'agent at wave 61');

    expect(a.bus.stats.dropped.injected).toBe(dropped.length);
    expect(a.events.some((e) => e.kind === 'resync' && e.reason === 'gap')).toBe(true);
    const snaps = a.events.flatMap((e) => (e.kind === 'snapshot' ? [e.s] : []));
    checkDelivery(a.waves().map((w) => w.head.wave), snaps.map((s) => s.wave), 61);
    // Every dump job reached the agent: in a wave's dump lane or as pending in a snapshot.
    const seenJobs = new Set<string>();
    for (const w of a.waves()) for (const j of w.dump?.jobs ?? []) seenJobs.add(j.jobId);
    for (const s of snaps) for (const l of s.pending) for (const j of l.jobs) seenJobs.add(j.jobId);
    for (const id of jobsArmed) expect(seenJobs.has(id)).toBe(true);
    // The config the agent ends with is the last one published (from a lane or a snapshot).
    let cfg = 0;
    let body: unknown = null;
    for (const e of a.events) {
      if (e.kind === 'snapshot') [cfg, body] = [e.s.configVersion, e.s.config];
      if (e.kind === 'wave' && e.w.config) [cfg, body] = [e.w.config.version, e.w.config.config];
    }
    expect(cfg).toBe(60);
    expect(body).toEqual({ ...LANE_CONFIG, freeHeadroomBytes: 60 });
  });

  test('coordinator restart on the same port (new epoch): agents resync by themselves', async () => {
    const port = await freePortPair();
    const layout = layoutOf(2);
    const c1 = await startCoordinator({ port, layout });
    const proc = spawnAgent(0, layout, port);
    const a = makeAgent(1, layout, port);
    await a.bus.start();
    await waitFor(() => c1.ready, 'first coordinator ready');
    c1.beginWave(1 - DEFAULT_LOOKAHEAD_WAVES, null);
    await waitFor(() => a.bus.latest()?.wave === 1, 'wave 1 from the first coordinator');
    const epoch1 = c1.epoch;
    await c1.stop();
    // libzmq releases a closed socket's port on its I/O thread, a moment after close()
    await waitFor(async () => (await portFree(port)) && (await portFree(port + 1)), 'the first coordinator\'s ports released');

    const c2 = await startCoordinator({ port, layout });
    expect(c2.epoch).not.toBe(epoch1);
    await waitFor(() => c2.ready, 'second coordinator ready (both agents resubscribed)', 30000);
    await waitFor(() => a.bus.currentEpoch === c2.epoch && a.bus.synced, 'in-process agent on the new epoch');
    expect(a.events.some((e) => e.kind === 'resync' && (e.reason === 'epoch' || e.reason === 'coordinator-silent'))).toBe(true);
    c2.beginWave(1 - DEFAULT_LOOKAHEAD_WAVES, null);
    c2.beginWave(2 - DEFAULT_LOOKAHEAD_WAVES, null);
    await waitFor(() => a.bus.latest()?.wave === 2 && a.bus.latest()?.epoch === c2.epoch, 'wave 2 of the new epoch');
    await waitFor(() => logLines(proc.stderr()).some((l) => l.msg === 'wave' && l.wave === 2), 'agent process got wave 2 of the new epoch');
    const snaps = logLines(proc.stderr()).filter((l) => l.msg === 'snapshot');
    expect(snaps.map((s) => s.epoch)).toContain(c2.epoch);
  });

  test('an agent started before its coordinator keeps trying and joins when it appears', async () => {
    const port = await freePortPair();
    const layout = layoutOf(1);
    const a = makeAgent(0, layout, port);
    await a.bus.start();
    await new Promise((r) => setTimeout(r, 600)); // a few heartbeat periods with nobody there
    expect(a.bus.synced).toBe(false);
    const c = await startCoordinator({ port, layout });
    await waitFor(() => c.ready, 'ready after the late coordinator start');
    c.beginWave(1 - DEFAULT_LOOKAHEAD_WAVES, null);
    await waitFor(() => a.bus.latest()?.wave === 1, 'wave 1');
    expect(a.bus.currentEpoch).toBe(c.epoch);
  });

  test('garbage on the ROUTER is dropped and counted by reason; the bus keeps working', async () => {
    const port = await freePortPair();
    const layout = layoutOf(1);
    const c = await startCoordinator({ port, layout, maxFrameBytes: 4096 });
    const a = makeAgent(0, layout, port);
    await a.bus.start();
    await waitFor(() => c.ready, 'ready');

    const rogue = new Dealer({ linger: 0 });
    rogue.connect(`tcp://127.0.0.1:${port + 1}`);
    const valid = encodeAgentMessage({ globalRank: 0, hello: { identity: { globalRank: 0, host: 'x'.repeat(200) }, subscribed: false } });
    await rogue.send(Buffer.from('this is not protobuf \xff\xff\xff\xff', 'latin1'));
    await rogue.send(valid.subarray(0, valid.length - 50)); // truncated
    await rogue.send(Buffer.alloc(5000, 0x08)); // oversized
    await rogue.send([valid, valid]); // wrong number of frames
    await rogue.send(Buffer.alloc(0)); // decodes, but has no body
    await rogue.send(encodeAgentMessage({ globalRank: 0, epochSeen: 12345, requestId: 9, status: { protocolVersion: PROTOCOL_VERSION } })); // wrong epoch_seen: accepted
    const [reply] = await rogue.receive();
    await waitFor(() => (c.stats.dropped.empty ?? 0) >= 1, 'all garbage processed');
    expect(c.stats.dropped).toMatchObject({ undecodable: 1, truncated: 1, oversized: 1, frame_count: 1, empty: 1 });
    expect(c.stats.wrongEpochSeen).toBeGreaterThanOrEqual(1);
    const { CoordinatorMessage, decode } = await import('../src/proto');
    const st = decode(CoordinatorMessage, reply);
    expect(st.body).toBe('status');
    expect(st.requestId).toBe(9);
    expect(st.status.epoch).toBe(c.epoch);
    rogue.close();

    c.beginWave(1 - DEFAULT_LOOKAHEAD_WAVES, null);
    await waitFor(() => a.bus.latest()?.wave === 1, 'wave still delivered after garbage');
    expect(c.ready).toBe(true);
  });

  test('garbage on a rogue PUB is dropped and counted; a wrong epoch is resynced away; valid waves still arrive', async () => {
    const port = await freePortPair();
    const E = 4242;
    const pub = new Publisher({ linger: 0 });
    const router = new Router({ linger: 0 });
    await pub.bind(`tcp://127.0.0.1:${port}`);
    await router.bind(`tcp://127.0.0.1:${port + 1}`);
    let seq = 100;
    let snapshotsServed = 0;
    // A minimal stand-in coordinator built from raw sockets: answers snapshot requests only.
    const serve = (async () => {
      for (;;) {
        let parts: Buffer[];
        try {
          parts = await router.receive();
        } catch {
          return;
        }
        const d = decodeAgentMessage(parts[1], 1 << 20);
        if (d.ok && d.value.body === 'snapshot') {
          snapshotsServed++;
          // The first answer says the stream decides 7 waves ahead, which no pp=1 layout allows
          // (at most 6, the mailbox's ring): dropped, and the agent asks again.
          const decideAhead = snapshotsServed === 1 ? 7 : 1;
          await router.send([parts[0], encodeCoordinatorMessage({ epoch: E, requestId: d.value.requestId, snapshot: { epoch: E, seq, wave: 5, configVersion: 3, config: LANE_CONFIG, protocolVersion: PROTOCOL_VERSION, decideAhead } })]);
        }
      }
    })();
    const layout = layoutOf(1);
    const a = makeAgent(0, layout, port, { maxFrameBytes: 4096 });
    await a.bus.start();
    await waitFor(async () => {
      await pub.send(encodeBusFrame(E, ++seq, 'heartbeat', { wave: 5, unixMs: Date.now() }));
      return a.bus.synced;
    }, 'agent synced to the stand-in', 20000, 50);
    expect(a.events.find((e) => e.kind === 'snapshot')).toMatchObject({ s: { epoch: E, wave: 5, configVersion: 3, decideAhead: 1 } });
    expect(a.bus.stats.dropped.bad_snapshot).toBe(1);

    const head = (s: number, wave: number) => encodeBusFrame(E, s, 'head', { epoch: E, seq: s, wave, configDue: false, dumpDue: false });
    // Topics are per replica ("r<dp>.<kind>"): the agent of replica 0 subscribes to "r0." only.
    await pub.send(['r0.W', Buffer.from('definitely not protobuf \xff\xff\xff', 'latin1')]);
    const good = head(999, 6)[1];
    await pub.send(['r0.W', good.subarray(0, good.length - 3)]); // truncated
    await pub.send(['r0.W', Buffer.alloc(5000, 0x08)]); // oversized
    await pub.send(['r0.Q', head(seq + 1, 6)[1]]); // unknown topic (X is a head with work: frames.ts)
    await pub.send(['r0.C', head(seq + 1, 6)[1]]); // topic does not match the body
    await pub.send(['r0.W', encodeBusFrame(E, seq + 1, 'head', { epoch: E, seq: seq + 1, wave: 6 }, false, 1)[1]]); // a replica-1 frame under replica 0's topic
    await pub.send(['r1.W', head(seq + 1, 6)[1]]); // another replica's stream: filtered by the subscription, never seen
    await pub.send(['r0.W', head(seq + 1, 6)[1], Buffer.from('extra')]); // wrong number of frames
    await pub.send(['r0.W', encodeBusFrame(E, 0, 'head', { wave: 6 })[1]]); // no seq
    await waitFor(() => (a.bus.stats.dropped.empty ?? 0) >= 1, 'garbage processed');
    expect(a.bus.stats.dropped).toMatchObject({ undecodable: 1, truncated: 1, oversized: 1, wrong_topic: 3, frame_count: 1, empty: 1 });
    expect(a.bus.synced).toBe(true);
    expect(a.bus.stats.resyncs).toBe(0);

    // A frame from a foreign epoch: the agent asks for a snapshot, which says epoch E, so the
    // foreign frame is dropped and the agent stays on E.
    await pub.send(encodeBusFrame(777, 1, 'head', { epoch: 777, seq: 1, wave: 1 }));
    await waitFor(() => (a.bus.stats.dropped.wrong_epoch ?? 0) >= 1 && a.bus.synced, 'foreign epoch dropped');
    expect(a.bus.stats.resyncs).toBe(1);
    expect(a.bus.currentEpoch).toBe(E);
    expect(snapshotsServed).toBe(3); // the dropped one, the good one, the resync

    seq++;
    await pub.send(head(seq, 6));
    await waitFor(() => a.bus.latest()?.wave === 6, 'valid wave 6 delivered');
    expect(a.waves().map((w) => w.head.wave)).toEqual([6]);

    await a.bus.stop();
    pub.close();
    router.close();
    await serve;
  });

  test('dump acks: complete when every expected rank acks; a timeout names the missing ranks', async () => {
    const port = await freePortPair();
    const layout = layoutOf(2);
    const policy = new RecordingPolicy();
    const c = await startCoordinator({ port, layout, policy, dumpAckTimeoutMs: 1500 });
    const a0 = makeAgent(0, layout, port);
    const a1 = makeAgent(1, layout, port);
    await Promise.all([a0.bus.start(), a1.bus.start()]);
    await waitFor(() => c.ready, 'ready');

    // Snapshot content: config/manual-dump state from the policy, pending dump lanes.
    c.armDumps([job('req-1'), job('req-2')]);
    c.beginWave(1 - DEFAULT_LOOKAHEAD_WAVES, null);
    await waitFor(() => a0.bus.latest()?.wave === 1 && a1.bus.latest()?.wave === 1, 'wave 1 everywhere');
    const late = makeAgent(0, layout, port);
    await late.bus.start();
    await waitFor(() => late.events.some((e) => e.kind === 'snapshot'), 'late snapshot');
    const snap = late.events.find((e) => e.kind === 'snapshot')! as { kind: 'snapshot'; s: SnapshotReplyMsg };
    // The snapshot's wave is the engine's last head; the vector it covers is wave + DEFAULT_LOOKAHEAD_WAVES.
    expect(snap.s).toMatchObject({ epoch: c.epoch, wave: 1 - DEFAULT_LOOKAHEAD_WAVES, configVersion: 7, config: POLICY_CONFIG, manualDumpDone: 2 });
    expect(snap.s.pending).toHaveLength(1);
    expect(snap.s.pending[0].jobs.map((j) => j.jobId).sort()).toEqual(['1/token_repeat/req-1', '1/token_repeat/req-2']);
    await late.bus.stop();

    const complete = new Promise<any>((r) => c.once('dump-complete', r));
    const timeout = new Promise<any>((r) => c.once('dump-timeout', r));
    const result = (rank: number, reqId: string): DumpResult => ({
      globalRank: rank,
      jobId: `1/token_repeat/${reqId}`,
      wave: 1,
      files: [{ path: `dp0_tp${rank}_pp0_cp0/layer0.pt`, bytes: 10, checksum: 'crc32c:00000000' }],
      bytes: 10,
      error: '',
      skippedReason: '',
    });
    a0.bus.sendDumpResult(result(0, 'req-1'));
    a1.bus.sendDumpResult(result(1, 'req-1'));
    a0.bus.sendDumpResult(result(0, 'req-2'));
    const done = await complete;
    expect(done.jobId).toBe('1/token_repeat/req-1');
    expect(done.results.map((r: DumpResult) => r.globalRank).sort()).toEqual([0, 1]);
    expect(await timeout).toEqual({ jobId: '1/token_repeat/req-2', missing: [1] });
    expect(policy.timeouts).toEqual([{ jobId: '1/token_repeat/req-2', missing: [1] }]);
    expect(policy.results.map((r) => `${r.globalRank}:${r.jobId}`).sort()).toEqual(['0:1/token_repeat/req-1', '0:1/token_repeat/req-2', '1:1/token_repeat/req-1']);
    expect(c.pendingDumpLanes()).toEqual([]);
  });

  test('requestFromAgent: correlated replies, handler errors and unknown ranks', async () => {
    const port = await freePortPair();
    const layout = layoutOf(2);
    const c = await startCoordinator({ port, layout });
    const a0 = makeAgent(0, layout, port);
    const a1 = makeAgent(1, layout, port);
    a0.bus.onRequest(async (req) => ({ fileList: { globalRank: 0, files: [{ path: `${req.fileList.root}/${req.fileList.prefix}a.pt`, bytes: 3, checksum: 'crc32c:01020304' }] } }));
    a1.bus.onRequest(async () => {
      throw new Error('disk on fire');
    });
    await Promise.all([a0.bus.start(), a1.bus.start()]);
    await waitFor(() => c.ready, 'ready');
    const [r0, r0b, r1] = await Promise.all([
      c.requestFromAgent(0, { fileList: { root: 'dumps', prefix: 'x/' } }),
      c.requestFromAgent(0, { fileList: { root: 'snapshots', prefix: '' } }),
      c.requestFromAgent(1, { fileList: { root: 'dumps', prefix: '' } }),
    ]);
    expect(r0.fileList.files[0].path).toBe('dumps/x/a.pt');
    expect(r0b.fileList.files[0].path).toBe('snapshots/a.pt');
    expect(r1.fileList.error).toMatch(/rank 1: disk on fire/);
    await expect(c.requestFromAgent(5, { fileList: {} })).rejects.toMatchObject({ code: 'ERR_UNKNOWN_RANK' });
  });

  test('non-loopback bind is refused without --insecure (library and CLI)', async () => {
    const port = await freePortPair();
    const c = new Coordinator({ host: '0.0.0.0', port, layout: layoutOf(1), logger: quiet });
    const err = await c.start().then(() => null, (e) => e);
    expect(err).toBeInstanceOf(ConfigError);
    expect(err.code).toBe('ERR_INSECURE_BIND');
    expect(err.message).toMatch(/--host 0\.0\.0\.0/);
    expect(err.message).toMatch(/CURVE/);
    expect(err.message).toMatch(/--insecure/);
    expect(await portFree(port)).toBe(true); // nothing was bound

    const r = runWavebus(['coordinator', '--host', '0.0.0.0', '--port', String(port), '--world-size', '1']);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/--host 0\.0\.0\.0.*--insecure/);
  });

  test('port in use: a clear error naming the port (library and CLI)', async () => {
    const port = await freePortPair();
    await startCoordinator({ port, layout: layoutOf(1) });
    const err = await new Coordinator({ port, layout: layoutOf(1), logger: quiet }).start().then(() => null, (e) => e);
    expect(err).toBeInstanceOf(ConfigError);
    expect(err.code).toBe('ERR_PORT_IN_USE');
    expect(err.message).toContain(`port ${port}`);

    const r = runWavebus(['coordinator', '--port', String(port), '--world-size', '1']);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain(`port ${port}`);
    expect(r.stderr).toContain('ERR_PORT_IN_USE');
  });
});

describe('CLI', () => {
  test('coordinator and agent processes: ready, status over the ROUTER, clean exit on SIGTERM/SIGINT', async () => {
    const port = await freePortPair();
    const coord = spawnWavebus(['coordinator', '--port', String(port), '--world-size', '2', '--heartbeat-ms', '200']);
    await waitFor(() => coord.stdout().includes('"event":"started"'), 'coordinator started line');
    const a0 = spawnAgent(0, layoutOf(2), port);
    const a1 = spawnWavebus(['agent', '--rank', '1', '--world-size', '2'], { env: { ...process.env, WAVEBUS_COORDINATOR: `127.0.0.1:${port}` } });
    await waitFor(async () => (await requestStatus({ host: '127.0.0.1', port })).ready, 'processes ready');
    expect(coord.stdout()).toContain('"event":"ready"');
    a0.child.kill('SIGTERM');
    a1.child.kill('SIGINT');
    expect((await a0.exited).code).toBe(0);
    expect((await a1.exited).code).toBe(0);
    coord.child.kill('SIGTERM');
    expect((await coord.exited).code).toBe(0);
    expect(await portFree(port)).toBe(true);
    expect(await portFree(port + 1)).toBe(true);
  });

  test('bad flags and variables exit non-zero naming the flag and value', () => {
    const bad: Array<[string[], NodeJS.ProcessEnv, RegExp]> = [
      [['agent', '--rank', 'abc', '--world-size', '2'], {}, /--rank.*abc/],
      [['agent', '--rank', '0', '--world-size', '1', '--coordinator', 'nohost'], {}, /--coordinator.*nohost/],
      [['agent', '--rank', '0', '--world-size', '1'], { WAVEBUS_COORDINATOR: 'h:99999' }, /WAVEBUS_COORDINATOR.*99999/],
      [['agent', '--rank', '0', '--world-size', '1', '--heartbeat-ms', '0'], {}, /--heartbeat-ms.*"0"/],
      [['coordinator', '--port', '70000', '--world-size', '1'], {}, /--port.*70000/],
      [['coordinator', '--world-size', '1'], { WAVEBUS_PORT: 'x1' }, /WAVEBUS_PORT.*x1/],
      [['coordinator', '--world-size', '4', '--tp', '3'], {}, /tp\(3\)/],
    ];
    for (const [args, env, re] of bad) {
      const r = runWavebus(args, { env: { ...process.env, ...env }, timeout: 20000 });
      expect({ args, code: r.code === 0 }).toEqual({ args, code: false });
      expect(r.stderr).toMatch(re);
    }
  });
});
