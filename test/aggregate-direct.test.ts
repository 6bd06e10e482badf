// Direct fetch of `wavebus aggregate` with CURVE (docs/aggregate.md): each agent serves its files
// on a CURVE socket of its own, admitting only the coordinator's allow-list. Two network
// namespaces joined by a veth pair: the coordinator (CURVE, no --insecure) and the tool on host A,
// two real `wavebus agent` processes on host B, each with a dump root of its own (as if on two hosts). Rank 0 serves on its address toward the
// coordinator; rank 1 is told to serve on host B's loopback, which host A cannot reach, so its
// chunks must come through the coordinator. A key not on the allow-list gets nothing from an
// agent's socket (the refusal is logged with its count), and garbage does not take it down.
// Needs root (CI runs as root).
import * as fs from 'fs';
import * as path from 'path';
import { Bundle } from '../src/artifacts/bundle';
import { Tensor } from '../src/artifacts/tensor';
import { curveDirFiles, newKeyPair, writeKeyPair } from '../src/bus/curve';
import { directFilesSetup } from '../src/commands/direct-files-flags';
import { checkFileServeReply } from '../src/tools/aggregate-direct';
import { CLI, ROOT, cleanup, cleanupNetns, createNetnsPair, rootOnlyReason, spawnInNetns, tmpDir, waitFor, type NetnsPair, type Spawned } from './helpers';

jest.setTimeout(120000);

const why = rootOnlyReason();
const PORT = 29600; // a fresh namespace has every port free
const WAVE = 'token_repeat/req-1/wave_5';
const rel = (rank: number) => path.join('dumps', WAVE, `dp0_tp${rank}_pp0_cp0`, 'kv.npy');

async function writeBundle(dumps: string, rank: number): Promise<void> {
  const b = Bundle.begin(path.join(dumps, WAVE, `dp0_tp${rank}_pp0_cp0`));
  const data = Buffer.alloc(5 * 2 ** 20 + 333, 0x40 + rank); // three 2 MiB chunks
  const f = await b.writeTensor('kv.npy', 'npy', Tensor.fromBuffer('uint8', [data.length], data));
  await b.commit({ name: 'dump.json', value: { schema: 1, req_id: 'req-1', arm_wave: 5, files: [f] } });
}

