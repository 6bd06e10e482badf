// Fuzzing: garbage frames on every socket (bench/fuzz.ts, a few thousand per socket here), random
// edits of a hot-reloaded JSONC config, and random values for every flag and environment variable
// of the long-running commands. Never a crash, a hang or a stack trace; always a clear error.
import * as fs from 'fs';
import * as path from 'path';
import { Dealer } from 'zeromq';
import { fuzz, Mutator } from '../bench/fuzz';
import { requestStatus } from '../src/bus/coordinator';
import { encodeAgentMessage } from '../src/bus/frames';
import { configJson } from '../src/guard/config';
import { ConfigFollower } from '../src/guard/reload';
import { configFromText } from '../src/guard/startup';
import { cleanup, freePortPair, spawnWavebus, tmpDir, waitFor, type Spawned } from './helpers';

jest.setTimeout(180000);
afterEach(cleanup);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A Node stack frame or an internal error class in a process's output. */
function stackTrace(s: string): string | undefined {
  const m = /^ {4}at .+$/m.exec(s) ?? /\b(TypeError|RangeError|ReferenceError|SyntaxError: Unexpected)\b.*$/m.exec(s);
  return m?.[0];
}

test('garbage frames on the coordinator ROUTER, the agent SUB and the agent client socket', async () => {
  const r = await fuzz({ frames: 2500, seed: 7, oversized: true });
  expect(r.problems).toEqual([]);
  expect(r.crashes).toBe(0);
  expect(r.hung).toBe(false);
  expect(r.accounted).toBe(true);
  // The garbage really exercised the decoders: several drop reasons on each socket.
  expect(Object.keys(r.dropped.coordinator_router).length).toBeGreaterThanOrEqual(4);
  expect(Object.keys(r.dropped.agent_sub).length).toBeGreaterThanOrEqual(4);
  expect(r.client_replies.got).toBe(r.client_replies.expected);
  expect(r.client_replies.expected).toBeGreaterThan(0);
});

// ---------------------------------------------------------------- JSONC hot reload

const GOOD = `// runtime config
{
  "detector": {
    /* every detector */
    "token_repeat": { "enabled": true, "window": 32, "on_trigger": ["report", "dump_kv"], },
    "logits_finite": { "enabled": false },
    "garbled": { "enabled": true, "surprise_logprob": -5.5, "min_tokens": 16 },
  },
  "dump": { "auto_max_times": 3, "auto_cooldown_seconds": 10, "format": "npy", "free_headroom_bytes": 1024 },
  "report": { "max_per_req": 2, "include_block_ids": false },
}
`;

function mutateText(m: Mutator, text: string): string {
  const at = m.int(text.length + 1);
  const alphabet = '{}[],:"\'/*\n 0123456789-.eEtrufalsn\\xyz_';
  switch (m.int(8)) {
    case 0:
      return text.slice(0, at) + text.slice(at + 1 + m.int(4)); // delete
    case 1:
      return text.slice(0, at) + alphabet[m.int(alphabet.length)] + text.slice(at); // insert
    case 2:
      return text.slice(0, at); // truncate
    case 3: {
      const b = m.int(text.length + 1);
      return text.slice(0, at) + text.slice(Math.min(at, b), Math.max(at, b)) + text.slice(at); // duplicate a slice
    }
    case 4:
      return text.replace(/-?\d+(\.\d+)?/, m.pick(['-1', '1e309', '0.5', '99999999999999999999', '"7"', 'null', 'true', '[]', '{}'])); // wrong value
    case 5:
      return text.replace(/"[a-z_]+"/, m.pick(['"bogus"', '""', '"detector"', '"enabled"'])); // wrong key
    case 6:
      return text.replace(/true|false/, m.pick(['1', '"yes"', 'null', 'tru'])); // wrong type
    default:
      return m.pick(['', '[]', 'null', '{', '\u0000', '{"dump": {"format": "exe"}}', '{"detector": []}']); // whole-file garbage
  }
}

