// `wavebus bench bus --agents N [--waves W] [--baseline|--no-baseline] --json`
//
// Latency of one wave vector from the coordinator's publish until the LAST of N agent
// processes has it. Agents are real processes (this file, started with --child) on loopback;
// each reports receipt over a PUSH socket with its process.hrtime.bigint(), which reads
// CLOCK_MONOTONIC, a clock shared by every process on one Linux machine. Waves are paced: the
// next one is published when every agent has the previous one (or after a timeout: lost).
// Baseline: bench/gloo_bcast.py, the seeds' mechanism (gloo broadcast + barrier) on N ranks.
import { spawn, spawnSync, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import yargs from 'yargs';
import { Pull, Push } from 'zeromq';
import { AgentBus } from '../src/bus/agent-bus';
import { Coordinator } from '../src/bus/coordinator';
import { resolveIdentity } from '../src/identity';
import { createLogger } from '../src/log';
import { freePort, freePortPair } from '../src/ports';

const PYTHON = '/usr/bin/python3';
const WAVE_TIMEOUT_MS = 500;
const WARMUP = 20;

function percentile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * q))];
}

const round = (x: number) => Math.round(x * 10) / 10;

function hasTorch(): boolean {
  if (!fs.existsSync(PYTHON)) return false;
  return spawnSync(PYTHON, ['-c', 'import torch.distributed'], { timeout: 60000 }).status === 0;
}

async function glooBaseline(agents: number): Promise<{ gloo_p50_us?: number; gloo_p99_us?: number; gloo_error?: string }> {
  const script = path.resolve(__dirname, '..', '..', 'bench', 'gloo_bcast.py');
  const alt = path.resolve(__dirname, 'gloo_bcast.py'); // when run from the sources
  const file = fs.existsSync(script) ? script : alt;
  const port = await freePort();
  return new Promise((resolve) => {
    const child = spawn(PYTHON, [file, String(agents), String(port), '300'], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, OMP_NUM_THREADS: '1' } });
    let out = '';
    let err = '';
    child.stdout.on('data', (b) => (out += b));
    child.stderr.on('data', (b) => (err += b));
    const timer = setTimeout(() => child.kill('SIGKILL'), 90000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      try {
        const r = JSON.parse(out.trim().split('\n').pop() ?? '');
        if (code === 0 && typeof r.gloo_p50_us === 'number') return resolve({ gloo_p50_us: round(r.gloo_p50_us), gloo_p99_us: round(r.gloo_p99_us) });
      } catch {
        /* fall through */
      }
      resolve({ gloo_error: `gloo_bcast.py exited ${code}: ${(err || out).trim().split('\n').slice(-3).join(' | ')}` });
    });
  });
}

/** Child mode: one agent that reports every wave it emits. */
async function child(rank: number, world: number, port: number, reportPort: number): Promise<void> {
  const identity = resolveIdentity({}, { rank, worldSize: world });
  const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity, logger: createLogger(`bench-agent-${rank}`, 'warn') });
  const push = new Push({ linger: 0 });
  push.connect(`tcp://127.0.0.1:${reportPort}`);
  const queue: string[] = [];
  let sending = false;
  const pump = async () => {
    sending = true;
    while (queue.length) await push.send(queue.shift()!);
    sending = false;
  };
  bus.on('wave', (w) => {
    queue.push(`${rank} ${w.head.wave} ${process.hrtime.bigint()}`);
    if (!sending) void pump();
  });
  await bus.start();
  const stop = async () => {
    await bus.stop();
    push.close();
    process.exit(0);
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  process.once('disconnect', stop);
}

