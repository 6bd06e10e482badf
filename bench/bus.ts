// `wavebus bench bus --agents N [--waves W] [--pace-ms P] [--baseline|--no-baseline] --json`
//
// Latency of one wave vector from the coordinator's publish until the LAST of N agent
// processes has it. Agents are real processes (this file, started with --child) on loopback;
// each notes its receipt time with process.hrtime.bigint(), which reads CLOCK_MONOTONIC, a clock
// shared by every process on one Linux machine, and sends all its receipts in one message after
// the last wave: nothing but the bus runs on the agents while waves are measured. Waves are
// published every --pace-ms (default 2, a fast engine's step); a wave some agent never had is lost.
// Baseline: bench/gloo_bcast.py, the seeds' mechanism (gloo broadcast + barrier) on N ranks.
import { spawn, spawnSync, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import yargs from 'yargs';
import { Pull, Push } from 'zeromq';
import { AgentBus } from '../src/bus/agent-bus';
import { Coordinator } from '../src/bus/coordinator';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { freePort, freePortPair } from '../src/bus/ports';

const PYTHON = '/usr/bin/python3';
/** How long to wait for every agent's receipts after the end wave. */
const REPORT_TIMEOUT_MS = 10000;
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

/** Child mode: one agent that notes every wave it emits and reports them all after `endWave`. */
async function child(rank: number, world: number, port: number, reportPort: number, endWave: number): Promise<void> {
  const identity = resolveIdentity({}, { rank, worldSize: world });
  const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity, logger: createLogger(`bench-agent-${rank}`, 'warn') });
  const push = new Push({ linger: 0 });
  push.connect(`tcp://127.0.0.1:${reportPort}`);
  const receipts: string[] = [];
  bus.on('wave', (w) => {
    receipts.push(`${w.head.wave} ${process.hrtime.bigint()}`);
    if (w.head.wave >= endWave) void push.send(`${rank}\n${receipts.join('\n')}`);
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
    .option('pace-ms', { type: 'number', default: 2, describe: 'ms between two published waves (an engine stepping every 2 ms)' })
    .option('baseline', { type: 'boolean', describe: 'also run the gloo baseline (default: when /usr/bin/python3 has torch)' })
    .option('json', { type: 'boolean', default: true })
    .strict(false)
    .parseSync();
  const n = args.agents;
  const waves = args.waves;
  if (!Number.isInteger(n) || n < 1) throw new Error(`--agents: expected a positive integer, got ${args.agents}`);
  if (!Number.isInteger(waves) || waves < 1) throw new Error(`--waves: expected a positive integer, got ${args.waves}`);
  const pace = args['pace-ms'];
  if (!Number.isFinite(pace) || pace < 0) throw new Error(`--pace-ms: expected a non-negative number, got ${args['pace-ms']}`);

  const port = await freePortPair();
  const reportPort = await freePort();
  const log = createLogger('bench-bus', 'warn');
  const coordinator = new Coordinator({ port, layout: { worldSize: n, tp: n, pp: 1, dp: 1, cp: 1 }, logger: log });
  const pull = new Pull({ linger: 0 });
  await pull.bind(`tcp://127.0.0.1:${reportPort}`);
  await coordinator.start();

  // Receipts: per agent, all its receipt times, sent once after the end wave.
  const receipts = new Map<number, Map<number, bigint>>();
  const endWave = WARMUP + waves + 1;
  const receive = (async () => {
    for (;;) {
      let msg: Buffer[];
      try {
        msg = await pull.receive();
      } catch {
        return;
      }
      const [rank, ...lines] = msg[0].toString().split('\n');
      const mine = new Map<number, bigint>();
      for (const line of lines) {
        const [w, t] = line.split(' ');
        mine.set(Number(w), BigInt(t));
      }
      receipts.set(Number(rank), mine);
    }
  })();

  const self = __filename;
  const children: ChildProcess[] = [];
  for (let r = 0; r < n; r++) {
    children.push(spawn(process.execPath, [self, '--child', String(r), String(n), String(port), String(reportPort), String(endWave)], { stdio: ['ignore', 'ignore', 'inherit'] }));
  }
  const result: Record<string, unknown> = { agents: n, waves, pace_ms: pace };
  try {
    const deadline = Date.now() + 60000;
    while (!coordinator.ready) {
      if (Date.now() > deadline) throw new Error(`bench bus: agents not ready after 60 s (live: ${coordinator.liveRanks().join(',')})`);
      await new Promise((r) => setTimeout(r, 20));
    }
    const published = new Map<number, bigint>();
    for (let w = 1; w <= endWave; w++) {
      published.set(w, process.hrtime.bigint());
      coordinator.beginWave(w, null);
      await new Promise((r) => setTimeout(r, pace));
    }
    const until = Date.now() + REPORT_TIMEOUT_MS;
    while (receipts.size < n && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    const lat: number[] = [];
    let lost = 0;
    for (let w = WARMUP + 1; w < endWave; w++) {
      let last = -1n;
      let have = 0;
      for (const mine of receipts.values()) {
        const t = mine.get(w);
        if (t === undefined) continue;
        have++;
        if (t > last) last = t;
      }
      if (have < n) lost++;
      else lat.push(Number(last - published.get(w)!) / 1000);
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
  const [rank, world, port, reportPort, endWave] = process.argv.slice(3).map(Number);
  child(rank, world, port, reportPort, endWave).catch((e) => {
    process.stderr.write(`bench agent ${rank}: ${String(e)}\n`);
    process.exit(1);
  });
}