test('random JSONC edits under hot reload: never a crash, a clear error each time, the last good config stays', () => {
  const dir = tmpDir('wavebus-fuzz-cfg-');
  const file = path.join(dir, 'runtime_config.json');
  fs.writeFileSync(file, GOOD);
  const initial = configFromText(GOOD, file);
  const f = new ConfigFollower(file, initial, { pollIntervalMs: 0, verifyIntervalMs: 0 });
  const m = new Mutator(11);
  let good = initial;
  let rejected = 0;
  let changed = 0;
  for (let i = 0; i < 600; i++) {
    const text = mutateText(m, m.rand() < 0.3 ? GOOD : mutateText(m, GOOD));
    fs.writeFileSync(file, text);
    let expectOk: boolean;
    try {
      configFromText(text, file);
      expectOk = true;
    } catch (e) {
      expectOk = false;
      // A clear error: a ConfigError naming the file (and, for syntax, line:column).
      expect((e as Error).name).not.toMatch(/^(TypeError|RangeError|ReferenceError)$/);
      expect((e as Error).message).toContain(file);
    }
    const r = f.poll(Date.now(), true);
    if (r.kind === 'rejected') {
      rejected++;
      expect(expectOk).toBe(false);
      expect(r.error.message).toContain(file);
      expect(configJson(f.current())).toBe(configJson(good)); // the last good config stays
    } else if (r.kind === 'changed') {
      changed++;
      expect(expectOk).toBe(true);
      good = r.config;
    } else {
      expect(configJson(f.current())).toBe(configJson(good));
    }
  }
  expect(rejected).toBeGreaterThan(100);
  expect(changed).toBeGreaterThan(2);
});

test('a running coordinator under random config edits stays up, reports the rejection and takes the next good file', async () => {
  const dir = tmpDir('wavebus-fuzz-coord-');
  const file = path.join(dir, 'runtime', 'config', 'runtime_config.json');
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, GOOD);
  const port = await freePortPair();
  const c = spawnWavebus(['coordinator', '--port', String(port), '--world-size', '1', '--runtime-config-path', file, '--runtime-config-hot-reload'], {
    env: { ...process.env, WAVEBUS_LOG_LEVEL: 'info' },
  });
  await waitFor(() => c.stdout().includes('"started"'), 'the coordinator to start', 20000);
  // The guard polls the file at wave heads: drive waves as TP0's agent would.
  const d = new Dealer({ linger: 0 });
  d.connect(`tcp://127.0.0.1:${port + 1}`);
  let wave = 1;
  let driving = true;
  const driver = (async () => {
    while (driving) {
      await d.send(encodeAgentMessage({ globalRank: 0, waveHead: { wave: wave++ } }));
      await sleep(40);
    }
  })();
  try {
    const m = new Mutator(23);
    for (let i = 0; i < 16; i++) {
      fs.writeFileSync(`${file}.edit`, mutateText(m, mutateText(m, GOOD)));
      fs.renameSync(`${file}.edit`, file);
      await sleep(300);
    }
    fs.writeFileSync(`${file}.edit`, '{ "dump": { "auto_max_times": 77 } } // last good');
    fs.renameSync(`${file}.edit`, file);
    const s = await waitFor(
      async () => {
        const st = JSON.parse((await requestStatus({ host: '127.0.0.1', port }, 1000)).statusJson);
        return st.auto_max_times === 77 ? st : undefined;
      },
      'the coordinator to take the good file',
      20000,
      100,
    );
    expect(s.config_rejections).toBeGreaterThan(0);
    expect(s.config_error).toBeNull();
  } finally {
    driving = false;
    await driver;
    d.close();
  }
  expect(c.child.exitCode).toBeNull();
  expect(stackTrace(c.stderr())).toBeUndefined();
  expect(c.stderr()).toMatch(/runtime config rejected/);
});

// ---------------------------------------------------------------- flags and environment

