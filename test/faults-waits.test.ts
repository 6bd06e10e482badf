// Faults while a command waits on a running job (issue #35's "faults on the new paths"): the process
// a command waits on is killed -9 mid-wait; the command must end by itself, well before its own
// --timeout, with a clear error and code, and no stack trace. One entry per wait in WAITS (the
// flight recorder's and the wave receiver's waits join here when they land).
import * as fs from 'fs';
import * as path from 'path';
import { GiveUp, cleanup, exitedWithin, freePortPair, spawnWavebus, tmpDir, waitFor, type Spawned } from './helpers';

jest.setTimeout(120000);
afterEach(cleanup);

interface Wait {
  name: string;
  /** The waiting command's arguments, given the coordinator's HOST:PORT. */
  args: (at: string) => string[];
  /** What it prints once it is waiting (then the fault comes). */
  waiting: RegExp;
  /** Its exit code and what stderr must say after the fault. */
  code: number;
  says: RegExp;
}

/** The control client asks at most every 5 s (a bounded query): a dead coordinator is seen within that. */
const NOTICE_MS = 5000;

const WAITS: Wait[] = [
  {
    name: 'wavebus dump --wait (a manual dump that no wave has armed yet)',
    args: (at) => ['dump', '--coordinator', at, '--all', '--wait', '--timeout', '90000'],
    waiting: /^armed dump-\d+: a manual dump of every running request/m,
    code: 3, // docs/control.md: the job ends while --wait waits
    says: /waiting for dump-\d+: the coordinator at tcp:\/\/127\.0\.0\.1:\d+ stopped answering \(the job ended\?\) \[ERR_JOB_ENDED\]/,
  },
];

/** A coordinator with the runtime guard and no agents: nothing steps, so an armed dump stays pending. */
async function startCoordinator(): Promise<{ proc: Spawned; at: string }> {
  const dir = tmpDir('wavebus-faults-waits-');
  const port = await freePortPair();
  const cfg = path.join(dir, 'runtime', 'config', 'runtime_config.json');
  fs.mkdirSync(path.dirname(cfg), { recursive: true });
  fs.writeFileSync(cfg, '{}');
  const proc = spawnWavebus(['coordinator', '--port', String(port), '--world-size', '2', '--tp', '2', '--runtime-config-path', cfg], { env: { ...process.env, WAVEBUS_LOG_LEVEL: 'warn' } });
  await waitFor(() => proc.stdout().includes('"started"') || undefined, 'the coordinator to start', 30000);
  return { proc, at: `127.0.0.1:${port}` };
}

test.each(WAITS.map((w) => [w.name, w] as const))('kill -9 of the coordinator while %s: it ends by itself with a clear error', async (_name, w) => {
  const { proc, at } = await startCoordinator();
  const waiter = spawnWavebus(w.args(at));
  await waitFor(() => {
    if (w.waiting.test(waiter.stdout())) return true;
    if (waiter.child.exitCode !== null) throw new GiveUp(`it exited first: ${waiter.stderr()}`);
    return undefined;
  }, `${w.name} to wait`, 30000);
  // Still waiting a moment later (a poll or two in): then the fault.
  await new Promise((r) => setTimeout(r, 600));
  expect(waiter.child.exitCode).toBeNull();
  const killedAt = Date.now();
  proc.child.kill('SIGKILL');
  const e = await exitedWithin(waiter, NOTICE_MS + 10000, `${w.name} to end after the kill`);
  const tookMs = Date.now() - killedAt;
  expect({ code: e.code, stderr: waiter.stderr() }).toEqual({ code: w.code, stderr: expect.stringMatching(w.says) });
  expect(waiter.stderr()).not.toMatch(/^\s+at .+\(.+:\d+:\d+\)$/m); // no stack trace
  // Well before its own --timeout (90 s): the dead coordinator was noticed at the next bounded query.
  expect(tookMs).toBeLessThan(NOTICE_MS + 10000);
});
