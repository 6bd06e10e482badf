// Wake on demand (docs/control.md, "An idle job"): `wavebus dump` and `wavebus capture` on jobs
// started by `wavebus launch` with the defaults (no hot reload, no detector: the engines send
// nothing), with the simulated engine, the PyTorch engine (examples/torch-engine) and transformers'
// continuous batching under torch 2.x's own torchrun (examples/transformers-engine). The
// commands complete, the files exist, and afterwards every mailbox's feature bits are 0 again.
// And the answers at once where nothing can serve an arm.
import * as fs from 'fs';
import * as path from 'path';
import { MailboxReader } from '../src/client/mailbox';
import { ReplicaWake, WAKE } from '../src/bus/replica-wake';
import { Job } from './sim-job';
import { spawnSync } from 'child_process';
import { CLI, ROOT, cleanup, freePortPair, readManifests, spawnWavebus, tmpDir, waitFor, type Spawned } from './helpers';
import { torch2, torchRanks } from './torch2';
import { argsOf, descendants } from './procs';

jest.setTimeout(300000);
afterAll(cleanup);

const ENGINE = path.join(ROOT, 'examples', 'torch-engine');

// How the engine's ranks start: torch 2.x's torchrun (the stand-in where torch 2.x is absent); its python for what reads their files.
const RANKS = torchRanks();
// The only flag: each agent's end-of-wave bound, wider than the default 50 ms, because this
// 2-vCPU machine runs several suites at once (the bound is not a feature: nothing is turned on).
const BOUND = ['--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000'];

interface Launched {
  dir: string;
  port: number;
  runDir: string;
  launch: Spawned;
  env: NodeJS.ProcessEnv;
}

