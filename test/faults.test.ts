// Fault injection on a whole job made of real processes: coordinator, one agent per rank and the
// simulated engine (`wavebus sim`). Each test injects one fault and checks the guarantees of
// docs/faults.md: nothing under a final bundle name is partial, the engine's end_of_wave stays
// bounded (timeouts are counted, steps all run), the manifest names exactly the missing ranks,
// every dump whose copy finished verifies, and the job resumes by itself.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { requestStatus, type StatusReplyMsg } from '../src/bus/coordinator';
import { inspectTree } from '../src/tools/inspect';
import {
  CLI,
  cleanup,
  cleanupMounts,
  freePortPair,
  mountTmpfs,
  rootOnlyReason,
  spawnTracked,
  spawnWavebus,
  tmpDir,
  waitFor,
  readManifests,
  type Spawned,
} from './helpers';

jest.setTimeout(180000);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A timer that does not keep jest alive (for races against a process exit). */
const deadline = (ms: number) => new Promise<undefined>((r) => setTimeout(() => r(undefined), ms).unref());

interface JobOptions {
  world: number;
  steps: number;
  stepMs: number;
  requests?: number;
  faults?: Record<string, unknown>;
  /** Extra `wavebus sim` flags (KV geometry). */
  simArgs?: string[];
  ackTimeoutMs?: number;
  /** The agents' end_of_wave bound. */
  boundMs?: number;
  config?: Record<string, unknown>;
  /** KV dump root (default <dir>/runtime/report/kv_cache). */
  dumpRoot?: string;
  /** Wrap a process's argv (e.g. drop capabilities); default none. */
  wrapAgent?: (argv: string[]) => [string, string[]];
  wrapCoordinator?: (argv: string[]) => [string, string[]];
}

interface RankResult {
  rank: number;
  steps: number;
  wallMs: number;
  endOfWaveTimeouts: number;
  dueWaves: number;
}

interface Manifest {
  job_id: string;
  arm_wave: number;
  expected_ranks: number[];
  completed_ranks: number[];
  missing_ranks: number[];
  failed_ranks: Record<string, string>;
  skipped_ranks: Record<string, string>;
  complete: boolean;
  timed_out: boolean;
  dir: string;
}

const HEARTBEAT_MS = 150;

export function baseConfig(extra: Record<string, unknown> = {}): Record<string, unknown> {
  const on = { enabled: true, on_trigger: ['report', 'dump_kv'] };
  const dump = { auto_max_times: 100, auto_cooldown_seconds: 0, free_headroom_bytes: 0, format: 'pt', manual_dump: 0, ...((extra.dump as object) ?? {}) };
  return { detector: { logits_finite: on }, ...extra, dump };
}

/** A job on this machine, started piece by piece so that a test can kill and restart each piece. */
class Job {
  readonly dir = tmpDir('wavebus-faults-');
  readonly runDir: string;
  readonly resultDir: string;
  readonly configPath: string;
  readonly kvRoot: string;
  port = 0;
  coordinator!: Spawned;
  agents: Spawned[] = [];
  sim?: Spawned;
  private config: Record<string, unknown>;

  constructor(readonly o: JobOptions) {
    this.runDir = path.join(this.dir, 'run');
    this.resultDir = path.join(this.dir, 'ranks');
    this.configPath = path.join(this.dir, 'runtime', 'config', 'runtime_config.json');
    this.kvRoot = o.dumpRoot ?? path.join(this.dir, 'runtime', 'report', 'kv_cache');
    this.config = o.config ?? baseConfig();
    fs.mkdirSync(this.runDir, { recursive: true, mode: 0o700 }); // a run dir must be private
    this.writeConfig(this.config);
  }

  writeConfig(cfg: Record<string, unknown>): void {
    this.config = cfg;
    fs.mkdirSync(path.dirname(this.configPath), { recursive: true });
    const tmp = `${this.configPath}.edit`;
    fs.writeFileSync(tmp, JSON.stringify(cfg, null, 2));
    fs.renameSync(tmp, this.configPath); // the follower never sees a half-written file
  }

