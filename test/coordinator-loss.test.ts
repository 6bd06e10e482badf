// A dead coordinator in a running job (`wavebus launch`, `wavebus sim` TP=2, 40 ms steps, the
// default 50 ms bound): the engine pays one bound once per rank and then nothing (its steps per
// second stay within 5 % of its rate before the kill, measured; asserted within 10 % on this shared
// VM, with the bounds actually waited counted), launch starts the coordinator again, and a
// manual dump after that is complete (docs/faults.md, "A dead coordinator"). And a second local
// user squatting the ports after the kill receives no request id and no token id from the agents:
// nothing but challenges (docs/security.md).
import * as fs from 'fs';
import * as path from 'path';
import { requestStatus } from '../src/bus/coordinator';
import { AgentMessage } from '../src/proto';
import { childrenOf, cmdline } from './procs';
import { cleanup, cleanupUsers, CLI, describeAsRoot, freePortPair, jsonEvents, otherUser, readManifests, rootOnlyReason, spawnAs, spawnWavebus, tmpDir, type Spawned, waitFor } from './helpers';

jest.setTimeout(300000);

afterAll(async () => {
  await cleanup();
  if (!rootOnlyReason()) cleanupUsers();
});

const STEP_MS = 40;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface LaunchedJob {
  launch: Spawned;
  port: number;
  stopFile: string;
  resultDir: string;
  configPath: string;
  kvRoot: string;
}

async function startJob(): Promise<LaunchedJob> {
  const dir = tmpDir('wavebus-coordloss-');
  const port = await freePortPair();
  const j = { port, stopFile: path.join(dir, 'stop'), resultDir: path.join(dir, 'ranks'), configPath: path.join(dir, 'config', 'runtime_config.json'), kvRoot: path.join(dir, 'kv') };
  const overlay = { runtime_config: { detector: {}, dump: { manual_dump: 0, auto_cooldown_seconds: 0, free_headroom_bytes: 0, format: 'pt' } } };
  const launch = spawnWavebus([
    'launch', '--tp', '2', '--nproc-per-node', '2', '--port', String(port), '--ready-timeout-ms', '120000',
    '--runtime-config-path', j.configPath, '--runtime-config-hot-reload', '--runtime-dump-dir', j.kvRoot, '--additional-config', JSON.stringify(overlay),
    '--', process.execPath, CLI, 'sim', '--steps', '100000', '--step-ms', String(STEP_MS), '--stop-file', j.stopFile, '--step-times',
    '--result-dir', j.resultDir, '--layers', '2', '--num-blocks', '128', '--requests', '3000',
  ], { env: { ...process.env, WAVEBUS_LOG_LEVEL: 'warn' } });
  return { launch, ...j };
}

const status = (port: number) => requestStatus({ host: '127.0.0.1', port }, 1000).then((s) => ({ ...s, json: JSON.parse(s.statusJson) }), () => undefined);

function coordinatorPid(launch: Spawned): number {
  const pids = childrenOf(launch.child.pid!).filter((p) => / coordinator /.test(cmdline(p)));
  expect(pids).toHaveLength(1);
  return pids[0];
}

/** The job runs, heads flow: returns the coordinator's epoch and pid. */
async function running(j: LaunchedJob, fromWave = 30): Promise<{ epoch: number; pid: number }> {
  const s = await waitFor(async () => {
    const st = await status(j.port);
    return st && st.ready && st.wave >= fromWave ? st : undefined;
  }, `the job to run to wave ${fromWave}`, 150000, 100);
  return { epoch: s.epoch, pid: coordinatorPid(j.launch) };
}

/** Steps per second of a rank in [from, to). */
function rate(stepEndsAt: number[], from: number, to: number): number {
  return (stepEndsAt.filter((t) => t >= from && t < to).length * 1000) / (to - from);
}

/** Bump dump.manual_dump in the live config file; resolves with the complete manifest it makes. */
async function manualDump(j: LaunchedJob, afterWave: number): Promise<void> {
  const cfg = JSON.parse(fs.readFileSync(j.configPath, 'utf8'));
  cfg.dump = { ...cfg.dump, manual_dump: (cfg.dump?.manual_dump ?? 0) + 1 };
  fs.writeFileSync(`${j.configPath}.edit`, JSON.stringify(cfg, null, 2));
  fs.renameSync(`${j.configPath}.edit`, j.configPath);
  const got = await waitFor(() => {
    const ms = readManifests<{ arm_wave: number; complete: boolean; expected_ranks: number[]; completed_ranks: number[] }>(j.kvRoot).filter((m) => m.arm_wave > afterWave);
    return ms.length > 0 ? ms : undefined;
  }, 'a manual dump after the restart', 60000, 100);
  for (const m of got) expect({ complete: m.complete, completed: m.completed_ranks }).toEqual({ complete: true, completed: [0, 1] });
}

