// `wavebus launch`: flag validation, the child command lines, and end to end with real
// coordinator / agent processes (bin/wavebus.js, build first with `npx tsc -p tsconfig.json`).
import * as fs from 'fs';
import * as net from 'net';
import * as path from 'path';
import { ConfigError } from '../src/errors';
import { parseLaunchOptions } from '../src/launch/options';
import { agentArgv, commandEnv, coordinatorArgv } from '../src/launch/sidecar-args';
import { agentEndpoint, mailboxPath } from '../src/paths';
import { requestStatus } from '../src/bus/coordinator';
import { COORDINATOR_NODE_FLAGS } from '../src/bus/constants';
import { cleanup, freePortPair, spawnWavebus, tmpDir, waitFor, waitWhileRunning, type Spawned } from './helpers';

afterAll(cleanup);

// The machine is small and shared: give a job that must come up plenty of time.
const READY = ['--ready-timeout-ms', '120000'];

// ------------------------------------------------------------------ validation (no processes)

function launchError(argv: Record<string, unknown>, env: NodeJS.ProcessEnv = {}): ConfigError {
  try {
    parseLaunchOptions(argv, env);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return e as ConfigError;
  }
  throw new Error('expected a ConfigError');
}

describe('parseLaunchOptions', () => {
  const cmd = { '--': ['python', 'serve.py'] };

  test('defaults: one node, nproc from the sizes, port 29600, coordinator on the master', () => {
    const o = parseLaunchOptions({ ...cmd, tp: '4', pp: '2' }, {});
    expect(o).toMatchObject({ nnodes: 1, nodeRank: 0, nprocPerNode: 8, port: 29600, masterAddr: '127.0.0.1', coordinator: { host: '127.0.0.1', port: 29600 } });
    expect(o.layout).toEqual({ worldSize: 8, tp: 4, pp: 2, dp: 1, cp: 1 });
    expect(o.command).toEqual(['python', 'serve.py']);
  });

  test('no sizes: tp = world; WAVEBUS_PORT and MASTER_ADDR from the environment', () => {
    const o = parseLaunchOptions({ ...cmd, nnodes: '2', 'nproc-per-node': '4', 'node-rank': '1' }, { WAVEBUS_PORT: '30000', MASTER_ADDR: '10.0.0.1' });
    expect(o.layout).toEqual({ worldSize: 8, tp: 8, pp: 1, dp: 1, cp: 1 });
    expect(o.coordinator).toEqual({ host: '10.0.0.1', port: 30000 });
  });

  test('--coordinator gives the host and the port', () => {
    const o = parseLaunchOptions({ ...cmd, coordinator: 'head:31000', 'nproc-per-node': '2' }, {});
    expect(o.coordinator).toEqual({ host: 'head', port: 31000 });
    expect(o.port).toBe(31000);
  });

  test.each([
    ['no command', { tp: '2' }, /no command to run: give it after --/],
    ['empty command', { '--': [] }, /no command to run/],
    ['sizes do not match the ranks', { ...cmd, 'nproc-per-node': '8', tp: '2', pp: '2' }, /--tp\(2\)\*--pp\(2\)\*dp\(1\)\*cp\(1\)=4 != --nnodes\(1\)\*--nproc-per-node\(8\)=8/],
    ['sizes cannot be split over nodes', { ...cmd, nnodes: '3', tp: '4' }, /tp\*pp\*dp\*cp=4 ranks cannot be split evenly over --nnodes 3/],
    ['node rank past nnodes', { ...cmd, nnodes: '2', 'node-rank': '2', 'master-addr': 'h' }, /--node-rank 2 must be below --nnodes 2/],
    ['bad --nproc-per-node', { ...cmd, 'nproc-per-node': 'four' }, /--nproc-per-node: expected an integer >= 1, got "four"/],
    ['zero --tp', { ...cmd, tp: '0' }, /--tp: expected an integer >= 1, got "0"/],
    ['bad --port', { ...cmd, port: '70000' }, /--port: expected a port number/],
    ['bad --coordinator', { ...cmd, coordinator: 'nohost' }, /--coordinator: expected HOST:PORT/],
    ['--port and --coordinator disagree', { ...cmd, port: '29600', coordinator: 'h:29700' }, /--port 29600 and --coordinator h:29700 name different bus ports/],
    ['several nodes on the default loopback master', { ...cmd, nnodes: '2', 'nproc-per-node': '1' }, /--nnodes 2: no --master-addr, MASTER_ADDR or --coordinator/],
    ['bad --ready-timeout-ms', { ...cmd, 'ready-timeout-ms': '0' }, /--ready-timeout-ms: expected an integer >= 1/],
    ['bad --metrics-port', { ...cmd, 'metrics-port': 'x' }, /--metrics-port: expected an integer in 0..65535/],
  ])('%s', (_n, argv, re) => {
    expect(launchError(argv as Record<string, unknown>).message).toMatch(re);
  });

  test('WAVEBUS_TP is named when it is the inconsistent source', () => {
    expect(launchError({ ...cmd, 'nproc-per-node': '4' }, { WAVEBUS_TP: '2' }).message).toMatch(/WAVEBUS_TP\(2\)\*pp\(1\)\*dp\(1\)\*cp\(1\)=2 != /);
    expect(launchError({ ...cmd }, { WAVEBUS_TP: 'x' }).message).toMatch(/WAVEBUS_TP: expected an integer >= 1, got "x"/);
  });
});