  /** Ask for a manual dump of every running request (hot reload of dump.manual_dump). */
  manualDump(n: number, dump: Record<string, unknown> = {}): void {
    const cfg = JSON.parse(JSON.stringify(this.config));
    cfg.dump = { ...cfg.dump, ...dump, manual_dump: n };
    this.writeConfig(cfg);
  }

  private wrap(w: JobOptions['wrapAgent'], argv: string[]): Spawned {
    if (!w) return spawnWavebus(argv);
    const [cmd, args] = w([process.execPath, CLI, ...argv]);
    return spawnTracked(cmd, args);
  }

  startCoordinator(): Spawned {
    const argv = [
      'coordinator', '--port', String(this.port), '--world-size', String(this.o.world), '--tp', String(this.o.world),
      '--heartbeat-ms', String(HEARTBEAT_MS), '--dump-ack-timeout-ms', String(this.o.ackTimeoutMs ?? 3000),
      '--runtime-config-path', this.configPath, '--runtime-config-hot-reload', '--metrics-port', '0',
      // startup rewrites the file from defaults ← overlay: the job's config is the overlay (a
      // restarted coordinator too; manual dumps are asked for by later edits of the live file)
      '--additional-config', JSON.stringify({ runtime_config: { ...this.config, dump: { ...(this.config.dump as object), manual_dump: 0 } } }),
    ];
    if (this.o.dumpRoot) argv.push('--runtime-dump-dir', this.o.dumpRoot);
    this.coordinator = this.wrap(this.o.wrapCoordinator, argv);
    return this.coordinator;
  }

  startAgent(g: number): Spawned {
    const a = this.wrap(this.o.wrapAgent, [
      'agent', '--coordinator', `127.0.0.1:${this.port}`, '--rank', String(g), '--local-rank', String(g),
      '--world-size', String(this.o.world), '--local-world-size', String(this.o.world), '--tp', String(this.o.world),
      '--run-dir', this.runDir, '--heartbeat-ms', String(HEARTBEAT_MS), '--end-of-wave-timeout-ms', String(this.o.boundMs ?? 200),
      '--staging-mb', '256', '--dump-root', this.kvRoot,
    ]);
    this.agents[g] = a;
    return a;
  }

  async start(): Promise<void> {
    this.port = await freePortPair();
    this.startCoordinator();
    for (let g = 0; g < this.o.world; g++) this.startAgent(g);
    await waitFor(async () => (await this.status()).ready, 'the bus to be ready', 30000, 100);
    this.sim = spawnWavebus(
      [
        'sim', '--nproc-per-node', String(this.o.world), '--steps', String(this.o.steps), '--step-ms', String(this.o.stepMs),
        '--requests', String(this.o.requests ?? 8), '--result-dir', this.resultDir, '--faults', JSON.stringify(this.o.faults ?? {}),
        ...(this.o.simArgs ?? []),
      ],
      {
        env: {
          ...process.env,
          WAVEBUS_RUN_DIR: this.runDir,
          WAVEBUS_TP: String(this.o.world),
          WAVEBUS_NNODES: '1',
          WAVEBUS_NODE_RANK: '0',
          WAVEBUS_NPROC_PER_NODE: String(this.o.world),
          MASTER_ADDR: '127.0.0.1',
        },
      },
    );
  }

  async status(timeoutMs = 1000): Promise<StatusReplyMsg & { json: Record<string, any> }> {
    const s = await requestStatus({ host: '127.0.0.1', port: this.port }, timeoutMs);
    return { ...s, json: JSON.parse(s.statusJson) };
  }

  async waitWave(wave: number): Promise<void> {
    await waitFor(async () => (await this.status()).wave >= wave, `wave ${wave}`, 60000, 50);
  }

  /** Wait for the engine to finish; every rank must have run every step. */
  async engineResults(): Promise<RankResult[]> {
    const sim = this.sim!;
    const done = await Promise.race([sim.exited, deadline(120000)]);
    if (!done) throw new Error(`the simulated engine did not finish:\n${sim.stderr().slice(-3000)}`);
    expect({ code: done.code, stderr: done.code === 0 ? '' : sim.stderr().slice(-3000) }).toEqual({ code: 0, stderr: '' });
    const out: RankResult[] = [];
    for (let g = 0; g < this.o.world; g++) out.push(JSON.parse(fs.readFileSync(path.join(this.resultDir, `rank${g}.json`), 'utf8')));
    for (const r of out) expect(r.steps).toBe(this.o.steps);
    return out;
  }

