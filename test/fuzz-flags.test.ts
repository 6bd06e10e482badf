// Random values for every flag of every command and every WAVEBUS_* environment variable: each
// invocation starts (or finishes) cleanly, fails the way the command fails without that value, or
// exits non-zero with a message naming the flag or variable; never a stack trace, a crash or a
// hang. The flags come from the commands' own yargs builders and the variables from the sources,
// so a new one that this file does not list fails the first test.
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import yargs from 'yargs';
import { Mutator } from '../bench/fuzz';
import { within } from '../bench/lib/fuzz-procs';
import { CLI, cleanup, freePortPair, ROOT, tmpDir } from './helpers';

jest.setTimeout(600000);
afterAll(cleanup);


/** Every command's flags, from its yargs builder (positionals left out). */
function derivedFlags(): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  const dir = path.join(ROOT, 'src', 'commands');
  for (const f of fs.readdirSync(dir).filter((x) => x.endsWith('.ts') && x !== 'flags.ts')) {
    // eslint-disable-next-line @typescript-eslint/no-var-requires
    const mod = require(path.join(dir, f)) as Record<string, unknown>;
    for (const v of Object.values(mod)) {
      const c = v as { command?: unknown; builder?: unknown };
      if (!c || typeof c !== 'object' || typeof c.command !== 'string') continue;
      const [name, ...rest] = c.command.split(' ');
      const positional = new Set(rest.map((p) => p.replace(/[<>[\].]/g, '')));
      const y = yargs([]);
      if (typeof c.builder === 'function') c.builder(y);
      else if (c.builder) y.options(c.builder as never);
      out[name] = Object.keys((y as unknown as { getOptions(): { key: Record<string, unknown> } }).getOptions().key).filter((k) => !['help', 'version', '$0'].includes(k) && !positional.has(k));
    }
  }
  return out;
}

/** Every WAVEBUS_* variable the sources read (the snapshot settings through snapshotVar()). */
function derivedEnv(): string[] {
  const names = new Set<string>();
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (p.endsWith('.ts')) {
        const text = fs.readFileSync(p, 'utf8');
        for (const m of text.matchAll(/\bWAVEBUS_[A-Z0-9_]*[A-Z0-9]\b/g)) names.add(m[0]);
        for (const m of text.matchAll(/snapshotVar\('([A-Z_]+)'\)/g)) names.add(`WAVEBUS_SNAPSHOT_${m[1]}`);
      }
    }
  };
  walk(path.join(ROOT, 'src'));
  names.delete('WAVEBUS_SNAPSHOT_X'); // the docs' placeholder for "each WAVEBUS_SNAPSHOT_* variable"
  return [...names].sort();
}

const BAD = ['', '-1', '0', 'abc', '1.5', '1e3', '0x10', ' 7 ', 'NaN', '99999999999999999999', '{"a":1}', '$(id)', '∞', 'x'.repeat(3000), '127.0.0.1:0', ':::', '../../etc/passwd', 'true'];
/** For flags that size a job (processes, memory): no large valid values. */
const SMALL = [...BAD.filter((v) => !/^ ?\d+ ?$/.test(v) || Number(v) <= 2), '2'];

