import { spawnSync } from 'child_process';
import yargs from 'yargs';
import { ConfigError } from '../src/errors';
import {
  checkSnapshotGating,
  resolveSnapshotConfig,
  snapshotEnvFromArgv,
  snapshotFlagsFromArgv,
  snapshotOptions,
  SnapshotConfig,
} from '../src/snapshot/config';
import { pyInt, pyStrip } from '../src/snapshot/py-int';
import { PYTHON } from './helpers';

/** Python reads each JSON string with int() and str.strip(): the reference the TypeScript reader must match. */
const PY_PROG = `
import json, sys
out = []
for s in json.load(sys.stdin):
    try:
        v = int(s)
    except ValueError:
        v = None
    out.append({"int": v, "strip": s.strip()})
print(json.dumps(out))
`;

const W = 'WAVEBUS_SNAPSHOT_';
const V = 'VLLM_NEURON_RUNTIME_INPUT_SNAPSHOT_';

function resolve(env: Record<string, string>, flags = {}, warnings: string[] = []): SnapshotConfig {
  return resolveSnapshotConfig({ WAVEBUS_CACHE_ROOT: '/tmp/wb-cache', ...env }, flags, (m) => warnings.push(m));
}

function errorOf(fn: () => unknown): ConfigError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return e as ConfigError;
  }
  throw new Error('expected a ConfigError');
}

describe('enable switch', () => {
  test('off when unset; defaults', () => {
    const c = resolve({});
    expect(c.enabled).toBe(false);
    expect(c.format).toBe('pt');
    expect(c.maxCaptures).toBe(4);
    expect(c.snapshotRoot).toBe('/tmp/wb-cache/snapshots');
  });
  test.each(['1', 'true', 'TRUE', 'Yes', 'on', ' on '])('%j is on', (v) => {
    expect(resolve({ [`${W}ENABLE`]: v }).enabled).toBe(true);
  });
  test.each(['0', 'false', 'No', 'OFF', ''])('%j is off', (v) => {
    expect(resolve({ [`${W}ENABLE`]: v }).enabled).toBe(false);
  });
  test('garbage names the variable and the value', () => {
    const e = errorOf(() => resolve({ [`${V}ENABLE`]: 'maybe' }));
    expect(e.message).toContain(`${V}ENABLE`);
    expect(e.message).toContain('"maybe"');
  });
  test('disabled: selection variables are not read', () => {
    const c = resolve({ [`${W}CAPTURE_TOKEN`]: 'abc', [`${W}FORMAT`]: 'tiff' });
    expect(c.enabled).toBe(false);
  });
  test('default root is ~/.cache/wavebus/snapshots without WAVEBUS_CACHE_ROOT', () => {
    const c = resolveSnapshotConfig({ HOME: '/home/someone', [`${W}ENABLE`]: '1' }, {}, () => undefined);
    expect(c.snapshotRoot).toBe('/home/someone/.cache/wavebus/snapshots');
  });
});

