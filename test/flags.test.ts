// Bad numbers and names in flags and environment variables: each is a usage error (exit 2) that
// names the flag or variable and its bound, before anything is bound, allocated or created.
// Real CLI processes.
import * as path from 'path';
import { cleanup, freePortPair, runWavebus, tmpDir } from './helpers';

jest.setTimeout(60000);
afterAll(cleanup);

let port: number;
beforeAll(async () => {
  port = await freePortPair();
});

const env = (extra: NodeJS.ProcessEnv = {}) => ({ ...process.env, WAVEBUS_LOG_LEVEL: 'warn', ...extra });

test('coordinator --metrics-port 99999 names the flag and its range', () => {
  const r = runWavebus(['coordinator', '--port', String(port), '--world-size', '1', '--metrics-port', '99999'], { env: env() });
  expect(r.stderr).toContain('--metrics-port: expected an integer in 0..65535, got "99999"');
  expect(r.code).toBe(2);
});

test('WAVEBUS_LOG_LEVEL=bogus names the variable and the levels it takes', () => {
  const r = runWavebus(['coordinator', '--port', String(port), '--world-size', '1'], { env: env({ WAVEBUS_LOG_LEVEL: 'bogus' }) });
  expect(r.stderr).toMatch(/WAVEBUS_LOG_LEVEL: expected one of [a-z, ]*info[a-z, ]*, got "bogus"/);
  expect(r.code).toBe(2);
});

test('sim: a node rank past the node count names where it came from, the variable launch sets or the flag', () => {
  const fromEnv = runWavebus(['sim', '--steps', '1', '--result-dir', tmpDir()], { env: env({ WAVEBUS_NODE_RANK: '2' }) });
  expect({ code: fromEnv.code, stderr: fromEnv.stderr.trim() }).toEqual({ code: 2, stderr: 'wavebus: WAVEBUS_NODE_RANK 2 must be < --nnodes 1 [ERR_CONFIG]' });
  const fromFlags = runWavebus(['sim', '--steps', '1', '--node-rank', '3', '--result-dir', tmpDir()], { env: env({ WAVEBUS_NNODES: '2' }) });
  expect(fromFlags.stderr.trim()).toBe('wavebus: --node-rank 3 must be < WAVEBUS_NNODES 2 [ERR_CONFIG]');
});

test('coordinator --world-size 100000000 is refused at once, naming the flag and MAX_WORLD_SIZE', () => {
  const r = runWavebus(['coordinator', '--port', String(port), '--world-size', '100000000'], { env: env(), timeout: 20000 });
  expect(r.stderr).toContain('--world-size=100000000 is over the largest world wavebus serves, 65536 ranks (MAX_WORLD_SIZE)');
  expect(r.code).toBe(2);
});

test('launch --nnodes 1000 --nproc-per-node 100 is refused the same way', () => {
  const r = runWavebus(['launch', '--nnodes', '1000', '--nproc-per-node', '100', '--master-addr', '127.0.0.1', '--', 'true'], { env: env() });
  expect(r.stderr).toContain('--nnodes*--nproc-per-node=100000 is over the largest world wavebus serves, 65536 ranks');
  expect(r.code).toBe(2);
});

test('agent --run-dir too long for a unix socket names the flag (as launch does)', () => {
  const long = path.join(tmpDir('wavebus-flags-'), 'd'.repeat(120));
  const r = runWavebus(['agent', '--rank', '0', '--world-size', '1', '--coordinator', `127.0.0.1:${port}`, '--run-dir', long], { env: env() });
  expect(r.stderr).toContain(`--run-dir ${long}: too long for a unix socket path`);
  expect(r.code).toBe(2);
  const viaEnv = runWavebus(['agent', '--rank', '0', '--world-size', '1', '--coordinator', `127.0.0.1:${port}`], { env: env({ WAVEBUS_RUN_DIR: long }) });
  expect(viaEnv.stderr).toContain(`WAVEBUS_RUN_DIR ${long}: too long for a unix socket path`);
  expect(viaEnv.code).toBe(2);
});