const BAD_VALUES = ['', '-1', '0', 'abc', '1.5', '1e3', '0x10', ' 7 ', 'NaN', '99999999999999999999', '{"a":1}', '$(id)', '∞', 'x'.repeat(3000), '127.0.0.1:0', ':::'];
const SMALL_VALUES = [...BAD_VALUES.filter((v) => !/^ ?\d+ ?$/.test(v) || Number(v) <= 2), '2'];

interface Case {
  cmd: string[];
  name: string; // the flag or variable, as it must appear in an error
  flag?: string;
  env?: Record<string, string>;
}

function cases(m: Mutator, deadPort: number, runDir: string, perName: number): Case[] {
  const out: Case[] = [];
  const agent = ['agent', '--coordinator', `127.0.0.1:${deadPort}`, '--run-dir', runDir];
  const coord = ['coordinator', '--port', String(deadPort), '--runtime-config-path', path.join(runDir, 'cfg.json')];
  const sim = ['sim', '--detached', '--steps', '3', '--step-ms', '0', '--result-dir', path.join(runDir, 'sim')];
  const launch = ['launch', '--port', String(deadPort), '--run-dir', path.join(runDir, 'l'), '--ready-timeout-ms', '8000', '--grace-ms', '200'];
  const flags: Array<[string[], string, readonly string[]]> = [
    ...['--rank', '--local-rank', '--world-size', '--tp', '--pp', '--heartbeat-ms', '--end-of-wave-timeout-ms', '--staging-mb', '--coordinator', '--snapshot-max-captures', '--snapshot-capture-token', '--snapshot-ranks', '--snapshot-format'].map(
      (f) => [agent, f, f === '--staging-mb' ? SMALL_VALUES : BAD_VALUES] as [string[], string, readonly string[]],
    ),
    ...['--port', '--heartbeat-ms', '--metrics-port', '--dump-ack-timeout-ms', '--world-size', '--tp', '--host', '--additional-config', '--runtime-dump-dir'].map(
      (f) => [coord, f, BAD_VALUES] as [string[], string, readonly string[]],
    ),
    ...['--steps', '--step-ms', '--requests', '--layers', '--num-blocks', '--head-dim', '--faults', '--nproc-per-node', '--node-rank'].map(
      (f) => [sim, f, f === '--nproc-per-node' || f === '--layers' || f === '--num-blocks' || f === '--head-dim' ? SMALL_VALUES : BAD_VALUES] as [string[], string, readonly string[]],
    ),
    ...['--nnodes', '--node-rank', '--nproc-per-node', '--port', '--ready-timeout-ms', '--grace-ms', '--master-addr', '--metrics-port', '--tp'].map(
      (f) => [launch, f, SMALL_VALUES] as [string[], string, readonly string[]],
    ),
  ];
  // Cases run eight at a time: two agents that both start must not share a run dir (one would
  // find the other's socket there: "Address already in use").
  let n = 0;
  const own = (cmd: string[]): string[] => {
    const i = cmd.indexOf('--run-dir');
    if (cmd[0] !== 'agent' || i < 0) return cmd;
    const dir = path.join(runDir, `agent${n++}`);
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 }); // a run dir must be private
    return [...cmd.slice(0, i + 1), dir, ...cmd.slice(i + 2)];
  };
  for (const [base, flag, pool] of flags) {
    for (let k = 0; k < perName; k++) {
      const v = m.pick(pool);
      const cmd = own([...base, `${flag}=${v}`]);
      out.push({ cmd: base === launch ? [...cmd, '--', 'true'] : cmd, name: flag, flag });
    }
  }
  const envs: Array<[string[], string]> = [
    ...['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'WAVEBUS_TP', 'WAVEBUS_PP', 'WAVEBUS_COORDINATOR', 'WAVEBUS_PORT', 'MASTER_ADDR'].map((e) => [['agent', '--run-dir', runDir], e] as [string[], string]),
    ...['WAVEBUS_PORT', 'WORLD_SIZE', 'WAVEBUS_TP', 'WAVEBUS_DP'].map((e) => [['coordinator', '--runtime-config-path', path.join(runDir, 'cfg.json')], e] as [string[], string]),
    ...['ENABLE', 'CAPTURE_AT_CALL', 'CAPTURE_TOKEN', 'CAPTURE_REQUEST', 'MAX_CAPTURES', 'RANKS', 'FORMAT'].map(
      (s) => [agent, `WAVEBUS_SNAPSHOT_${s}`] as [string[], string],
    ),
    ...['WAVEBUS_NPROC_PER_NODE', 'WAVEBUS_NNODES', 'WAVEBUS_NODE_RANK'].map((e) => [sim, e] as [string[], string]),
  ];
  for (const [base, name] of envs) {
    for (let k = 0; k < perName; k++) {
      const v = m.pick(name.includes('NPROC') || name.includes('NNODES') ? SMALL_VALUES : BAD_VALUES);
      // WAVEBUS_PORT for an agent matters only without --coordinator; the others need a dead port.
      const extra: Record<string, string> = name === 'WAVEBUS_PORT' || name === 'WAVEBUS_COORDINATOR' || name === 'MASTER_ADDR' ? {} : { WAVEBUS_COORDINATOR: `127.0.0.1:${deadPort}` };
      if (base[0] === 'coordinator' && name !== 'WAVEBUS_PORT') extra.WAVEBUS_PORT = String(deadPort);
      out.push({ cmd: own(base), name, env: { ...extra, [name]: v } });
    }
  }
  return out;
}

