// `wavebus launch`: run once per host, like torchrun. Starts the coordinator (node 0) and one
// agent per local rank, waits until the bus is ready (by asking the coordinator, never by
// sleeping), runs the user's command with the wavebus environment, forwards signals to it, and
// tears everything down when it exits, exiting with its code.
import { ChildProcess, spawn } from 'child_process';
import * as dns from 'dns';
import * as fs from 'fs';
import * as net from 'net';
import * as os from 'os';
import * as path from 'path';
import * as zmq from 'zeromq';
import { Parser } from 'yargs/helpers';
import { BusToken, createTokenFile } from '../bus/auth';
import { dumpRootOf, effectiveStartupConfig, parseStartupOptions } from '../guard/startup';
import { ConfigError, ProtocolError, WavebusError } from '../errors';
import { PROTOCOL_VERSION } from '../bus/protocol-version';
import { clientSocketOptions, curveDirFiles, loadCurveDirClient, loadCurveDirServer, type CurveClientKeys } from '../bus/curve';
import { checkBindAllowed, HostPort, isLoopback, parseBusPort, parseHostPort, socketIpOptions, tcpEndpoint } from '../bus/endpoints';
import { agentEndpoint, checkRunDirFits, mailboxPath, packageRoot } from '../paths';
import { claimRunDir, makeRunDir, newShmPrefix, releaseRunDir, removeShmSegments, type RunDir } from './run-dir';
import { CoordinatorMessage, decode, AgentMessage, encode } from '../proto';
import { boundedLayout, type WorldLayout } from './identity';
import type { Logger } from '../log';

export { agentEndpoint, mailboxPath };

export const DEFAULT_BUS_PORT = 29600;
const STATUS_POLL_MS = 250;
const TAIL_CHARS = 4000;

export interface LaunchOptions {
  nnodes: number;
  nodeRank: number;
  nprocPerNode: number;
  masterAddr: string;
  /** Bus base port: coordinator PUB on port, ROUTER on port + 1. */
  port: number;
  /** Where agents and tools reach the coordinator (its PUB port). */
  coordinator: HostPort;
  layout: WorldLayout;
  runDir?: string;
  metricsPort?: number;
  insecure: boolean;
  readyTimeoutMs: number;
  graceMs: number;
  coordinatorArgs: string[];
  agentArgs: string[];
  command: string[];
  /** After the command exits, keep the agents and coordinator serving files (aggregation) this long; 0 = stop at once. */
  lingerMs?: number;
  /** --curve-dir: CURVE keys for the coordinator, agents and readiness polling (docs/security.md). */
  curveDir?: string;
  /** Client keys loaded from curveDir (the launcher polls the coordinator with them). */
  curve?: CurveClientKeys;
}

function launchError(message: string): ConfigError {
  return new ConfigError(message, 'ERR_LAUNCH');
}

/** A startup or runtime failure of the launched job (not a usage error). */
export class LaunchError extends WavebusError {
  constructor(message: string, code = 'ERR_LAUNCH_FAILED') {
    super(code, message);
  }
}

function lastOf(v: unknown): unknown {
  return Array.isArray(v) ? v[v.length - 1] : v;
}

function given(v: unknown): boolean {
  return v !== undefined && v !== null && String(v) !== '';
}

function parseIntArg(raw: unknown, name: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  const s = String(lastOf(raw)).trim();
  const n = /^\d+$/.test(s) ? Number(s) : NaN;
  if (!Number.isSafeInteger(n) || n < min || n > max) {
    const range = max === Number.MAX_SAFE_INTEGER ? `an integer >= ${min}` : `an integer ${min}..${max}`;
    throw launchError(`${name}: expected ${range}, got ${JSON.stringify(lastOf(raw))}`);
  }
  return n;
}

function stringList(v: unknown): string[] {
  if (v === undefined || v === null) return [];
  return (Array.isArray(v) ? v : [v]).map((x) => String(x));
}

const SIZES = ['tp', 'pp', 'dp', 'cp'] as const;

