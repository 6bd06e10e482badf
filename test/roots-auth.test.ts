// Issue 13 item 1: a squatted bus port must not read or write anything outside an agent's local
// roots, and with the launcher's bus token the agents and the coordinator believe only each other.
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { Context, Dealer, Publisher } from 'zeromq';
import { ZapHandler } from '../src/bus/zap-handler';
import { Agent } from '../src/agent/agent';
import { aggregate } from '../src/tools/aggregate';
import { narrowRoot } from '../src/agent/roots';
import { AgentBus } from '../src/bus/agent-bus';
import { BusToken, createTokenFile, SUBSCRIBER_USER, TOKEN_FILE_NAME } from '../src/bus/auth';
import { Coordinator, requestStatus } from '../src/bus/coordinator';
import { encodeAgentMessage, encodeBusFrame } from '../src/bus/frames';
import { WavebusClient } from '../src/client/client';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { ShmSegment } from '../src/memory';
import { launchDumpRoot } from '../src/launch/sidecar-args';
import { localDumpRoot } from '../src/commands/agent';
import { agentEndpoint, mailboxPath } from '../src/paths';
import { cleanup, cleanupUsers, describeAsRoot, freePortPair, jsonEvents, otherUser, PYTHON, ROOT, spawnAs, spawnWavebus, tmpDir, type Spawned, waitFor } from './helpers';
import { DEFAULT_LOOKAHEAD_WAVES } from '../src/bus/constants';

const quiet = createLogger('roots-auth-test', 'silent');
const SHADOW = fs.existsSync('/etc/shadow') ? fs.readFileSync('/etc/shadow') : Buffer.from('root:');
const LAYOUT1 = { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 };
const POOL_BYTES = 32 * 4 * 2 * 8 * 2;

afterAll(async () => {
  await cleanup();
  cleanupUsers();
});

function token(): BusToken {
  return BusToken.load(createTokenFile(tmpDir('wavebus-token-')), 'test token');
}

/** The engine's client for rank 0 of `runDir`, with a KV pool in shared memory named by `tag`. */
async function engineClient(runDir: string, tag: string): Promise<{ client: WavebusClient; close: () => Promise<void> }> {
  const shmName = `/wavebus-rootsauth-${process.pid}-${tag}`;
  const seg = ShmSegment.create(shmName, 2 * POOL_BYTES);
  seg.buffer().fill(5);
  const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
  return {
    client,
    close: async () => {
      await client.close();
      seg.close();
      ShmSegment.unlink(shmName);
    },
  };
}

async function registerPool(client: WavebusClient, runDirTag: string): Promise<void> {
  const shmName = `/wavebus-rootsauth-${process.pid}-${runDirTag}`;
  for (const [i, kv] of (['k', 'v'] as const).entries()) {
    await client.register({ name: `layers.0.${kv}`, shmName, offset: i * POOL_BYTES, nbytes: POOL_BYTES, dtype: 'bfloat16', shape: [32, 4, 2, 8], role: 'kv_pool', layer: 'layers.0', kv });
  }
}

describe('roots from the bus only narrow the local ones', () => {
  test.each([
    ['/data/kv', '/data/kv', '/data/kv'],
    ['/data/kv', '/data/kv/manual_trigger/r1/wave_3', '/data/kv/manual_trigger/r1/wave_3'],
    ['/data/kv/', '/data//kv/x/', '/data/kv/x'],
  ])('local %s, bus %s: accepted as %s', (local, bus, want) => {
    expect(narrowRoot(local, bus, 'dump_dir')).toBe(want);
  });
  test.each([
    ['/', /outside the local dump root/],
    ['/data', /outside the local dump root/],
    ['/data/kvx', /outside the local dump root/],
    ['/data/kv/../../etc', /'\.' or '\.\.' component/],
    ['/data/kv/./x', /'\.' or '\.\.' component/],
    ['data/kv', /not an absolute path/],
    ['/data/kv/\0x', /NUL/],
  ])('bus %j is refused', (bus, why) => {
    expect(() => narrowRoot('/data/kv', bus, 'dump_dir')).toThrow(why);
  });
});

