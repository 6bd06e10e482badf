// The Python client's native path (clients/python/wavebus_client/_native.c; docs/python-client.md,
// "The native path"), built here from the current sources as npm install builds it: the telemetry
// ring's and the decision ring's per-step writes give byte-identical files through C and through
// numpy on the same inputs (every dtype an engine holds; columns C does not take go numpy's way),
// its CRC-32 equals zlib's at every length 0..9000 and alignment, garbage never crashes and never
// writes outside the slot, WAVEBUS_PY_NATIVE picks the path (a bad value named), and a package
// without the built module falls back (or, with WAVEBUS_PY_NATIVE=1, says it is missing). The
// tensor batch's rows and events in C (_native.Slots) answer every call as slot_batch.py's SlotEvents.
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { PYTHON, ROOT, cleanup, tmpDir } from './helpers';
import { TORCH2_VENV } from './torch2';

// eslint-disable-next-line @typescript-eslint/no-var-requires
const { build } = require('../scripts/build-python-native');

afterAll(cleanup);
jest.setTimeout(120000);

const CLIENT = path.join(ROOT, 'clients', 'python');
const SCRIPT = path.join(ROOT, 'test', 'python', 'native_parity.py');
const env = (extra: Record<string, string> = {}, pythonPath = CLIENT) => ({ ...process.env, PYTHONPATH: pythonPath, PYTHONDONTWRITEBYTECODE: '1', ...extra });