/**
 * Validate the launch flags (yargs argv, with the command under argv['--']) against each
 * other: world = nnodes * nproc-per-node = tp * pp * dp * cp. Errors name the flags.
 */
export function parseLaunchOptions(argv: Record<string, unknown>, env: NodeJS.ProcessEnv = process.env): LaunchOptions {
  const command = stringList(argv['--']);
  if (command.length === 0 || command[0] === '') {
    throw launchError('no command to run: give it after --, e.g. `wavebus launch --nproc-per-node 8 -- python serve.py`');
  }

  const nnodes = given(argv.nnodes) ? parseIntArg(argv.nnodes, '--nnodes', 1) : 1;
  const nodeRank = given(argv['node-rank']) ? parseIntArg(argv['node-rank'], '--node-rank', 0) : 0;
  if (nodeRank >= nnodes) throw launchError(`--node-rank ${nodeRank} must be below --nnodes ${nnodes}`);

  // Parallel sizes: flag, then WAVEBUS_<SIZE>; remember where each came from for the error.
  const size: Record<string, { value: number; from: string } | undefined> = {};
  for (const k of SIZES) {
    const envName = `WAVEBUS_${k.toUpperCase()}`;
    if (given(argv[k])) size[k] = { value: parseIntArg(argv[k], `--${k}`, 1), from: `--${k}` };
    else if (given(env[envName])) size[k] = { value: parseIntArg(env[envName], envName, 1), from: envName };
  }
  const anySize = SIZES.some((k) => size[k] !== undefined);
  const sizeProduct = SIZES.reduce((p, k) => p * (size[k]?.value ?? 1), 1);

  let nprocPerNode: number;
  if (given(argv['nproc-per-node'])) {
    nprocPerNode = parseIntArg(argv['nproc-per-node'], '--nproc-per-node', 1);
  } else if (anySize) {
    if (sizeProduct % nnodes !== 0) {
      throw launchError(`tp*pp*dp*cp=${sizeProduct} ranks cannot be split evenly over --nnodes ${nnodes}; pass --nproc-per-node`);
    }
    nprocPerNode = sizeProduct / nnodes;
  } else {
    nprocPerNode = 1;
  }
  const worldSize = nnodes * nprocPerNode;

  let layout: WorldLayout;
  if (!anySize) {
    layout = { worldSize, tp: worldSize, pp: 1, dp: 1, cp: 1 };
  } else {
    const v = (k: string) => size[k]?.value ?? 1;
    if (sizeProduct !== worldSize) {
      const terms = SIZES.map((k) => `${size[k]?.from ?? k}(${v(k)})`).join('*');
      throw launchError(
        `${terms}=${sizeProduct} != --nnodes(${nnodes})*--nproc-per-node(${nprocPerNode})=${worldSize}; ` +
          `the parallel sizes must multiply to the number of ranks`,
      );
    }
    layout = { worldSize, tp: v('tp'), pp: v('pp'), dp: v('dp'), cp: v('cp') };
  }
  boundedLayout(layout, '--nnodes*--nproc-per-node');

  const masterAddr = given(argv['master-addr'])
    ? String(lastOf(argv['master-addr'])).trim()
    : given(env.MASTER_ADDR)
      ? String(env.MASTER_ADDR).trim()
      : '127.0.0.1';

  let port = given(argv.port) ? parseBusPort(lastOf(argv.port), '--port') : given(env.WAVEBUS_PORT) ? parseBusPort(env.WAVEBUS_PORT, 'WAVEBUS_PORT') : DEFAULT_BUS_PORT;
  let coordinator: HostPort = { host: masterAddr, port };
  if (given(argv.coordinator)) {
    coordinator = parseHostPort(String(lastOf(argv.coordinator)), '--coordinator');
    if (given(argv.port) && coordinator.port !== port) {
      throw launchError(`--port ${port} and --coordinator ${coordinator.host}:${coordinator.port} name different bus ports; give one of them`);
    }
    port = coordinator.port;
  }
  // Several nodes with the default loopback master cannot work across hosts. An explicit
  // loopback address is respected: that is how several "nodes" are simulated on one host.
  const explicitAddr = given(argv['master-addr']) || given(env.MASTER_ADDR) || given(argv.coordinator);
  if (nnodes > 1 && !explicitAddr && isLoopback(coordinator.host)) {
    throw launchError(
      `--nnodes ${nnodes}: no --master-addr, MASTER_ADDR or --coordinator, and the default ${coordinator.host} is loopback, ` +
        'which other hosts cannot reach; pass --master-addr (or --coordinator HOST:PORT) with the address of node 0',
    );
  }

  const runDir = given(argv['run-dir']) ? path.resolve(String(lastOf(argv['run-dir']))) : undefined;
  const metricsPort = given(argv['metrics-port']) ? parseIntArg(argv['metrics-port'], '--metrics-port', 0, 65535) : undefined;
  const readyTimeoutMs = given(argv['ready-timeout-ms']) ? parseIntArg(argv['ready-timeout-ms'], '--ready-timeout-ms', 1) : 30000;
  const graceMs = given(argv['grace-ms']) ? parseIntArg(argv['grace-ms'], '--grace-ms', 0) : 5000;
  const curveDir = given(argv['curve-dir']) ? path.resolve(String(lastOf(argv['curve-dir']))) : undefined;
  const curve = curveDir !== undefined ? loadCurveDirClient(curveDir) : undefined;

  return {
    nnodes,
    nodeRank,
    nprocPerNode,
    masterAddr,
    port,
    coordinator,
    layout,
    runDir,
    metricsPort,
    insecure: argv.insecure === true,
    readyTimeoutMs,
    graceMs,
    coordinatorArgs: stringList(argv['coordinator-arg']),
    agentArgs: stringList(argv['agent-arg']),
    lingerMs: given(argv['linger-ms']) ? parseIntArg(argv['linger-ms'], '--linger-ms', 0) : 0,
    command,
    ...(curveDir !== undefined ? { curveDir, curve } : {}),
  };
}