export async function run(argv: string[]): Promise<Record<string, unknown>> {
  const args = yargs(argv)
    .option('agents', { type: 'number', default: 8 })
    .option('waves', { type: 'number', default: 1000 })
    .option('baseline', { type: 'boolean', describe: 'also run the gloo baseline (default: when /usr/bin/python3 has torch)' })
    .option('json', { type: 'boolean', default: true })
    .strict(false)
    .parseSync();
  const n = args.agents;
  const waves = args.waves;
  if (!Number.isInteger(n) || n < 1) throw new Error(`--agents: expected a positive integer, got ${args.agents}`);
  if (!Number.isInteger(waves) || waves < 1) throw new Error(`--waves: expected a positive integer, got ${args.waves}`);

  const port = await freePortPair();
  const reportPort = await freePort();
  const log = createLogger('bench-bus', 'warn');
  const coordinator = new Coordinator({ port, layout: { worldSize: n, tp: n, pp: 1, dp: 1, cp: 1 }, logger: log });
  const pull = new Pull({ linger: 0 });
  await pull.bind(`tcp://127.0.0.1:${reportPort}`);
  await coordinator.start();

  // Receipts: per wave, how many agents have it and the latest receipt time.
  const got = new Map<number, { count: number; last: bigint }>();
  let waiting: { wave: number; resolve: () => void } | undefined;
  const receive = (async () => {
    for (;;) {
      let msg: Buffer[];
      try {
        msg = await pull.receive();
      } catch {
        return;
      }
      const [, w, t] = msg[0].toString().split(' ');
      const wave = Number(w);
      const r = got.get(wave) ?? { count: 0, last: 0n };
      r.count++;
      const tt = BigInt(t);
      if (tt > r.last) r.last = tt;
      got.set(wave, r);
      if (waiting && waiting.wave === wave && r.count >= n) waiting.resolve();
    }
  })();

  const self = __filename;
  const children: ChildProcess[] = [];
  for (let r = 0; r < n; r++) {
    children.push(spawn(process.execPath, [self, '--child', String(r), String(n), String(port), String(reportPort)], { stdio: ['ignore', 'ignore', 'inherit'] }));
  }
  const result: Record<string, unknown> = { agents: n, waves };
  try {
    const deadline = Date.now() + 60000;
    while (!coordinator.ready) {
      if (Date.now() > deadline) throw new Error(`bench bus: agents not ready after 60 s (live: ${coordinator.liveRanks().join(',')})`);
      await new Promise((r) => setTimeout(r, 20));
    }
    const lat: number[] = [];
    let lost = 0;
    for (let w = 1; w <= WARMUP + waves; w++) {
      const done = new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => resolve(false), WAVE_TIMEOUT_MS);
        waiting = { wave: w, resolve: () => (clearTimeout(timer), resolve(true)) };
      });
      const t0 = process.hrtime.bigint();
      coordinator.beginWave(w, null);
      const ok = await done;
      waiting = undefined;
      if (w <= WARMUP) continue;
      if (!ok) lost++;
      else lat.push(Number(got.get(w)!.last - t0) / 1000);
      got.delete(w);
    }
    lat.sort((a, b) => a - b);
    Object.assign(result, { p50_us: round(percentile(lat, 0.5)), p99_us: round(percentile(lat, 0.99)), lost });
  } finally {
    for (const c of children) c.kill('SIGTERM');
    await Promise.all(children.map((c) => (c.exitCode !== null ? null : new Promise((r) => c.once('exit', r)))));
    pull.close();
    await receive;
    await coordinator.stop();
  }
  const baseline = args.baseline ?? hasTorch();
  if (baseline) {
    const g = await glooBaseline(n);
    Object.assign(result, g);
    if (g.gloo_p50_us) result.ratio = Math.round(((result.p50_us as number) / g.gloo_p50_us) * 1000) / 1000;
  }
  return result;
}

if (require.main === module && process.argv[2] === '--child') {
  const [rank, world, port, reportPort] = process.argv.slice(3).map(Number);
  child(rank, world, port, reportPort).catch((e) => {
    process.stderr.write(`bench agent ${rank}: ${String(e)}\n`);
    process.exit(1);
  });
}
