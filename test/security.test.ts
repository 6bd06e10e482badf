// CURVE security of the wave bus: key files, the allow-list enforced by ZAP, peers without an
// allowed key getting and changing nothing, the bind rule, and the CLI flags end to end.
// Real sockets and processes, loopback only (a 0.0.0.0 bind is tested, but every peer connects
// to 127.0.0.1).
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { Dealer, Subscriber, curveKeyPair } from 'zeromq';
import { AgentBus, type WaveEvent } from '../src/bus/agent-bus';
import { Coordinator, requestStatus, type CoordinatorOptions } from '../src/bus/coordinator';
import {
  isZ85Key,
  loadAllowList,
  loadClientKeys,
  loadKeyPair,
  loadPublicKey,
  loadServerKeys,
  publicKeyOf,
  writeKeyPair,
  z85Decode,
  z85Encode,
  type CurveClientKeys,
  type CurveKeyPair,
  type CurveServerKeys,
} from '../src/bus/curve';
import { encodeAgentMessage, encodeBusFrame } from '../src/bus/frames';
import type { CoordinatorPolicy } from '../src/bus/policy';
import { ConfigError } from '../src/errors';
import { agentConfig } from '../src/guard/agent-config';
import { defaultConfig } from '../src/guard/config';
import { resolveIdentity } from '../src/launch/identity';
import type { WorldLayout } from '../src/layout';
import { createLogger } from '../src/log';
import type { DumpResult } from '../src/messages';
import { cleanup, freePortPair, portFree, runWavebus, spawnWavebus, tmpDir, waitFor } from './helpers';
import { DEFAULT_LOOKAHEAD_WAVES } from '../src/bus/constants';

jest.setTimeout(120000);
const quiet = createLogger('security-test', 'error');

const layoutOf = (worldSize: number): WorldLayout => ({ worldSize, tp: worldSize, pp: 1, dp: 1, cp: 1 });

const coordinators: Coordinator[] = [];
const buses: AgentBus[] = [];
const sockets: Array<Subscriber | Dealer> = [];

afterAll(async () => {
  for (const s of sockets) if (!s.closed) s.close();
  await Promise.all(buses.map((b) => b.stop()));
  await Promise.all(coordinators.map((c) => c.stop()));
  await cleanup();
});

/** A policy that records every call, so a test can assert it was never called by a forger. */
function recordingPolicy() {
  const calls = { waveHeads: [] as number[], dumpResults: [] as DumpResult[] };
  const policy: CoordinatorPolicy = {
    onWaveHead: (_replica, wave) => {
      calls.waveHeads.push(wave);
      return { dumps: [] };
    },
    onDumpResult: (r) => void calls.dumpResults.push(r),
    status: () => ({}),
    snapshotState: () => ({ configVersion: 0, config: null, manualDumpDone: 0 }),
  };
  return { calls, policy };
}

async function startCoordinator(opts: Partial<CoordinatorOptions> & { layout: WorldLayout; port: number }): Promise<Coordinator> {
  const c = new Coordinator({ logger: quiet, heartbeatMs: 100, deadAfterMs: 5000, dumpAckTimeoutMs: 60000, ...opts });
  coordinators.push(c);
  await c.start();
  return c;
}

function startAgent(rank: number, layout: WorldLayout, port: number, curve?: CurveClientKeys) {
  const identity = resolveIdentity({}, { rank, worldSize: layout.worldSize, tp: layout.tp, pp: layout.pp });
  const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity, heartbeatMs: 100, deadAfterMs: 5000, logger: quiet, curve });
  buses.push(bus);
  const waves: WaveEvent[] = [];
  bus.on('wave', (w: WaveEvent) => waves.push(w));
  return { bus, waves };
}