/** One rank: the real guard (its dump root `guardRoot`), a coordinator, an agent whose local dump root is `agentRoot`. */
async function oneRankJob(guardRoot: string, agentRoot: string, busToken?: BusToken) {
  const root = tmpDir('wavebus-rootsauth-job-');
  const startup = parseStartupOptions(JSON.stringify({ runtime_dump_dir: guardRoot, runtime_config: { dump: { manual_dump: 1, free_headroom_bytes: 0, auto_cooldown_seconds: 0 } } }), {}, root);
  const guard = new Guard({ startup, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, log: quiet });
  const port = await freePortPair();
  const coordinator = new Coordinator({ port, layout: LAYOUT1, heartbeatMs: 100, deadAfterMs: 5000, dumpAckTimeoutMs: 5000, busToken, policy: guard, logger: quiet });
  await coordinator.start();
  const runDir = path.join(root, 'run');
  const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
  const agent = new Agent({ identity, runDir, coordinator: { host: '127.0.0.1', port }, heartbeatMs: 100, endOfWaveTimeoutMs: 5000, roots: { dumps: agentRoot }, busToken, logger: quiet });
  await agent.start();
  const tag = `j${port}`;
  const shmName = `/wavebus-rootsauth-${process.pid}-${tag}`;
  const seg = ShmSegment.create(shmName, 2 * POOL_BYTES);
  seg.buffer().fill(5);
  const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
  await waitFor(() => client.featureFlags() !== 0, 'the bus to be active');
  await registerPool(client, tag);
  const stop = async () => {
    await client.close();
    await agent.stop();
    await coordinator.stop();
    guard.close();
    seg.close();
    ShmSegment.unlink(shmName);
  };
  return { coordinator, agent, client, stop, busToken };
}

/** Run waves with one request until the manual dump's manifest appears under `guardRoot`. */
async function manualDumpManifest(job: Awaited<ReturnType<typeof oneRankJob>>, guardRoot: string): Promise<Record<string, any>> {
  const base = path.join(guardRoot, 'manual_trigger', 'req-1');
  for (let w = 1; w <= 4; w++) {
    await job.client.waveHead(w, { wave: w - 1, requests: [{ reqId: 'req-1', newTokenIds: [1], newTokenLogprobs: [], newTokenRanks: [], draftLen: 0, accepted: 0, blockIds: [1, 2], finished: false, freed: false, promptLen: 4, numOutputTokens: w }], nonFinite: [] });
    await job.client.endOfWave(w);
  }
  await job.agent.drain();
  const file = await waitFor(() => {
    if (!fs.existsSync(base)) return undefined;
    const [wave] = fs.readdirSync(base);
    const p = wave && path.join(base, wave, 'manifest.json');
    return p && fs.existsSync(p) ? p : undefined;
  }, 'the manual dump manifest', 20000);
  return JSON.parse(fs.readFileSync(file, 'utf8'));
}