function parity(check: string, python = PYTHON): Record<string, any> {
  const dir = tmpDir('wavebus-native-');
  const r = spawnSync(python, [SCRIPT, check, dir], { encoding: 'utf8', env: env(), timeout: 110000 });
  if (r.status !== 0) throw new Error(`native_parity.py ${check} exited ${r.status ?? r.signal}: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!);
}

beforeAll(() => {
  expect(build()).toBe(true); // python3-dev is in scripts/test-preflight.js's list: the build must succeed here
});

test('the telemetry ring: both paths write byte-identical files, each counted in the ring stats; columns C does not take go the numpy way', () => {
  const r = parity('telemetry');
  expect(r['1']).toMatchObject({ ring_native_writes: 12, ring_numpy_writes: 0 });
  expect(r['0']).toMatchObject({ ring_native_writes: 0, ring_numpy_writes: 12 });
  expect(r['1'].seqs).toEqual(r['0'].seqs);
  expect(r.identical).toBe(true);
  expect(r.odd_identical).toBe(true);
  expect(r.odd_stats).toEqual({ ring_native_writes: 0, ring_numpy_writes: 4 }); // strided, float ids, big-endian, bool
});

test('the decision ring: both paths write byte-identical files with the digests of their definition (int64, int32, uint, int16 columns)', () => {
  const r = parity('digest');
  expect(r.identical).toBe(true);
  expect(r.definition).toBe(true);
  expect(r['1'].crcs).toEqual(r['0'].crcs);
  expect(r['1'].digest_native_writes).toBeGreaterThan(40);
  expect(r['0'].digest_native_writes).toBe(0);
  expect(r['1'].digest_native_writes + r['1'].digest_numpy_writes).toBe(80);
});

test("the C CRC-32 (carry-less multiplication and the slice-by-8 tables both) equals zlib.crc32 at every length 0..9000, unaligned, chained and on a memoryview", () => {
  const r = parity('crc');
  expect(r).toEqual({ mismatches: [], view: true, empty: 0, kind: r.kind });
  expect(['pclmul', 'slice-by-8']).toContain(r.kind);
});

test('garbage to the C calls: a ConfigError or the numpy path, never a crash, nothing written outside (or inside) the slot', () => {
  const r = parity('garbage');
  const { outside_slot_unchanged, slot_unchanged, digest_file_unchanged, ...cases } = r;
  expect({ outside_slot_unchanged, slot_unchanged, digest_file_unchanged }).toEqual({ outside_slot_unchanged: true, slot_unchanged: true, digest_file_unchanged: true });
  const numpy = ['not_contiguous', 'float_rows', 'object_array', 'list_not_array', 'digest_float_column', 'digest_bool_column', 'digest_strided'];
  for (const [k, v] of Object.entries(cases)) {
    const want = numpy.includes(k) ? 'numpy_path' : k === 'read_only_map' ? 'BufferError' : 'ConfigError';
    expect([k, v]).toEqual([k, want]);
  }
  expect(Object.keys(cases).length).toBeGreaterThan(40);
});

test("the tensor batch's rows and events in C (_native.Slots) answer every call as SlotEvents does (arrive and blocks with their checks and encoding too; through long pauses too): results, error texts, events and head bytes; garbage refused; nothing leaked", () => {
  const r = spawnSync(PYTHON, [path.join(ROOT, 'test', 'python', 'native_slots.py')], { encoding: 'utf8', env: env(), timeout: 110000 });
  if (r.status !== 0) throw new Error(`native_slots.py exited ${r.status ?? r.signal}: ${r.stderr}`);
  const { heads_compared, paused_steps_compared, errors_compared, still_one_live, held_more, released_on_free, released_on_dealloc, kept_bytes, left_bytes, no_leak, ...cases } = JSON.parse(r.stdout.trim().split('\n').pop()!);
  expect(heads_compared).toBe(6000);
  expect(paused_steps_compared).toBe(6000); // the same through long pauses: no head for ~20 steps at a time
  expect(errors_compared).toBeGreaterThan(500); // the refused calls were compared too, text and all
  expect({ still_one_live, held_more, released_on_free, released_on_dealloc }).toEqual({ still_one_live: true, held_more: true, released_on_free: true, released_on_dealloc: true });
  // 2000 lives of a row with prompt ids and a table: the store keeps its last rows' bytes only (a
  // leak of the bytes or lists arrive() and blocks() make would keep ~5 MB).
  expect({ kept_bytes, left_bytes, no_leak }).toEqual({ kept_bytes: expect.any(Number), left_bytes: expect.any(Number), no_leak: true });
  // Not a column at all, a wrong call, or what the engine's own tolist() raises: Python's own error.
  const python = { arrive_arity: 'TypeError', arrive_unknown_keyword: 'TypeError', arrive_ids_not_iterable: 'TypeError', blocks_arity: 'TypeError', blocks_tolist_raises: 'ZeroDivisionError' };
  for (const [k, v] of Object.entries(cases)) expect([k, v]).toEqual([k, (python as Record<string, string>)[k] ?? 'ConfigError']);
  expect(Object.keys(cases).length).toBeGreaterThan(20);
});

const PICK = `import os
from wavebus_client import native
try:
    m = native.load()
    print("native" if m is not None else "numpy")
except Exception as e:
    print(type(e).__name__, e)`;

test('WAVEBUS_PY_NATIVE picks the path; a bad value is a ConfigError naming the variable, from Client.connect() too', () => {
  const pick = (v?: string) => spawnSync(PYTHON, ['-c', PICK], { encoding: 'utf8', env: env(v === undefined ? {} : { WAVEBUS_PY_NATIVE: v }) }).stdout.trim();
  expect(pick()).toBe('native');
  expect(pick('auto')).toBe('native');
  expect(pick('1')).toBe('native');
  expect(pick('0')).toBe('numpy');
  expect(pick('yes')).toMatch(/^ConfigError WAVEBUS_PY_NATIVE must be 0 .* got 'yes'/);
  // ...and Client.connect() says so at once, at the engine's setup (not a ring left unused at its first head).
  const connect = spawnSync(PYTHON, ['-c', `from wavebus_client import Client
try:
    Client.connect(env={"WAVEBUS_RUN_DIR": "/nonexistent", "LOCAL_RANK": "0"})
except Exception as e:
    print(type(e).__name__, e)`], { encoding: 'utf8', env: env({ WAVEBUS_PY_NATIVE: 'on' }) });
  expect(connect.stdout.trim()).toMatch(/^ConfigError WAVEBUS_PY_NATIVE must be 0 .* got 'on'/);
});

test('a package without the built module runs the numpy path; WAVEBUS_PY_NATIVE=1 then says the module is missing', () => {
  const dir = tmpDir('wavebus-native-bare-');
  fs.cpSync(path.join(CLIENT, 'wavebus_client'), path.join(dir, 'wavebus_client'), { recursive: true, filter: (src) => !/_native.*\.so$/.test(src) && !src.includes('__pycache__') });
  const pick = (v: Record<string, string>) => spawnSync(PYTHON, ['-c', PICK], { encoding: 'utf8', env: env(v, dir) }).stdout.trim();
  expect(pick({})).toBe('numpy');
  expect(pick({ WAVEBUS_PY_NATIVE: '1' })).toMatch(/^ConfigError WAVEBUS_PY_NATIVE=1 but wavebus_client._native does not load/);
});

test('the torch 2.x venv (when made) loads the same module or falls back cleanly, and writes the same bytes', () => {
  const py = path.join(TORCH2_VENV, 'bin', 'python');
  if (!fs.existsSync(py)) return; // made by npm test's preflight; this file alone does not make it
  const tag = spawnSync(py, ['-c', 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))'], { encoding: 'utf8' }).stdout.trim();
  const built = fs.existsSync(path.join(CLIENT, 'wavebus_client', `_native${tag}`));
  const got = spawnSync(py, ['-c', PICK], { encoding: 'utf8', env: env() }).stdout.trim();
  expect([tag, got]).toEqual([tag, built ? 'native' : 'numpy']);
  if (built) expect(parity('telemetry', py).identical).toBe(true);
});