test('aggregate --timeout-ms 3000000000 (over a timer\'s range) names the flag and its bound', () => {
  const r = runWavebus(['aggregate', '--coordinator', `127.0.0.1:${port}`, '--out', tmpDir('wavebus-flags-'), '--timeout-ms', '3000000000'], { env: env(), timeout: 20000 });
  expect(r.stderr).toContain(`--timeout-ms: expected an integer in 1..${2 ** 31 - 1 - 5000}, got "3000000000"`);
  expect(r.code).toBe(2);
});

// commands/flags.ts: the one parser for numeric flags. Plain decimal digits only, bounds named.
describe('flags.ts', () => {
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const { intFlag, msFlag, portFlag, mibFlag, numberFlag, strictInt, flagOrEnv, envSetting, isSet, MAX_TIMER_MS } = require('../src/commands/flags') as typeof import('../src/commands/flags');
  const msg = (f: () => unknown): string => {
    try {
      f();
    } catch (e) {
      return `${(e as { code: string }).code}: ${(e as Error).message}`;
    }
    return 'no error';
  };

  test.each(['1e3', '0x10', '1.0', '+5', '-1', '', ' ', 'ten', '9007199254740993'])('integer flags refuse %j, naming the flag', (raw) => {
    expect(strictInt(raw)).toBeUndefined();
    expect(msg(() => intFlag(raw, '--steps'))).toBe(`ERR_CONFIG: --steps: expected an integer >= 1, got ${JSON.stringify(raw)}`);
  });

  test('bounds, blanks around digits, error codes', () => {
    expect(intFlag(' 42 ', '--n')).toBe(42);
    expect(intFlag(0, '--n', 0)).toBe(0);
    expect(msg(() => intFlag('65', '--window', 1, 64))).toBe('ERR_CONFIG: --window: expected an integer in 1..64, got "65"');
    expect(msg(() => intFlag('1e3', '--tp', 1, undefined, { code: 'ERR_LAUNCH' }))).toBe('ERR_LAUNCH: --tp: expected an integer >= 1, got "1e3"');
    expect(msg(() => msFlag(String(MAX_TIMER_MS + 1), '--heartbeat-ms'))).toBe(`ERR_CONFIG: --heartbeat-ms: expected an integer in 1..${MAX_TIMER_MS}, got "${MAX_TIMER_MS + 1}"`);
    expect(portFlag('0', '--metrics-port', 0)).toBe(0);
    expect(msg(() => portFlag('0', '--port'))).toBe('ERR_CONFIG: --port: expected an integer in 1..65535, got "0"');
    expect(mibFlag('3', '--staging-mb')).toBe(3 * 2 ** 20);
    expect(msg(() => mibFlag('1e3', '--staging-mb'))).toMatch(/^ERR_CONFIG: --staging-mb: expected an integer in 1\.\.\d+, got "1e3"$/);
  });

  test('flag, else variable, else default: the value travels with the name the user set', () => {
    const env = { WAVEBUS_PORT: '4000', BLANK: '  ', EMPTY: '' };
    expect(flagOrEnv('5000', '--port', env, 'WAVEBUS_PORT')).toEqual({ raw: '5000', from: '--port' });
    expect(flagOrEnv(['1', '2'], '--port', env, 'WAVEBUS_PORT')).toEqual({ raw: '2', from: '--port' }); // the last one given
    expect(flagOrEnv(undefined, '--port', env, 'WAVEBUS_PORT')).toEqual({ raw: '4000', from: 'WAVEBUS_PORT' });
    // A blank variable is unset (`VAR=` in a shell); an empty flag was given, and its parser names it.
    expect(flagOrEnv(undefined, '--x', env, 'BLANK')).toBeUndefined();
    expect(envSetting(env, 'EMPTY')).toBeUndefined();
    expect(envSetting(env, 'MISSING')).toBeUndefined();
    expect([isSet(undefined), isSet(''), isSet('  '), isSet(' 0 ')]).toEqual([false, false, false, true]);
    const given = flagOrEnv('', '--lookahead-waves', env, 'WAVEBUS_LOOKAHEAD_WAVES')!;
    expect(msg(() => intFlag(given.raw, given.from))).toBe('ERR_CONFIG: --lookahead-waves: expected an integer >= 1, got ""');
  });

  test('number flags (tolerances, fractional MiB) take decimals and exponents, nothing else', () => {
    expect(numberFlag('1e-5', '--atol', 0)).toBe(1e-5);
    expect(numberFlag('0.5', '--chunk-mb', 1 / 1024, 64)).toBe(0.5);
    for (const raw of ['', 'nan', 'Infinity', '0x10', '-1', '1,5']) {
      expect(msg(() => numberFlag(raw, '--atol', 0))).toBe(`ERR_CONFIG: --atol: expected a number >= 0, got ${JSON.stringify(raw)}`);
    }
    expect(msg(() => numberFlag('100', '--chunk-mb', 1, 64))).toBe('ERR_CONFIG: --chunk-mb: expected a number in [1, 64], got "100"');
  });
});