describe('an agent writes only under its local dump root', () => {
  test('a dump root the kernel cannot open (a component over 255 bytes, the whole over 4095) is refused naming its flag or variable', () => {
    const long = '/tmp/' + 'x'.repeat(300);
    expect(() => localDumpRoot(undefined, { WAVEBUS_DUMP_ROOT: long }, '/')).toThrow('WAVEBUS_DUMP_ROOT: a path component of 300 bytes (at most 255)');
    expect(() => localDumpRoot(long, {}, '/')).toThrow('--dump-root: a path component of 300 bytes');
    expect(() => localDumpRoot(`/tmp/${'y/'.repeat(2100)}`, {}, '/')).toThrow(/^--dump-root: a path of \d+ bytes \(at most 4095\)/);
    expect(localDumpRoot('kv', {}, '/srv')).toBe('/srv/kv');
  });

  test('the snapshot root too: an agent given a WAVEBUS_CACHE_ROOT the kernel cannot open exits at startup naming the variable', () => {
    const dir = tmpDir('wavebus-cache-root-');
    const long = path.join(dir, 'x'.repeat(300));
    const r = spawnSync(process.execPath, [path.join(ROOT, 'bin', 'wavebus.js'), 'agent', '--coordinator', '127.0.0.1:1', '--run-dir', path.join(dir, 'run'), '--local-rank', '0'], {
      env: { ...process.env, WAVEBUS_CACHE_ROOT: long }, encoding: 'utf8', timeout: 30000,
    });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('WAVEBUS_CACHE_ROOT: a path component of 300 bytes (at most 255) [ERR_SNAPSHOT_ROOT]');
    expect(fs.existsSync(long)).toBe(false);
  });

  test('a bus dump root below the local one is used: the dump is complete', async () => {
    const local = tmpDir('wavebus-local-root-');
    const guardRoot = path.join(local, 'narrower');
    const job = await oneRankJob(guardRoot, local, token());
    try {
      const m = await manualDumpManifest(job, guardRoot);
      expect(m).toMatchObject({ complete: true, completed_ranks: [0], failed_ranks: {} });
      expect(job.agent.rootsRefused).toBe(0);
      const rankDir = path.join(guardRoot, 'manual_trigger', 'req-1', fs.readdirSync(path.join(guardRoot, 'manual_trigger', 'req-1'))[0], 'dp0_tp0_pp0_cp0');
      expect(fs.existsSync(path.join(rankDir, 'dump.json'))).toBe(true);
      // `wavebus aggregate` pulls it through the coordinator with the token, and is refused without it.
      const coordinator = { host: '127.0.0.1', port: job.coordinator.port };
      const pulled = await aggregate({ coordinator, busToken: job.busToken, out: tmpDir('wavebus-agg-'), what: 'dumps', requestTimeoutMs: 5000 });
      expect(pulled.complete).toBe(true);
      expect(pulled.files.map((f) => f.path)).toContain(`${path.relative(guardRoot, rankDir)}/dump.json`);
      const refused = await aggregate({ coordinator, out: tmpDir('wavebus-agg-'), what: 'dumps', requestTimeoutMs: 5000 });
      expect(refused.complete).toBe(false);
      expect(refused.ranks['0'].errors.join(' ')).toMatch(/requires the bus token/);
    } finally {
      await job.stop();
    }
  });

  test('a bus dump root outside the local one is refused, counted, and the manifest names the rank and the path', async () => {
    const local = tmpDir('wavebus-local-root-');
    const elsewhere = tmpDir('wavebus-elsewhere-');
    const job = await oneRankJob(elsewhere, local, token());
    try {
      const m = await manualDumpManifest(job, elsewhere);
      expect(m.complete).toBe(false);
      expect(m.completed_ranks).toEqual([]);
      expect(m.failed_ranks['0']).toMatch(/^rank 0: DumpJob\.dump_dir ".*wavebus-elsewhere-.*manual_trigger\/req-1\/wave_\d+" refused: outside the local dump root/);
      expect(m.failed_ranks['0']).toContain(local);
      expect(job.agent.rootsRefused).toBeGreaterThanOrEqual(1);
      // Nothing of this rank's was written there: no rank0 bundle, no dump_skipped.json.
      const waveDir = path.join(elsewhere, 'manual_trigger', 'req-1', fs.readdirSync(path.join(elsewhere, 'manual_trigger', 'req-1'))[0]);
      expect(fs.readdirSync(waveDir).sort()).toEqual(['manifest.json', 'request_info.json']);
      // The local root holds no dump either: only the agent's own wave timeline (docs/report.md).
      expect(fs.readdirSync(local).filter((n) => n !== 'timeline')).toEqual([]);
    } finally {
      await job.stop();
    }
  });
});