  manifests(): (Manifest & { dir: string })[] {
    return readManifests<Manifest>(this.kvRoot);
  }

  /** waitFor, with the job's state in the error when it times out (for CI logs). */
  async until<T>(fn: () => T | Promise<T>, what: string, timeoutMs: number, everyMs = 50): Promise<NonNullable<T>> {
    try {
      return await waitFor(fn, what, timeoutMs, everyMs);
    } catch (e) {
      let st = '';
      try {
        st = JSON.stringify((await this.status()).json);
      } catch (e2) {
        st = String(e2);
      }
      const brief = this.manifests().map((m) => ({ job: m.job_id, done: m.completed_ranks, missing: m.missing_ranks, failed: m.failed_ranks, skipped: m.skipped_ranks, timed_out: m.timed_out }));
      throw new Error(`${(e as Error).message}\nsim: ${this.sim?.stderr().slice(-1500)}\nstatus: ${st}\nmanifests: ${JSON.stringify(brief)}\ncoordinator: ${this.coordinator.stderr().slice(-3000)}\nagent1: ${this.agents[1]?.stderr().slice(-1500)}`);
    }
  }

  /** SIGTERM the engine (it forwards to its ranks) so no rank process outlives the test. */
  async stop(): Promise<void> {
    const sim = this.sim;
    if (sim && sim.child.exitCode === null && sim.child.signalCode === null) {
      sim.child.kill('SIGTERM');
      await Promise.race([sim.exited, deadline(5000)]);
    }
    for (const a of this.agents) if (a?.child.pid) tryKill(a.child.pid, 'SIGCONT');
  }
}

function tryKill(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    /* gone */
  }
}

/** The guarantees every fault test checks on the dump tree. */
function checkTree(root: string, allowedMissing: (problem: string) => boolean): ReturnType<typeof inspectTree> {
  const r = inspectTree(root, { verify: true });
  const unexpected = r.problems.filter((p) => !allowedMissing(p));
  expect(unexpected).toEqual([]);
  // Temp dirs of interrupted writers are allowed, but only under a hidden (leading '.') name.
  for (const t of r.incomplete) expect(path.basename(t).startsWith('.')).toBe(true);
  // Every rank bundle under a final name verified (sizes and checksums) and its tensors parse.
  for (const b of r.bundles.filter((x) => x.kind === 'kv_dump')) {
    expect(b.problems).toEqual([]);
    expect(b.files.length).toBeGreaterThan(0);
    for (const f of b.files) expect(f.verified).toBe(true);
    expect(b.tensors.length).toBeGreaterThan(0);
  }
  return r;
}

/** Find a writer's temp dir `.dp0_tp<g>_pp0_cp0.tmp-...` (tp = world) anywhere under root. */
function findTemp(root: string, rank: number): string | undefined {
  const want = `.dp0_tp${rank}_pp0_cp0.tmp-`;
  const walk = (d: string, depth: number): string | undefined => {
    let names: string[];
    try {
      names = fs.readdirSync(d);
    } catch {
      return undefined;
    }
    for (const n of names) {
      if (n.startsWith(want)) return path.join(d, n);
      if (depth < 3 && !n.includes('.')) {
        const hit = walk(path.join(d, n), depth + 1);
        if (hit) return hit;
      }
    }
    return undefined;
  };
  return walk(root, 0);
}

/** Sanity bound only (the machine is noisy): the engine never stalled far beyond its steps and counted waits. */
function checkBounded(r: RankResult, o: JobOptions): void {
  const bound = (o.boundMs ?? 200) + 20;
  expect(r.wallMs).toBeLessThan(r.steps * (o.stepMs + 5) + r.endOfWaveTimeouts * (bound + 50) + 15000);
}