async function finish(j: LaunchedJob): Promise<{ rank: number; stepEndsAt: number[]; stalledSkips: number; endOfWaveTimeouts: number }[]> {
  fs.writeFileSync(j.stopFile, '');
  const { code } = await j.launch.exited;
  expect({ code, stderr: code === 0 ? '' : j.launch.stderr().slice(-3000) }).toEqual({ code: 0, stderr: '' });
  return [0, 1].map((g) => JSON.parse(fs.readFileSync(path.join(j.resultDir, `rank${g}.json`), 'utf8')));
}

test('kill -9 of the coordinator: one bound per rank, the engine keeps its rate, launch restarts it, and a manual dump afterwards is complete', async () => {
  const j = await startJob();
  const before = await running(j);
  await sleep(4000);
  const killedAt = Date.now();
  process.kill(before.pid, 'SIGKILL');
  // A new coordinator (a new epoch) that every agent joined.
  const after = await waitFor(async () => {
    const st = await status(j.port);
    return st && st.epoch !== before.epoch && st.ready && st.wave > 0 ? st : undefined;
  }, 'launch to restart the coordinator and the agents to rejoin it', 60000, 100);
  expect(j.launch.stderr()).toMatch(/the coordinator was killed by SIGKILL; starting it again in 500 ms/);
  await manualDump(j, after.wave);
  await sleep(Math.max(0, killedAt + 8000 - Date.now()));
  const ranks = await finish(j);
  for (const r of ranks) {
    const was = rate(r.stepEndsAt, killedAt - 4000, killedAt);
    const now = rate(r.stepEndsAt, killedAt, killedAt + 8000);
    // 5 % holds by design: no wait after the first bound (the waits below), and the engine's
    // fixed schedule catches up what that bound cost. The rate is asserted looser: on this 2-core
    // VM shared with other builds, CPU taken by others for seconds costs steps too (the measured
    // figures are in docs/benchmarks.md, "A dead coordinator").
    const perSecond = Array.from({ length: 12 }, (_, i) => rate(r.stepEndsAt, killedAt + (i - 4) * 1000, killedAt + (i - 3) * 1000));
    process.stderr.write(`rank ${r.rank}: ${was.toFixed(2)} steps/s before the kill, ${now.toFixed(2)} after (per second from -4 s: ${perSecond.join(' ')}); ${r.stalledSkips} stalled skips, ${r.endOfWaveTimeouts} end-of-wave timeouts\n`);
    expect(was).toBeGreaterThan(20);
    expect(now / was).toBeGreaterThanOrEqual(0.9);
    // Bounds actually waited: one at the loss, one or two while the new coordinator's first
    // vectors come; every other wave of the outage returned at once.
    expect(r.stalledSkips).toBeGreaterThan(20);
    expect(r.endOfWaveTimeouts - r.stalledSkips).toBeLessThanOrEqual(6);
  }
});

// ---------------------------------------------------------------- a second uid squats the ports

/** A raw TCP squatter on PORT and PORT+1: greets as a ZeroMQ PUB / ROUTER (ZMTP 3.0, NULL) and prints every byte it gets. */
const SQUATTER = `
const net = require('net');
const port = Number(process.argv[2]);
function greeting(type) {
  const g = Buffer.alloc(64); g[0] = 0xff; g[9] = 0x7f; g[10] = 3; g[11] = 0; g.write('NULL', 12);
  const len = Buffer.alloc(4); len.writeUInt32BE(type.length);
  const body = Buffer.concat([Buffer.from([5]), Buffer.from('READY'), Buffer.from([11]), Buffer.from('Socket-Type'), len, Buffer.from(type)]);
  return Buffer.concat([g, Buffer.from([0x04, body.length]), body]);
}
let conn = 0;
for (const [p, type, key] of [[port, 'PUB', 'pub'], [port + 1, 'ROUTER', 'router']]) {
  const srv = net.createServer((c) => {
    const id = ++conn;
    c.on('error', () => {});
    c.write(greeting(type));
    c.on('data', (d) => console.log(JSON.stringify({ event: 'data', key, conn: id, hex: d.toString('hex') })));
  });
  const listen = () => srv.listen(p, '127.0.0.1');
  srv.on('error', () => setTimeout(listen, 2));
  srv.on('listening', () => console.log(JSON.stringify({ event: 'bound', key })));
  listen();
}
process.stdin.on('end', () => process.exit(0)); process.stdin.resume();
`;

