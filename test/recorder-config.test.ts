// The runtime config's `recorder` key and report.save_sensitive_info on the flight recorder
// (docs/recorder.md): validation naming the field, the AgentConfig the ranks receive through the
// real proto encoding, the agent's refusal to resize its ring live, crash-rank<g>.json's note, and
// a recorder.flush raise in the config file of a running TP=2 torch job producing a flush folder
// on both ranks (the same capture path as `wavebus capture --flush-recorder`).
import * as fs from 'fs';
import * as path from 'path';
import { runtimeView } from '../src/agent/runtime-view';
import { applyRecorderConfig, FlightRecorder, takeFlushArms } from '../src/agent/flight-recorder';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { crashNote } from '../src/agent/recorder-flush';
import { agentConfig } from '../src/guard/agent-config';
import { configFromRaw, defaultConfig } from '../src/guard/config';
import { recorderSizeMismatch } from '../src/guard/recorder-config';
import { ConfigError } from '../src/errors';
import { decode, encode, messageType } from '../src/proto';
import { ROOT, cleanup, freePortPair, spawnWavebus, tmpDir, waitFor } from './helpers';
import { torchRanks } from './torch2';

afterAll(cleanup);

// How the engine's ranks start: torch 2.x's torchrun (the stand-in where torch 2.x is absent); its python for what reads their files.
const RANKS = torchRanks();

test('recorder: defaults, and bad values refused naming the field', () => {
  expect(defaultConfig().recorder).toEqual({ forwards: 0, max_bytes: 0, on: ['crash', 'incident', 'flush'], flush: 0 });
  expect(configFromRaw({ recorder: { on: ['crash'], flush: 2 } }, 'f').recorder).toEqual({ forwards: 0, max_bytes: 0, on: ['crash'], flush: 2 });
  expect(() => configFromRaw({ recorder: { on: ['crash', 'boom'] } }, 'f')).toThrow(/recorder\.on: expected a list of "crash" \| "incident" \| "flush".*item 1 is "boom"/);
  expect(() => configFromRaw({ recorder: { forwards: 5000 } }, 'f')).toThrow(/recorder\.forwards: expected an integer in \[0, 4096\]/);
  expect(() => configFromRaw({ recorder: { flush: -1 } }, 'f')).toThrow(ConfigError);
  expect(() => configFromRaw({ recorder: { size: 1 } }, 'f')).toThrow(/unknown key 'recorder\.size'/);
});

test('AgentConfig carries recorder.on, the size wished and save_sensitive_info through the proto', () => {
  for (const sensitive of [false, true, 'hashed'] as const) {
    const cfg = configFromRaw({ recorder: { on: ['incident'], forwards: 8, max_bytes: 1 << 20 }, report: { save_sensitive_info: sensitive } }, 'f');
    const wire = decode<any>(messageType('AgentConfig'), encode(messageType('AgentConfig'), agentConfig(cfg, { hotReload: true, dumpRoot: '/d' }) as unknown as Record<string, unknown>));
    const view = runtimeView(wire);
    expect(view.recorder).toEqual({ on: ['incident'], forwards: 8, maxBytes: 1 << 20 });
    expect(view.sensitive).toBe(sensitive);
  }
  // A newer peer's SensitiveInfo is refused naming the field; unknown trigger names are left out.
  const wire = agentConfig(defaultConfig(), { hotReload: false, dumpRoot: '' });
  expect(() => runtimeView({ ...wire, saveSensitiveInfo: 9 })).toThrow(/AgentConfig\.save_sensitive_info: unknown SensitiveInfo 9/);
  expect(runtimeView({ ...wire, recorderOn: ['flush', 'later'] }).recorder.on).toEqual(['flush']);
});

test('the ring is not resized live: a size other than the startup one is named, with what to do', () => {
  const ring = { forwards: 4, maxBytes: 1024 };
  expect(recorderSizeMismatch(ring, 0, 0)).toBeUndefined();
  expect(recorderSizeMismatch(ring, 4, 1024)).toBeUndefined();
  expect(recorderSizeMismatch(ring, 8, 0)).toMatch(/recorder\.forwards = 8 \(the ring has 4\).*restart the agents/);
  expect(recorderSizeMismatch(ring, 0, 2048)).toMatch(/recorder\.max_bytes = 2048 \(the ring has 1024\)/);
  expect(recorderSizeMismatch(undefined, 8, 0)).toMatch(/started without the flight recorder: set WAVEBUS_RECORD_FORWARDS/);
});

