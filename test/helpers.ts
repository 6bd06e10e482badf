// The one shared test helper: temp dirs, spawned processes, free ports, Python, polling.
// Everything started here is stopped by cleanup(), which every test file calls in afterAll/afterEach.
import { ChildProcess, spawn, SpawnOptions, spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { createNetnsPair as createNetnsPair_, removeNetns, sh, type NetnsPair } from '../bench/lib/netns';

export const ROOT = path.resolve(__dirname, '..');
export const CLI = path.join(ROOT, 'bin', 'wavebus.js');
/** Debian's interpreter, which has python3-numpy, python3-torch and python3-zmq. */
export const PYTHON = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

const children = new Set<ChildProcess>();
/** Children started as process-group leaders (spawn option `detached`): cleanup() kills their whole group. */
const groups = new Set<number>();
const dirs: string[] = [];

export function tmpDir(prefix = 'wavebus-test-'): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  dirs.push(d);
  return d;
}

export interface Spawned {
  child: ChildProcess;
  stdout: () => string;
  stderr: () => string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export function spawnTracked(cmd: string, args: string[], opts: SpawnOptions = {}): Spawned {
  const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...opts });
  children.add(child);
  if (opts.detached && child.pid !== undefined) groups.add(child.pid);
  let out = '';
  let err = '';
  child.stdout?.on('data', (b) => (out += b.toString()));
  child.stderr?.on('data', (b) => (err += b.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.on('exit', (code, signal) => {
      children.delete(child);
      resolve({ code, signal });
    });
  });
  return { child, stdout: () => out, stderr: () => err, exited };
}

/** Run the built CLI (`bin/wavebus.js`) as a separate process. */
export function spawnWavebus(args: string[], opts: SpawnOptions = {}): Spawned {
  return spawnTracked(process.execPath, [CLI, ...args], opts);
}