describe('child command lines and environment', () => {
  const o = parseLaunchOptions(
    { '--': ['run'], nnodes: '2', 'node-rank': '1', 'nproc-per-node': '4', 'master-addr': '10.0.0.5', port: '29700', tp: '4', pp: '2', 'metrics-port': '9100', insecure: true, 'coordinator-arg': ['--dump-ack-timeout-ms', '500'], 'agent-arg': ['--heartbeat-ms', '200'] },
    {},
  );

  test('coordinator', () => {
    expect(coordinatorArgv(o, '10.0.0.5')).toEqual(
      ['coordinator', '--host', '10.0.0.5', '--port', '29700', '--world-size', '8', '--tp', '4', '--pp', '2', '--dp', '1', '--cp', '1', '--metrics-port', '9100', '--insecure', '--dump-ack-timeout-ms', '500'],
    );
  });

  test('agent of local rank 3 on node 1 is global rank 7', () => {
    expect(agentArgv(o, 3, '/dev/shm/r')).toEqual([
      'agent', '--coordinator', '10.0.0.5:29700', '--rank', '7', '--local-rank', '3', '--world-size', '8', '--local-world-size', '4', '--node-rank', '1',
      '--tp', '4', '--pp', '2', '--dp', '1', '--cp', '1', '--run-dir', '/dev/shm/r', '--heartbeat-ms', '200',
    ]);
  });

  test('command environment keeps an existing MASTER_ADDR, sets the rest', () => {
    const env = commandEnv(o, '/dev/shm/r', { MASTER_ADDR: 'keep', PATH: '/bin' });
    expect(env).toMatchObject({
      PATH: '/bin', MASTER_ADDR: 'keep', WAVEBUS_RUN_DIR: '/dev/shm/r', WAVEBUS_COORDINATOR: '10.0.0.5:29700',
      WAVEBUS_TP: '4', WAVEBUS_PP: '2', WAVEBUS_DP: '1', WAVEBUS_CP: '1', WAVEBUS_NNODES: '2', WAVEBUS_NODE_RANK: '1', WAVEBUS_NPROC_PER_NODE: '4',
    });
    expect(commandEnv(o, '/r', {}).MASTER_ADDR).toBe('10.0.0.5');
  });

  test('agent endpoint and mailbox rule, keyed on the local rank', () => {
    expect(agentEndpoint('/dev/shm/r', 3)).toBe('ipc:///dev/shm/r/agent-local3.sock');
    expect(mailboxPath('/dev/shm/r', 3)).toBe('/dev/shm/r/mailbox-local3');
    expect(() => agentEndpoint('/r', -1)).toThrow(RangeError);
  });
});