describe("where the seed's variables are used, the seed's root is used too", () => {
  const seedOn = { HOME: '/home/someone', [`${V}ENABLE`]: '1' };
  const root = (env: Record<string, string>, flags = {}) => resolveSnapshotConfig(env, flags, () => undefined);
  test('$VLLM_CACHE_ROOT/neuron/snapshots when the seed names configure the capture', () => {
    const c = root({ ...seedOn, VLLM_CACHE_ROOT: '/data/vllm' });
    expect(c.snapshotRoot).toBe('/data/vllm/neuron/snapshots');
    expect(c.rootSource).toBe('VLLM_CACHE_ROOT');
  });
  test("VLLM_CACHE_ROOT unset: vLLM's default, ~/.cache/vllm (XDG_CACHE_HOME/vllm when that is set)", () => {
    expect(root(seedOn).snapshotRoot).toBe('/home/someone/.cache/vllm/neuron/snapshots');
    expect(root({ ...seedOn, XDG_CACHE_HOME: '/xdg' }).snapshotRoot).toBe('/xdg/vllm/neuron/snapshots');
  });
  test('~ is expanded as vLLM expands it (os.path.expanduser)', () => {
    expect(root({ ...seedOn, VLLM_CACHE_ROOT: '~/vc' }).snapshotRoot).toBe('/home/someone/vc/neuron/snapshots');
    expect(root({ ...seedOn, XDG_CACHE_HOME: '~/xdg' }).snapshotRoot).toBe('/home/someone/xdg/vllm/neuron/snapshots');
  });
  test('a blank VLLM_CACHE_ROOT is an error naming it (vLLM would write under the working directory)', () => {
    const e = errorOf(() => root({ ...seedOn, VLLM_CACHE_ROOT: ' ' }));
    expect(e.message).toContain('VLLM_CACHE_ROOT=" "');
  });
  test('WAVEBUS_* names keep the wavebus root; VLLM_CACHE_ROOT is then not read', () => {
    const c = root({ HOME: '/home/someone', [`${W}ENABLE`]: '1', VLLM_CACHE_ROOT: '/data/vllm' });
    expect(c.snapshotRoot).toBe('/home/someone/.cache/wavebus/snapshots');
    // Both names set (as the launcher passes a flag down): the wavebus name decides.
    expect(root({ ...seedOn, [`${W}ENABLE`]: '1', VLLM_CACHE_ROOT: '/data/vllm' }).snapshotRoot).toBe('/home/someone/.cache/wavebus/snapshots');
  });
  test('an explicit WAVEBUS_CACHE_ROOT wins over the seed root; the flag wins over both', () => {
    expect(root({ ...seedOn, VLLM_CACHE_ROOT: '/data/vllm', WAVEBUS_CACHE_ROOT: '/wb' }).snapshotRoot).toBe('/wb/snapshots');
    expect(root({ ...seedOn, VLLM_CACHE_ROOT: '/data/vllm', WAVEBUS_CACHE_ROOT: '/wb' }, { cacheRoot: '/flag' }).snapshotRoot).toBe('/flag/snapshots');
  });
  test('the root is decided even while capture is off (the agent serves that directory)', () => {
    expect(root({ HOME: '/home/someone', [`${V}ENABLE`]: '0', VLLM_CACHE_ROOT: '/data/vllm' }).snapshotRoot).toBe('/data/vllm/neuron/snapshots');
  });
  test('capture off adds nothing: a blank root variable is read as unset, not a startup failure', () => {
    const home = { HOME: '/home/someone' };
    expect(root({ ...home, WAVEBUS_CACHE_ROOT: '' }).snapshotRoot).toBe('/home/someone/.cache/wavebus/snapshots');
    expect(root({ ...home, [`${W}ENABLE`]: '0', WAVEBUS_CACHE_ROOT: ' ' }).snapshotRoot).toBe('/home/someone/.cache/wavebus/snapshots');
    expect(root({ ...home, [`${V}ENABLE`]: '0', VLLM_CACHE_ROOT: '' }).snapshotRoot).toBe('/home/someone/.cache/vllm/neuron/snapshots');
    expect(root({ ...home, [`${V}ENABLE`]: '0', VLLM_CACHE_ROOT: ' ', XDG_CACHE_HOME: '' }).snapshotRoot).toBe('/home/someone/.cache/vllm/neuron/snapshots');
  });
  test('capture on: a blank WAVEBUS_CACHE_ROOT is still ERR_SNAPSHOT_ROOT naming it', () => {
    const e = errorOf(() => root({ HOME: '/home/someone', [`${W}ENABLE`]: '1', WAVEBUS_CACHE_ROOT: '' }));
    expect(e.code).toBe('ERR_SNAPSHOT_ROOT');
    expect(e.message).toContain('WAVEBUS_CACHE_ROOT=""');
    expect(errorOf(() => root({ ...seedOn, VLLM_CACHE_ROOT: '' })).code).toBe('ERR_SNAPSHOT_ROOT');
  });
  test('a root the kernel cannot open (a component over 255 bytes, the whole over 4095) is ERR_SNAPSHOT_ROOT naming its variable or flag, capture on or off', () => {
    const long = '/tmp/' + 'x'.repeat(300);
    const home = { HOME: '/home/someone' };
    for (const on of ['0', '1']) {
      const e = errorOf(() => root({ ...home, [`${W}ENABLE`]: on, WAVEBUS_CACHE_ROOT: long }));
      expect(e.code).toBe('ERR_SNAPSHOT_ROOT');
      expect(e.message).toBe('WAVEBUS_CACHE_ROOT: a path component of 300 bytes (at most 255)');
    }
    expect(errorOf(() => root(home, { cacheRoot: long })).message).toBe('--cache-root: a path component of 300 bytes (at most 255)');
    expect(errorOf(() => root({ ...home, WAVEBUS_CACHE_ROOT: `/tmp/${'y/'.repeat(2100)}` })).message).toMatch(/^WAVEBUS_CACHE_ROOT: a path of \d+ bytes \(at most 4095\)$/);
    expect(errorOf(() => root({ ...seedOn, VLLM_CACHE_ROOT: long })).message).toContain('VLLM_CACHE_ROOT: a path component of 300 bytes');
    expect(errorOf(() => root({ HOME: long })).message).toContain('HOME: a path component of 300 bytes');
    // 255 bytes is the kernel's limit, not over it.
    expect(root({ ...home, WAVEBUS_CACHE_ROOT: '/tmp/' + 'z'.repeat(255) }).snapshotRoot).toBe(`/tmp/${'z'.repeat(255)}/snapshots`);
  });
});