describe('the bus token', () => {
  const identity = resolveIdentity({}, { rank: 0, worldSize: 1 });

  test('an agent never syncs with a coordinator of another token or none: its PUB refuses the agent\'s subscription (another token) or the handshake fails (none)', async () => {
    for (const coordToken of [undefined, token()]) {
      const port = await freePortPair();
      const c = new Coordinator({ port, layout: LAYOUT1, heartbeatMs: 100, busToken: coordToken, logger: quiet });
      await c.start();
      const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity, heartbeatMs: 100, deadAfterMs: 5000, busToken: token(), logger: quiet });
      await bus.start();
      try {
        if (coordToken) await waitFor(() => (c.stats.subscribersRefused.wrong_password ?? 0) >= 1, "the PUB to refuse the agent's subscriber password");
        else await waitFor(() => bus.stats.subRenewals >= 1, "the agent's SUB, whose handshake failed, to be renewed");
        expect(bus.synced).toBe(false);
        expect(bus.stats.waves).toBe(0);
        // A coordinator with another token does not count this agent either (one without a token
        // ignores the MAC field: it authenticates nobody, docs/security.md).
        if (coordToken) expect(c.liveRanks()).toEqual([]);
      } finally {
        await bus.stop();
        await c.stop();
      }
    }
  });

  test('a coordinator drops agent messages without the MAC or with a wrong one; it answers only status without it', async () => {
    const t = token();
    const port = await freePortPair();
    const c = new Coordinator({ port, layout: LAYOUT1, heartbeatMs: 100, busToken: t, logger: quiet });
    await c.start();
    const rogue = new Dealer({ linger: 0 });
    rogue.connect(`tcp://127.0.0.1:${port + 1}`);
    try {
      const head = encodeAgentMessage({ globalRank: 0, epochSeen: c.epoch, waveHead: { wave: 5 } });
      const hb = encodeAgentMessage({ globalRank: 0, heartbeat: { wave: 1, globalRank: 0, epochSeen: c.epoch, lastSeq: 1, unixMs: 1 } });
      await rogue.send(head);
      await rogue.send(hb);
      await rogue.send(token().seal('to-coordinator', head));
      // A message sealed for the other direction (an agent's bytes reflected) is no better.
      await rogue.send(t.seal('from-coordinator', head));
      await waitFor(() => (c.stats.dropped.no_mac ?? 0) >= 2 && (c.stats.dropped.bad_mac ?? 0) >= 2, 'the coordinator to drop them');
      expect(c.wave).toBe(0);
      expect(c.liveRanks()).toEqual([]);
      // A relay without the MAC gets a refusal that says what is missing.
      await rogue.send(encodeAgentMessage({ requestId: 9, relay: { rank: 0, fileList: { root: 'dumps', prefix: '' } } }));
      const [reply] = await rogue.receive();
      const opened = t.open('from-coordinator', reply);
      expect(opened.ok).toBe(true);
      expect(reply.toString('latin1')).toContain('requires the bus token');
      // Status is answered without the token (and a holder of the token can check the answer is ours).
      const st = await requestStatus({ host: '127.0.0.1', port }, 3000);
      expect(JSON.parse(st.statusJson).security).toMatchObject({ curve: false, bus_token: true });
      await expect(requestStatus({ host: '127.0.0.1', port }, 1000, undefined, token())).rejects.toThrow(/no status reply/);
      // The real agent with the token syncs and its wave heads count.
      const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity, heartbeatMs: 100, deadAfterMs: 5000, busToken: t, logger: quiet });
      await bus.start();
      try {
        await waitFor(() => bus.synced && c.ready, 'the real agent to sync');
        bus.sendWaveHead(7, null);
        // Head 7 publishes the vector of wave 7 + DEFAULT_LOOKAHEAD_WAVES.
        await waitFor(() => bus.latest()?.wave === 7 + DEFAULT_LOOKAHEAD_WAVES, 'head 7\'s vector through the bus');
        expect(bus.stats.dropped).toEqual({});
      } finally {
        await bus.stop();
      }
    } finally {
      rogue.close();
      await c.stop();
    }
  });

  test('a rogue publisher on the port is ignored by an agent with the token (frames without the MAC or with a wrong one dropped before reading)', async () => {
    const port = await freePortPair();
    const tok = token();
    // A rogue that admits the agent's PLAIN subscription (it learned the subscriber password, or
    // takes any: a NULL publisher fails the agent's handshake before any frame).
    const context = new Context();
    const zap = new ZapHandler(context, { plain: { user: SUBSCRIBER_USER, password: tok.subscriberPassword() } });
    await zap.start();
    const pub = new Publisher({ linger: 0, context, plainServer: true, zapDomain: 'rogue' });
    await pub.bind(`tcp://127.0.0.1:${port}`);
    const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity, heartbeatMs: 100, deadAfterMs: 5000, busToken: tok, logger: quiet });
    await bus.start();
    const other = token();
    try {
      for (const reason of ['no_mac', 'bad_mac'] as const) {
        await waitFor(async () => {
          const [topic, body] = encodeBusFrame(1, 1, 'heartbeat', { wave: 1, unixMs: 1 });
          await pub.send([topic, reason === 'no_mac' ? body : other.seal('pub', body, undefined, Buffer.from(topic))]);
          return (bus.stats.dropped[reason] ?? 0) >= 3;
        }, `the rogue frames to be dropped as ${reason}`);
      }
      expect(bus.synced).toBe(false);
      expect(bus.stats.waves).toBe(0);
    } finally {
      await bus.stop();
      pub.close();
      await zap.stop();
    }
  });

  test('token files: 0600, created exclusively, never through a link; loose or linked files are refused', () => {
    const dir = tmpDir('wavebus-tokenfile-');
    const f = createTokenFile(dir);
    expect(path.basename(f)).toBe(TOKEN_FILE_NAME);
    expect(fs.statSync(f).mode & 0o777).toBe(0o600);
    expect(fs.readFileSync(f, 'utf8')).toMatch(/^[0-9a-f]{64}\n$/);
    fs.chmodSync(f, 0o644);
    expect(() => BusToken.load(f, '--bus-token-file')).toThrow(/--bus-token-file .*permissions 0644 are too open/);
    const link = path.join(dir, 'link');
    fs.symlinkSync(f, link);
    expect(() => BusToken.load(link, '--bus-token-file')).toThrow(/symbolic link/);
    // A link planted where the launcher writes its token is replaced, never written through.
    const victim = path.join(dir, 'victim');
    fs.writeFileSync(victim, 'keep');
    fs.rmSync(f);
    fs.symlinkSync(victim, f);
    createTokenFile(dir);
    expect(fs.readFileSync(victim, 'utf8')).toBe('keep');
    expect(fs.lstatSync(f).isFile()).toBe(true);
  });
});