/** Run the CLI to completion, synchronously. */
export function runWavebus(args: string[], opts: { env?: NodeJS.ProcessEnv; cwd?: string; timeout?: number } = {}) {
  const r = spawnSync(process.execPath, [CLI, ...args], {
    encoding: 'utf8',
    env: opts.env ?? process.env,
    cwd: opts.cwd,
    timeout: opts.timeout ?? 60000,
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr, signal: r.signal };
}

/** Run a Python snippet with Debian's python3; throws with its stderr on failure. */
export function runPython(code: string, args: string[] = [], opts: { env?: NodeJS.ProcessEnv; timeout?: number; python?: string } = {}): string {
  const timeout = opts.timeout ?? 120000;
  const r = spawnSync(opts.python ?? PYTHON, ['-c', code, ...args], { encoding: 'utf8', env: opts.env ?? process.env, timeout });
  if (r.status !== 0) throw new Error(`python ${r.signal ? `was stopped by ${r.signal} (its bound is ${timeout} ms)` : `exited ${r.status}`}: ${r.stderr}`);
  return r.stdout;
}

export { freePort, freePortPair, portFree } from '../src/bus/ports';

/** Thrown by a waitFor condition that can never become true (say, the process it watches exited): the wait ends at once. */
export class GiveUp extends Error {}

export async function waitFor<T>(fn: () => T | Promise<T>, what: string, timeoutMs = 20000, everyMs = 25): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const v = await fn();
      if (v) return v as NonNullable<T>;
    } catch (e) {
      if (e instanceof GiveUp) throw new Error(`gave up waiting for ${what}: ${e.message}`);
      last = e;
    }
    await new Promise((r) => setTimeout(r, everyMs));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ''}`);
}

/**
 * The ms this thread has spent runnable but not running (waiting for a CPU), from
 * /proc/thread-self/schedstat; 0 where the kernel does not say. Subtracted from a call's wall
 * time, it leaves what the call itself spent (working, or waiting for an answer) however busy the
 * machine is: a bound on waiting is checked on that, never on how often the host lets us run.
 */
export function runQueueMs(): number {
  try {
    return Number(fs.readFileSync('/proc/thread-self/schedstat', 'utf8').split(' ')[1]) / 1e6 || 0;
  } catch {
    return 0;
  }
}

/** waitFor while `proc` runs: a process that exited first ends the wait at once (GiveUp), naming its exit. */
export function waitWhileRunning<T>(proc: Spawned, fn: () => T | Promise<T>, what: string, timeoutMs: number, everyMs = 25): Promise<NonNullable<T>> {
  let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  void proc.exited.then((e) => (exit = e));
  return waitFor(
    () => {
      if (exit) throw new GiveUp(`the process exited first (code ${exit.code}, signal ${exit.signal}); its stderr ends with:\n${proc.stderr().slice(-3000)}`);
      return fn();
    },
    what,
    timeoutMs,
    everyMs,
  );
}

/** The process's exit, or a failure naming `what` when it runs longer than `ms` (then it is killed, with its group if it leads one). */
export async function exitedWithin(p: Spawned, ms: number, what = `${p.child.spawnargs.slice(0, 8).join(' ')} ... to exit`): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      p.child.kill('SIGKILL');
      if (p.child.pid !== undefined && groups.has(p.child.pid)) {
        try {
          process.kill(-p.child.pid, 'SIGKILL');
        } catch {
          /* the group is gone */
        }
      }
      reject(new Error(`timed out after ${ms} ms waiting for ${what}; stderr: ${p.stderr().slice(-1500)}`));
    }, ms);
  });
  try {
    return await Promise.race([p.exited, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** How long cleanup() lets the processes it stops exit on SIGTERM before it kills them. */
const CLEANUP_GRACE_MS = 3000;

/** Stop every process this file started and remove its temp dirs. */
export async function cleanup(): Promise<void> {
  // SIGTERM first, as a user stops them: an agent then removes the run dir it made in /tmp (a
  // SIGKILL leaves it behind). Whatever still runs after the grace (stopped, or slow) is killed.
  const live = [...children].filter((c) => c.exitCode === null && c.signalCode === null);
  const waits = live.map((c) => new Promise((r) => c.once('exit', r)));
  const signal = (sig: NodeJS.Signals) => {
    for (const c of live) {
      try {
        c.kill(sig);
      } catch {
        /* already gone */
      }
    }
  };
  signal('SIGTERM');
  let graceTimer: NodeJS.Timeout | undefined;
  await Promise.race([Promise.all(waits), new Promise((r) => (graceTimer = setTimeout(r, CLEANUP_GRACE_MS)))]);
  clearTimeout(graceTimer);
  signal('SIGKILL');
  await Promise.all(waits);
  children.clear();
  // What a group leader started (a launched job's command and its workers) may outlive it: kill the group.
  for (const pgid of groups) {
    try {
      process.kill(-pgid, 'SIGKILL');
    } catch {
      /* the group is gone */
    }
  }
  groups.clear();
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
}

// ---------------------------------------------------------------- appended: root-only fixtures

/** Run a system command synchronously; throws with its stderr when it fails. */
export { sh };

/** Mount/netns fixtures need root; CI runs as root. Returns why not, or undefined when they can run. */
export function rootOnlyReason(): string | undefined {
  // CI runs as root: there these tests always run, and fail loudly if they cannot (never a silent skip).
  if (process.env.CI) return undefined;
  return process.getuid?.() === 0 ? undefined : `needs root (uid ${process.getuid?.()}): mounts and network namespaces`;
}

/**
 * describe() for tests that need root (mounts, network namespaces, a second uid). Where
 * rootOnlyReason() says they cannot run, the block is one skipped test that says why.
 */
export function describeAsRoot(name: string, body: () => void): void {
  const why = rootOnlyReason();
  if (why === undefined) {
    describe(name, body);
    return;
  }
  describe(name, () => {
    test.skip(`skipped: ${why}`, () => undefined);
  });
  // eslint-disable-next-line no-console
  console.warn(`${name}: skipped: ${why}`);
}

const mounts: string[] = [];

/** Mount a tmpfs of `size` (e.g. '1m') at `dir` (not a tmpDir(): cleanup() would rmdir it while mounted); cleanupMounts() undoes it. */
export function mountTmpfs(dir: string, size: string, opts: { readOnly?: boolean } = {}): void {
  fs.mkdirSync(dir, { recursive: true });
  sh('mount', ['-t', 'tmpfs', '-o', `size=${size}${opts.readOnly ? ',ro' : ''}`, 'tmpfs', dir]);
  mounts.push(dir);
}

/** Unmount (lazily) every mount made here and remove the mount points. Call after cleanup(). */
export function cleanupMounts(): void {
  for (const d of mounts.splice(0).reverse()) {
    spawnSync('umount', ['-l', d]);
    fs.rmSync(d, { recursive: true, force: true });
  }
}

/**
 * Two network namespaces joined by a veth pair in a private /30 that exists only inside them
 * (bench/lib/netns.ts): `a` has `addrA`, `b` has `addrB`, each with `lo` up. Names are unique per
 * test process; cleanupNetns() removes them.
 */
export type { NetnsPair };

const namespaces: string[] = [];

export function createNetnsPair(index = 0): NetnsPair {
  const tag = `wb${process.pid % 100000}${String.fromCharCode(97 + (index % 26))}`;
  // 10.213.<x>.{1,2}/30: x from the pid, so parallel test runs on one machine do not collide
  // (each pair lives in its own namespaces anyway; the addresses never reach the host's stack).
  const p = createNetnsPair_(tag, (process.pid + index * 7) % 63);
  namespaces.push(p.a, p.b);
  return p;
}

/**
 * Several "hosts" on one L2 segment: a hub namespace holding a bridge, and one namespace per host
 * (and per extra peer, such as a rogue one) joined to it by a veth pair, each with `lo` up and one
 * address in a private /24 that exists only inside these namespaces (10.214.<x>.<i+1>; the
 * host's own interfaces are never touched). Names are unique per test process; cleanupNetns()
 * removes them all.
 */
export interface NetnsCluster {
  hub: string;
  bridge: string;
  nodes: { ns: string; veth: string; addr: string }[];
}

export function createNetnsCluster(count: number, index = 0): NetnsCluster {
  if (count < 1 || count > 20) throw new RangeError(`createNetnsCluster: 1..20 namespaces, got ${count}`);
  const tag = `wb${process.pid % 100000}${String.fromCharCode(97 + (index % 26))}`;
  const x = (process.pid + index * 7) % 63;
  const add = (ns: string) => {
    spawnSync('ip', ['netns', 'del', ns]); // a leftover of a killed run with the same pid
    sh('ip', ['netns', 'add', ns]);
    namespaces.push(ns);
    sh('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
  };
  const c: NetnsCluster = { hub: `${tag}hub`, bridge: `${tag}br`, nodes: [] };
  add(c.hub);
  sh('ip', ['-n', c.hub, 'link', 'add', c.bridge, 'type', 'bridge']);
  sh('ip', ['-n', c.hub, 'link', 'set', c.bridge, 'up']);
  for (let i = 0; i < count; i++) {
    const node = { ns: `${tag}n${i}`, veth: `${tag}v${i}`, addr: `10.214.${x}.${i + 1}` };
    const peer = `${tag}p${i}`;
    add(node.ns);
    sh('ip', ['link', 'add', node.veth, 'netns', node.ns, 'type', 'veth', 'peer', 'name', peer, 'netns', c.hub]);
    sh('ip', ['-n', c.hub, 'link', 'set', peer, 'master', c.bridge]);
    sh('ip', ['-n', c.hub, 'link', 'set', peer, 'up']);
    sh('ip', ['-n', node.ns, 'addr', 'add', `${node.addr}/24`, 'dev', node.veth]);
    sh('ip', ['-n', node.ns, 'link', 'set', node.veth, 'up']);
    c.nodes.push(node);
  }
  return c;
}

/** Start a process inside network namespace `ns` (tracked like spawnTracked). */
export function spawnInNetns(ns: string, cmd: string, args: string[], opts: SpawnOptions = {}): Spawned {
  return spawnTracked('ip', ['netns', 'exec', ns, cmd, ...args], opts);
}

/** What a status prober reports: the coordinator's StatusReply with its status JSON parsed. */
export interface ProbedStatus {
  epoch: number;
  wave: number;
  liveRanks: number[];
  ready: boolean;
  json: Record<string, any>;
}

/**
 * A status prober inside namespace `ns`: asks the coordinator at host:port for its status every
 * 200 ms (with the CURVE client keys of `curveDir` when given) and prints one JSON line per answer.
 */
export function startStatusProber(ns: string, host: string, port: number, curveDir?: string): { latest: () => ProbedStatus | undefined; proc: Spawned } {
  const dist = (m: string) => JSON.stringify(path.join(ROOT, 'dist', 'src', 'bus', m));
  const script = `
    const { requestStatus } = require(${dist('coordinator.js')});
    const curve = ${curveDir ? `require(${dist('curve.js')}).loadCurveDirClient(${JSON.stringify(curveDir)})` : 'undefined'};
    const tick = () => requestStatus({ host: ${JSON.stringify(host)}, port: ${port} }, 1000, curve).then(
      (s) => process.stdout.write(JSON.stringify({ ...s, json: JSON.parse(s.statusJson) }) + '\\n'),
      () => process.stdout.write('{}\\n'),
    ).finally(() => setTimeout(tick, 200));
    tick();`;
  const proc = spawnInNetns(ns, process.execPath, ['-e', script]);
  return {
    proc,
    latest: () => {
      const lines = proc.stdout().trim().split('\n');
      for (let i = lines.length - 1; i >= 0; i--) {
        try {
          const s = JSON.parse(lines[i]);
          return s.epoch ? (s as ProbedStatus) : undefined;
        } catch {
          /* a line still being written */
        }
      }
      return undefined;
    },
  };
}

/**
 * Start a process inside network namespace `ns` that sees directory `disk` at path `at` (a bind
 * mount in the mount namespace `ip netns exec` gives each command): every "host" of a cluster
 * uses the same paths, each on its own disk, as real hosts do. `at` must exist.
 */
export function spawnOnHost(ns: string, disk: { dir: string; at: string }, cmd: string, args: string[], opts: SpawnOptions = {}): Spawned {
  fs.mkdirSync(disk.dir, { recursive: true });
  return spawnInNetns(ns, 'sh', ['-c', 'mount --bind "$1" "$2" && shift 2 && exec "$@"', 'sh', disk.dir, disk.at, cmd, ...args], opts);
}

/** Kill every process left in our namespaces (launch sidecars live in their own process groups), then delete them. */
export function cleanupNetns(): void {
  for (const ns of namespaces.splice(0)) removeNetns(ns);
}

/** `n` deterministic pseudo-random bytes (xorshift32 from `seed`), the same sequence for the same seed. */
export function pseudoRandomBytes(n: number, seed: number): Buffer {
  const b = Buffer.alloc(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    b[i] = x & 0xff;
  }
  return b;
}

/**
 * Every dump manifest.json under `root` (a KV dump root), with the directory it sits in, in arm-wave
 * order. Names starting with '.' are bundles being written; a manifest mid-rename is skipped.
 */
export function readManifests<T extends { arm_wave: number }>(root: string): (T & { dir: string })[] {
  const out: (T & { dir: string })[] = [];
  const walk = (d: string): void => {
    if (!fs.existsSync(d)) return;
    for (const n of fs.readdirSync(d)) {
      const p = path.join(d, n);
      if (n === 'manifest.json') {
        try {
          out.push({ ...(JSON.parse(fs.readFileSync(p, 'utf8')) as T), dir: d });
        } catch {
          /* being renamed into place */
        }
      } else if (!n.startsWith('.') && fs.statSync(p).isDirectory()) walk(p);
    }
  };
  walk(root);
  return out.sort((a, b) => a.arm_wave - b.arm_wave);
}


// ---------------------------------------------------------------- a second, unprivileged uid

export interface OtherUser {
  name: string;
  uid: number;
  gid: number;
}

const users: string[] = [];

/**
 * A script of test/attack/ where another uid can run it (otherUser): a fresh 0755 directory of its
 * own (`prefix`), the script in it 0644 under `as`. Data files for it go in the same directory.
 */
export function attackScript(name: string, prefix: string, as = name): { dir: string; script: string } {
  const dir = tmpDir(prefix);
  fs.chmodSync(dir, 0o755);
  const script = path.join(dir, as);
  fs.copyFileSync(path.join(ROOT, 'test', 'attack', name), script);
  fs.chmodSync(script, 0o644);
  return { dir, script };
}

/** The JSON lines a process printed so far (an attack script's events), a partial last line left out. */
export function jsonEvents(p: { stdout(): string }): Record<string, any>[] {
  return p.stdout().split('\n').filter((l) => l.startsWith('{') && l.endsWith('}')).map((l) => JSON.parse(l));
}

/**
 * A real unprivileged user for attack tests (`useradd`, root only): `tag` keeps test files apart
 * (at most 8 letters). Removed by cleanupUsers(). Skip with rootOnlyReason() where not root.
 */
export function otherUser(tag: string): OtherUser {
  const name = `wbt${tag}${process.pid % 100000}`.slice(0, 31);
  if (spawnSync('id', ['-u', name]).status !== 0) {
    sh('useradd', ['--system', '--no-create-home', '--shell', '/usr/sbin/nologin', name]);
    users.push(name);
  }
  const uid = Number(sh('id', ['-u', name]).trim());
  const gid = Number(sh('id', ['-g', name]).trim());
  return { name, uid, gid };
}

/** Run `cmd` as `user` to completion (stdout, stderr, exit code). */
export function runAs(user: OtherUser, cmd: string, args: string[], opts: { env?: NodeJS.ProcessEnv; cwd?: string; timeout?: number; input?: string } = {}) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', uid: user.uid, gid: user.gid, env: opts.env ?? { PATH: process.env.PATH ?? '/usr/bin:/bin' }, cwd: opts.cwd ?? '/', timeout: opts.timeout ?? 30000, input: opts.input });
  return { code: r.status, stdout: r.stdout ?? '', stderr: r.stderr ?? '', signal: r.signal };
}

/** Start `cmd` as `user` (tracked like spawnTracked, killed by cleanup()). */
export function spawnAs(user: OtherUser, cmd: string, args: string[], opts: SpawnOptions = {}): Spawned {
  return spawnTracked(cmd, args, { cwd: '/', env: { PATH: process.env.PATH ?? '/usr/bin:/bin' }, ...opts, uid: user.uid, gid: user.gid });
}

/** Remove every user made by otherUser(). Call after cleanup() (their processes must be gone). */
export function cleanupUsers(): void {
  for (const name of users.splice(0)) spawnSync('userdel', ['--force', name]);
}