describe('call rule', () => {
  const on = { [`${W}ENABLE`]: '1' };
  test('no rule at all: call 0 only', () => {
    expect(resolve(on).callRule).toEqual({ kind: 'first' });
  });
  test('only token or request rules: the call rule never fires', () => {
    expect(resolve({ ...on, [`${W}CAPTURE_TOKEN`]: '12' }).callRule).toEqual({ kind: 'never' });
    expect(resolve({ ...on, [`${W}CAPTURE_REQUEST`]: 'abc' }).callRule).toEqual({ kind: 'never' });
  });
  test('-1 means every call', () => {
    expect(resolve({ ...on, [`${W}CAPTURE_AT_CALL`]: '-1' }).callRule).toEqual({ kind: 'all' });
  });
  test('CAPTURE_AT_CALL=-1,-1 means all calls (-1 may repeat; it only cannot combine with an index)', () => {
    for (const prefix of [W, V]) expect(resolve({ ...on, [`${prefix}CAPTURE_AT_CALL`]: '-1,-1' }).callRule).toEqual({ kind: 'all' });
    expect(resolve({ ...on, [`${W}CAPTURE_AT_CALL`]: ' -1 , -1 ,-1' }).callRule).toEqual({ kind: 'all' });
  });
  test('empty pieces in CAPTURE_REQUEST are dropped, as upstream does', () => {
    for (const prefix of [W, V]) {
      expect(resolve({ ...on, [`${prefix}CAPTURE_REQUEST`]: 'abc,,def, ,' }).requestIds).toEqual(['abc', 'def']);
    }
  });
  test('a CAPTURE_REQUEST of only commas means no request rule (so no rule at all: call 0)', () => {
    const c = resolve({ ...on, [`${V}CAPTURE_REQUEST`]: ' , ,,' });
    expect(c.requestIds).toEqual([]);
    expect(c.callRule).toEqual({ kind: 'first' });
    // ... and beside a token rule it adds nothing.
    expect(resolve({ ...on, [`${W}CAPTURE_REQUEST`]: ',', [`${W}CAPTURE_TOKEN`]: '7' }).callRule).toEqual({ kind: 'never' });
  });
  test('indices, stripped, with token rule too', () => {
    const c = resolve({ ...on, [`${W}CAPTURE_AT_CALL`]: ' 0, 3 ,+7', [`${W}CAPTURE_TOKEN`]: '5' });
    expect(c.callRule).toEqual({ kind: 'indices', indices: new Set([0, 3, 7]) });
    expect(c.tokenTargets).toEqual(new Set([5]));
  });
  test('blank value counts as unset', () => {
    expect(resolve({ ...on, [`${W}CAPTURE_AT_CALL`]: '  ' }).callRule).toEqual({ kind: 'first' });
  });
});