/** The commands this file runs, and how (`own`: a fresh directory; `port`: a fresh port pair). */
interface Bases {
  own: () => string;
  port: () => Promise<number>;
  deadPort: number;
}
const COMMANDS: Record<string, { base: (b: Bases) => Promise<string[]>; small?: string[]; after?: string[] }> = {
  agent: { base: async (b) => ['agent', '--coordinator', `127.0.0.1:${b.deadPort}`, '--run-dir', b.own()], small: ['staging-mb', 'cuda-staging-mb', 'world-size', 'local-world-size'] },
  coordinator: { base: async (b) => ['coordinator', '--port', String(await b.port()), '--runtime-config-path', path.join(b.own(), 'cfg.json')], small: ['world-size', 'tp', 'pp', 'dp', 'cp'] },
  launch: {
    base: async (b) => ['launch', '--port', String(await b.port()), '--run-dir', path.join(b.own(), 'l'), '--ready-timeout-ms', '8000', '--grace-ms', '200', '--runtime-config-path', path.join(b.own(), 'cfg.json')],
    small: ['*'],
    after: ['--', 'true'],
  },
  sim: { base: async (b) => ['sim', '--detached', '--steps', '3', '--step-ms', '0', '--result-dir', b.own()], small: ['*'] },
  aggregate: { base: async (b) => ['aggregate', '--coordinator', `127.0.0.1:${b.deadPort}`, '--out', b.own(), '--timeout-ms', '300'] },
  status: { base: async (b) => ['status', '--coordinator', `127.0.0.1:${b.deadPort}`, '--timeout', '300'] },
  dump: { base: async (b) => ['dump', '--coordinator', `127.0.0.1:${b.deadPort}`, '--all', '--timeout', '300'] },
  capture: { base: async (b) => ['capture', '--coordinator', `127.0.0.1:${b.deadPort}`, '--next', '--timeout', '300'] },
  compare: { base: async (b) => ['compare', b.own(), b.own()] },
  inspect: { base: async (b) => ['inspect', b.own()] },
  keys: { base: async (b) => ['keys', '--out', b.own(), '--name', 'k'] },
  demo: { base: async (b) => ['demo', '--out', b.own(), '--steps', '3', '--tp', '1'], small: ['*'] },
  report: { base: async (b) => ['report', b.own()] },
  trace: { base: async (b) => ['trace', b.own()] },
  bisect: { base: async (b) => ['bisect', b.own(), b.own()] },
  verdict: { base: async (b) => ['verdict', b.own(), '--engine-out', b.own(), '--timeout', '300'] },
};
/** Commands whose flags are not fuzzed here, their flags (a new one still fails the listing test), and why. */
const NOT_FUZZED: Record<string, { flags: string[]; why: string }> = {
  bench: { flags: [], why: "its only inputs are the bench name and the bench's flags, which one parser (bench/lib/flags.ts) checks for every bench: test/bench-flags.test.ts refuses an unknown flag and a bad number of each" },
  'sim-rank': { flags: ['options'], why: 'hidden and internal: one simulated rank that `wavebus sim` forks (IPC channel) with the JSON of options it checked' },
};

/** Each variable: the command that reads it, and whether it sizes a job. */
const ENV: Record<string, { cmd: string; small?: boolean; extra?: Record<string, string> }> = {
  WAVEBUS_PORT: { cmd: 'coordinator-noport' },
  WAVEBUS_RUN_DIR: { cmd: 'agent-norundir' },
  WAVEBUS_BUS_TOKEN_FILE: { cmd: 'agent' },
  WAVEBUS_COORDINATOR: { cmd: 'agent-nocoord' },
  WAVEBUS_DUMP_ROOT: { cmd: 'agent' },
  WAVEBUS_SHM_PREFIX: { cmd: 'sim' },
  WAVEBUS_CACHE_ROOT: { cmd: 'agent' },
  WAVEBUS_TP: { cmd: 'coordinator', small: true },
  WAVEBUS_PP: { cmd: 'coordinator', small: true },
  WAVEBUS_DP: { cmd: 'coordinator', small: true },
  WAVEBUS_CP: { cmd: 'coordinator', small: true },
  WAVEBUS_NPROC_PER_NODE: { cmd: 'sim', small: true },
  WAVEBUS_NNODES: { cmd: 'sim', small: true },
  WAVEBUS_NODE_RANK: { cmd: 'sim', small: true },
  WAVEBUS_LOG_LEVEL: { cmd: 'agent' },
  WAVEBUS_DIRECT_FILES: { cmd: 'agent' },
  WAVEBUS_DIRECT_FILES_HOST: { cmd: 'agent' },
  WAVEBUS_DIRECT_FILES_PORT: { cmd: 'agent' },
  WAVEBUS_MALLOC_TUNING: { cmd: 'coordinator' },
  WAVEBUS_LOOKAHEAD_WAVES: { cmd: 'coordinator', small: true },
  WAVEBUS_SNAPSHOT_ENABLE: { cmd: 'agent' },
  WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: { cmd: 'agent', extra: { WAVEBUS_SNAPSHOT_ENABLE: '1' } },
  WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: { cmd: 'agent', extra: { WAVEBUS_SNAPSHOT_ENABLE: '1' } },
  WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: { cmd: 'agent', extra: { WAVEBUS_SNAPSHOT_ENABLE: '1' } },
  WAVEBUS_SNAPSHOT_MAX_CAPTURES: { cmd: 'agent', extra: { WAVEBUS_SNAPSHOT_ENABLE: '1' } },
  WAVEBUS_SNAPSHOT_RANKS: { cmd: 'agent', extra: { WAVEBUS_SNAPSHOT_ENABLE: '1' } },
  WAVEBUS_SNAPSHOT_FORMAT: { cmd: 'agent', extra: { WAVEBUS_SNAPSHOT_ENABLE: '1' } },
  WAVEBUS_RECORD_FORWARDS: { cmd: 'agent' },
  WAVEBUS_RECORD_MAX_BYTES: { cmd: 'agent', extra: { WAVEBUS_RECORD_FORWARDS: '2' } },
  WAVEBUS_TOKEN_HASH_KEY_FILE: { cmd: 'coordinator' },
  // Read only by `demo --engine torch` (findTorchrun: any value without a torchrun under it is
  // absent, demo.test); fuzzed here on the default demo, which must not mind it either.
  WAVEBUS_TORCH2_VENV: { cmd: 'demo' },
};