(why ? describe.skip : describe)(`aggregate: direct fetch from the agents' own CURVE sockets${why ? ` (skipped: ${why})` : ''}`, () => {
  let pair: NetnsPair;
  let keyDir: string;
  let strangerDir: string;
  /** Each rank's dump root. */
  const dumps: string[] = [];
  const agents: Spawned[] = [];

  beforeAll(async () => {
    pair = createNetnsPair(5);
    keyDir = tmpDir('wavebus-aggdirect-keys-');
    writeKeyPair(keyDir, 'coordinator');
    writeKeyPair(keyDir, 'agent');
    strangerDir = tmpDir('wavebus-aggdirect-stranger-');
    writeKeyPair(strangerDir, 'stranger');
    for (const r of [0, 1]) {
      dumps.push(path.join(tmpDir('wavebus-aggdirect-hostB-'), 'dumps'));
      await writeBundle(dumps[r], r);
    }
    const f = curveDirFiles(keyDir);
    const cwd = tmpDir('wavebus-aggdirect-coord-');
    const coord = spawnInNetns(pair.a, process.execPath, [CLI, 'coordinator', '--host', pair.addrA, '--port', String(PORT), '--world-size', '2', '--tp', '2', '--pp', '1', '--heartbeat-ms', '100', '--curve-secret-key', f.serverKey, '--curve-allow', f.allow], { cwd });
    await waitFor(() => coord.stdout().includes('"started"'), `the CURVE coordinator on ${pair.addrA} (stderr: ${coord.stderr()})`);
    for (const rank of [0, 1]) {
      const extra = rank === 1 ? ['--direct-files-host', '127.0.0.1'] : [];
      agents.push(
        spawnInNetns(pair.b, process.execPath, [
          CLI, 'agent', '--coordinator', `${pair.addrA}:${PORT}`, '--rank', String(rank), '--local-rank', String(rank), '--world-size', '2', '--tp', '2', '--pp', '1',
          '--heartbeat-ms', '100', '--dump-root', dumps[rank], '--curve-server-key', f.serverPub, '--curve-key', f.clientKey, ...extra,
        ], { env: { ...process.env, WAVEBUS_LOG_LEVEL: 'info' } }), // their log says when they synced and what they refused
      );
    }
    await waitFor(() => agents.every((a) => /snapshot applied/.test(a.stdout() + a.stderr())), `both agents to sync over CURVE (${agents.map((a) => `exit ${a.child.exitCode}: ${a.stdout().slice(-300)} ${a.stderr().slice(-500)}`).join(' | ')})`, 30000);
  });

  afterAll(async () => {
    await cleanup();
    cleanupNetns();
  });

  const runAggregate = async (args: string[]) => {
    const p = spawnInNetns(pair.a, process.execPath, [CLI, 'aggregate', '--coordinator', `${pair.addrA}:${PORT}`, '--curve-dir', keyDir, '--timeout-ms', '10000', '--json', ...args]);
    const { code } = await p.exited;
    return { code, stdout: p.stdout(), stderr: p.stderr() };
  };

  test('rank 0 straight from its socket, rank 1 (unreachable socket) through the relay: a whole, verified tree that says which', async () => {
    const out = tmpDir('wavebus-aggdirect-out-');
    const r = await runAggregate(['--out', out, '--direct-timeout-ms', '1500']);
    expect(r.code).toBe(0);
    const m = JSON.parse(r.stdout);
    expect(m.complete).toBe(true);
    expect(m.direct).toEqual({ asked: true, ranks: [0], relayed: [1] });
    expect(m.ranks['0'].transport).toBe('direct');
    expect(m.ranks['0'].endpoint).toBe(`tcp://${pair.addrB}:${m.ranks['0'].endpoint.split(':').pop()}`);
    expect(m.ranks['1'].transport).toBe('relay');
    expect(m.ranks['1'].direct_error).toMatch(/tcp:\/\/127\.0\.0\.1:\d+ did not answer within 1500 ms/);
    expect(r.stderr).toMatch(/rank 1: fetched through the coordinator, not directly/);
    for (const rank of [0, 1]) {
      expect(fs.readFileSync(path.join(out, rel(rank))).equals(fs.readFileSync(path.join(path.dirname(dumps[rank]), rel(rank))))).toBe(true);
      expect(m.files.find((x: { path: string }) => x.path.endsWith(`dp0_tp${rank}_pp0_cp0/kv.npy`))).toMatchObject({ rank, status: 'fetched', verified: true });
    }
  });

  test('--relay: every chunk through the coordinator, no direct socket asked', async () => {
    const out = tmpDir('wavebus-aggdirect-out-');
    const r = await runAggregate(['--out', out, '--relay']);
    expect(r.code).toBe(0);
    const m = JSON.parse(r.stdout);
    expect(m.direct).toEqual({ asked: false, ranks: [], relayed: [] });
    expect(fs.readFileSync(path.join(out, rel(0))).equals(fs.readFileSync(path.join(path.dirname(dumps[0]), rel(0))))).toBe(true);
  });

  test("a key not on the allow-list gets nothing from an agent's socket; garbage is dropped and counted; the agent keeps serving", async () => {
    const dist = (m: string) => JSON.stringify(path.join(ROOT, 'dist', 'src', ...m.split('/')));
    const script = `
      const zmq = require('zeromq');
      const { RelayClient } = require(${dist('bus/relay-client.js')});
      const { DirectClient, checkFileServeReply } = require(${dist('tools/aggregate-direct.js')});
      const { loadCurveDirClient, loadKeyPair, clientSocketOptions } = require(${dist('bus/curve.js')});
      const { encodeCoordinatorMessage } = require(${dist('bus/frames.js')});
      const { PROTOCOL_VERSION } = require(${dist('bus/protocol-version.js')});
      (async () => {
        const keys = loadCurveDirClient(${JSON.stringify(keyDir)});
        const relay = new RelayClient({ host: ${JSON.stringify(pair.addrA)}, port: ${PORT} }, undefined, undefined, keys);
        const s = checkFileServeReply(await relay.fileServe(0, 5000));
        const out = { endpoint: s.endpoint };
        const req = { root: 'dumps', path: ${JSON.stringify(path.join(WAVE, 'dp0_tp0_pp0_cp0', 'kv.npy'))}, offset: 0, length: 1000 };
        // A stranger's key: the handshake is refused, no byte of a file comes back.
        const stranger = loadKeyPair(${JSON.stringify(path.join(strangerDir, 'stranger.key'))}, 'test');
        const bad = new DirectClient(0, s.endpoint, s.serverKey, { ...stranger, serverPublicKey: s.serverKey }, false);
        try { const c = await bad.fileChunk(0, req, 4000); out.stranger = 'GOT ' + c.offset; } catch (e) { out.stranger = e.code; }
        await bad.close();
        // Plain text (no CURVE) and garbage over an admitted CURVE connection.
        const plain = new zmq.Dealer({ linger: 0 });
        plain.connect(s.endpoint);
        await plain.send([Buffer.from('GET / HTTP/1.0')]);
        const raw = new zmq.Dealer({ linger: 0, ...clientSocketOptions({ ...keys, serverPublicKey: s.serverKey }) });
        raw.connect(s.endpoint);
        await raw.send([Buffer.from([0xff, 0xff, 0xff, 0x0f, 1, 2, 3])]);
        await raw.send([Buffer.from('a'), Buffer.from('b'), Buffer.from('c')]);
        await raw.send([encodeCoordinatorMessage({ requestId: 7, status: { protocolVersion: PROTOCOL_VERSION } })]);
        await new Promise((r) => setTimeout(r, 300));
        // The agent still serves an admitted client.
        const good = new DirectClient(0, s.endpoint, s.serverKey, keys, false);
        const c = await good.fileChunk(0, req, 5000);
        out.good = c.offset === 0 ? require(${dist('bus/payload.js')}).payloadOf(c).length : -1;
        await good.close();
        plain.close(); raw.close();
        await relay.close();
        process.stdout.write(JSON.stringify(out) + '\\n');
        process.exit(0);
      })().catch((e) => { process.stderr.write(String(e && e.stack || e)); process.exit(1); });`;
    const p = spawnInNetns(pair.a, process.execPath, ['-e', script]);
    const { code } = await p.exited;
    expect(p.stderr()).toBe('');
    expect(code).toBe(0);
    const out = JSON.parse(p.stdout());
    expect(out.endpoint).toContain(pair.addrB);
    expect(out.stranger).toBe('ERR_HANDSHAKE');
    expect(out.good).toBe(1000);
    const log = () => agents[0].stdout() + agents[0].stderr();
    await waitFor(() => /"reason":"unknown_key","total":1/.test(log()), `rank 0 to log the refused key (${log().slice(-1500)})`, 5000);
    await waitFor(() => /"reason":"handshake_failed"/.test(log()), 'rank 0 to log the plain-text peer', 5000);
    for (const reason of ['truncated|undecodable', 'frame_count', 'unexpected']) {
      expect(log()).toMatch(new RegExp(`rank 0 file socket","reason":"(${reason})"`));
    }
    expect(agents[0].child.exitCode).toBeNull();
  });
});