/** Global rank of local rank `l` on this node (torchrun's rule: nodes hold consecutive blocks). */
export function globalRankOfLocal(opts: LaunchOptions, localRank: number): number {
  return opts.nodeRank * opts.nprocPerNode + localRank;
}

function layoutArgs(l: WorldLayout): string[] {
  return ['--tp', String(l.tp), '--pp', String(l.pp), '--dp', String(l.dp), '--cp', String(l.cp)];
}

/** Arguments of `wavebus coordinator` (after the script path). */
export function coordinatorArgv(opts: LaunchOptions, bindHost: string): string[] {
  const a = ['coordinator', '--host', bindHost, '--port', String(opts.port), '--world-size', String(opts.layout.worldSize), ...layoutArgs(opts.layout)];
  if (opts.metricsPort !== undefined) a.push('--metrics-port', String(opts.metricsPort));
  if (opts.insecure) a.push('--insecure');
  if (opts.curveDir !== undefined) {
    const f = curveDirFiles(opts.curveDir);
    a.push('--curve-secret-key', f.serverKey, '--curve-allow', f.allow);
  }
  return [...a, ...opts.coordinatorArgs];
}

/**
 * The KV dump root the coordinator on this host derives from the guard flags among its
 * arguments (the config file's dump.dump_dir, else --runtime-dump-dir, else <report_dir>/kv_cache),
 * read the way `wavebus coordinator` reads them, without writing anything. Agents get it as
 * --dump-root: the only place they write and serve dumps (a bus dump_dir may only narrow it).
 */
export function launchDumpRoot(coordinatorArgs: string[], cwd: string = process.cwd()): string {
  const a = Parser(coordinatorArgs, {
    string: ['additional-config', 'runtime-config-path', 'runtime-report-dir', 'runtime-dump-dir'],
    boolean: ['runtime-config-hot-reload'],
    configuration: { 'duplicate-arguments-array': false, 'camel-case-expansion': false },
  }) as Record<string, unknown>;
  const str = (k: string) => (a[k] === undefined ? undefined : String(a[k]));
  const startup = parseStartupOptions(
    str('additional-config'),
    { runtimeConfigPath: str('runtime-config-path'), runtimeReportDir: str('runtime-report-dir'), runtimeDumpDir: str('runtime-dump-dir') },
    cwd,
  );
  // Computed, never written: the coordinator alone writes the live file at its startup.
  return dumpRootOf(effectiveStartupConfig(startup), startup);
}