describe('the launcher', () => {
  test('derives the dump root the coordinator will use from its guard flags', () => {
    const cwd = tmpDir('wavebus-launchroot-');
    expect(launchDumpRoot([], cwd)).toBe(path.join(cwd, 'runtime', 'report', 'kv_cache'));
    expect(launchDumpRoot(['--runtime-report-dir=rep'], cwd)).toBe(path.join(cwd, 'rep', 'kv_cache'));
    expect(launchDumpRoot(['--runtime-dump-dir', '/srv/kv', '--dump-ack-timeout-ms', '500'], cwd)).toBe('/srv/kv');
    const cfg = path.join(cwd, 'cfg', 'runtime_config.json');
    fs.mkdirSync(path.dirname(cfg));
    // Startup ignores what the live file holds (seed: it is rewritten from defaults <- overlay), and
    // working the root out writes nothing: the coordinator alone rewrites the file.
    fs.writeFileSync(cfg, JSON.stringify({ dump: { dump_dir: '/srv/from-old-file' } }));
    expect(launchDumpRoot([`--runtime-config-path=${cfg}`], cwd)).toBe(path.join(cwd, 'cfg', 'report', 'kv_cache'));
    expect(JSON.parse(fs.readFileSync(cfg, 'utf8'))).toEqual({ dump: { dump_dir: '/srv/from-old-file' } });
    const overlay = JSON.stringify({ runtime_config: { dump: { dump_dir: '/srv/from-overlay' } } });
    expect(launchDumpRoot([`--runtime-config-path=${cfg}`, '--additional-config', overlay], cwd)).toBe('/srv/from-overlay');
  });

  test('a launch gives its command one 0600 token by path and its coordinator and agents the token on a pipe, and the job comes up with it', async () => {
    const port = await freePortPair();
    const runDir = path.join(tmpDir('wavebus-launchtok-'), 'run');
    const out = path.join(path.dirname(runDir), 'seen.json');
    const probe = `const fs=require('fs');const f=process.env.WAVEBUS_BUS_TOKEN_FILE;const st=fs.statSync(f);` +
      `fs.writeFileSync(${JSON.stringify(out)}, JSON.stringify({f, mode: st.mode & 0o777, ps: require('child_process').execSync('ps -eo args').toString()}))`;
    const r = spawnWavebus(['launch', '--port', String(port), '--run-dir', runDir, '--ready-timeout-ms', '60000', '--', process.execPath, '-e', probe]);
    const { code } = await r.exited;
    expect({ code, err: code === 0 ? '' : r.stderr().slice(-3000) }).toEqual({ code: 0, err: '' });
    const seen = JSON.parse(fs.readFileSync(out, 'utf8'));
    expect(seen.f).toBe(path.join(runDir, TOKEN_FILE_NAME));
    expect(seen.mode).toBe(0o600);
    const args = (seen.ps as string).split('\n').filter((l) => l.includes(`--port ${port}`) || l.includes(`127.0.0.1:${port}`));
    // The sidecars read the token from descriptor 3 once (a restarted coordinator too), never the path.
    expect(args.filter((l) => / coordinator /.test(l) && l.includes('--bus-token-fd 3') && !l.includes('--bus-token-file'))).toHaveLength(1);
    expect(args.filter((l) => / agent /.test(l) && l.includes('--bus-token-fd 3') && !l.includes('--bus-token-file') && l.includes('--dump-root '))).toHaveLength(1);
    // The token itself is on no command line.
    expect(seen.ps).not.toMatch(/[0-9a-f]{64}/);
    expect(fs.existsSync(runDir)).toBe(false);
  });
});