describe('direct fetch: flags and what a FileServeReply may say', () => {
  test('--direct-files, --direct-files-host, --direct-files-port and their variables: checked, errors name the flag or variable', () => {
    expect(directFilesSetup({}, {}, 0)).toEqual({ enabled: true });
    expect(directFilesSetup({ 'direct-files': 'off' }, {}, 0)).toEqual({ enabled: false });
    expect(directFilesSetup({}, { WAVEBUS_DIRECT_FILES: '0', WAVEBUS_DIRECT_FILES_HOST: '10.1.2.3', WAVEBUS_DIRECT_FILES_PORT: '40000' }, 3)).toEqual({ enabled: false, host: '10.1.2.3', port: 40003 });
    expect(() => directFilesSetup({ 'direct-files': 'maybe' }, {}, 0)).toThrow(/--direct-files: expected on or off, got "maybe"/);
    expect(() => directFilesSetup({}, { WAVEBUS_DIRECT_FILES_PORT: '70000' }, 0)).toThrow(/WAVEBUS_DIRECT_FILES_PORT: expected an integer in 1\.\.65535/);
    expect(() => directFilesSetup({ 'direct-files-port': '65535' }, {}, 1)).toThrow(/--direct-files-port: 65535 \+ local rank 1 is over 65535/);
  });

  test('a FileServeReply is used only with a tcp address and a CURVE key; anything else sends the rank through the relay', () => {
    const key = newKeyPair().publicKey;
    expect(checkFileServeReply({ endpoint: 'tcp://10.0.0.7:41234', serverKey: key })).toEqual({ endpoint: 'tcp://10.0.0.7:41234', serverKey: key, ipv6: false });
    expect(checkFileServeReply({ endpoint: 'tcp://[fd00::7]:41234', serverKey: key })).toMatchObject({ ipv6: true });
    expect(checkFileServeReply({ error: 'direct file serving is off' })).toEqual({ reason: 'direct file serving is off' });
    for (const endpoint of ['ipc:///tmp/x', 'tcp://evil.example:80', 'tcp://10.0.0.7:0', 'tcp://10.0.0.7:99999', 'tcp://10.0.0.7:1;rm', '']) {
      expect(checkFileServeReply({ endpoint, serverKey: key })).toEqual({ reason: expect.stringMatching(/no usable endpoint/) });
    }
    expect(checkFileServeReply({ endpoint: 'tcp://10.0.0.7:41234', serverKey: 'short' })).toEqual({ reason: 'the agent named no valid CURVE server key' });
  });
});