/** Arguments of `wavebus agent` for local rank `l` (after the script path). */
export function agentArgv(opts: LaunchOptions, localRank: number, runDir: string, local: { dumpRoot?: string; tokenFile?: string } = {}): string[] {
  return [
    'agent',
    '--coordinator', `${opts.coordinator.host}:${opts.coordinator.port}`,
    '--rank', String(globalRankOfLocal(opts, localRank)),
    '--local-rank', String(localRank),
    '--world-size', String(opts.layout.worldSize),
    '--local-world-size', String(opts.nprocPerNode),
    '--node-rank', String(opts.nodeRank),
    ...layoutArgs(opts.layout),
    '--run-dir', runDir,
    ...(local.dumpRoot !== undefined ? ['--dump-root', local.dumpRoot] : []),
    ...(local.tokenFile !== undefined ? ['--bus-token-file', local.tokenFile] : []),
    ...(opts.curveDir !== undefined ? ['--curve-server-key', curveDirFiles(opts.curveDir).serverPub, '--curve-key', curveDirFiles(opts.curveDir).clientKey] : []),
    ...opts.agentArgs,
  ];
}

/** The environment the user's command (and every process it starts) sees. */
export function commandEnv(opts: LaunchOptions, runDir: string, env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {
    ...env,
    WAVEBUS_RUN_DIR: runDir,
    WAVEBUS_COORDINATOR: `${opts.coordinator.host}:${opts.coordinator.port}`,
    WAVEBUS_TP: String(opts.layout.tp),
    WAVEBUS_PP: String(opts.layout.pp),
    WAVEBUS_DP: String(opts.layout.dp),
    WAVEBUS_CP: String(opts.layout.cp),
    WAVEBUS_NNODES: String(opts.nnodes),
    WAVEBUS_NODE_RANK: String(opts.nodeRank),
    WAVEBUS_NPROC_PER_NODE: String(opts.nprocPerNode),
  };
  if (!given(out.MASTER_ADDR)) out.MASTER_ADDR = opts.masterAddr;
  return out;
}


/**
 * The run dir: --run-dir created 0700 (or an existing one that is ours and 0700), else a fresh
 * unpredictable /dev/shm/wavebus-XXXXXX. Only a directory we created is removed at the end.
 */
function prepareRunDir(runDir: string | undefined, nproc: number): RunDir {
  if (runDir !== undefined) {
    checkRunDirFits(runDir, nproc - 1, '--run-dir', 'ERR_LAUNCH');
    return claimRunDir(runDir, '--run-dir');
  }
  return makeRunDir('wavebus-');
}

// ------------------------------------------------------------------ where the coordinator runs

function localAddresses(): Set<string> {
  const out = new Set<string>(['0.0.0.0', '::']);
  for (const list of Object.values(os.networkInterfaces())) for (const a of list ?? []) out.add(a.address);
  return out;
}

/**
 * The IP this host should bind the coordinator to, or undefined when `host` is not an address
 * of this host (the coordinator then runs elsewhere). libzmq binds IPs, not names.
 */
export async function localBindAddress(host: string): Promise<string | undefined> {
  const h = host.replace(/^\[|\]$/g, '');
  if (h === 'localhost') return '127.0.0.1';
  const locals = localAddresses();
  const isLocal = (ip: string) => isLoopback(ip) || locals.has(ip);
  if (net.isIP(h)) return isLocal(h) ? h : undefined;
  let addrs: dns.LookupAddress[];
  try {
    addrs = await dns.promises.lookup(h, { all: true });
  } catch (e) {
    throw launchError(`coordinator host ${JSON.stringify(host)} (from --master-addr / --coordinator) does not resolve: ${(e as Error).message}`);
  }
  const local = addrs.map((a) => a.address).filter(isLocal);
  return local.find((a) => !isLoopback(a)) ?? local[0];
}