interface Outcome {
  c: Case;
  code: number | null;
  running: boolean;
  stderr: string;
}

async function runCase(c: Case, ms: number): Promise<Outcome> {
  const p: Spawned = spawnWavebus(c.cmd, { env: { ...process.env, WAVEBUS_LOG_LEVEL: 'warn', ...c.env } });
  const done = await Promise.race([p.exited, sleep(ms).then(() => undefined)]);
  if (!done) {
    p.child.kill('SIGTERM');
    const stopped = await Promise.race([p.exited, sleep(5000).then(() => undefined)]);
    if (!stopped) p.child.kill('SIGKILL');
    return { c, code: null, running: true, stderr: p.stderr() };
  }
  return { c, code: done.code, running: false, stderr: p.stderr() };
}

test('random values for every flag and variable: a clear error naming it, or a clean start; never a stack trace or a hang', async () => {
  const dir = tmpDir('wavebus-fuzz-flags-');
  const deadPort = await freePortPair();
  const all = cases(new Mutator(5), deadPort, dir, 1);
  const outcomes: Outcome[] = [];
  for (let i = 0; i < all.length; i += 8) {
    outcomes.push(...(await Promise.all(all.slice(i, i + 8).map((c) => runCase(c, 2500)))));
  }
  const bad: string[] = [];
  for (const o of outcomes) {
    const label = `${o.c.cmd.slice(0, 1).join(' ')} ${o.c.flag ? o.c.cmd.find((a) => a.startsWith(`${o.c.flag}=`))?.slice(0, 80) : JSON.stringify(o.c.env).slice(0, 120)}`;
    const trace = stackTrace(o.stderr);
    if (trace) bad.push(`${label}: stack trace: ${trace}`);
    if (o.running || o.code === 0) continue; // started fine (or finished fine)
    const bare = o.c.name.replace(/^--/, '');
    const named = o.stderr.includes(o.c.name) || o.stderr.includes(bare) || (o.c.name.startsWith('WAVEBUS_SNAPSHOT_') && /WAVEBUS_SNAPSHOT_|VLLM_/.test(o.stderr));
    if (!named) bad.push(`${label}: exit ${o.code} without naming ${o.c.name}: ${o.stderr.trim().split('\n').slice(-3).join(' | ').slice(0, 400)}`);
  }
  expect(bad).toEqual([]);
  // Both outcomes happened: the fuzz reached errors and clean starts.
  expect(outcomes.some((o) => o.code !== 0 && !o.running)).toBe(true);
  expect(outcomes.some((o) => o.running || o.code === 0)).toBe(true);
});