const jobs: Job[] = [];
async function startJob(o: JobOptions): Promise<Job> {
  const j = new Job(o);
  jobs.push(j);
  await j.start();
  return j;
}

afterEach(async () => {
  for (const j of jobs.splice(0)) await j.stop();
  await cleanup();
  cleanupMounts();
});

// KV geometry big enough that a rank's bundle takes a while to write (16 fsynced files of 256 KiB).
const BIG_KV = ['--layers', '16', '--num-blocks', '96', '--kv-heads', '8', '--head-dim', '256'];

describe('faults', () => {
  test('kill -9 of an agent in the middle of a bundle write', async () => {
    const job = await startJob({ world: 2, steps: 80, stepMs: 60, requests: 3, ackTimeoutMs: 3000, simArgs: BIG_KV, faults: { nonFinite: { request: 0, at: 10 } } });
    const victim = job.agents[1];
    // Kill rank 1's agent the moment its temp bundle dir appears (polled every millisecond).
    const temp = await job.until(
      () => {
        const t = findTemp(job.kvRoot, 1);
        if (t) victim.child.kill('SIGKILL');
        return t;
      },
      "rank 1's bundle write",
      30000,
      1,
    );
    await victim.exited;
    expect(fs.existsSync(temp)).toBe(true); // killed mid-write: the temp dir stays, hidden
    // The job resumes: a new agent for rank 1 takes over its socket and mailbox and rejoins by itself.
    job.startAgent(1);

    // After the ack timeout the manifest names exactly rank 1 as missing.
    const jobDir = path.dirname(temp);
    const m = await job.until(() => job.manifests().find((x) => x.dir === jobDir && x.timed_out), 'the manifest of the interrupted dump', 20000, 50);
    expect(m.missing_ranks).toEqual([1]);
    expect(m.completed_ranks).toEqual([0]);
    expect(fs.existsSync(path.join(jobDir, 'dp0_tp1_pp0_cp0'))).toBe(false);

    await job.until(async () => (await job.status()).liveRanks.includes(1), 'rank 1 to rejoin', 20000, 100);
    const rejoined = (await job.status()).wave;
    job.manualDump(1);
    const later = await job.until(
      () => {
        const ms = job.manifests().filter((x) => x.arm_wave > rejoined);
        return ms.length > 0 && ms.every((x) => x.missing_ranks.length === 0) ? ms : undefined;
      },
      'a dump after the restart acked by every rank',
      40000,
      100,
    );
    for (const x of later) {
      // The new agent refuses the engine's client until it says hello again (ERR_NO_HELLO); the client
      // then re-sends its hello and KV regions within the step's bound, so the dump is whole.
      expect(x.completed_ranks).toEqual([0, 1]);
    }

    const results = await job.engineResults();
    for (const r of results) checkBounded(r, job.o);

    const tree = checkTree(job.kvRoot, (p) => p.includes('rank 1 missing'));
    expect(tree.incomplete.map((t) => path.join(job.kvRoot, t))).toContain(temp);
    // Rank 0's bundle of the interrupted dump is complete and recoverable.
    expect(tree.bundles.some((b) => b.kind === 'kv_dump' && b.dir === path.relative(job.kvRoot, path.join(jobDir, 'dp0_tp0_pp0_cp0')))).toBe(true);
  });

  test('coordinator killed and restarted mid-run: agents resync to the new epoch, later incidents still dump', async () => {
    const job = await startJob({ world: 2, steps: 100, stepMs: 60, ackTimeoutMs: 3000 });
    await job.waitWave(8);
    const before = await job.status();
    job.coordinator.child.kill('SIGKILL');
    await job.coordinator.exited;
    await sleep(1000); // the engine keeps stepping with no coordinator
    job.startCoordinator();
    const after = await job.until(
      async () => {
        const s = await job.status();
        const ranks = Object.values(s.json.ranks ?? {}) as { epoch_seen: number; live: boolean }[];
        return s.ready && s.epoch !== before.epoch && ranks.length === 2 && ranks.every((r) => r.live && r.epoch_seen === s.epoch) ? s : undefined;
      },
      'every agent to resync to the new epoch',
      20000,
      100,
    );
    expect(after.liveRanks).toEqual([0, 1]);
    await job.waitWave(after.wave + 1); // waves flow again
    const restartWave = (await job.status()).wave;
    job.manualDump(1);
    const done = await job.until(
      () => {
        const ms = job.manifests().filter((m) => m.arm_wave > restartWave);
        return ms.length > 0 && ms.every((m) => m.complete) ? ms : undefined;
      },
      'a complete dump after the restart',
      30000,
      100,
    );
    for (const m of done) expect(m.completed_ranks).toEqual([0, 1]);
    const results = await job.engineResults();
    for (const r of results) {
      expect(r.endOfWaveTimeouts).toBeGreaterThan(0); // the outage was felt, and bounded
      checkBounded(r, job.o);
    }
    checkTree(job.kvRoot, () => false);
  });

  test('a slow rank: its late ack is first reported missing, then completes the manifest', async () => {
    const job = await startJob({
      world: 2, steps: 20, stepMs: 30, requests: 2, ackTimeoutMs: 500,
      faults: { nonFinite: { request: 0, at: 6 }, slowRank: { rank: 1, extraMs: 250 } },
    });
    const first = await job.until(() => job.manifests()[0], 'the manifest of the dump', 30000, 20);
    expect(first.timed_out).toBe(true);
    expect(first.missing_ranks).toEqual([1]);
    expect(first.completed_ranks).toEqual([0]);
    const results = await job.engineResults();
    const last = await job.until(() => job.manifests().find((m) => m.complete), 'the late ack to complete the manifest', 20000, 50);
    expect(last.completed_ranks).toEqual([0, 1]);
    expect(last.missing_ranks).toEqual([]);
    for (const r of results) checkBounded(r, job.o);
    checkTree(job.kvRoot, () => false);
  });

  test('a frozen agent (SIGSTOP): engine bounded, rank reported missing and not live, then it recovers', async () => {
    const job = await startJob({ world: 2, steps: 100, stepMs: 80, ackTimeoutMs: 1500, boundMs: 100, faults: { nonFinite: { request: 0, at: 20 } } });
    await job.waitWave(14);
    const agent = job.agents[1];
    agent.child.kill('SIGSTOP');
    try {
      await job.until(async () => !(await job.status()).liveRanks.includes(1), 'rank 1 to be marked not live', 10000, 50);
      const m = await job.until(() => job.manifests().find((x) => x.timed_out), 'the dump armed during the freeze to time out', 20000, 20);
      expect(m.missing_ranks).toEqual([1]);
      expect(m.completed_ranks).toEqual([0]);
    } finally {
      agent.child.kill('SIGCONT');
    }
    await job.until(async () => (await job.status()).liveRanks.includes(1), 'rank 1 to be live again', 20000, 50);
    const resumed = (await job.status()).wave;
    job.manualDump(1);
    const later = await job.until(
      () => {
        const ms = job.manifests().filter((x) => x.arm_wave > resumed);
        // complete: every rank acked (a rank still catching up may ack after the timeout)
        return ms.length > 0 && ms.every((x) => x.complete) ? ms : undefined;
      },
      'a complete dump after the freeze',
      30000,
      100,
    );
    for (const x of later) expect(x.completed_ranks).toEqual([0, 1]);
    const results = await job.engineResults();
    expect(results[1].endOfWaveTimeouts).toBeGreaterThan(0);
    for (const r of results) checkBounded(r, job.o);
    checkTree(job.kvRoot, (p) => /rank 1 missing/.test(p));
  });

  describe('disk faults (root: tmpfs and capabilities)', () => {
    const why = rootOnlyReason();
    if (why) {
      test.skip(`skipped: ${why}`, () => undefined);
      return;
    }

    // One request of 4 blocks; 5 layers × K,V × 4 blocks × 16 KiB = 640 KiB per rank, so the
    // free-space rule (estimate × tp_size + headroom) asks for 1280 KiB with headroom 0. A 1320 KiB
    // tmpfs passes that check, but the 20 .pt files take a header and a partly filled page each
    // beyond their tensor bytes: the writes run out of room.
    const SMALL_KV = ['--layers', '5', '--num-blocks', '16', '--kv-heads', '8', '--head-dim', '128'];

    test('ENOSPC: the free-space check refuses, and a real ENOSPC mid-write leaves nothing partial', async () => {
      const root = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-enospc-'));
      mountTmpfs(root, '1320k');
      const job = await startJob({
        world: 2, steps: 45, stepMs: 60, requests: 1, ackTimeoutMs: 3000, simArgs: SMALL_KV, dumpRoot: root,
        config: baseConfig({ dump: { free_headroom_bytes: 8 * 2 ** 20 } }),
        faults: { nonFinite: { request: 0, at: 5 } },
      });
      // 1) headroom 8 MiB on a 1.3 MiB disk: both ranks refuse before copying.
      const refused = await job.until(() => job.manifests().find((m) => Object.keys(m.skipped_ranks).length === 2), 'the refused dump', 20000, 50);
      expect(refused.skipped_ranks).toEqual({ 0: 'insufficient_free_space', 1: 'insufficient_free_space' });
      expect(refused.missing_ranks).toEqual([]);
      for (const g of [0, 1]) {
        const skipped = JSON.parse(fs.readFileSync(path.join(refused.dir, `dp0_tp${g}_pp0_cp0`, 'dump_skipped.json'), 'utf8'));
        expect(skipped.reason).toBe('insufficient_free_space');
      }
      // 2) headroom 0: both ranks pass the estimate × tp_size, the disk fills during the writes.
      const wave = (await job.status()).wave;
      job.manualDump(1, { free_headroom_bytes: 0 });
      const full = await job.until(
        () => job.manifests().find((m) => m.arm_wave > wave && m.completed_ranks.length + Object.keys(m.failed_ranks).length === 2),
        'the dump that fills the disk',
        30000,
        50,
      );
      const failed = Object.entries(full.failed_ranks);
      expect(failed.length).toBeGreaterThanOrEqual(1);
      for (const [, err] of failed) expect(err).toMatch(/ENOSPC|no space/i);
      expect(full.missing_ranks).toEqual([]);
      const results = await job.engineResults();
      for (const r of results) checkBounded(r, job.o);
      const tree = checkTree(root, (p) => failed.some(([g]) => p.includes(`rank ${g} missing`)) || p.includes('missing (dump_skipped.json present)'));
      expect(tree.incomplete).toEqual([]); // aborted writers removed their temp dirs
      for (const g of full.completed_ranks) expect(tree.bundles.some((b) => b.kind === 'kv_dump' && b.ranks[0] === g)).toBe(true);
    });

    test('EACCES: agents that cannot write the dump dir ack the failure; nothing partial, engine unaffected', async () => {
      // The coordinator creates the dump dirs read-only (umask 0222; it is root and still writes its
      // JSON there); the agents run without CAP_DAC_OVERRIDE, so the dirs refuse them with EACCES.
      const job = await startJob({
        world: 2, steps: 40, stepMs: 50, requests: 2, ackTimeoutMs: 3000, simArgs: SMALL_KV,
        faults: { nonFinite: { request: 0, at: 6 } },
        wrapCoordinator: (argv) => ['sh', ['-c', 'umask 0222; exec "$@"', 'sh', ...argv]],
        wrapAgent: (argv) => ['setpriv', ['--bounding-set', '-dac_override,-dac_read_search', ...argv]],
      });
      const m = await job.until(() => job.manifests().find((x) => Object.keys(x.failed_ranks).length === 2), 'the failed acks', 20000, 50);
      for (const g of ['0', '1']) expect(m.failed_ranks[g]).toMatch(/EACCES|permission denied/i);
      expect(m.missing_ranks).toEqual([]);
      const results = await job.engineResults();
      for (const r of results) checkBounded(r, job.o);
      const tree = checkTree(job.kvRoot, (p) => /rank [01] missing/.test(p));
      expect(tree.incomplete).toEqual([]);
      expect(tree.bundles.filter((b) => b.kind === 'kv_dump')).toEqual([]);
    });
  });
});