const clientKeys = (server: CurveKeyPair, own: CurveKeyPair): CurveClientKeys => ({ serverPublicKey: server.publicKey, publicKey: own.publicKey, secretKey: own.secretKey });
const serverKeys = (server: CurveKeyPair, ...allowed: CurveKeyPair[]): CurveServerKeys => ({ keyPair: server, allow: new Map(allowed.map((k, i) => [k.publicKey, `client${i}`])) });

/**
 * A raw peer that records everything it receives and resolves `refused` when its own socket
 * reports a failed security handshake (so tests wait for the refusal, not for time).
 */
function rawPeer(kind: 'sub' | 'dealer', port: number, curve?: CurveClientKeys) {
  const opts = { linger: 0, ...(curve ? { curveServerKey: curve.serverPublicKey, curvePublicKey: curve.publicKey, curveSecretKey: curve.secretKey } : {}) };
  const sock = kind === 'sub' ? new Subscriber(opts) : new Dealer({ ...opts, sendTimeout: 0 });
  sockets.push(sock);
  const got: Buffer[][] = [];
  let handshakes = 0;
  // Settles on the peer's first handshake outcome: refused resolves, admitted rejects at once.
  const refused = new Promise<string>((resolve, reject) => {
    for (const ev of ['handshake:error:auth', 'handshake:error:protocol', 'handshake:error:other'] as const) sock.events.on(ev, () => resolve(ev));
    sock.events.on('handshake', () => {
      handshakes++;
      reject(new Error(`a ${kind} peer without an allowed key completed the CURVE handshake`));
    });
  });
  refused.catch(() => undefined);
  if (sock instanceof Subscriber) sock.subscribe();
  sock.connect(`tcp://127.0.0.1:${kind === 'sub' ? port : port + 1}`);
  void (async () => {
    while (!sock.closed) {
      try {
        got.push(await sock.receive());
      } catch {
        if (sock.closed) return;
      }
    }
  })();
  return { sock, got, refused, handshakes: () => handshakes };
}

// ------------------------------------------------------------------ key files