// ------------------------------------------------------------------ end to end

/** Pids of live processes whose command line contains every one of `needles`. */
function pidsWith(...needles: string[]): number[] {
  const out: number[] = [];
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    let cmdline: string;
    try {
      cmdline = fs.readFileSync(`/proc/${d}/cmdline`, 'utf8');
    } catch {
      continue;
    }
    const args = cmdline.split('\0');
    if (needles.every((n) => args.includes(n))) out.push(Number(d));
  }
  return out;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  // A zombie is dead for our purpose, but none should be left either: it would mean no one reaped it.
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  return !/^\d+ \(.*\) Z/.test(stat);
}

/**
 * A command for the launcher: records its wavebus environment and the pids of the job's
 * sidecars (the agents carry --run-dir, the coordinator --port), then acts by MODE.
 */
function writeProbe(dir: string): string {
  const file = path.join(dir, 'probe.js');
  fs.writeFileSync(
    file,
    `
const fs = require('fs');
const e = process.env;
const out = process.argv[2];
const mode = process.argv[3];
const port = e.WAVEBUS_COORDINATOR.split(':').pop();
const pids = [];
for (const d of fs.readdirSync('/proc')) {
  if (!/^\\d+$/.test(d)) continue;
  let a; try { a = fs.readFileSync('/proc/' + d + '/cmdline', 'utf8').split('\\0'); } catch { continue; }
  const agent = a.includes('agent') && a.includes(e.WAVEBUS_RUN_DIR);
  const coord = a.includes('coordinator') && a[a.indexOf('--port') + 1] === port;
  // nodeFlags: node's own flags, before the sidecar's watchdog script (-e)
  if (agent || coord) pids.push({ pid: Number(d), role: agent ? 'agent' : 'coordinator', nodeFlags: a.slice(1, Math.max(1, a.indexOf('-e'))) });
}
const env = {};
for (const k of Object.keys(e)) if (k.startsWith('WAVEBUS_') || k === 'MASTER_ADDR') env[k] = e[k];
const runDirExists = fs.statSync(e.WAVEBUS_RUN_DIR).isDirectory();
// Atomic, so that a test polling for the file never reads half of it.
const write = (f, v) => { fs.writeFileSync(f + '.tmp', v); fs.renameSync(f + '.tmp', f); };
if (mode === 'trap') {
  process.on('SIGTERM', () => { write(out + '.term', 'SIGTERM'); process.exit(0); });
  write(out, JSON.stringify({ env, pids, runDirExists, self: process.pid }));
  setInterval(() => {}, 1000);
} else if (mode === 'wait-for') {
  write(out, JSON.stringify({ env, pids, runDirExists, self: process.pid }));
  const t = setInterval(() => { if (fs.existsSync(process.argv[4])) { clearInterval(t); process.exit(0); } }, 20);
} else if (mode === 'kill-self') {
  write(out, JSON.stringify({ env, pids, runDirExists, self: process.pid }));
  process.kill(process.pid, 'SIGKILL');
} else {
  write(out, JSON.stringify({ env, pids, runDirExists, self: process.pid }));
  if (process.argv[4]) write(process.argv[4], 'go');
  process.exit(Number(mode));
}
`,
  );
  return file;
}

interface Probe {
  env: Record<string, string>;
  pids: Array<{ pid: number; role: string; nodeFlags: string[] }>;
  runDirExists: boolean;
  self: number;
}

const readProbe = (f: string): Probe => JSON.parse(fs.readFileSync(f, 'utf8')) as Probe;

/** Wait for `fn`, but fail at once (with its output) if the launcher exits first. */
const whileRunning = <T>(r: Spawned, fn: () => T, what: string) => waitWhileRunning(r, fn, what, 150000);