test('every flag of every command and every WAVEBUS_* variable is listed here (a new one must be added)', () => {
  const flags = derivedFlags();
  expect(Object.keys(flags).filter((c) => !COMMANDS[c] && !NOT_FUZZED[c])).toEqual([]);
  expect(Object.keys(COMMANDS).filter((c) => !flags[c])).toEqual([]); // no stale entry
  for (const [c, skip] of Object.entries(NOT_FUZZED)) expect(flags[c]).toEqual(skip.flags); // nothing new hidden behind a skip
  expect(derivedEnv().filter((v) => !ENV[v])).toEqual([]);
  expect(Object.keys(ENV).filter((v) => !derivedEnv().includes(v))).toEqual([]);
});

interface Case {
  cmd: string[];
  /** The flag (--x) or variable as an error must name it. */
  name: string;
  env: Record<string, string>;
  /** The same command without the fuzzed value. */
  baseline: string;
}

interface Outcome {
  code: number | null;
  signal: string | null;
  running: boolean;
  stderr: string;
}

/** Run one command line in a process group of its own; after `ms` the whole group is stopped. */
async function runCmd(cmd: string[], env: Record<string, string>, ms: number): Promise<Outcome> {
  // In a directory of its own: a relative path among the values lands there, not in the checkout.
  // Deep enough that a relative value ('../../etc/passwd') stays inside the test's own dir.
  const cwd = path.join(tmpDir('wavebus-fuzz-cwd-'), 'a', 'b', 'c', 'd');
  fs.mkdirSync(cwd, { recursive: true });
  const child = spawn(process.execPath, [CLI, ...cmd], { cwd, env: { ...process.env, WAVEBUS_LOG_LEVEL: 'warn', ...env }, stdio: ['ignore', 'ignore', 'pipe'], detached: true });
  let stderr = '';
  child.stderr!.on('data', (b) => (stderr = (stderr + b.toString()).slice(-20000)));
  const ended = new Promise((r) => child.stderr!.on('end', r));
  // 'exit' may come before the last of stderr: wait for its end too (a child it left may hold it: bounded)
  const exited = new Promise<{ code: number | null; signal: string | null }>((r) =>
    child.on('exit', (code, signal) => void within(ended, 2000, undefined).then(() => r({ code, signal }))),
  );
  const done = await within(exited, ms, undefined);
  const kill = (sig: NodeJS.Signals) => {
    try {
      process.kill(-child.pid!, sig);
    } catch {
      /* the group is gone */
    }
  };
  if (!done) {
    kill('SIGTERM');
    if (!(await within(exited, 5000, undefined))) kill('SIGKILL');
    await exited;
  }
  kill('SIGKILL'); // children the command left behind
  return { ...(done ?? { code: null, signal: null }), running: !done, stderr };
}