test('an agent applies recorder.on live, and refuses to resize its ring (once per setting)', async () => {
  const dir = tmpDir('wavebus-reccfg-unit-');
  const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
  const rec = new FlightRecorder({ file: path.join(dir, 'ring'), settings: { forwards: 4, maxBytes: 4096 }, root: path.join(dir, 'out'), identity, log: createLogger('t', 'silent'), crashName: 'crash-t' });
  try {
    const warned = new Set<string>();
    const view = (on: string[], forwards = 0) => ({ recorder: { on: on as any, forwards, maxBytes: 0 }, sensitive: false as const });
    expect(applyRecorderConfig(rec, view(['crash']), createLogger('t', 'silent'), warned)).toBeUndefined();
    const said: any[] = [];
    takeFlushArms([{ id: 'capture-1', flushRecorder: true, replica: 0, wave: 3 }], new Set(), rec, 0, (r) => said.push(r));
    expect(said).toEqual([{ armId: 'capture-1', wave: 3, callDir: '', error: 'recorder.on leaves out "flush" on this rank (the runtime config)', done: true }]);
    expect(await rec.atIncident('incident-wave3', 3, {})).toBeUndefined();
    expect(fs.existsSync(path.join(dir, 'out'))).toBe(false);
    expect(applyRecorderConfig(rec, view(['crash', 'incident', 'flush'], 8), createLogger('t', 'silent'), warned)).toMatch(/recorder\.forwards = 8 \(the ring has 4\)/);
    expect(warned.size).toBe(1);
    applyRecorderConfig(rec, view(['flush'], 8), createLogger('t', 'silent'), warned);
    expect(warned.size).toBe(1);
    expect(rec.writesOn('flush') && !rec.writesOn('crash')).toBe(true);
    expect(rec.forwards).toBe(4);
  } finally {
    await rec.stop();
  }
});

test('crash-rank<g>.json keeps the exception message only with save_sensitive_info true', () => {
  const note = 'uncaught RuntimeError: prompt was "secret words"';
  expect(crashNote(note, true)).toBe(note);
  expect(crashNote(note, false)).toBe('uncaught RuntimeError');
  expect(crashNote(note, 'hashed')).toBe('uncaught RuntimeError');
  expect(crashNote('free text from the engine', false)).not.toMatch(/free text/);
  expect(crashNote('', false)).toBe('');
});

test('a recorder.flush raise in the config file of a running TP=2 job: both ranks write their ring out', async () => {
  const ENGINE = path.join(ROOT, 'examples', 'torch-engine');
  const dir = tmpDir('wavebus-reccfg-');
  const out = path.join(dir, 'out');
  const configPath = path.join(dir, 'runtime_config.json');
  const port = await freePortPair();
  const proc = spawnWavebus(
    ['launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--run-dir', path.join(dir, 'run'),
      '--runtime-config-path', configPath, '--runtime-config-hot-reload', '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000',
      '--', ...RANKS.command(path.join(ENGINE, 'engine.py'), { nproc: 2 }), '--out', out, '--save-every-forward',
      '--requests', '2', '--max-tokens', '120', '--arrive-every', '1', '--step-sleep-ms', '30'],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache'), WAVEBUS_RECORD_FORWARDS: '4' }, cwd: dir },
  );
  const flushRoot = path.join(dir, 'cache', 'snapshots', 'recorder');
  const until = async <T>(fn: () => T, what: string, ms: number) => {
    try {
      return await waitFor(fn, what, ms);
    } catch (e) {
      throw new Error(`${(e as Error).message}\n${proc.stderr().slice(-6000)}`);
    }
  };
  await until(() => [0, 1].every((g) => fs.existsSync(path.join(out, `forward_rank${g}_step10.pt`))), 'forward 10 on both ranks', 90000);
  expect(fs.existsSync(flushRoot)).toBe(false);
  // The effective config startup wrote, with the watermark raised: written whole, then renamed.
  const cfg = JSON.parse(fs.readFileSync(configPath, 'utf8'));
  expect(cfg.recorder.flush).toBe(0);
  cfg.recorder.flush = 1;
  fs.writeFileSync(`${configPath}.tmp`, JSON.stringify(cfg));
  fs.renameSync(`${configPath}.tmp`, configPath);
  const calls = (g: number) => {
    if (!fs.existsSync(flushRoot)) return [];
    const names = fs.readdirSync(flushRoot).filter((n) => n.startsWith('flush-capture-'));
    const rank = names.length === 1 ? path.join(flushRoot, names[0], 'torch-engine-tp2', `rank${g}`) : '';
    return rank && fs.existsSync(rank) ? fs.readdirSync(rank).filter((n) => /^call\d+$/.test(n) && fs.existsSync(path.join(rank, n, 'meta.json'))) : [];
  };
  await until(() => calls(0).length > 0 && calls(1).length > 0, 'a recorder flush on both ranks', 60000);
  const { code } = await proc.exited;
  expect(code).toBe(0);
  // One raise, one flush: nothing more was written by the later heads.
  expect(fs.readdirSync(flushRoot).filter((n) => n.startsWith('flush-'))).toHaveLength(1);
  const meta = JSON.parse(fs.readFileSync(path.join(flushRoot, fs.readdirSync(flushRoot)[0], 'torch-engine-tp2', 'rank1', calls(1)[0], 'meta.json'), 'utf8'));
  expect(meta.selected_by).toEqual(['recorder']);
  expect(meta.recorder.reason).toBe('user');
  // save_sensitive_info false (the default): the engine's input_ids (declared token ids) is not written.
  expect(meta.recorder.save_sensitive_info).toBe(false);
  expect(meta.withheld).toEqual([{ index: 0, name: 'input_ids', reason: 'save_sensitive_info is false' }]);
  expect(fs.existsSync(path.join(flushRoot, fs.readdirSync(flushRoot)[0], 'torch-engine-tp2', 'rank1', calls(1)[0], 'tensor0.npy'))).toBe(false);
}, 180000);