/** Fail before spawning anything when the bus ports are taken (the coordinator would die on bind). */
async function checkPortFree(host: string, port: number, role: string): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const s = net.createServer();
    s.once('error', (e: NodeJS.ErrnoException) => {
      if (e.code === 'EADDRINUSE') {
        reject(
          new ConfigError(
            `--port ${port - (role === 'ROUTER' ? 1 : 0)}: ${host}:${port} is already in use (the coordinator's ${role} socket needs it); ` +
              'pick another --port (or WAVEBUS_PORT), or stop what holds it',
            'ERR_PORT_IN_USE',
          ),
        );
      } else {
        reject(launchError(`cannot bind ${host}:${port} for the coordinator's ${role} socket: ${e.message}`));
      }
    });
    s.listen({ host, port, exclusive: true }, () => s.close(() => resolve()));
  });
}

// ------------------------------------------------------------------ sidecar processes

/**
 * Runs `node -e WATCHDOG -- bin/wavebus.js <args>`: the sidecar's stdin is a pipe from the
 * launcher, so if the launcher dies without tearing down (SIGKILL, OOM), the pipe's end makes
 * the sidecar stop itself (SIGTERM, then exit) instead of lingering and holding the bus ports.
 */
const WATCHDOG = [
  'const bin = process.argv[1];',
  'const stop = () => { process.kill(process.pid, "SIGTERM"); setTimeout(() => process.exit(1), 10000).unref(); };',
  'process.stdin.on("end", stop); process.stdin.on("error", stop); process.stdin.resume();',
  'require(bin);',
].join(' ');