async function launch(command: string[], tag: string): Promise<Launched> {
  const dir = tmpDir(`wavebus-wake-${tag}-`);
  const runDir = path.join(dir, 'run');
  const port = await freePortPair();
  const env = { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache') };
  const l = spawnWavebus(['launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--run-dir', runDir, ...BOUND, '--', ...command], { env, cwd: dir });
  await waitFor(() => fs.existsSync(path.join(runDir, 'bus.token')) && fs.existsSync(path.join(runDir, 'mailbox-local1')), 'the job to start', 60000, 50);
  const j = { dir, port, runDir, launch: l, env: { ...env, WAVEBUS_BUS_TOKEN_FILE: path.join(runDir, 'bus.token') } };
  // Every agent live and synced (the launcher starts the command only then).
  await waitFor(async () => {
    const r = await cli(j, ['status', '--json']);
    return r.code === 0 && JSON.parse(r.stdout).ready === true;
  }, 'every agent on the bus', 60000, 200);
  return j;
}

async function cli(j: Launched, args: string[]): Promise<{ code: number | null; stdout: string; stderr: string; ms: number }> {
  const t0 = Date.now();
  const p = spawnWavebus([...args, '--coordinator', `127.0.0.1:${j.port}`], { env: j.env, cwd: j.dir });
  const e = await p.exited;
  return { code: e.code, stdout: p.stdout(), stderr: p.stderr(), ms: Date.now() - t0 };
}

async function statusJson(j: Launched): Promise<Record<string, any>> {
  const r = await cli(j, ['status', '--json']);
  expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
  return JSON.parse(r.stdout);
}

/** Every rank's mailbox feature bits (what the engine reads each step). */
function features(j: Launched): number[] {
  return [0, 1].map((l) => {
    const r = MailboxReader.open(path.join(j.runDir, `mailbox-local${l}`));
    try {
      return r.features();
    } finally {
      r.close();
    }
  });
}

/**
 * Until the engine steps: an engine still starting (node, or python and torch) sends no wave head,
 * so an arm finds none within the grace and says so at once (the answer checked here); then one is
 * served. Or one rank's forward was not offered: a client whose agent, busy starting up, missed a
 * call's bound skips it until its next probe of the agent, so a probe may miss that rank (the
 * capture after the dump is checked on every rank). The replica sleeps again before the caller goes on.
 */
async function untilStepping(j: Launched): Promise<void> {
  for (let tries = 1; ; tries++) {
    const probe = await cli(j, ['capture', '--next', '--wait', '--timeout', '60000']);
    if (probe.code === 0) return;
    expect(probe.stderr).toMatch(/not served on replica 0: its engine sent no wave head within 5 s of the wake although its client said hello to rank 0's agent: is the engine stepping\?|^wavebus capture: replica 0: no bundle from rank\(s\) [01] \(waves \d+\.\.\d+, expired\)\n$/);
    expect(tries).toBeLessThan(12);
  }
}

/** Nothing armed any more: the replica sleeps and every engine's bits are back to 0. */
async function asleep(j: Launched): Promise<void> {
  await waitFor(async () => (await statusJson(j)).replicas['0'].wake === 'off', 'the replica to sleep again', 30000, 200);
  await waitFor(() => features(j).every((b) => b === 0), 'every mailbox to say everything off', 30000, 100);
}

interface Bundle {
  rank: number;
  wave: number;
  dir: string;
}

/**
 * Dump every running request; it completes and the bus sleeps; then capture the next forward (a
 * second wake); it is served and the bus sleeps again. The capture's bundles.
 */
async function dumpAndCapture(j: Launched, kvRoot: string): Promise<Bundle[]> {
  expect(features(j)).toEqual([0, 0]); // asleep: the engines send nothing
  const s0 = await statusJson(j);
  expect(s0.replicas['0'].wake).toBe('off');

  const dump = await cli(j, ['dump', '--all', '--wait', '--timeout', '120000']);
  expect({ code: dump.code, stderr: dump.stderr, out: dump.code === 0 ? '' : dump.stdout + j.launch.stderr().split('\n').filter((l) => /did not arrive|config applied|level":[45]0|manual dump|held|wake/.test(l) && !/dump job incomplete|not acked by every|no proof/.test(l)).slice(0, 12).join('\n') }).toEqual({ code: 0, stderr: '', out: '' });
  const manifests = [...dump.stdout.matchAll(/^complete: (.+manifest\.json)$/gm)].map((m) => m[1]);
  expect(manifests.length).toBeGreaterThan(0);
  for (const f of manifests) {
    expect(f.startsWith(kvRoot)).toBe(true);
    const m = JSON.parse(fs.readFileSync(f, 'utf8'));
    expect({ complete: m.complete, ranks: m.completed_ranks }).toEqual({ complete: true, ranks: [0, 1] });
    // Each rank's bundle is there: its dump.json and a KV file per layer and kind.
    for (const d of fs.readdirSync(path.dirname(f)).filter((n) => /^dp0_tp\d_pp0_cp0$/.test(n))) {
      const files = fs.readdirSync(path.join(path.dirname(f), d));
      expect(files).toContain('dump.json');
      expect(files.filter((n) => n.endsWith('.pt')).length).toBeGreaterThan(0);
    }
  }
  expect(readManifests(kvRoot).length).toBe(manifests.length);
  await asleep(j);
  const s1 = await statusJson(j);
  expect(s1.replicas['0'].wave).toBeGreaterThan(s0.replicas['0'].wave); // it did step on the bus while awake

  // A capture armed on the sleeping bus wakes it again and is served.
  const cap = await cli(j, ['capture', '--next', '--wait', '--timeout', '120000']);
  expect({ code: cap.code, stderr: cap.stderr }).toEqual({ code: 0, stderr: '' });
  const bundles = [...cap.stdout.matchAll(/^rank (\d+) wave (\d+): (.+)$/gm)].map((m) => ({ rank: Number(m[1]), wave: Number(m[2]), dir: m[3] }));
  expect(bundles.map((b) => b.rank).sort()).toEqual([0, 1]);
  expect(bundles[0].wave).toBe(bundles[1].wave);
  expect(bundles[0].wave).toBeGreaterThan(s1.replicas['0'].wave);
  for (const b of bundles) {
    expect(b.dir.startsWith(path.join(j.dir, 'cache'))).toBe(true);
    expect(fs.existsSync(path.join(b.dir, 'meta.json'))).toBe(true);
  }
  await asleep(j);
  return bundles;
}

test('a simulated TP=2 job started with the defaults: dump --all --wait and capture --next --wait complete, then the bus sleeps', async () => {
  const stop = path.join(tmpDir('wavebus-wake-stop-'), 'stop');
  const j = await launch([process.execPath, CLI, 'sim', '--nproc-per-node', '2', '--steps', '100000', '--step-ms', '20', '--requests', '4000', '--stop-file', stop, '--result-dir', path.join(path.dirname(stop), 'ranks')], 'sim');
  try {
    await untilStepping(j);
    await waitFor(() => features(j).every((b) => b === 0), 'every mailbox to say everything off', 30000, 100);
    await dumpAndCapture(j, path.join(j.dir, 'runtime', 'report', 'kv_cache'));
  } finally {
    fs.writeFileSync(stop, '');
  }
  const { code } = await j.launch.exited;
  expect({ code, stderr: code === 0 ? '' : j.launch.stderr().slice(-3000) }).toEqual({ code: 0, stderr: '' });
});

test('the PyTorch engine (TP=2) started with the defaults: dump --all --wait and capture --next --wait complete, then the bus sleeps', async () => {
  const dirOut = tmpDir('wavebus-wake-torch-out-');
  const j = await launch([...RANKS.command(path.join(ENGINE, 'engine.py'), { nproc: 2 }), '--out', dirOut, '--requests', '2', '--max-tokens', '400', '--num-blocks', '256', '--arrive-every', '2', '--step-sleep-ms', '40'], 'torch');
  try {
    await untilStepping(j);
    await waitFor(() => features(j).every((b) => b === 0), 'every mailbox to say everything off', 30000, 100);
    await dumpAndCapture(j, path.join(j.dir, 'runtime', 'report', 'kv_cache'));
  } catch (e) {
    j.launch.child.kill('SIGTERM');
    throw e;
  }
  const { code } = await j.launch.exited;
  if (code !== 0) throw new Error(`launch exited ${code}\n${j.launch.stderr().slice(-6000)}`);
});

test('transformers continuous batching (TP=2, torch 2.x torchrun) started with the defaults: dump --all --wait and capture --next --wait complete, then the bus sleeps', async () => {
  const venv = torch2();
  const hf = path.join(ROOT, 'examples', 'transformers-engine');
  const model = path.join(tmpDir('wavebus-wake-hf-model-'), 'model');
  const made = spawnSync(venv.python, [path.join(hf, 'make_model.py'), model, '--layers', '2'], { encoding: 'utf8', timeout: 180000 });
  expect({ code: made.status, stderr: made.status === 0 ? '' : made.stderr }).toEqual({ code: 0, stderr: '' });
  const dirOut = tmpDir('wavebus-wake-hf-out-');
  // Long enough to outlive the wake, the dump and the capture: 4 requests of 400 tokens, 60 ms a forward.
  const j = await launch([venv.torchrun, '--standalone', '--nproc-per-node', '2', path.join(hf, 'serve.py'), '--model', model, '--out', dirOut,
    '--requests', '4', '--max-tokens', '400', '--num-blocks', '160', '--step-sleep-ms', '60'], 'hf');
  try {
    await untilStepping(j);
    await waitFor(() => features(j).every((b) => b === 0), 'every mailbox to say everything off', 30000, 100);
    // The capture comes after the probe's and the dump's waves, its context longer than at the
    // probe's capture (attention_mask, [1, 1, q, k], outgrew the probe's slice of it).
    for (const b of await dumpAndCapture(j, path.join(j.dir, 'runtime', 'report', 'kv_cache'))) {
      const meta = JSON.parse(fs.readFileSync(path.join(b.dir, 'meta.json'), 'utf8'));
      expect(meta.global_step).toBe(b.wave); // the integration's wave is the bus's
      // SNAPSHOT_INPUTS (attention_mask only with a kernel that needs it) and the whole cache last.
      expect([8, 9]).toContain(meta.inputs.length);
      expect(meta.inputs[meta.inputs.length - 1].dtype).toBe('uint8');
    }
  } catch (e) {
    j.launch.child.kill('SIGTERM');
    throw e;
  }
  const { code } = await j.launch.exited;
  if (code !== 0) throw new Error(`launch exited ${code}\n${j.launch.stderr().slice(-6000)}`);
});

test('an engine that connects late (loading its model) is waited for; one connected and not stepping fails after the grace; no engine: the --timeout says what the arm waits on', async () => {
  // The engine starts 8 s after the job (a model loading): a dump armed at once waits for it and
  // is served at its first steps (until this was fixed it failed after the 5 s grace).
  const stop = path.join(tmpDir('wavebus-wake-late-'), 'stop');
  const sim = [process.execPath, CLI, 'sim', '--nproc-per-node', '2', '--steps', '100000', '--step-ms', '20', '--requests', '4000', '--stop-file', stop, '--result-dir', path.join(path.dirname(stop), 'ranks')];
  const late = await launch(['sh', '-c', 'sleep 8; exec "$@"', 'late-engine', ...sim], 'late');
  try {
    const t0 = Date.now();
    const dump = await cli(late, ['dump', '--all', '--wait', '--timeout', '120000']);
    expect({ code: dump.code, stderr: dump.stderr }).toEqual({ code: 0, stderr: '' });
    expect(dump.stdout).toMatch(/^complete: .+manifest\.json$/m);
    expect(Date.now() - t0).toBeGreaterThan(5000); // it did wait past the grace for the engine
    await asleep(late);
    const s = await statusJson(late);
    expect(s.ranks['0'].engine_clients).toBeGreaterThan(0);
  } finally {
    fs.writeFileSync(stop, '');
  }
  expect((await late.launch.exited).code).toBe(0);

  // An engine that said hello and stopped stepping (SIGSTOP, as a hang): the grace runs, the command says why.
  const stop2 = path.join(tmpDir('wavebus-wake-hung-'), 'stop');
  const h = await launch([process.execPath, CLI, 'sim', '--nproc-per-node', '2', '--steps', '100000', '--step-ms', '20', '--requests', '4000', '--stop-file', stop2, '--result-dir', path.join(path.dirname(stop2), 'ranks')], 'hung');
  const engines = () => descendants(h.launch.child.pid!).filter((pid) => argsOf(pid).some((a) => a === 'sim' || a === 'sim-rank'));
  try {
    await untilStepping(h); // its client said hello at its first step after that wake
    await asleep(h);
    expect((await statusJson(h)).ranks['0'].engine_clients).toBeGreaterThan(0);
    for (const pid of engines()) process.kill(pid, 'SIGSTOP');
    const dump = await cli(h, ['dump', '--all', '--wait', '--timeout', '120000']);
    expect(dump.code).toBe(1);
    expect(dump.stderr).toMatch(/wavebus dump: dump-1 not served on replica 0: its engine sent no wave head within 5 s of the wake although its client said hello to rank 0's agent: is the engine stepping\?/);
    expect(dump.ms).toBeLessThan(30000); // the grace and a heartbeat, never the 2-minute --timeout
    const cap = await cli(h, ['capture', '--request', 'abc', '--wait', '--timeout', '120000']);
    expect(cap.code).toBe(1);
    expect(cap.stderr).toMatch(/wavebus capture: capture-\d+ not served on replica 0: its engine sent no wave head within 5 s/);
    expect(cap.ms).toBeLessThan(30000);
    const s = await statusJson(h);
    expect(s.replicas['0'].wake).toBe('off');
    expect(s.captures.map((c: { state: string }) => c.state)).toContain('unserved');
    expect(features(h)).toEqual([0, 0]);
  } finally {
    for (const pid of engines()) process.kill(pid, 'SIGCONT');
    fs.writeFileSync(stop2, '');
  }
  expect((await h.launch.exited).code).toBe(0);

  // No engine at all: the arm waits; --timeout ends the command, which says what it waits on, and it stays armed.
  const j = await launch(['sleep', '60'], 'idle');
  try {
    const dump = await cli(j, ['dump', '--all', '--wait', '--timeout', '4000']);
    expect(dump.code).toBe(1);
    expect(dump.stderr).toContain('wavebus dump: --timeout ran out before every dump of dump-1 settled; it stays armed\n');
    expect(dump.stderr).toContain("wavebus dump: dump-1 waits on replica 0: no engine client has said hello to rank 0's agent yet");
    const cap = await cli(j, ['capture', '--request', 'abc', '--wait', '--timeout', '4000']);
    expect(cap.code).toBe(1);
    expect(cap.stderr).toContain("wavebus capture: capture-1 waits on replica 0: no engine client has said hello to rank 0's agent yet");
    const s = await statusJson(j);
    expect(s.replicas['0'].wake).toBe('heads');
    expect(s.ranks['0'].engine_clients).toBe(0);
    expect(s.manual_dumps_waiting).toBe(1);
    expect(s.captures.map((c: { state: string }) => c.state)).toEqual(['queued']);
  } finally {
    j.launch.child.kill('SIGTERM');
    await j.launch.exited;
  }

  // A replica whose head rank's agent was lost: refused at once, nothing armed.
  const job = new Job({ world: 2, steps: 1, stepMs: 20 });
  job.port = await freePortPair();
  job.startCoordinator();
  job.startAgent(0);
  job.startAgent(1);
  try {
    await waitFor(async () => (await job.status()).ready, 'the bus to be ready', 30000, 100);
    job.agents[0].child.kill('SIGKILL');
    await waitFor(async () => !(await job.status()).liveRanks.includes(0), 'rank 0 to be lost', 30000, 100);
    const at = { dir: job.dir, port: job.port, runDir: job.runDir, launch: job.coordinator, env: process.env };
    const r = await cli(at, ['dump', '--all', '--wait', '--timeout', '120000']);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/dump: replica 0 \(its head rank 0\) lost its agent, so no wave of it can carry the dump; nothing was armed \(live ranks: 1\) \[ERR_CONTROL_UNSERVABLE\]/);
    expect(r.ms).toBeLessThan(10000);
    expect((await statusJson(at)).manual_dumps_waiting).toBe(0);
  } finally {
    job.agents[1].child.kill('SIGTERM');
    job.coordinator.child.kill('SIGTERM');
    await Promise.all([job.agents[1].exited, job.coordinator.exited]);
  }
});

test('the wake states of one replica: heads on an arm, nothing armed at the first head nor within the settle time, off when nothing is armed, failed after the grace', () => {
  let now = 1000;
  let armed = false;
  let headWaiting: string | undefined;
  const announced: number[] = [];
  const failed: string[] = [];
  const w = new ReplicaWake({
    dp: 1,
    armed: () => armed,
    busActive: () => false,
    failQueued: (_r, why) => {
      failed.push(why);
      armed = false;
    },
    headRank: () => 0,
    headWaiting: () => headWaiting,
    announce: () => announced.push(w.of(0)),
    settleMs: 1000,
    graceMs: 5000,
    now: () => now,
  });
  w.refresh();
  expect(w.of(0)).toBe(WAKE.OFF);
  armed = true;
  w.refresh();
  expect([w.of(0), announced]).toEqual([WAKE.HEADS, [WAKE.HEADS]]);
  expect(w.holdAtHead(0)).toBe(true); // the first head: nothing armed at it
  w.afterHead(0);
  expect([w.of(0), announced]).toEqual([WAKE.ON, [WAKE.HEADS, WAKE.ON]]);
  now += 999;
  expect(w.holdAtHead(0)).toBe(true); // within the settle time
  now += 2;
  expect(w.holdAtHead(0)).toBe(false); // armed here
  armed = false;
  w.refresh();
  expect([w.of(0), announced]).toEqual([WAKE.OFF, [WAKE.HEADS, WAKE.ON, WAKE.OFF]]);
  // Woken, and no head within the grace: what waits fails with the reason, and it sleeps again.
  // The grace counts only while the head rank's agent is live with an engine client connected (a
  // job starting, an engine loading its model, is waited for, and what it waits on is said).
  armed = true;
  headWaiting = 'no engine client has said hello to rank 0\'s agent yet';
  w.refresh();
  now += 60000;
  w.refresh();
  expect([w.of(0), failed, w.waiting(0)]).toEqual([WAKE.HEADS, [], headWaiting]);
  headWaiting = undefined;
  now += 4000;
  w.refresh();
  expect(failed).toEqual([]);
  now += 1001;
  w.refresh();
  expect(failed).toEqual([expect.stringMatching(/^its engine sent no wave head within 5 s of the wake although its client said hello to rank 0's agent: is the engine stepping\?$/)]);
  expect([w.of(0), w.waiting(0)]).toEqual([WAKE.OFF, undefined]);
  // A config that keeps the bus on never needs a wake.
  const on = new ReplicaWake({ dp: 1, armed: () => true, busActive: () => true, failQueued: () => undefined, headRank: () => 0, headWaiting: () => undefined, announce: () => undefined, settleMs: 0 });
  on.refresh();
  expect([on.of(0), on.holdAtHead(0)]).toEqual([WAKE.OFF, false]);
});
