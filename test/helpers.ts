// The one shared test helper: temp dirs, spawned processes, free ports, Python, polling.
// Everything started here is stopped by cleanup(), which every test file calls in afterAll/afterEach.
import { ChildProcess, spawn, SpawnOptions, spawnSync } from 'child_process';
import * as fs from 'fs';
import * as net from 'net';
import * as os from 'os';
import * as path from 'path';

export const ROOT = path.resolve(__dirname, '..');
export const CLI = path.join(ROOT, 'bin', 'wavebus.js');
/** Debian's interpreter, which has python3-numpy, python3-torch and python3-zmq. */
export const PYTHON = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

const children = new Set<ChildProcess>();
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
export function runPython(code: string, args: string[] = [], opts: { env?: NodeJS.ProcessEnv; timeout?: number } = {}): string {
  const r = spawnSync(PYTHON, ['-c', code, ...args], { encoding: 'utf8', env: opts.env ?? process.env, timeout: opts.timeout ?? 120000 });
  if (r.status !== 0) throw new Error(`python exited ${r.status}: ${r.stderr}`);
  return r.stdout;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

export async function waitFor<T>(fn: () => T | Promise<T>, what: string, timeoutMs = 20000, everyMs = 25): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const v = await fn();
      if (v) return v as NonNullable<T>;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, everyMs));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ''}`);
}

/** Kill every process this file started and remove its temp dirs. */
export async function cleanup(): Promise<void> {
  const waits: Promise<unknown>[] = [];
  for (const c of children) {
    if (c.exitCode === null && c.signalCode === null) {
      waits.push(new Promise((r) => c.once('exit', r)));
      try {
        c.kill('SIGKILL');
      } catch {
        /* already gone */
      }
    }
  }
  await Promise.all(waits);
  children.clear();
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
}