describe('parsing errors name the variable, the raw value and the bad piece', () => {
  const on = { [`${W}ENABLE`]: '1' };
  const cases: [string, string, string][] = [
    ['CAPTURE_AT_CALL', '1,,2', '""'],
    ['CAPTURE_AT_CALL', '1,2,', '""'],
    ['CAPTURE_AT_CALL', '1.5', '"1.5"'],
    ['CAPTURE_AT_CALL', '3,abc', '"abc"'],
    ['CAPTURE_AT_CALL', '0x1', '"0x1"'],
    ['CAPTURE_AT_CALL', '-2', '"-2"'],
    ['CAPTURE_AT_CALL', '-1,3', '"3"'],
    ['CAPTURE_AT_CALL', '3,-1,-1', '"3"'],
    ['CAPTURE_AT_CALL', '99999999999999999999', '"99999999999999999999"'],
    ['CAPTURE_TOKEN', '-1', '"-1"'],
    ['CAPTURE_TOKEN', '10, 1e3', '"1e3"'],
    ['CAPTURE_TOKEN', ',', '""'],
  ];
  test.each(cases)('%s=%j', (setting, value, piece) => {
    for (const prefix of [W, V]) {
      const e = errorOf(() => resolve({ ...on, [`${prefix}${setting}`]: value }));
      expect(e.message).toContain(`${prefix}${setting}`);
      expect(e.message).toContain(JSON.stringify(value));
      expect(e.message).toContain(`bad entry ${piece}`);
    }
  });
  test.each(['0', '-3', 'four', '2.5', '', '  '])('MAX_CAPTURES=%j', (v) => {
    for (const prefix of [W, V]) {
      const e = errorOf(() => resolve({ ...on, [`${prefix}MAX_CAPTURES`]: v }));
      expect(e.message).toContain(`${prefix}MAX_CAPTURES=${JSON.stringify(v)}`);
      expect(e.code).toBe('ERR_SNAPSHOT_MAX_CAPTURES');
    }
  });
  test('a blank FORMAT or a blank MAX_CAPTURES is an error (only an unset one takes pt / 4)', () => {
    for (const prefix of [W, V]) {
      expect(errorOf(() => resolve({ ...on, [`${prefix}FORMAT`]: '' })).message).toContain(`${prefix}FORMAT="" is blank`);
      expect(errorOf(() => resolve({ ...on, [`${prefix}FORMAT`]: ' ' })).code).toBe('ERR_SNAPSHOT_FORMAT');
      expect(errorOf(() => resolve({ ...on, [`${prefix}MAX_CAPTURES`]: '' })).message).toContain(`${prefix}MAX_CAPTURES="" is blank`);
    }
    expect(resolve(on)).toMatchObject({ format: 'pt', maxCaptures: 4 });
  });
  test('MAX_CAPTURES valid', () => {
    expect(resolve({ ...on, [`${V}MAX_CAPTURES`]: ' 9 ' }).maxCaptures).toBe(9);
  });
  test('FORMAT lower-cased; unknown names the variable', () => {
    expect(resolve({ ...on, [`${W}FORMAT`]: 'NPY' }).format).toBe('npy');
    expect(resolve({ ...on, [`${W}FORMAT`]: 'safetensors' }).format).toBe('safetensors');
    const e = errorOf(() => resolve({ ...on, [`${V}FORMAT`]: 'hdf5' }));
    expect(e.message).toContain(`${V}FORMAT`);
    expect(e.message).toContain('"hdf5"');
  });
});

describe('rank list degrades to all ranks with a warning', () => {
  const on = { [`${W}ENABLE`]: '1' };
  test('valid list', () => {
    const warnings: string[] = [];
    expect(resolve({ ...on, [`${W}RANKS`]: '0, 2' }, {}, warnings).ranks).toEqual(new Set([0, 2]));
    expect(warnings).toEqual([]);
  });
  test.each(['0,x', '-1', '1,,2', '1.0'])('%j', (v) => {
    const warnings: string[] = [];
    expect(resolve({ ...on, [`${W}RANKS`]: v }, {}, warnings).ranks).toBeNull();
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain(`${W}RANKS`);
  });
});

