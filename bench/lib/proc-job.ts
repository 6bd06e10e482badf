// A job of real processes on loopback in which the caller plays the engine: a `wavebus coordinator`
// process (the guard, hot reload of the runtime config), one `wavebus agent` process per rank, and
// in this process one client per rank with a tiny KV pool in shared memory. DP replicas each have
// their own wave stream headed by their last-PP TP0 (pp = 1 here: the replica's TP0). Used by
// `bench soak` and by the fault tests that need to act between a wave vector and its copy.
import { spawn, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { requestStatus } from '../../src/bus/coordinator';
import { freePortPair } from '../../src/bus/ports';
import { COORDINATOR_NODE_FLAGS } from '../../src/bus/constants';
import type { CurveClientKeys } from '../../src/bus/curve';
import { WavebusClient, type EndOfWaveResult } from '../../src/client/client';
import { replicaDumpRanks, replicaHead, replicaOf, type WorldLayout } from '../../src/layout';
import { ShmSegment } from '../../src/memory';
import type { StepTelemetry } from '../../src/messages';
import { agentEndpoint, mailboxPath, packageRoot } from '../../src/paths';

export const POOL_BLOCKS = 16;
const SHAPE = [POOL_BLOCKS, 16, 1, 64]; // float16: 2 KiB per block
const REGION_BYTES = SHAPE.reduce((a, b) => a * b, 1) * 2;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface ProcJobOptions {
  world: number;
  dp: number;
  /** The agents' end_of_wave bound (ms). */
  boundMs: number;
  ackTimeoutMs: number;
  heartbeatMs?: number;
  /** The runtime config (the coordinator's overlay; manual dumps are later edits of the live file). */
  config: Record<string, unknown>;
  /** Extra coordinator flags (e.g. CURVE keys). */
  coordinatorArgs?: string[];
  /** Extra agent flags for rank g. */
  agentArgs?: (g: number) => string[];
  env?: NodeJS.ProcessEnv;
  /** CURVE client keys for status requests (a CURVE job). */
  statusCurve?: CurveClientKeys;
  /** Keep this many stderr chunks per process (diagnostics). */
  keepStderr?: number;
}

export interface Proc {
  child: ChildProcess;
  stderr: string[];
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export function alive(p: Proc | undefined): boolean {
  return !!p && p.child.exitCode === null && p.child.signalCode === null;
}

export class ProcJob {
  readonly layout: WorldLayout;
  readonly dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-procjob-'));
  readonly runDir = fs.mkdtempSync(path.join(fs.existsSync('/dev/shm') ? '/dev/shm' : os.tmpdir(), 'wbpj-'));
  readonly cfgPath = path.join(this.dir, 'runtime', 'config', 'runtime_config.json');
  readonly kvRoot = path.join(this.dir, 'runtime', 'report', 'kv_cache');
  port = 0;
  coordinator!: Proc;
  agents: Proc[] = [];
  clients: WavebusClient[] = [];
  private readonly segs: string[] = [];
  private readonly procs: Proc[] = [];
  private config: Record<string, unknown>;
  private readonly bin = path.join(packageRoot(), 'bin', 'wavebus.js');
  private readonly tag = `wbpj${process.pid}-${Math.random().toString(16).slice(2, 8)}`;

  constructor(readonly o: ProcJobOptions) {
    if (o.world % o.dp !== 0) throw new Error(`world ${o.world} is not a multiple of dp ${o.dp}`);
    this.layout = { worldSize: o.world, tp: o.world / o.dp, pp: 1, dp: o.dp, cp: 1 };
    this.config = o.config;
    fs.mkdirSync(path.dirname(this.cfgPath), { recursive: true });
    this.writeConfig(o.config);
  }

  /** Replace the live config file atomically (the coordinator's follower never sees half a file). */
  writeConfig(cfg: Record<string, unknown>): void {
    this.config = cfg;
    fs.writeFileSync(`${this.cfgPath}.edit`, JSON.stringify(cfg));
    fs.renameSync(`${this.cfgPath}.edit`, this.cfgPath);
  }

  /** Ask for manual dump number `n` (hot reload of dump.manual_dump): every replica serves it at its next head. */
  manualDump(n: number): void {
    const cfg = JSON.parse(JSON.stringify(this.config));
    cfg.dump = { ...cfg.dump, manual_dump: n };
    this.writeConfig(cfg);
  }

  private spawn(args: string[], nodeFlags: readonly string[] = []): Proc {
    const child = spawn(process.execPath, [...nodeFlags, this.bin, ...args], { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, WAVEBUS_LOG_LEVEL: process.env.WAVEBUS_LOG_LEVEL ?? 'warn', ...this.o.env } });
    const stderr: string[] = [];
    const keep = this.o.keepStderr ?? 200;
    child.stderr!.on('data', (b) => stderr.length < keep && stderr.push(String(b).slice(0, 2000)));
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) => child.once('exit', (code, signal) => r({ code, signal })));
    const p = { child, stderr, exited };
    this.procs.push(p);
    return p;
  }

  private layoutArgs(): string[] {
    const l = this.layout;
    return ['--world-size', String(l.worldSize), '--tp', String(l.tp), '--dp', String(l.dp)];
  }

  startCoordinator(): Proc {
    const hb = String(this.o.heartbeatMs ?? 500);
    const overlay = { ...this.config, dump: { ...(this.config.dump as object), manual_dump: 0 } };
    this.coordinator = this.spawn([
      'coordinator', '--port', String(this.port), ...this.layoutArgs(), '--heartbeat-ms', hb,
      '--dump-ack-timeout-ms', String(this.o.ackTimeoutMs), '--runtime-config-path', this.cfgPath, '--runtime-config-hot-reload',
      // startup writes defaults <- overlay to the live file (seed): a restarted coordinator too
      '--additional-config', JSON.stringify({ runtime_config: overlay }),
      ...(this.o.coordinatorArgs ?? []),
    ], COORDINATOR_NODE_FLAGS); // as the launcher starts it
    return this.coordinator;
  }

  startAgent(g: number): Proc {
    const n = this.o.world;
    this.agents[g] = this.spawn([
      'agent', '--coordinator', `127.0.0.1:${this.port}`, '--rank', String(g), '--local-rank', String(g), ...this.layoutArgs(),
      '--local-world-size', String(n), '--run-dir', this.runDir, '--heartbeat-ms', String(this.o.heartbeatMs ?? 500),
      '--end-of-wave-timeout-ms', String(this.o.boundMs), '--staging-mb', '16', '--dump-root', this.kvRoot,
      ...(this.o.agentArgs?.(g) ?? []),
    ]);
    return this.agents[g];
  }

  async status(timeoutMs = 2000): Promise<{ ready: boolean; wave: number; epoch: number; liveRanks: number[]; json: Record<string, any> }> {
    const s = await requestStatus({ host: '127.0.0.1', port: this.port }, timeoutMs, this.o.statusCurve);
    return { ...s, json: JSON.parse(s.statusJson) };
  }

  /** Start every process, wait until the bus is ready, connect one client per rank with its KV pool. */
  async start(readyMs = 60000 + this.o.world * 2000): Promise<void> {
    const by = Date.now() + readyMs;
    // A free port pair can be taken by another process before the coordinator binds it: try another.
    for (let attempt = 1; ; attempt++) {
      this.port = await freePortPair();
      this.startCoordinator();
      if (await this.coordinatorUp(by)) break;
      if (attempt >= 5 || Date.now() > by) throw new Error(`the coordinator did not start: ${this.coordinator.stderr.slice(-3).join(' | ')}`);
    }
    for (let g = 0; g < this.o.world; g++) this.startAgent(g);
    for (;;) {
      try {
        if ((await this.status(1000)).ready) break;
      } catch {
        /* not up yet */
      }
      if (Date.now() > by) throw new Error(`the bus was not ready in time: ${this.coordinator.stderr.slice(-3).join(' | ')}`);
      await sleep(200);
    }
    for (let g = 0; g < this.o.world; g++) {
      const name = `/${this.tag}-r${g}`;
      const seg = ShmSegment.create(name, 2 * REGION_BYTES);
      this.segs.push(name);
      seg.buffer().fill(g + 1);
      seg.close();
      const c = await WavebusClient.connect({ endpoint: agentEndpoint(this.runDir, g), mailbox: mailboxPath(this.runDir, g) });
      for (const [i, kv] of (['k', 'v'] as const).entries()) {
        await c.register({ name: `l0.${kv}`, kind: 'shm', shmName: name, offset: i * REGION_BYTES, nbytes: REGION_BYTES, dtype: 'float16', shape: SHAPE, role: 'kv_pool', layer: 'model.layers.0.self_attn', kv });
      }
      this.clients[g] = c;
    }
  }

  /** True once the coordinator answers status; false if it exited first. */
  private async coordinatorUp(by: number): Promise<boolean> {
    while (Date.now() < by) {
      if (!alive(this.coordinator)) return false;
      try {
        await this.status(1000);
        return true;
      } catch {
        await sleep(100);
      }
    }
    return false;
  }

  /** The rank heading replica r's wave stream, and its ranks. */
  head(replica: number): number {
    return replicaHead(this.layout, replica);
  }

  ranksOf(replica: number): number[] {
    return Array.from({ length: this.o.world }, (_, g) => g).filter((g) => replicaOf(g, this.layout) === replica);
  }

  /** The ranks that must hold each of replica r's dumps (its last-PP TP ranks). */
  dumpRanks(replica: number): number[] {
    return replicaDumpRanks(this.layout, replica);
  }

  /**
   * One step of replica r as a real engine runs it: its head opens wave w with the telemetry of
   * w-1; the forward (paceMs); every rank of the replica ends w.
   */
  async step(replica: number, w: number, telemetry: StepTelemetry | undefined, paceMs = 0): Promise<EndOfWaveResult[]> {
    await this.clients[this.head(replica)].waveHead(w, telemetry);
    if (paceMs > 0) await sleep(paceMs);
    return Promise.all(this.ranksOf(replica).map((g) => this.clients[g].endOfWave(w)));
  }

  /** Close the clients, stop every process (SIGTERM, then SIGKILL), remove shm, dirs. */
  async close(): Promise<void> {
    for (const c of this.clients) await c?.close().catch(() => undefined);
    for (const p of this.procs) if (alive(p)) p.child.kill('SIGCONT');
    for (const p of this.procs) if (alive(p)) p.child.kill('SIGTERM');
    const t = new Promise<void>((r) => setTimeout(r, 10000).unref());
    await Promise.race([Promise.all(this.procs.map((p) => p.exited)), t]);
    for (const p of this.procs) if (alive(p)) p.child.kill('SIGKILL');
    await Promise.race([Promise.all(this.procs.map((p) => p.exited)), new Promise<void>((r) => setTimeout(r, 5000).unref())]);
    for (const name of this.segs) {
      try {
        ShmSegment.unlink(name);
      } catch {
        /* gone */
      }
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
    fs.rmSync(this.runDir, { recursive: true, force: true });
  }
}