/** The last line of an error, with numbers and paths taken out (a value the command took shows only there). */
function gist(s: string): string {
  const line = s.trim().split('\n').filter(Boolean).slice(-1)[0] ?? '';
  return line.replace(/\/[^\s"']+/g, 'PATH').replace(/\d+/g, 'N').slice(0, 300);
}

/** A Node stack frame, plain or inside a JSON log line, or an internal error class. */
function stackTrace(s: string): string | undefined {
  const m = /^ {4}at .+$/m.exec(s) ?? /\\n {4}at .+?\\n/.exec(s) ?? /\b(TypeError|RangeError|ReferenceError|SyntaxError: Unexpected)\b.*$/m.exec(s);
  return m?.[0];
}

test('random values for every flag and variable: it works, or a clear error naming it; never a stack trace or a hang', async () => {
  const root = tmpDir('wavebus-fuzz-flags-');
  let n = 0;
  // Every case's ports are drawn before any case runs: no two pairs may share a port, or two
  // coordinators of one batch bind the same one (a failure that names --port, not the fuzzed flag).
  const drawn = new Set<number>();
  const distinctPair = async (): Promise<number> => {
    for (;;) {
      const p = await freePortPair();
      if (!drawn.has(p) && !drawn.has(p + 1)) {
        drawn.add(p).add(p + 1);
        return p;
      }
    }
  };
  const b: Bases = {
    own: () => {
      const d = path.join(root, `d${n++}`);
      fs.mkdirSync(d, { recursive: true, mode: 0o700 }); // a run dir must be private
      return d;
    },
    port: distinctPair,
    deadPort: await distinctPair(),
  };
  const m = new Mutator(5);
  const cases: Case[] = [];
  const baselines = new Map<string, string[]>();
  const flags = derivedFlags();
  for (const [cmd, spec] of Object.entries(COMMANDS)) {
    baselines.set(cmd, [...(await spec.base(b)), ...(spec.after ?? [])]);
    for (const flag of flags[cmd]) {
      const pool = spec.small?.includes('*') || spec.small?.includes(flag) ? SMALL : BAD;
      cases.push({ cmd: [...(await spec.base(b)), `--${flag}=${m.pick(pool)}`, ...(spec.after ?? [])], name: `--${flag}`, env: {}, baseline: cmd });
    }
  }
  const envBase = async (kind: string): Promise<string[]> => {
    if (kind === 'coordinator-noport') return ['coordinator', '--runtime-config-path', path.join(b.own(), 'cfg.json')];
    if (kind === 'agent-norundir') return ['agent', '--coordinator', `127.0.0.1:${b.deadPort}`];
    if (kind === 'agent-nocoord') return ['agent', '--run-dir', b.own()];
    return COMMANDS[kind].base(b);
  };
  for (const [name, spec] of Object.entries(ENV)) {
    const cmd = await envBase(spec.cmd);
    baselines.set(`env:${name}`, cmd);
    cases.push({ cmd, name, env: { WAVEBUS_COORDINATOR: `127.0.0.1:${b.deadPort}`, ...spec.extra, [name]: m.pick(spec.small ? SMALL : BAD) }, baseline: `env:${name}` });
  }
  const gists = new Map<string, Outcome>();
  const bad: string[] = [];
  const run = async (c: Case) => {
    const o = await runCmd(c.cmd, c.env, 4000);
    const label = `${c.cmd[0]} ${c.name}=${JSON.stringify(c.env[c.name] ?? c.cmd.find((a) => a.startsWith(`${c.name}=`))?.slice(c.name.length + 1)).slice(0, 60)}`;
    const trace = stackTrace(o.stderr);
    if (trace) bad.push(`${label}: stack trace: ${trace}`);
    if (o.signal && !o.running) bad.push(`${label}: killed by ${o.signal}`);
    if (o.running || o.code === 0) return; // started (or finished) fine
    if (o.stderr.includes(c.name) || o.stderr.includes(c.name.replace(/^--/, ''))) return; // named
    // Failed the way the command fails without the fuzzed value: the value was taken.
    let base = gists.get(c.baseline);
    if (!base) {
      base = await runCmd(baselines.get(c.baseline)!, c.baseline.startsWith('env:') ? { WAVEBUS_COORDINATOR: `127.0.0.1:${b.deadPort}` } : {}, 4000);
      gists.set(c.baseline, base);
    }
    if (!base.running && base.code === o.code && gist(base.stderr) === gist(o.stderr)) return;
    bad.push(`${label}: exit ${o.code} without naming ${c.name}: ${o.stderr.trim().split('\n').slice(-2).join(' | ').slice(0, 300)}`);
  };
  for (let i = 0; i < cases.length; i += 8) await Promise.all(cases.slice(i, i + 8).map(run));
  expect(bad).toEqual([]);
  expect(cases.length).toBeGreaterThan(150);
});

test('found by the fuzz: a flag of `wavebus keys` given twice takes its last value (was a TypeError about an Array)', async () => {
  const root = tmpDir('wavebus-fuzz-keys-');
  const o = await runCmd(['keys', '--out', path.join(root, 'a'), '--out', path.join(root, 'b'), '--name', 'x', '--name', 'k'], {}, 20000);
  expect(o.stderr).toBe('');
  expect(o.code).toBe(0);
  expect(fs.existsSync(path.join(root, 'b', 'k.key'))).toBe(true);
  expect(fs.existsSync(path.join(root, 'a'))).toBe(false);
});