describe("integers are read as upstream's int() reads them, in every snapshot variable", () => {
  const on = { [`${W}ENABLE`]: '1' };
  test.each([W, V])('%sRANKS=-0 is rank 0, with no warning', (prefix) => {
    const warnings: string[] = [];
    expect(resolve({ ...on, [`${prefix}RANKS`]: '-0' }, {}, warnings).ranks).toEqual(new Set([0]));
    expect(warnings).toEqual([]);
  });
  test('a sign, surrounding blanks and underscores between digits, in each integer variable and flag', () => {
    const warnings: string[] = [];
    expect(resolve({ ...on, [`${W}RANKS`]: ' +1 ,\t2_0\n' }, {}, warnings).ranks).toEqual(new Set([1, 20]));
    expect(resolve({ ...on, [`${V}CAPTURE_AT_CALL`]: ' +3 , -0,1_0' }).callRule).toEqual({ kind: 'indices', indices: new Set([3, 0, 10]) });
    expect(resolve({ ...on, [`${W}CAPTURE_TOKEN`]: '+104, 0_7' }).tokenTargets).toEqual(new Set([104, 7]));
    expect(resolve({ ...on, [`${W}MAX_CAPTURES`]: ' +1_2\n' }).maxCaptures).toBe(12);
    expect(resolve({ ...on, [`${W}CAPTURE_AT_CALL`]: ' -1 ' }).callRule).toEqual({ kind: 'all' });
    expect(resolve(on, { ranks: '-0', captureAtCall: '+2', maxCaptures: ' 5 ' })).toMatchObject({ ranks: new Set([0]), maxCaptures: 5, callRule: { kind: 'indices', indices: new Set([2]) } });
    expect(warnings).toEqual([]);
  });
  test.each(['1__0', '_1', '1_', '+_1', '+ 1', '--1', '+', '0x1', '1e3', '1.0'])('what int() refuses stays refused: %j', (v) => {
    expect(errorOf(() => resolve({ ...on, [`${W}CAPTURE_AT_CALL`]: v })).code).toBe('ERR_SNAPSHOT_SELECTION');
    expect(errorOf(() => resolve({ ...on, [`${V}MAX_CAPTURES`]: v })).code).toBe('ERR_SNAPSHOT_MAX_CAPTURES');
    const warnings: string[] = [];
    expect(resolve({ ...on, [`${W}RANKS`]: v }, {}, warnings).ranks).toBeNull();
    expect(warnings).toHaveLength(1);
  });
  test("the reader agrees with Python's int() and str.strip() on every case, run through python3", () => {
    const cases = [
      ' +3 ', '-0', '+0', '1_0', '0_0', '00', '007', '1__0', '_1', '1_', '+_1', '-_1', '+ 3', '--3', '+', '-', '', '  ', '1,0',
      '\t3\r', '\v3\f', '3\n', '\x1c3\x1f', '\x853', '\xa03\u3000', '\ufeff3', '\u200b3', '\u180e3',
      '\u0663', '\uff13', '\u0663_\u0663', '\u{1D7CE}\u{1D7D9}', '1.5', '1e3', '0x10', '0b1', '٣', 'Ⅻ', '²', '9007199254740991',
    ];
    const py = spawnSync(PYTHON, ['-c', PY_PROG], { input: JSON.stringify(cases), encoding: 'utf8' });
    expect(py.status).toBe(0);
    const want = JSON.parse(py.stdout) as { int: number | null; strip: string }[];
    expect(want).toHaveLength(cases.length);
    cases.forEach((c, i) => {
      const got = pyInt(c);
      expect([c, got.ok ? got.value : null]).toEqual([c, want[i].int]);
      expect([c, pyStrip(c)]).toEqual([c, want[i].strip]);
    });
  });
  test('a number past 2^53 - 1 is refused as out of range (int() would read it; no rank or index is that big)', () => {
    expect(pyInt('9007199254740992')).toEqual({ ok: false, why: 'integer out of range' });
  });
});

describe('aliases', () => {
  test('the seed names alone work', () => {
    const c = resolve({ [`${V}ENABLE`]: '1', [`${V}CAPTURE_REQUEST`]: 'abc, def', [`${V}FORMAT`]: 'npy' });
    expect(c.enabled).toBe(true);
    expect(c.requestIds).toEqual(['abc', 'def']);
    expect(c.format).toBe('npy');
    expect(c.callRule).toEqual({ kind: 'never' });
  });
  test('both set to the same value is fine', () => {
    expect(resolve({ [`${V}ENABLE`]: '1', [`${W}ENABLE`]: '1', [`${V}CAPTURE_TOKEN`]: '4', [`${W}CAPTURE_TOKEN`]: '4' }).tokenTargets).toEqual(new Set([4]));
  });
  test('both set to different values names both variables and values', () => {
    const e = errorOf(() => resolve({ [`${W}ENABLE`]: '1', [`${W}CAPTURE_TOKEN`]: '4', [`${V}CAPTURE_TOKEN`]: '5' }));
    expect(e.message).toContain(`${W}CAPTURE_TOKEN="4"`);
    expect(e.message).toContain(`${V}CAPTURE_TOKEN="5"`);
    expect(e.code).toBe('ERR_SNAPSHOT_ALIAS_CONFLICT');
  });
});