describe('"1e3" is refused by every command, naming the flag', () => {
  test.each([
    ['coordinator', () => ['coordinator', '--port', String(port), '--world-size', '1', '--heartbeat-ms', '1e3'], '--heartbeat-ms: expected an integer in 1..2147483647, got "1e3"'],
    ['sim', () => ['sim', '--steps', '1e3', '--result-dir', tmpDir('wavebus-flags-')], '--steps: expected an integer >= 1, got "1e3"'],
    ['demo', () => ['demo', '--tp', '1e3', '--out', tmpDir('wavebus-flags-')], '--tp: expected an integer >= 1, got "1e3"'],
    ['launch', () => ['launch', '--nproc-per-node', '1e3', '--', 'true'], '--nproc-per-node: expected an integer >= 1, got "1e3"'],
    ['aggregate', () => ['aggregate', '--coordinator', `127.0.0.1:${port}`, '--out', tmpDir('wavebus-flags-'), '--window', '1e3'], '--window: expected an integer in 1..64, got "1e3"'],
  ])('%s', (_name, args, text) => {
    const r = runWavebus(args(), { env: env(), timeout: 20000 });
    expect(r.stderr).toContain(text);
    expect(r.code).toBe(2);
  });
});

describe('flags given twice, and switches given a value', () => {
  test('a scalar flag given twice takes its last value (a path option never gets a list)', () => {
    const dir = tmpDir();
    const out = path.join(dir, 'second');
    const r = runWavebus(['sim', '--detached', '--steps', '2', '--step-ms', '0', '--result-dir', path.join(dir, 'first'), '--result-dir', out], { env: env() });
    expect(r.code).toBe(0);
    expect(require('fs').readdirSync(out).length).toBeGreaterThan(0);
    expect(require('fs').existsSync(path.join(dir, 'first'))).toBe(false);
  });

  test('a switch given a value that is not true or false is refused by name, not read as false', () => {
    const r = runWavebus(['sim', '--detached=0x10', '--steps', '1', '--result-dir', tmpDir()], { env: env() });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--detached: a switch takes no value or =true \/ =false, got "0x10"/);
    expect(runWavebus(['sim', '--detached=true', '--steps', '1', '--step-ms', '0', '--result-dir', tmpDir()], { env: env() }).code).toBe(0);
  });

  test('an array flag keeps every value: each --agent-arg reaches the agents', () => {
    const r = runWavebus(['launch', '--port', String(port), '--run-dir', path.join(tmpDir(), 'l'), '--agent-arg=--staging-mb=8', '--agent-arg=--bogus-one', '--', 'true'], { env: env(), timeout: 30000 });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/started with the extra arguments \["--staging-mb=8","--bogus-one"\] from --agent-arg/);
    expect(r.stderr).toMatch(/Unknown arguments?: bogus-one/);
  });
});