/** The ZMTP messages a peer sent on one connection, after its greeting and READY command. */
function zmtpMessages(bytes: Buffer): Buffer[] {
  let pos = 64; // greeting
  const msgs: Buffer[] = [];
  let parts: Buffer[] = [];
  while (pos < bytes.length) {
    const flags = bytes[pos];
    const long = (flags & 0x02) !== 0;
    if (pos + (long ? 9 : 2) > bytes.length) break;
    const size = long ? Number(bytes.readBigUInt64BE(pos + 1)) : bytes[pos + 1];
    const start = pos + (long ? 9 : 2);
    if (start + size > bytes.length) break;
    const body = bytes.subarray(start, start + size);
    pos = start + size;
    if (flags & 0x04) continue; // a command (READY)
    parts.push(body);
    if ((flags & 0x01) === 0) {
      msgs.push(Buffer.concat(parts));
      parts = [];
    }
  }
  return msgs;
}

describeAsRoot('a second local user squats the bus ports after kill -9 of the coordinator', () => {
  test('it receives nothing but challenges: no Hello, heartbeat, wave head, request id or token id; the job keeps its rate and dumps again afterwards', async () => {
    const user = otherUser('squat');
    const dir = tmpDir('wavebus-squatter-');
    fs.chmodSync(dir, 0o755);
    const script = path.join(dir, 'squatter.js');
    fs.writeFileSync(script, SQUATTER, { mode: 0o644 });
    const j = await startJob();
    let squatter: Spawned | undefined;
    try {
      const before = await running(j);
      await sleep(3500);
      // Started before the kill: it takes the ports within milliseconds of their release.
      squatter = spawnAs(user, process.execPath, [script, String(j.port)], { stdio: ['pipe', 'pipe', 'pipe'] });
      await sleep(500);
      const killedAt = Date.now();
      process.kill(before.pid, 'SIGKILL');
      const events = () => jsonEvents(squatter!);
      await waitFor(() => events().filter((e) => e.event === 'bound').length === 2, 'the squatter to hold both ports', 10000, 5);
      // Long enough for every agent to see its coordinator lost and challenge new connections.
      await waitFor(() => new Set(events().filter((e) => e.event === 'data' && e.key === 'router').map((e) => e.conn)).size >= 4, 'the agents to connect to the squatter', 30000, 50);
      await sleep(3000);
      squatter.child.stdin!.end();
      await squatter.exited;
      const byConn = new Map<string, Buffer>();
      for (const e of events().filter((x) => x.event === 'data')) {
        const k = `${e.key}:${e.conn}`;
        byConn.set(k, Buffer.concat([byConn.get(k) ?? Buffer.alloc(0), Buffer.from(e.hex, 'hex')]));
      }
      const all = Buffer.concat([...byConn.values()]);
      expect(all.toString('latin1')).not.toMatch(/req-\d+-/);
      let challenges = 0;
      for (const [k, bytes] of byConn) {
        for (const m of zmtpMessages(bytes)) {
          if (k.startsWith('pub:')) {
            // A subscriber sends only its subscriptions: 0x01 + its replica's topic prefix (the
            // host receiver), or one of the work topics (a lanes-only agent: docs/bus.md).
            expect(m.subarray(0, 1).toString('hex')).toBe('01');
            expect(m.subarray(1).toString()).toMatch(/^r\d+\.[XCDH]?$/);
            continue;
          }
          const msg = AgentMessage.toObject(AgentMessage.decode(m), { oneofs: true, bytes: Buffer as any }) as Record<string, any>;
          expect(msg.body).toBe('challenge');
          expect(Object.keys(msg).filter((k) => !['body', 'challenge', 'globalRank', 'mac'].includes(k))).toEqual([]);
          challenges++;
        }
      }
      expect(challenges).toBeGreaterThanOrEqual(2);
      // The squatter gone, launch's next attempt takes the ports; the job dumps again.
      const after = await waitFor(async () => {
        const st = await status(j.port);
        return st && st.epoch !== before.epoch && st.ready && st.wave > 0 ? st : undefined;
      }, 'the restarted coordinator', 90000, 100);
      // While the ports were held, launch probed them instead of starting coordinators that die on bind.
      expect(j.launch.stderr()).toMatch(/not starting the coordinator: --port \d+: 127\.0\.0\.1:\d+ is already in use/);
      await manualDump(j, after.wave);
      const ranks = await finish(j);
      for (const r of ranks) {
        const was = rate(r.stepEndsAt, killedAt - 4000, killedAt);
        const now = rate(r.stepEndsAt, killedAt, killedAt + 8000);
        process.stderr.write(`squatted: rank ${r.rank}: ${was.toFixed(2)} steps/s before, ${now.toFixed(2)} after; ${r.stalledSkips} stalled skips, ${r.endOfWaveTimeouts} end-of-wave timeouts\n`);
        expect(now / was).toBeGreaterThanOrEqual(0.9);
        expect(r.endOfWaveTimeouts - r.stalledSkips).toBeLessThanOrEqual(6);
      }
    } finally {
      squatter?.child.stdin?.end();
      if (j.launch.child.exitCode === null) {
        fs.writeFileSync(j.stopFile, '');
        await j.launch.exited;
      }
    }
  });
});
