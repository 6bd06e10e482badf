// `wavebus aggregate` against a coordinator that runs with CURVE on a non-loopback address: two
// network namespaces joined by a veth pair; the coordinator binds host A's address with CURVE keys
// (no --insecure), the agents and the tool run on host B. With --curve-dir (or the explicit key
// pair) the tool collects every rank's bundles; without keys it fails at once, naming the flags.
// Needs root (CI runs as root); a failure to create the namespaces fails the test.
import * as fs from 'fs';
import * as path from 'path';
import { Bundle } from '../src/artifacts/bundle';
import { Tensor } from '../src/artifacts/tensor';
import { curveDirFiles, writeKeyPair } from '../src/bus/curve';
import { CLI, ROOT, cleanup, cleanupNetns, createNetnsPair, describeAsRoot, spawnInNetns, tmpDir, waitFor, type NetnsPair } from './helpers';

jest.setTimeout(120000);

const PORT = 29600; // a fresh namespace has every port free
const WAVE = 'token_repeat/req-1/wave_3';

async function writeBundle(root: string, rank: number): Promise<void> {
  const b = Bundle.begin(path.join(root, 'dumps', WAVE, `dp0_tp${rank}_pp0_cp0`));
  const data = Buffer.alloc(3 * 2 ** 20 + 17, rank + 1); // more than one 2 MiB chunk
  const f = await b.writeTensor('kv.npy', 'npy', Tensor.fromBuffer('uint8', [data.length], data));
  await b.commit({ name: 'dump.json', value: { schema: 1, req_id: 'req-1', arm_wave: 3, files: [f] } });
}

/** Agents for ranks 0 and 1 inside `ns`, with the CURVE client keys of `keyDir`; prints "synced <rank>". */
function startAgents(ns: string, host: string, keyDir: string, root: string) {
  const dist = (m: string) => JSON.stringify(path.join(ROOT, 'dist', 'src', ...m.split('/')));
  const script = `
    const { AgentBus } = require(${dist('bus/agent-bus.js')});
    const { FileServer } = require(${dist('agent/file-server.js')});
    const { DirectFiles, fileRequestHandler } = require(${dist('agent/direct-files.js')});
    const { resolveIdentity } = require(${dist('launch/identity.js')});
    const { loadCurveDirClient } = require(${dist('bus/curve.js')});
    const { createLogger } = require(${dist('log.js')});
    const curve = loadCurveDirClient(${JSON.stringify(keyDir)});
    for (const rank of [0, 1]) {
      const log = createLogger('agent', 'silent');
      const bus = new AgentBus({ coordinator: { host: ${JSON.stringify(host)}, port: ${PORT} }, identity: resolveIdentity({}, { rank, worldSize: 2, tp: 2, pp: 1 }), heartbeatMs: 100, curve, logger: log });
      const server = new FileServer(rank, () => ({ dumps: ${JSON.stringify(path.join(root, 'dumps'))}, snapshots: ${JSON.stringify(path.join(root, 'snapshots'))} }), log);
      // As \`wavebus agent\` wires it: with CURVE, the rank also serves its files on a socket of its own.
      const direct = new DirectFiles({ globalRank: rank, roots: () => ({ dumps: ${JSON.stringify(path.join(root, 'dumps'))} }), coordinator: { host: ${JSON.stringify(host)}, port: ${PORT} }, enabled: true, log });
      bus.onRequest(fileRequestHandler(server, direct, rank));
      bus.once('snapshot', () => process.stdout.write('synced ' + rank + '\\n'));
      bus.start();
    }
    setInterval(() => {}, 1000);`;
  return spawnInNetns(ns, process.execPath, ['-e', script]);
}

describeAsRoot('aggregate with CURVE across network namespaces', () => {
  let pair: NetnsPair;
  let keyDir: string;
  let root: string;

  beforeAll(async () => {
    pair = createNetnsPair(3);
    keyDir = tmpDir('wavebus-aggcurve-keys-');
    writeKeyPair(keyDir, 'coordinator');
    writeKeyPair(keyDir, 'agent');
    root = tmpDir('wavebus-aggcurve-hostB-');
    for (const r of [0, 1]) await writeBundle(root, r);
    const f = curveDirFiles(keyDir);
    const coord = spawnInNetns(pair.a, process.execPath, [CLI, 'coordinator', '--host', pair.addrA, '--port', String(PORT), '--world-size', '2', '--tp', '2', '--pp', '1', '--heartbeat-ms', '100', '--curve-secret-key', f.serverKey, '--curve-allow', f.allow]);
    await waitFor(() => coord.stdout().includes('"started"'), `the CURVE coordinator on ${pair.addrA} (stderr: ${coord.stderr()})`);
    const agents = startAgents(pair.b, pair.addrA, keyDir, root);
    await waitFor(() => agents.stdout().includes('synced 0') && agents.stdout().includes('synced 1'), 'both agents to sync over CURVE', 30000);
  });

  afterAll(async () => {
    await cleanup();
    cleanupNetns();
  });

  const runAggregate = async (args: string[]) => {
    const p = spawnInNetns(pair.b, process.execPath, [CLI, 'aggregate', '--coordinator', `${pair.addrA}:${PORT}`, '--timeout-ms', '10000', ...args]);
    const { code } = await p.exited;
    return { code, stdout: p.stdout(), stderr: p.stderr() };
  };

  test('--curve-dir: every rank collected byte for byte over the veth link, no --insecure anywhere', async () => {
    const out = tmpDir('wavebus-aggcurve-out-');
    const r = await runAggregate(['--out', out, '--curve-dir', keyDir, '--json']);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const m = JSON.parse(r.stdout);
    expect(m.coordinator).toContain(pair.addrA);
    expect(m.present_ranks).toEqual([0, 1]);
    expect(m.missing_ranks).toEqual([]);
    expect(m.direct).toEqual({ asked: true, ranks: [0, 1], relayed: [] });
    for (const rank of [0, 1]) {
      const rel = path.join('dumps', WAVE, `dp0_tp${rank}_pp0_cp0`, 'kv.npy');
      expect(fs.readFileSync(path.join(out, rel)).equals(fs.readFileSync(path.join(root, rel)))).toBe(true);
    }
  });

  test('--curve-server-key with --curve-key works the same', async () => {
    const out = tmpDir('wavebus-aggcurve-out-');
    const f = curveDirFiles(keyDir);
    const r = await runAggregate(['--out', out, '--curve-server-key', f.serverPub, '--curve-key', f.clientKey]);
    expect(r.code).toBe(0);
    expect(fs.existsSync(path.join(out, 'manifest.json'))).toBe(true);
  });

  test('without keys: fails at once naming the missing CURVE keys, nothing that looks complete', async () => {
    const out = tmpDir('wavebus-aggcurve-out-');
    const t0 = Date.now();
    const r = await runAggregate(['--out', out]);
    expect(r.code).toBe(3);
    expect(r.stderr).toMatch(/runs with CURVE, and this tool has no CURVE keys \(pass --curve-dir DIR/);
    expect(Date.now() - t0).toBeLessThan(10000); // refused by the handshake, not a request timeout
    expect(fs.existsSync(path.join(out, 'manifest.json'))).toBe(false);
  });

  test('half a key pair: a ConfigError naming the missing flag (exit 2)', async () => {
    const r = await runAggregate(['--out', tmpDir('wavebus-aggcurve-out-'), '--curve-key', curveDirFiles(keyDir).clientKey]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('--curve-key needs --curve-server-key FILE');
  });
});