describe('key files', () => {
  let dir: string;
  beforeAll(() => {
    dir = tmpDir('wavebus-keys-');
  });

  test('Z85 matches the spec test vector and round-trips', () => {
    const bytes = Buffer.from([0x86, 0x4f, 0xd2, 0x6f, 0xb5, 0x59, 0xf7, 0x5b]);
    expect(z85Encode(bytes)).toBe('HelloWorld');
    expect(z85Decode('HelloWorld')).toEqual(bytes);
    expect(z85Decode('Hello')!.length).toBe(4);
    expect(z85Decode('Hell')).toBeUndefined(); // length
    expect(z85Decode('Hell ')).toBeUndefined(); // character
    expect(z85Decode('#####')).toBeUndefined(); // value above 2^32-1
    const kp = curveKeyPair();
    expect(isZ85Key(kp.publicKey) && isZ85Key(kp.secretKey)).toBe(true);
    expect(publicKeyOf(kp.secretKey)).toBe(kp.publicKey);
  });

  test('`wavebus keys` writes NAME.key (0600, JSON) and NAME.pub, and refuses to overwrite', () => {
    const out = path.join(dir, 'made');
    const r = runWavebus(['keys', '--out', out, '--name', 'coordinator']);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const line = JSON.parse(r.stdout.trim());
    expect(line).toMatchObject({ event: 'keys', name: 'coordinator', key_file: path.join(out, 'coordinator.key'), pub_file: path.join(out, 'coordinator.pub') });
    expect(fs.statSync(out).mode & 0o777).toBe(0o700);
    expect(fs.statSync(line.key_file).mode & 0o777).toBe(0o600);
    const doc = JSON.parse(fs.readFileSync(line.key_file, 'utf8'));
    expect(doc).toEqual({ type: 'wavebus-curve-keypair', name: 'coordinator', public_key: line.public_key, secret_key: expect.any(String) });
    expect(publicKeyOf(doc.secret_key)).toBe(doc.public_key);
    expect(loadKeyPair(line.key_file, '--curve-key')).toEqual({ publicKey: doc.public_key, secretKey: doc.secret_key });
    expect(fs.readFileSync(line.pub_file, 'utf8')).toBe(`# wavebus CURVE public key: coordinator\n${doc.public_key}\n`);
    expect(loadPublicKey(line.pub_file, '--curve-server-key')).toBe(doc.public_key);

    // A second run with the same name changes nothing.
    const before = fs.readFileSync(line.key_file, 'utf8');
    const again = runWavebus(['keys', '--out', out, '--name', 'coordinator']);
    expect(again.code).toBe(2);
    expect(again.stderr).toContain(`${path.join(out, 'coordinator.key')} already exists`);
    expect(again.stderr).toContain('ERR_KEY_EXISTS');
    expect(fs.readFileSync(line.key_file, 'utf8')).toBe(before);
    // Even when only the .pub is there.
    fs.writeFileSync(path.join(out, 'lonely.pub'), 'x\n');
    expect(() => writeKeyPair(out, 'lonely')).toThrow(/lonely\.pub already exists/);
    expect(fs.existsSync(path.join(out, 'lonely.key'))).toBe(false);

    // Default name: the short host name.
    const d = runWavebus(['keys', '--out', out]);
    expect(d.code).toBe(0);
    expect(JSON.parse(d.stdout).name).toBe(os.hostname().split('.')[0].replace(/[^A-Za-z0-9._-]/g, '_').replace(/^[.-]+/, ''));

    const bad = runWavebus(['keys', '--out', out, '--name', '../evil']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--name "\.\.\/evil"/);
    expect(runWavebus(['keys']).stderr).toMatch(/--out DIR is required/);
  });

  test('`wavebus keys --allow-list DIR` prints one `KEY name` line per *.pub, which loads back', () => {
    const pubs = path.join(dir, 'pubs');
    const a = writeKeyPair(pubs, 'host-a');
    const b = writeKeyPair(pubs, 'host-b');
    const r = runWavebus(['keys', '--allow-list', pubs]);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(`${a.publicKey} host-a\n${b.publicKey} host-b\n`);
    const file = path.join(dir, 'allow.txt');
    fs.writeFileSync(file, `# collected keys\n${r.stdout}`);
    expect(loadAllowList(file, '--curve-allow')).toEqual(new Map([[a.publicKey, 'host-a'], [b.publicKey, 'host-b']]));
    expect(loadAllowList(pubs, '--curve-allow')).toEqual(new Map([[a.publicKey, 'host-a'], [b.publicKey, 'host-b']]));
  });

  test('allow-list comments and labels; a key holding "#" is still a key', () => {
    let k = curveKeyPair();
    while (!k.publicKey.slice(1).includes('#')) k = curveKeyPair();
    const other = curveKeyPair();
    const file = path.join(dir, 'hash.txt');
    fs.writeFileSync(file, `# a comment\n#\n\n${k.publicKey}\n  ${other.publicKey}   labelled host # trailing\n`);
    const allow = loadAllowList(file, '--curve-allow');
    expect([...allow.keys()]).toEqual([k.publicKey, other.publicKey]);
    expect(allow.get(k.publicKey)).toBe('hash.txt:4');
    expect(allow.get(other.publicKey)).toBe('labelled host # trailing');
    // The first Z85 digit of a 4-byte group is at most '%' (index 82), so a key never starts with '#'.
    expect(z85Encode(Buffer.from([0xff, 0xff, 0xff, 0xff]))).toBe('%nSc0');
  });

  test('bad key files: ConfigError naming the flag and the file', () => {
    const kp = writeKeyPair(path.join(dir, 'bad'), 'good');
    const f = (name: string, text: string, mode = 0o600) => {
      const p = path.join(dir, 'bad', name);
      fs.writeFileSync(p, text, { mode });
      fs.chmodSync(p, mode);
      return p;
    };
    const expectErr = (fn: () => unknown, ...parts: (string | RegExp)[]) => {
      let err: unknown;
      try {
        fn();
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(ConfigError);
      for (const p of parts) expect((err as Error).message).toMatch(p);
      return err as ConfigError;
    };
    const missing = path.join(dir, 'bad', 'nope.key');
    expectErr(() => loadKeyPair(missing, '--curve-key'), `--curve-key ${missing}`, /ENOENT/);
    expectErr(() => loadPublicKey(missing, '--curve-server-key'), `--curve-server-key ${missing}`);
    expectErr(() => loadAllowList(missing, '--curve-allow'), `--curve-allow ${missing}`);

    const doc = JSON.parse(fs.readFileSync(kp.keyFile, 'utf8'));
    const open = f('open.key', JSON.stringify(doc), 0o644);
    expect(expectErr(() => loadKeyPair(open, '--curve-key'), `--curve-key ${open}`, /0644 are too open/, /chmod 600/).code).toBe('ERR_KEY_PERMISSIONS');
    const short = f('short.key', JSON.stringify({ ...doc, secret_key: doc.secret_key.slice(0, 39) }));
    expectErr(() => loadKeyPair(short, '--curve-secret-key'), `--curve-secret-key ${short}`, /secret_key is not a 40-character Z85/, /39 characters/);
    const notZ85 = f('space.key', JSON.stringify({ ...doc, public_key: `${doc.public_key.slice(0, 39)} ` }));
    expectErr(() => loadKeyPair(notZ85, '--curve-key'), `--curve-key ${notZ85}`, /public_key is not a 40-character Z85/);
    const mixed = f('mixed.key', JSON.stringify({ ...doc, public_key: curveKeyPair().publicKey }));
    expectErr(() => loadKeyPair(mixed, '--curve-key'), `--curve-key ${mixed}`, /does not belong to secret_key/);
    expectErr(() => loadKeyPair(f('pub-as-key', fs.readFileSync(kp.pubFile, 'utf8')), '--curve-key'), /--curve-key .*pub-as-key: not a wavebus key file.*looks like a \.pub file/);
    expectErr(() => loadKeyPair(f('other.json', '{"type":"x"}'), '--curve-key'), /--curve-key .*other\.json: not a wavebus key file/);

    expectErr(() => loadPublicKey(kp.keyFile, '--curve-server-key'), `--curve-server-key ${kp.keyFile}`, /secret \.key file; pass the public \.pub/);
    const twoKeys = f('two.pub', `${curveKeyPair().publicKey}\n${curveKeyPair().publicKey}\n`);
    expectErr(() => loadPublicKey(twoKeys, '--curve-server-key'), `--curve-server-key ${twoKeys}`, /exactly one public key, found 2/);
    // Z85's alphabet has '{': a public key that starts with one is a key, not a .key document.
    const brace = `{${curveKeyPair().publicKey.slice(1)}`;
    expect(loadPublicKey(f('brace.pub', `${brace}\n`), '--curve-server-key')).toBe(brace);
    const garbage = f('garbage.txt', `# ok\n${kp.publicKey}\nnot-a-key here\n`);
    expectErr(() => loadAllowList(garbage, '--curve-allow'), `--curve-allow ${garbage}:3`, /"not-a-key"/);
    const empty = path.join(dir, 'bad', 'emptydir');
    fs.mkdirSync(empty);
    expectErr(() => loadAllowList(empty, '--curve-allow'), `--curve-allow ${empty}`, /holds no public key/);
    expectErr(() => loadAllowList(f('comments-only', '# nothing\n'), '--curve-allow'), /holds no public key/);

    // Flags come in pairs.
    expectErr(() => loadServerKeys(kp.keyFile, undefined), /--curve-secret-key needs --curve-allow/);
    expectErr(() => loadServerKeys(undefined, kp.pubFile), /--curve-allow needs --curve-secret-key/);
    expectErr(() => loadClientKeys(kp.pubFile, undefined), /--curve-server-key needs --curve-key/);
    expectErr(() => loadClientKeys(undefined, kp.keyFile), /--curve-key needs --curve-server-key/);
    expect(loadServerKeys(undefined, undefined)).toBeUndefined();
    expect(loadServerKeys(kp.keyFile, kp.pubFile)!.allow.has(kp.publicKey)).toBe(true);
  });

  test('CLI: bad key flags exit 2 naming the flag and the file', () => {
    const kp = writeKeyPair(path.join(dir, 'cli'), 'k');
    const r1 = runWavebus(['agent', '--rank', '0', '--world-size', '1', '--curve-server-key', kp.keyFile, '--curve-key', kp.keyFile]);
    expect(r1.code).toBe(2);
    expect(r1.stderr).toContain(`--curve-server-key ${kp.keyFile}`);
    const missing = path.join(dir, 'cli', 'missing.key');
    const r2 = runWavebus(['coordinator', '--world-size', '1', '--port', '1', '--curve-secret-key', missing, '--curve-allow', kp.pubFile]);
    expect(r2.code).toBe(2);
    expect(r2.stderr).toContain(`--curve-secret-key ${missing}`);
    const r3 = runWavebus(['coordinator', '--world-size', '1', '--port', '1', '--curve-secret-key', kp.keyFile]);
    expect(r3.code).toBe(2);
    expect(r3.stderr).toMatch(/--curve-secret-key needs --curve-allow/);
  });
});

// ------------------------------------------------------------------ CURVE bus, in process

describe('CURVE bus (library)', () => {
  const server = curveKeyPair();
  const allowed = curveKeyPair();
  const stranger = curveKeyPair();
  const layout = layoutOf(1);
  let port: number;
  let c: Coordinator;
  let rec: ReturnType<typeof recordingPolicy>;
  let agent: ReturnType<typeof startAgent>;
  const coordinatorWaves: number[] = [];
  let nextWave = 1;

  /** The allowed agent (TP0) starts `count` waves; resolves when it has received all of them. */
  async function waves(count: number): Promise<number[]> {
    const sent: number[] = [];
    for (let i = 0; i < count; i++) {
      sent.push(nextWave);
      agent.bus.sendWaveHead(nextWave++, null);
    }
    // Head N publishes vector N + DEFAULT_LOOKAHEAD_WAVES: once the agent has the last one, the coordinator
    // has handled every head sent.
    const last = sent[sent.length - 1] + DEFAULT_LOOKAHEAD_WAVES;
    await waitFor(() => agent.waves.some((w) => w.head.wave === last), `allowed agent to receive wave ${last}`);
    return sent;
  }

  beforeAll(async () => {
    port = await freePortPair();
    rec = recordingPolicy();
    c = await startCoordinator({ port, layout, curve: serverKeys(server, allowed), policy: rec.policy });
    c.on('wave', (h: { wave: number }) => coordinatorWaves.push(h.wave));
    agent = startAgent(0, layout, port, clientKeys(server, allowed));
    await agent.bus.start();
    await waitFor(() => c.ready && agent.bus.synced, 'the allowed agent to sync');
  });

  test('an allowed agent receives waves; its wave heads and dump acks reach the coordinator', async () => {
    const sent = await waves(5);
    expect(agent.waves.map((w) => w.head.wave)).toEqual(sent.map((w) => w + DEFAULT_LOOKAHEAD_WAVES));
    expect(rec.calls.waveHeads).toEqual(sent);
    expect(coordinatorWaves).toEqual(sent.map((w) => w + DEFAULT_LOOKAHEAD_WAVES));

    const complete = new Promise<{ jobId: string }>((resolve) => c.once('dump-complete', resolve));
    c.armDumps([{ incidentType: 'nan', reqId: 'r1', blockIds: [1, 2], detectWave: 0, armWave: 0, dumpDir: '/tmp/x', requestFinishedAtDump: false, jobId: '', replica: 0, ranks: [] }]);
    const [head] = await waves(1);
    const w = head + DEFAULT_LOOKAHEAD_WAVES; // the vector the job rides on, and its arm wave
    const lane = agent.waves.find((x) => x.head.wave === w)!.dump!;
    expect(lane.jobs.map((j) => j.jobId)).toEqual([`${w}/nan/r1`]);
    agent.bus.sendDumpResult({ jobId: lane.jobs[0].jobId, globalRank: 0, wave: w, files: [], bytes: 0, error: '', skippedReason: '' });
    expect((await complete).jobId).toBe(`${w}/nan/r1`);
    expect(rec.calls.dumpResults.map((r) => r.jobId)).toEqual([`${w}/nan/r1`]);
    expect(c.stats.refused).toEqual({});
    expect(c.status().security).toEqual({ curve: true, allowed_keys: 1, refused: {}, bus_token: false });
  });

  test('subscribers without an allowed key receive nothing while the allowed agent receives N waves', async () => {
    const peers = {
      stranger: rawPeer('sub', port, clientKeys(server, stranger)),
      wrongServerKey: rawPeer('sub', port, clientKeys(curveKeyPair(), allowed)),
      plaintext: rawPeer('sub', port),
    };
    for (const p of Object.values(peers)) await p.refused;
    await waitFor(() => (c.stats.refused.unknown_key ?? 0) >= 1 && (c.stats.refused.handshake_failed ?? 0) >= 1, 'the coordinator to count the refusals');
    const before = agent.waves.length;
    const sent = await waves(20);
    expect(agent.waves.slice(before).map((w) => w.head.wave)).toEqual(sent.map((w) => w + DEFAULT_LOOKAHEAD_WAVES));
    for (const [name, p] of Object.entries(peers)) {
      expect({ name, frames: p.got.length, handshakes: p.handshakes() }).toEqual({ name, frames: 0, handshakes: 0 });
    }
    const status = c.status().security as { refused: Record<string, number> };
    expect(status.refused.unknown_key).toBeGreaterThanOrEqual(1);
  });

  test('forged wave heads, dump acks, hellos, status asks and config frames from peers without an allowed key have no effect', async () => {
    const forgedJob = 'forged/nan/r9';
    c.armDumps([{ incidentType: 'nan', reqId: 'r9', blockIds: [], detectWave: 0, armWave: 0, dumpDir: '', requestFinishedAtDump: false, jobId: forgedJob, replica: 0, ranks: [] }]);
    await waves(1); // the job is pending now; only rank 0 may ack it
    const pendingBefore = c.pendingDumpLanes();
    const heads = rec.calls.waveHeads.length;
    const results = rec.calls.dumpResults.length;
    const refusedBefore = (c.stats.refused.unknown_key ?? 0) + (c.stats.refused.handshake_failed ?? 0);
    const identity = { globalRank: 0, worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1, pid: 1, host: 'forger' };
    const forged = [
      encodeAgentMessage({ globalRank: 0, waveHead: { wave: 900001 } }),
      encodeAgentMessage({ globalRank: 0, dumpResult: { jobId: forgedJob, globalRank: 0 } }),
      encodeAgentMessage({ globalRank: 0, hello: { identity, subscribed: true } }),
      encodeAgentMessage({ globalRank: 0, requestId: 7, status: {} }),
      encodeAgentMessage({ globalRank: 0, requestId: 8, snapshot: { globalRank: 0 } }),
    ];
    const fakeConfig = encodeBusFrame(c.epoch, c.seq + 1, 'config', { wave: 900001, version: 99, config: agentConfig(defaultConfig(), { hotReload: true, dumpRoot: '' }) });
    const peers = {
      stranger: rawPeer('dealer', port, clientKeys(server, stranger)),
      wrongServerKey: rawPeer('dealer', port, clientKeys(curveKeyPair(), allowed)),
      plaintext: rawPeer('dealer', port),
    };
    for (const p of Object.values(peers)) {
      for (const m of forged) await (p.sock as Dealer).send(m).catch(() => undefined);
      await (p.sock as Dealer).send(fakeConfig).catch(() => undefined);
    }
    for (const p of Object.values(peers)) await p.refused;
    await waitFor(() => (c.stats.refused.unknown_key ?? 0) + (c.stats.refused.handshake_failed ?? 0) >= refusedBefore + 2, 'the coordinator to count the refusals');
    // A marker wave from the allowed agent: the coordinator has handled everything before it.
    const [marker] = await waves(1);
    expect(rec.calls.waveHeads.slice(heads)).toEqual([marker]);
    expect(rec.calls.dumpResults.length).toBe(results);
    expect(coordinatorWaves).not.toContain(900001);
    expect(c.wave).toBe(marker);
    expect(c.pendingDumpLanes()).toEqual(pendingBefore);
    expect(agent.waves.some((w) => w.config !== undefined)).toBe(false);
    expect(c.liveRanks()).toEqual([0]);
    expect((c.status().ranks as Record<string, { host: string }>)['0'].host).not.toBe('forger');
    for (const [name, p] of Object.entries(peers)) {
      expect({ name, replies: p.got.length, handshakes: p.handshakes() }).toEqual({ name, replies: 0, handshakes: 0 });
    }
  });

  test('requestStatus answers with allowed client keys and never without them', async () => {
    const s = await requestStatus({ host: '127.0.0.1', port }, 10000, clientKeys(server, allowed));
    expect(s.ready).toBe(true);
    expect(JSON.parse(s.statusJson).security.curve).toBe(true);
    await expect(requestStatus({ host: '127.0.0.1', port }, 300)).rejects.toMatchObject({ code: 'ERR_TIMEOUT' });
    await expect(requestStatus({ host: '127.0.0.1', port }, 300, clientKeys(server, stranger))).rejects.toMatchObject({ code: 'ERR_TIMEOUT' });
  });
});

// ------------------------------------------------------------------ the bind rule

describe('bind rule with CURVE', () => {
  test('non-loopback bind is allowed with keys (peers connect to 127.0.0.1), refused without keys and without --insecure', async () => {
    const server = curveKeyPair();
    const allowed = curveKeyPair();
    const port = await freePortPair();
    const c = await startCoordinator({ host: '0.0.0.0', port, layout: layoutOf(1), curve: serverKeys(server, allowed) });
    expect(c.curve).toBe(true);
    const a = startAgent(0, layoutOf(1), port, clientKeys(server, allowed));
    await a.bus.start();
    await waitFor(() => c.ready && a.bus.synced, 'the agent to sync over 127.0.0.1');

    const port2 = await freePortPair();
    const err = await new Coordinator({ host: '0.0.0.0', port: port2, layout: layoutOf(1), logger: quiet }).start().then(() => null, (e) => e);
    expect(err).toBeInstanceOf(ConfigError);
    expect(err.code).toBe('ERR_INSECURE_BIND');
    expect(err.message).toMatch(/--curve-secret-key FILE --curve-allow/);
    expect(await portFree(port2)).toBe(true);
  });

  test('two CURVE coordinators in one process keep separate allow-lists', async () => {
    const [s1, s2, k1, k2] = [curveKeyPair(), curveKeyPair(), curveKeyPair(), curveKeyPair()];
    const [p1, p2] = [await freePortPair(), await freePortPair()];
    const c1 = await startCoordinator({ port: p1, layout: layoutOf(1), curve: serverKeys(s1, k1) });
    const c2 = await startCoordinator({ port: p2, layout: layoutOf(1), curve: serverKeys(s2, k2) });
    const good = [startAgent(0, layoutOf(1), p1, clientKeys(s1, k1)), startAgent(0, layoutOf(1), p2, clientKeys(s2, k2))];
    for (const g of good) await g.bus.start();
    await waitFor(() => c1.ready && c2.ready, 'both coordinators ready');
    // k1 is allowed by c1 only: against c2 it is refused.
    const cross = rawPeer('sub', p2, clientKeys(s2, k1));
    await cross.refused;
    await waitFor(() => (c2.stats.refused.unknown_key ?? 0) >= 1, 'c2 to refuse k1');
    expect(c1.stats.refused).toEqual({});
    expect(cross.handshakes()).toBe(0);
  });
});

// ------------------------------------------------------------------ CLI end to end

describe('CLI end to end', () => {
  let dir: string;
  beforeAll(() => {
    dir = tmpDir('wavebus-curve-cli-');
    for (const n of ['coordinator', 'agent', 'stranger']) expect(runWavebus(['keys', '--out', dir, '--name', n]).code).toBe(0);
    // The allow-list directory holds the agent's key only.
    fs.mkdirSync(path.join(dir, 'allowed'));
    fs.copyFileSync(path.join(dir, 'agent.pub'), path.join(dir, 'allowed', 'agent.pub'));
  });

  test('coordinator and agents with key files: the allowed agent joins, the stranger never does', async () => {
    const port = await freePortPair();
    const co = spawnWavebus([
      'coordinator', '--host', '0.0.0.0', '--port', String(port), '--world-size', '2', '--heartbeat-ms', '100',
      '--curve-secret-key', path.join(dir, 'coordinator.key'), '--curve-allow', path.join(dir, 'allowed'),
    ]);
    await waitFor(() => co.stdout().includes('"event":"started"'), `coordinator start: ${co.stderr()}`);
    expect(JSON.parse(co.stdout().split('\n')[0])).toMatchObject({ event: 'started', curve: true });
    const agentArgs = (rank: number, key: string) => [
      'agent', '--rank', String(rank), '--world-size', '2', '--coordinator', `127.0.0.1:${port}`, '--heartbeat-ms', '100',
      '--curve-server-key', path.join(dir, 'coordinator.pub'), '--curve-key', path.join(dir, `${key}.key`),
    ];
    spawnWavebus(agentArgs(0, 'agent'));
    spawnWavebus(agentArgs(1, 'stranger'));
    const keys = loadClientKeys(path.join(dir, 'coordinator.pub'), path.join(dir, 'agent.key'))!;
    const status = await waitFor(async () => {
      const s = await requestStatus({ host: '127.0.0.1', port }, 2000, keys);
      const j = JSON.parse(s.statusJson);
      return s.liveRanks.includes(0) && (j.security.refused.unknown_key ?? 0) >= 2 ? s : undefined;
    }, 'rank 0 live and the stranger refused');
    expect(status.liveRanks).toEqual([0]);
    expect(status.ready).toBe(false);
    expect(JSON.parse(status.statusJson).ranks['1']).toBeUndefined();
    co.child.kill('SIGTERM');
    expect((await co.exited).code).toBe(0);
  });

  test('wavebus launch --curve-dir: coordinator, agent and readiness polling all use CURVE', async () => {
    const port = await freePortPair();
    const r = spawnWavebus(['launch', '--ready-timeout-ms', '60000', '--port', String(port), '--curve-dir', dir, '--', process.execPath, '-e', 'process.exit(7)']);
    const { code } = await r.exited;
    expect({ code, stderr: code === 7 ? '' : r.stderr() }).toEqual({ code: 7, stderr: '' });
    expect(r.stderr()).toMatch(/\[coordinator\] \{"event":"started".*"curve":true/);

    // A --curve-dir without the coordinator's public key fails before anything starts.
    const empty = tmpDir('wavebus-curve-empty-');
    const bad = runWavebus(['launch', '--port', String(port), '--curve-dir', empty, '--', 'true']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain(`--curve-dir ${path.join(empty, 'coordinator.pub')}`);
  });
});
