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