describe('wavebus launch end to end', () => {
  jest.setTimeout(200000);
  let dir: string;
  let probe: string;
  beforeAll(() => {
    dir = tmpDir('wavebus-launch-');
    probe = writeProbe(dir);
  });

  test('4 agents + coordinator; the command sees the environment; its exit code 3 is ours; nothing is left', async () => {
    const port = await freePortPair();
    const out = path.join(dir, 'env3.json');
    const r = spawnWavebus(['launch', ...READY, '--nproc-per-node', '4', '--tp', '4', '--port', String(port), '--', process.execPath, probe, out, '3']);
    const { code } = await r.exited;
    expect({ code, stderr: code === 3 ? '' : r.stderr() }).toEqual({ code: 3, stderr: '' });
    const p = readProbe(out);
    const runDir = p.env.WAVEBUS_RUN_DIR;
    expect(runDir).toMatch(/^\/dev\/shm\/wavebus-[A-Za-z0-9]{6}$/); // mkdtemp: unpredictable (test/run-dir.test.ts)
    expect(p.runDirExists).toBe(true);
    const inherited = Object.fromEntries(Object.entries(process.env).filter(([k]) => k.startsWith('WAVEBUS_')));
    expect(p.env).toEqual({
      ...inherited,
      WAVEBUS_RUN_DIR: runDir,
      WAVEBUS_SHM_PREFIX: expect.stringMatching(/^wavebus-[0-9a-f]{12}-$/),
      WAVEBUS_COORDINATOR: `127.0.0.1:${port}`,
      WAVEBUS_TP: '4',
      WAVEBUS_PP: '1',
      WAVEBUS_DP: '1',
      WAVEBUS_CP: '1',
      WAVEBUS_NNODES: '1',
      WAVEBUS_NODE_RANK: '0',
      WAVEBUS_NPROC_PER_NODE: '4',
      // The bus token's path (never the token): one host, no CURVE (docs/security.md).
      WAVEBUS_BUS_TOKEN_FILE: path.join(runDir, 'bus.token'),
      MASTER_ADDR: process.env.MASTER_ADDR ?? '127.0.0.1',
    });
    expect(p.pids.filter((x) => x.role === 'agent')).toHaveLength(4);
    expect(p.pids.filter((x) => x.role === 'coordinator')).toHaveLength(1);
    // The coordinator's young generation is capped (docs/bus.md, "Memory"); agents run with node's defaults.
    expect(p.pids.map((x) => [x.role, x.nodeFlags]).sort()).toEqual([...Array.from({ length: 4 }, () => ['agent', []]), ['coordinator', [...COORDINATOR_NODE_FLAGS]]]);
    for (const { pid } of p.pids) expect({ pid, alive: alive(pid) }).toEqual({ pid, alive: false });
    expect(fs.existsSync(runDir)).toBe(false);
  });

  test('a command killed by a signal gives 128 + signal', async () => {
    const port = await freePortPair();
    const out = path.join(dir, 'killed.json');
    const r = spawnWavebus(['launch', ...READY, '--port', String(port), '--', process.execPath, probe, out, 'kill-self']);
    expect((await r.exited).code).toBe(128 + 9);
    for (const { pid } of readProbe(out).pids) expect(alive(pid)).toBe(false);
  });

  test('a command that cannot start: exit 127, the error names it, nothing left', async () => {
    const port = await freePortPair();
    const runDir = path.join(dir, 'run-nostart');
    const r = spawnWavebus(['launch', ...READY, '--nproc-per-node', '2', '--port', String(port), '--run-dir', runDir, '--', '/nonexistent/serve']);
    const { code } = await r.exited;
    expect(code).toBe(127);
    expect(r.stderr()).toMatch(/could not start the command "\/nonexistent\/serve": spawn \/nonexistent\/serve ENOENT/);
    expect(pidsWith('agent', runDir)).toEqual([]);
    expect(pidsWith('coordinator', '--port', String(port))).toEqual([]);
    expect(fs.existsSync(runDir)).toBe(false);
  });

  test('a bad layout is refused before anything starts', async () => {
    const port = await freePortPair();
    const runDir = path.join(dir, 'run-badlayout');
    const r = spawnWavebus(['launch', '--nproc-per-node', '4', '--tp', '2', '--port', String(port), '--run-dir', runDir, '--', 'true']);
    const { code } = await r.exited;
    expect(code).toBe(2);
    expect(r.stderr()).toMatch(/--tp\(2\)\*pp\(1\)\*dp\(1\)\*cp\(1\)=2 != --nnodes\(1\)\*--nproc-per-node\(4\)=4; .*\[ERR_LAUNCH\]/);
    expect(fs.existsSync(runDir)).toBe(false);
    expect(pidsWith('coordinator', '--port', String(port))).toEqual([]);
  });

  test('a non-loopback master address without CURVE keys is refused before anything starts, naming --master-addr', async () => {
    const port = await freePortPair();
    const runDir = path.join(dir, 'run-insecure');
    const r = spawnWavebus(['launch', '--nproc-per-node', '1', '--master-addr', '0.0.0.0', '--port', String(port), '--run-dir', runDir, '--', 'true']);
    const { code } = await r.exited;
    expect(code).not.toBe(0);
    expect(r.stderr()).toMatch(/--master-addr \/ --coordinator 0\.0\.0\.0 \(binds 0\.0\.0\.0\): refusing to bind the bus to a non-loopback address without CURVE keys.*\[ERR_INSECURE_BIND\]/);
    expect(fs.existsSync(runDir)).toBe(false);
    expect(pidsWith('coordinator', '--port', String(port))).toEqual([]);
  });

  test('SIGTERM is forwarded to the command; it exits 0, so does the launcher, and the job is torn down', async () => {
    const port = await freePortPair();
    const out = path.join(dir, 'trap.json');
    const r = spawnWavebus(['launch', ...READY, '--nproc-per-node', '2', '--port', String(port), '--', process.execPath, probe, out, 'trap']);
    await whileRunning(r, () => fs.existsSync(out), 'the command to start');
    const p = readProbe(out);
    expect(p.pids).toHaveLength(3);
    for (const { pid } of p.pids) expect(alive(pid)).toBe(true);
    r.child.kill('SIGTERM');
    const { code } = await r.exited;
    expect(code).toBe(0);
    expect(fs.readFileSync(`${out}.term`, 'utf8')).toBe('SIGTERM');
    for (const { pid } of p.pids) expect(alive(pid)).toBe(false);
    expect(fs.existsSync(p.env.WAVEBUS_RUN_DIR)).toBe(false);
  });

  test.each([0, 1])('bus port in use (port + %i): a clear error, nothing started', async (offset) => {
    const port = await freePortPair();
    const holder = net.createServer();
    await new Promise<void>((resolve) => holder.listen(port + offset, '127.0.0.1', resolve));
    try {
      const runDir = path.join(dir, `run-inuse${offset}`);
      const r = spawnWavebus(['launch', '--port', String(port), '--run-dir', runDir, '--', 'true']);
      const { code } = await r.exited;
      expect(code).toBe(2);
      expect(r.stderr()).toContain(`--port ${port}: 127.0.0.1:${port + offset} is already in use (the coordinator's ${offset ? 'ROUTER' : 'PUB'} socket needs it)`);
      expect(r.stderr()).toContain('[ERR_PORT_IN_USE]');
      expect(fs.existsSync(runDir)).toBe(false);
      expect(pidsWith('agent', runDir)).toEqual([]);
    } finally {
      await new Promise((resolve) => holder.close(resolve));
    }
  });

  test('an agent that dies before ready fails the launch fast, with its output; nothing left', async () => {
    const port = await freePortPair();
    const runDir = path.join(dir, 'run-agentdies');
    const out = path.join(dir, 'never.json');
    const r = spawnWavebus(['launch', '--nproc-per-node', '2', '--port', String(port), '--run-dir', runDir, '--agent-arg=--bogus-flag', '--', process.execPath, probe, out, '0']);
    const { code } = await r.exited;
    expect(code).toBe(1);
    expect(r.stderr()).toMatch(/agent local\d\/rank\d exited with code 2 before the job was ready \(started with the extra arguments \[.*"--bogus-flag.*\] from --agent-arg .*\); its output ends with:\n.*Unknown argument.*bogus-flag/);
    expect(fs.existsSync(out)).toBe(false);
    expect(pidsWith('agent', runDir)).toEqual([]);
    expect(pidsWith('coordinator', '--port', String(port))).toEqual([]);
    expect(fs.existsSync(runDir)).toBe(false);
  });

  test('two simulated nodes on one host: node 1 starts no coordinator; both run their command', async () => {
    const port = await freePortPair();
    const go = path.join(dir, 'go');
    const out0 = path.join(dir, 'node0.json');
    const out1 = path.join(dir, 'node1.json');
    const common = [...READY, '--nnodes', '2', '--nproc-per-node', '1', '--tp', '2', '--master-addr', '127.0.0.1', '--port', String(port)];
    // Node 1's command waits for node 0's, so node 0 sees every agent while it waits for ready.
    const n1 = spawnWavebus(['launch', ...common, '--node-rank', '1', '--', process.execPath, probe, out1, 'wait-for', go]);
    const n0 = spawnWavebus(['launch', ...common, '--node-rank', '0', '--', process.execPath, probe, out0, '0', go]);
    const [e0, e1] = await Promise.all([n0.exited, n1.exited]);
    expect([e0.code, e1.code]).toEqual([0, 0]);
    const p0 = readProbe(out0);
    const p1 = readProbe(out1);
    expect(p0.env).toMatchObject({ WAVEBUS_NODE_RANK: '0', WAVEBUS_NNODES: '2', WAVEBUS_TP: '2', WAVEBUS_NPROC_PER_NODE: '1' });
    expect(p1.env).toMatchObject({ WAVEBUS_NODE_RANK: '1', WAVEBUS_COORDINATOR: `127.0.0.1:${port}` });
    expect(p0.env.WAVEBUS_RUN_DIR).not.toBe(p1.env.WAVEBUS_RUN_DIR);
    expect(p0.pids.filter((x) => x.role === 'coordinator')).toHaveLength(1);
    expect(p1.pids.filter((x) => x.role === 'agent')).toHaveLength(1);
    expect(n1.stderr()).not.toMatch(/\[coordinator\]/);
    for (const { pid } of [...p0.pids, ...p1.pids]) expect(alive(pid)).toBe(false);
  });

  test('no coordinator answers: --ready-timeout-ms fails the launch, nothing left', async () => {
    const port = await freePortPair();
    const runDir = path.join(dir, 'run-timeout');
    const r = spawnWavebus([
      'launch', '--nnodes', '2', '--node-rank', '1', '--nproc-per-node', '1', '--tp', '2', '--master-addr', '127.0.0.1',
      '--port', String(port), '--run-dir', runDir, '--ready-timeout-ms', '1500', '--', 'true',
    ]);
    const { code } = await r.exited;
    expect(code).toBe(1);
    expect(r.stderr()).toMatch(/the job was not ready after --ready-timeout-ms 1500 ms: coordinator 127\.0\.0\.1:\d+ \(no answer from the coordinator\) \[ERR_LAUNCH_TIMEOUT\]/);
    expect(pidsWith('agent', runDir)).toEqual([]);
    expect(fs.existsSync(runDir)).toBe(false);
  });

  test('SIGTERM while waiting for ready: exit 143, the agents are stopped', async () => {
    const port = await freePortPair();
    const runDir = path.join(dir, 'run-sigterm-early');
    const r = spawnWavebus([
      'launch', '--nnodes', '2', '--node-rank', '1', '--nproc-per-node', '1', '--tp', '2', '--master-addr', '127.0.0.1',
      '--port', String(port), '--run-dir', runDir, ...READY, '--', 'true',
    ]);
    const agents = await whileRunning(r, () => { const p = pidsWith('agent', runDir); return p.length === 1 ? p : undefined; }, 'the agent to start');
    r.child.kill('SIGTERM');
    const { code } = await r.exited;
    expect(code).toBe(128 + 15);
    expect(r.stderr()).toContain('received SIGTERM before the job was ready; stopping');
    for (const pid of agents) expect(alive(pid)).toBe(false);
    expect(fs.existsSync(runDir)).toBe(false);
  });

  test('a launcher killed with SIGKILL leaves no sidecar behind: they see their stdin close and stop', async () => {
    const port = await freePortPair();
    const out = path.join(dir, 'orphan.json');
    const runDir = path.join(dir, 'run-orphan');
    const r = spawnWavebus(['launch', ...READY, '--nproc-per-node', '2', '--port', String(port), '--run-dir', runDir, '--', process.execPath, probe, out, 'trap']);
    await whileRunning(r, () => fs.existsSync(out), 'the command to start');
    const p = readProbe(out);
    expect(p.pids).toHaveLength(3);
    r.child.kill('SIGKILL');
    await r.exited;
    try {
      await waitFor(() => p.pids.every(({ pid }) => !alive(pid)), 'the orphaned coordinator and agents to stop', 30000);
    } finally {
      process.kill(p.self, 'SIGKILL'); // the command itself is the user's to stop, as under torchrun
      for (const { pid } of p.pids) if (alive(pid)) process.kill(pid, 'SIGKILL');
    }
  });
  test('--linger-ms keeps the coordinator and agents serving after the command exits, until SIGTERM', async () => {
    const port = await freePortPair();
    const out = path.join(dir, 'linger.json');
    const r = spawnWavebus(['launch', ...READY, '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--linger-ms', '120000', '--', process.execPath, probe, out, '0']);
    await whileRunning(r, () => r.stderr().includes('agents keep serving files'), 'the command to exit and the launcher to linger');
    const st = await requestStatus({ host: '127.0.0.1', port }, 5000);
    expect(st.liveRanks).toEqual([0, 1]);
    r.child.kill('SIGTERM');
    expect((await r.exited).code).toBe(0);
    for (const { pid } of readProbe(out).pids) expect(alive(pid)).toBe(false);
  });

  test('SIGTERM while the command runs stops it, and the launcher does not linger after it (--linger-ms is for a command that ended on its own)', async () => {
    const port = await freePortPair();
    const started = path.join(dir, 'sigterm-started');
    const r = spawnWavebus(['launch', ...READY, '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--linger-ms', '120000', '--', process.execPath, '-e', `require('fs').writeFileSync(${JSON.stringify(started)}, ''); setTimeout(() => {}, 60000)`]);
    await waitFor(() => fs.existsSync(started), 'the command running', 30000);
    const t0 = Date.now();
    r.child.kill('SIGTERM');
    const { code } = await r.exited;
    expect(code).toBe(143); // the command's SIGTERM, passed on
    expect(r.stderr()).not.toMatch(/agents keep serving files/);
    expect(Date.now() - t0).toBeLessThan(30000); // not the 120 s linger
  });

  test('guard and snapshot flags are validated before anything starts, naming the flag', async () => {
    const bad = spawnWavebus(['launch', '--snapshot-enable', '--snapshot-capture-token', '3,,4', '--', 'true']);
    expect((await bad.exited).code).toBe(2);
    expect(bad.stderr()).toMatch(/--snapshot-capture-token.*3,,4/);
    const unknown = spawnWavebus(['launch', '--additional-config', '{"runtime_config_hot_reload": true, "bogus": 1}', '--', 'true']);
    expect((await unknown.exited).code).toBe(2);
    expect(unknown.stderr()).toMatch(/unknown key 'bogus'/);
  });
});