/** A coordinator or agent process: its own process group, output forwarded with a prefix. */
class Sidecar {
  readonly child: ChildProcess;
  private tail = '';
  exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  constructor(
    readonly name: string,
    bin: string,
    args: string[],
    env: NodeJS.ProcessEnv,
  ) {
    // Own process group: a Ctrl-C on the terminal reaches the command, not the sidecars, which
    // must outlive the command's shutdown; we stop them after it exits.
    this.child = spawn(process.execPath, ['-e', WATCHDOG, '--', bin, ...args], { detached: true, stdio: ['pipe', 'pipe', 'pipe'], env });
    this.child.stdin?.on('error', () => undefined); // EPIPE once it has exited
    const forward = (b: Buffer) => {
      const s = b.toString();
      this.tail = (this.tail + s).slice(-TAIL_CHARS);
      for (const line of s.split('\n')) if (line !== '') process.stderr.write(`[${this.name}] ${line}\n`);
    };
    this.child.stdout?.on('data', forward);
    this.child.stderr?.on('data', forward);
    this.exited = new Promise((resolve) => {
      this.child.on('error', (e) => {
        this.tail += `\n${e.message}`;
        // Spawn itself failed: there will be no 'exit' event.
        if (this.child.pid === undefined && this.exit === undefined) {
          this.exit = { code: null, signal: null };
          resolve(this.exit);
        }
      });
      this.child.on('exit', (code, signal) => {
        this.exit = { code, signal };
        resolve(this.exit);
      });
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  alive(): boolean {
    return this.exit === undefined && this.child.pid !== undefined;
  }

  stderrTail(): string {
    return this.tail.trim().split('\n').slice(-20).join('\n');
  }

  describeExit(): string {
    const e = this.exit;
    if (!e) return 'is running';
    if (e.code === null && e.signal === null) return 'could not be started';
    return e.signal ? `was killed by ${e.signal}` : `exited with code ${e.code}`;
  }

  signalGroup(sig: NodeJS.Signals): void {
    if (this.child.pid === undefined) return;
    try {
      process.kill(-this.child.pid, sig);
    } catch {
      /* group already gone */
    }
  }

  /** SIGTERM, then SIGKILL after `graceMs`; also kills anything left in its process group. */
  async stop(graceMs: number): Promise<void> {
    if (this.alive()) {
      this.signalGroup('SIGTERM');
      let timer: NodeJS.Timeout | undefined;
      const killed = new Promise<void>((resolve) => {
        timer = setTimeout(() => {
          this.signalGroup('SIGKILL');
          resolve();
        }, graceMs);
      });
      await Promise.race([this.exited, killed]);
      clearTimeout(timer);
      await this.exited;
    }
    this.signalGroup('SIGKILL');
  }
}

// ------------------------------------------------------------------ readiness

export interface StatusSnapshot {
  ready: boolean;
  liveRanks: number[];
  expectedRanks: number[];
  epoch: number;
}

/**
 * Ask the coordinator (DEALER → ROUTER on port + 1) for its status until `isReady` says so.
 * Each ask waits at most STATUS_POLL_MS for an answer; `abort` rejects to stop early.
 */
export async function waitForCoordinator(
  coordinator: HostPort,
  isReady: (s: StatusSnapshot) => boolean,
  abort: Promise<never>,
  curve?: CurveClientKeys,
  token?: BusToken,
): Promise<StatusSnapshot> {
  const sock = new zmq.Dealer({ linger: 0, receiveTimeout: STATUS_POLL_MS, sendTimeout: 0, ...socketIpOptions(coordinator.host), ...clientSocketOptions(curve) });
  sock.connect(tcpEndpoint(coordinator.host, coordinator.port + 1));
  let last: StatusSnapshot | undefined;
  const ask = encode(AgentMessage, { status: { protocolVersion: PROTOCOL_VERSION } });
  const request = token ? token.seal('to-coordinator', ask) : ask;
  let stopped = false;
  abort.catch(() => (stopped = true));
  try {
    while (!stopped) {
      try {
        await sock.send(request);
      } catch {
        /* queue full while the coordinator is not up yet; ask again next round */
      }
      const got = sock.receive();
      got.catch(() => undefined);
      let frames: Buffer[] | undefined;
      try {
        frames = await Promise.race([got, abort]);
      } catch (e) {
        if (stopped) throw e;
        continue; // receive timed out: ask again
      }
      for (const f of frames.slice(-1)) {
        let msg: Record<string, any>;
        try {
          // With the token, an answer from whatever else holds the port is not believed.
          let bytes = f;
          if (token) {
            const o = token.open('from-coordinator', f);
            if (!o.ok) continue;
            bytes = o.msg;
          }
          msg = decode(CoordinatorMessage, bytes);
        } catch {
          continue; // not ours to crash on
        }
        // The coordinator speaks another protocol version: no poll will ever pass, say why now.
        if (msg.body === 'refused' && msg.refused) throw new ProtocolError(String(msg.refused.error), 'ERR_PROTOCOL_VERSION');
        if (msg.body !== 'status' || !msg.status) continue;
        last = { ready: !!msg.status.ready, liveRanks: msg.status.liveRanks ?? [], expectedRanks: msg.status.expectedRanks ?? [], epoch: Number(msg.epoch ?? 0) };
        if (isReady(last)) return last;
      }
    }
    return await abort;
  } finally {
    sock.close();
  }
}

// ------------------------------------------------------------------ the launch

const SIGNALS: NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];

function signalExitCode(sig: NodeJS.Signals): number {
  return 128 + (os.constants.signals[sig] ?? 0);
}

/** Run the whole launch; resolves to the exit code the launcher should exit with. */
export async function launch(opts: LaunchOptions, logger?: Logger): Promise<number> {
  const bin = path.join(packageRoot(), 'bin', 'wavebus.js');
  const bindHost = opts.nodeRank === 0 ? await localBindAddress(opts.coordinator.host) : undefined;
  const startCoordinator = bindHost !== undefined;
  if (startCoordinator) {
    // A host name that resolves to loopback here (Debian's 127.0.1.1 line in /etc/hosts) would
    // bind where no other node can reach; an explicit loopback address is a deliberate one-host test.
    const named = net.isIP(opts.coordinator.host.replace(/^\[|\]$/g, '')) === 0 && opts.coordinator.host !== 'localhost';
    if (opts.nnodes > 1 && named && isLoopback(bindHost)) {
      throw launchError(
        `--nnodes ${opts.nnodes}: the coordinator host ${opts.coordinator.host} resolves to the loopback address ${bindHost} on this host, ` +
          'which other nodes cannot reach; pass --master-addr (or --coordinator) with an IP address of this host',
      );
    }
    // Fail before spawning anything when the coordinator's keys are unusable.
    const serverKeys = opts.curveDir !== undefined ? loadCurveDirServer(opts.curveDir) : undefined;
    checkBindAllowed(bindHost, { insecure: opts.insecure, curve: serverKeys !== undefined, logger });
    await checkPortFree(bindHost, opts.port, 'PUB');
    await checkPortFree(bindHost, opts.port + 1, 'ROUTER');
  } else if (opts.nodeRank === 0) {
    logger?.info({ coordinator: opts.coordinator }, 'the coordinator address is not on this host; expecting a coordinator there');
  }

  const rd = prepareRunDir(opts.runDir, opts.nprocPerNode);
  const runDir = rd.path;
  // The dump root is this host's decision, derived like the coordinator's (before anything starts).
  let dumpRoot: string;
  try {
    dumpRoot = launchDumpRoot(opts.coordinatorArgs);
  } catch (e) {
    releaseRunDir(rd);
    throw e;
  }
  // The engines name their shm segments with this prefix, so whatever kills them (SIGKILL
  // included), the launcher removes exactly this job's segments once the command is gone.
  const shmPrefix = newShmPrefix();
  const env: NodeJS.ProcessEnv = { ...commandEnv(opts, runDir), WAVEBUS_SHM_PREFIX: shmPrefix };
  const releaseShm = () => {
    const gone = removeShmSegments(shmPrefix);
    if (gone.length > 0) logger?.warn({ segments: gone }, 'removed shared memory the command left behind');
  };
  // Without CURVE, a one-host job's coordinator and agents share a fresh token (auth.ts), passed
  // by path. Several hosts cannot share a file from here: they use CURVE (docs/security.md).
  let tokenFile: string | undefined;
  let token: BusToken | undefined;
  if (startCoordinator && opts.nnodes === 1 && opts.curveDir === undefined) {
    try {
      tokenFile = createTokenFile(runDir);
      token = BusToken.load(tokenFile, 'the bus token');
    } catch (e) {
      releaseRunDir(rd);
      throw e;
    }
    env.WAVEBUS_BUS_TOKEN_FILE = tokenFile;
  }
  const sidecars: Sidecar[] = [];
  let command: ChildProcess | undefined;

  // Last line of defence: whatever happens to us, the sidecars do not outlive the launcher.
  const onExit = () => {
    for (const s of sidecars) if (s.alive()) s.signalGroup('SIGKILL');
    if (tokenFile) fs.rmSync(tokenFile, { force: true });
    removeShmSegments(shmPrefix);
    releaseRunDir(rd);
  };
  process.on('exit', onExit);

  let signalled: NodeJS.Signals | undefined;
  let abortStartup: (e: Error) => void = () => undefined;
  let stopLinger: () => void = () => undefined;
  const onSignal = (sig: NodeJS.Signals) => {
    if (command && (command.exitCode !== null || command.signalCode !== null)) {
      stopLinger();
    } else if (command) {
      command.kill(sig);
    } else {
      signalled = sig;
      abortStartup(new LaunchError(`received ${sig} before the job was ready`, 'ERR_LAUNCH_SIGNAL'));
    }
  };
  for (const s of SIGNALS) process.on(s, onSignal);

  const teardown = async () => {
    await Promise.all(sidecars.map((s) => s.stop(opts.graceMs)));
    for (const s of SIGNALS) process.off(s, onSignal);
    if (tokenFile) fs.rmSync(tokenFile, { force: true });
    releaseShm();
    releaseRunDir(rd);
    process.off('exit', onExit);
  };

  try {
    const startupFailed = new Promise<never>((_, reject) => {
      abortStartup = reject;
    });
    startupFailed.catch(() => undefined);

    const tokenArgs = tokenFile !== undefined ? ['--bus-token-file', tokenFile] : [];
    if (startCoordinator) sidecars.push(new Sidecar('coordinator', bin, [...coordinatorArgv(opts, bindHost), ...tokenArgs], env));
    for (let l = 0; l < opts.nprocPerNode; l++) {
      sidecars.push(new Sidecar(`agent local${l}/rank${globalRankOfLocal(opts, l)}`, bin, agentArgv(opts, l, runDir, { dumpRoot, tokenFile }), env));
    }
    for (const s of sidecars) {
      void s.exited.then(() => {
        const tail = s.stderrTail();
        abortStartup(new LaunchError(`${s.name} ${s.describeExit()} before the job was ready${tail ? `; its output ends with:\n${tail}` : ''}`));
      });
    }

    let lastStatus: StatusSnapshot | undefined;
    const timer = setTimeout(() => {
      const seen = lastStatus ? ` (live ranks [${lastStatus.liveRanks.join(',')}] of expected [${lastStatus.expectedRanks.join(',')}])` : ' (no answer from the coordinator)';
      abortStartup(
        new LaunchError(
          `the job was not ready after --ready-timeout-ms ${opts.readyTimeoutMs} ms: coordinator ${opts.coordinator.host}:${opts.coordinator.port}${seen}`,
          'ERR_LAUNCH_TIMEOUT',
        ),
      );
    }, opts.readyTimeoutMs);
    const mine = Array.from({ length: opts.nprocPerNode }, (_, l) => globalRankOfLocal(opts, l));
    try {
      const status = await waitForCoordinator(
        opts.coordinator,
        (s) => {
          lastStatus = s;
          // Node 0 waits for the whole job; other nodes only for their own agents that join the
          // bus (the last-PP ranks, which the coordinator expects; the others never say Hello).
          return opts.nodeRank === 0 ? s.ready : mine.filter((r) => s.expectedRanks.includes(r)).every((r) => s.liveRanks.includes(r));
        },
        startupFailed,
        opts.curve,
        token,
      );
      logger?.info({ liveRanks: status.liveRanks, epoch: status.epoch, runDir }, 'wavebus ready; starting the command');
    } finally {
      clearTimeout(timer);
    }
    if (signalled) throw new LaunchError(`received ${signalled} before the job was ready`, 'ERR_LAUNCH_SIGNAL');

    // From here on a sidecar dying is logged, never fatal: debugging must not stop the job.
    for (const s of sidecars) {
      void s.exited.then(() => {
        if (command && command.exitCode === null && command.signalCode === null) {
          process.stderr.write(`wavebus launch: warning: ${s.name} ${s.describeExit()} while the command runs\n`);
        }
      });
    }

    const cmd = spawn(opts.command[0], opts.command.slice(1), { stdio: 'inherit', env });
    command = cmd;
    const result = await new Promise<number>((resolve) => {
      cmd.once('error', (e: NodeJS.ErrnoException) => {
        process.stderr.write(`wavebus launch: could not start the command ${JSON.stringify(opts.command[0])}: ${e.message}\n`);
        resolve(e.code === 'ENOENT' ? 127 : 126);
      });
      cmd.once('exit', (code, signal) => resolve(signal ? signalExitCode(signal) : (code ?? 1)));
    });
    releaseShm();
    if (opts.lingerMs && opts.lingerMs > 0) {
      // Agents keep serving their bundles so `wavebus aggregate` can still collect them.
      process.stderr.write(`wavebus launch: the command exited (${result}); agents keep serving files for ${opts.lingerMs} ms (SIGTERM stops them)\n`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, opts.lingerMs);
        stopLinger = () => {
          clearTimeout(t);
          resolve();
        };
      });
    }
    return result;
  } catch (e) {
    if (signalled && !command) {
      process.stderr.write(`wavebus launch: received ${signalled} before the job was ready; stopping\n`);
      return signalExitCode(signalled);
    }
    throw e;
  } finally {
    await teardown();
  }
}