// ------------------------------------------------------------------ the attack, with a real second uid

describeAsRoot('a local user squats the bus port before a root agent starts', () => {
  async function attack(agentArgs: string[], roguePlain = false): Promise<{ rogue: Spawned; agent: Spawned; events: () => Record<string, any>[]; local: string; victimDir: string; runDir: string; done: () => Promise<void> }> {
    const user = otherUser('roots');
    const pbDir = tmpDir('wavebus-rogue-pb-');
    fs.chmodSync(pbDir, 0o755);
    fs.copyFileSync(path.join(ROOT, 'clients', 'python', 'wavebus_client', 'wavebus_pb2.py'), path.join(pbDir, 'wavebus_pb2.py'));
    fs.copyFileSync(path.join(ROOT, 'test', 'python', 'rogue_coordinator.py'), path.join(pbDir, 'rogue.py'));
    fs.chmodSync(path.join(pbDir, 'wavebus_pb2.py'), 0o644);
    fs.chmodSync(path.join(pbDir, 'rogue.py'), 0o644);
    const port = await freePortPair();
    const rogue = spawnAs(user, PYTHON, [path.join(pbDir, 'rogue.py'), pbDir, String(port), ...(roguePlain ? ['plain'] : [])], { stdio: ['pipe', 'pipe', 'pipe'] });
    const events = () => jsonEvents(rogue);
    await waitFor(() => events().some((e) => e.event === 'bound') || rogue.child.exitCode !== null, 'the rogue to bind the bus ports');
    expect(rogue.child.exitCode).toBe(null);
    const base = tmpDir('wavebus-squat-');
    const local = path.join(base, 'kv');
    const victimDir = path.join(base, 'victim');
    fs.mkdirSync(victimDir);
    const runDir = path.join(base, 'run');
    const agent = spawnWavebus([
      'agent', '--coordinator', `127.0.0.1:${port}`, '--rank', '0', '--local-rank', '0', '--world-size', '1', '--local-world-size', '1',
      '--run-dir', runDir, '--dump-root', local, '--heartbeat-ms', '100', '--end-of-wave-timeout-ms', '5000', ...agentArgs,
    ], { env: { ...process.env, WAVEBUS_LOG_LEVEL: 'info' } });
    await waitFor(() => fs.existsSync(mailboxPath(runDir, 0)) && fs.existsSync(agentEndpoint(runDir, 0).slice('ipc://'.length)), 'the agent to listen', 30000);
    const done = async () => {
      rogue.child.stdin?.end();
      agent.child.kill('SIGTERM');
      await Promise.all([rogue.exited, agent.exited]);
    };
    return { rogue, agent, events, local, victimDir, runDir, done };
  }

  test('without a token: the agent follows the rogue, but reads nothing outside its roots and writes nothing outside them', async () => {
    const a = await attack([]);
    let engine: Awaited<ReturnType<typeof engineClient>> | undefined;
    try {
      await waitFor(() => a.events().some((e) => e.event === 'snapshot_sent'), 'the agent to ask the rogue for a snapshot', 30000);
      expect(a.agent.stderr()).toMatch(/the coordinator is unauthenticated/);
      engine = await engineClient(a.runDir, 'squat');
      const client = engine.client;
      await waitFor(() => client.featureFlags() !== 0, "the rogue's config to reach the engine's mailbox");
      await registerPool(client, 'squat');
      // Wave 1 dumps into '/', wave 2 into a directory the rogue picked.
      for (const [w, dir] of [[1, '/'], [2, a.victimDir]] as const) {
        a.rogue.child.stdin!.write(`wave ${w} ${dir}\n`);
        await waitFor(() => a.events().some((e) => e.event === 'wave_sent' && e.wave === w), `wave ${w} sent`);
        const r = await client.endOfWave(w);
        expect(r.timedOut).toBe(false);
      }
      const acks = await waitFor(() => {
        const d = a.events().filter((e) => e.event === 'dump_result');
        return d.length >= 2 ? d : undefined;
      }, 'the dump acks', 20000);
      expect(acks.map((x) => x.files)).toEqual([0, 0]);
      expect(acks[0].error).toMatch(/^rank 0: DumpJob\.dump_dir "\/" refused: outside the local dump root/);
      expect(acks[1].error).toContain(`DumpJob.dump_dir ${JSON.stringify(a.victimDir)} refused`);
      expect(fs.existsSync('/rank0')).toBe(false);
      expect(fs.readdirSync(a.victimDir)).toEqual([]);
      // Every way of asking for /etc/shadow: errors, and not one byte of it.
      a.rogue.child.stdin!.write('files\n');
      const answers = await waitFor(() => {
        const f = a.events().filter((e) => e.event === 'file_chunk' || e.event === 'file_list');
        return f.length >= 12 ? f : undefined;
      }, 'answers to every file request', 20000);
      for (const x of answers.filter((e) => e.event === 'file_chunk')) {
        expect(x.error).not.toBe('');
        expect(x.data).toBe('');
      }
      for (const x of answers.filter((e) => e.event === 'file_list')) expect(x.files.filter((p: string) => /shadow|passwd/.test(p))).toEqual([]);
      expect(a.rogue.stdout()).not.toContain(SHADOW.subarray(0, 16).toString('hex'));
      // The agent is still up and still answers its engine.
      expect(a.agent.child.exitCode).toBe(null);
      expect((await client.endOfWave(3)).error).toBeUndefined();
    } finally {
      // Also when an expectation failed: the engine's shared memory must not outlive the test.
      await engine?.close();
      await a.done();
    }
  });

  test('with the token: every rogue frame is dropped and counted, the agent never follows it', async () => {
    const tokDir = tmpDir('wavebus-squat-token-');
    const file = createTokenFile(tokDir);
    // The agent's SUB proves the token with PLAIN (a NULL squatter fails its handshake): this
    // rogue speaks PLAIN and admits whatever password it is given, so its frames reach the agent.
    const a = await attack(['--bus-token-file', file], true);
    try {
      await waitFor(() => /"reason":"no_mac"/.test(a.agent.stderr()), 'the agent to drop the rogue frames', 30000);
      expect(a.events().some((e) => e.event === 'plain_hello' && e.user === SUBSCRIBER_USER)).toBe(true);
      // The rogue's frames never made the agent ask it for anything beyond Hello.
      a.rogue.child.stdin!.write('files\n');
      await new Promise((r) => setTimeout(r, 1500));
      expect(a.events().filter((e) => e.event === 'snapshot_sent' || e.event === 'file_chunk' || e.event === 'file_list')).toEqual([]);
      expect(a.agent.stderr()).not.toMatch(/snapshot applied/);
      expect(a.agent.child.exitCode).toBe(null);
    } finally {
      await a.done();
    }
  });
});