describe('flags', () => {
  test('flags override the environment (even conflicting aliases)', () => {
    const c = resolve(
      { [`${W}ENABLE`]: '0', [`${W}CAPTURE_TOKEN`]: '4', [`${V}CAPTURE_TOKEN`]: '5', [`${W}FORMAT`]: 'npy' },
      { enable: true, captureToken: '8,9', format: 'safetensors', cacheRoot: '/elsewhere' },
    );
    expect(c.enabled).toBe(true);
    expect(c.tokenTargets).toEqual(new Set([8, 9]));
    expect(c.format).toBe('safetensors'); // a documented wavebus extension beside the seed's pt | npy
    expect(c.snapshotRoot).toBe('/elsewhere/snapshots');
  });
  test('a bad flag value names the flag', () => {
    const e = errorOf(() => resolve({}, { enable: true, captureAtCall: '1,x' }));
    expect(e.message).toContain('--snapshot-capture-at-call');
    expect(e.message).toContain('"x"');
  });
  test('yargs options parse into flags and into env for the launcher', async () => {
    const argv = (await yargs(['--snapshot-enable', '--snapshot-capture-at-call', '-1', '--snapshot-format', 'npy', '--snapshot-max-captures', '2'])
      .options(snapshotOptions)
      .strict()
      .parseAsync()) as Record<string, unknown>;
    expect(snapshotFlagsFromArgv(argv)).toEqual({ enable: true, captureAtCall: '-1', format: 'npy', maxCaptures: '2' });
    const env = snapshotEnvFromArgv(argv);
    expect(env).toEqual({
      [`${W}ENABLE`]: '1',
      [`${V}ENABLE`]: '1',
      [`${W}CAPTURE_AT_CALL`]: '-1',
      [`${V}CAPTURE_AT_CALL`]: '-1',
      [`${W}FORMAT`]: 'npy',
      [`${V}FORMAT`]: 'npy',
      [`${W}MAX_CAPTURES`]: '2',
      [`${V}MAX_CAPTURES`]: '2',
    });
    // What the launcher passes down resolves to the same config, whatever stale aliases were around.
    const c = resolve({ [`${V}FORMAT`]: 'pt', ...env });
    expect(c).toMatchObject({ enabled: true, callRule: { kind: 'all' }, format: 'npy', maxCaptures: 2 });
  });
  test('no snapshot flags: no env', async () => {
    const argv = (await yargs([]).options(snapshotOptions).parseAsync()) as Record<string, unknown>;
    expect(snapshotEnvFromArgv(argv)).toEqual({});
  });
});

describe('gating', () => {
  const enabled = resolve({ [`${W}ENABLE`]: '1' });
  test('async scheduling is refused with a way out', () => {
    const e = errorOf(() => checkSnapshotGating(enabled, { asyncScheduling: true, backendHasMemoryAccess: true }));
    expect(e.message).toMatch(/disable async scheduling/i);
    expect(e.message).toContain('--no-async-scheduling');
    expect(e.message).toContain(`${W}ENABLE`);
  });
  test('a backend without memory access is a stated no-op', () => {
    expect(checkSnapshotGating(enabled, { asyncScheduling: false, backendHasMemoryAccess: false })).toEqual({
      noop: true,
      reason: 'backend_without_memory_access',
    });
  });
  test('all good', () => {
    expect(checkSnapshotGating(enabled, { asyncScheduling: false, backendHasMemoryAccess: true })).toEqual({ noop: false });
  });
  test('disabled: nothing to refuse', () => {
    expect(checkSnapshotGating(resolve({}), { asyncScheduling: true, backendHasMemoryAccess: true }).noop).toBe(true);
  });
});
