// A whole job made of real processes, started piece by piece so that a test can kill and restart
// each piece: coordinator, one agent per rank and the simulated engine (`wavebus sim`). Shared by
// test/faults.test.ts and test/lookahead.test.ts.
import * as fs from 'fs';
import * as path from 'path';
import { requestStatus, type StatusReplyMsg } from '../src/bus/coordinator';
import { createTokenFile } from '../src/bus/auth';
import { CLI, cleanup, freePortPair, spawnTracked, spawnWavebus, tmpDir, waitFor, readManifests, type Spawned } from './helpers';

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A timer that does not keep jest alive (for races against a process exit). */
export const deadline = (ms: number) => new Promise<undefined>((r) => setTimeout(() => r(undefined), ms).unref());

export interface JobOptions {
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
  /**
   * Step until the test ends the run (engineResults() does), `steps` being then at most: a test whose
   * checks take wall time it does not control must not find the engine already finished.
   */
  untilStopped?: boolean;
  /** Wrap a process's argv (e.g. drop capabilities); default none. */
  wrapAgent?: (argv: string[]) => [string, string[]];
  wrapCoordinator?: (argv: string[]) => [string, string[]];
  /** The job's bus token (a 0600 file in its dir, as `wavebus launch` makes one): coordinator and agents take it. */
  busToken?: boolean;
  /** Extra environment of the agents (e.g. WAVEBUS_CACHE_ROOT, their snapshot root). */
  agentEnv?: Record<string, string>;
}

export interface RankResult {
  rank: number;
  steps: number;
  wallMs: number;
  endOfWaveTimeouts: number;
  dueWaves: number;
}

export interface Manifest {
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
export class Job {
  readonly dir = tmpDir('wavebus-faults-');
  readonly runDir: string;
  readonly resultDir: string;
  readonly configPath: string;
  readonly kvRoot: string;
  /** With untilStopped: the engine stops stepping once this file exists. */
  readonly stopFile: string;
  /** With busToken: the token file's path. */
  readonly tokenFile?: string;
  port = 0;
  coordinator!: Spawned;
  agents: Spawned[] = [];
  sim?: Spawned;
  private config: Record<string, unknown>;

  constructor(readonly o: JobOptions) {
    this.runDir = path.join(this.dir, 'run');
    this.resultDir = path.join(this.dir, 'ranks');
    this.stopFile = path.join(this.dir, 'stop-engine');
    this.configPath = path.join(this.dir, 'runtime', 'config', 'runtime_config.json');
    this.kvRoot = o.dumpRoot ?? path.join(this.dir, 'runtime', 'report', 'kv_cache');
    this.config = o.config ?? baseConfig();
    fs.mkdirSync(this.runDir, { recursive: true, mode: 0o700 }); // a run dir must be private
    if (o.busToken) this.tokenFile = createTokenFile(this.dir);
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

  private wrap(w: JobOptions['wrapAgent'], argv: string[], env?: Record<string, string>): Spawned {
    if (this.tokenFile) argv = [...argv, '--bus-token-file', this.tokenFile];
    const opts = env ? { env: { ...process.env, ...env } } : {};
    if (!w) return spawnWavebus(argv, opts);
    const [cmd, args] = w([process.execPath, CLI, ...argv]);
    return spawnTracked(cmd, args, opts);
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
    ], this.o.agentEnv);
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
        ...(this.o.untilStopped ? ['--stop-file', this.stopFile] : []),
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
    await this.until(async () => (await this.status()).wave >= wave, `wave ${wave}`, 60000, 50);
  }

  /** Wait for the engine to finish (with untilStopped: end its run); every rank must have run every step (untilStopped: some). */
  async engineResults(): Promise<RankResult[]> {
    const sim = this.sim!;
    if (this.o.untilStopped) fs.writeFileSync(this.stopFile, '');
    const done = await Promise.race([sim.exited, deadline(120000)]);
    if (!done) throw new Error(`the simulated engine did not finish:\n${sim.stderr().slice(-3000)}`);
    expect({ code: done.code, stderr: done.code === 0 ? '' : sim.stderr().slice(-3000) }).toEqual({ code: 0, stderr: '' });
    const out: RankResult[] = [];
    for (let g = 0; g < this.o.world; g++) out.push(JSON.parse(fs.readFileSync(path.join(this.resultDir, `rank${g}.json`), 'utf8')));
    for (const r of out) {
      if (!this.o.untilStopped) expect(r.steps).toBe(this.o.steps);
      else expect(r.steps > 0 && r.steps <= this.o.steps).toBe(true);
    }
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

export function tryKill(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    /* gone */
  }
}


/**
 * A test file's job starter: each job started is stopped after its test (with cleanup()), so a
 * failed assertion never leaves a job running into the next test.
 */
export function jobStarter(): (o: JobOptions) => Promise<Job> {
  const jobs: Job[] = [];
  afterEach(async () => {
    for (const j of jobs.splice(0)) await j.stop();
    await cleanup();
  });
  return async (o) => {
    const j = new Job(o);
    jobs.push(j);
    await j.start();
    return j;
  };
}
