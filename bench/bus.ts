// `wavebus bench bus --agents N [--waves W] [--pace-ms P] [--rounds R] [--bus-token|--no-bus-token]
//  [--baseline|--no-baseline] [--bare|--no-bare] --json`
//
// Latency of one wave vector from the coordinator's publish until the LAST of N agent
// processes has it. Agents are real processes (this file, started with --child) on loopback;
// each notes its receipt times with process.hrtime.bigint() (CLOCK_MONOTONIC, shared by every
// process on one Linux machine) and sends them all in one message after the last wave
// (lib/bus-receipts.ts): nothing but the bus runs on the agents while waves are measured. Waves are
// published every --pace-ms (default 2, a fast engine's step); a wave some agent never had is lost.
// Floor: the same N as bare zeromq.js subscribers (lib/bus-bare.ts), in the same run: --rounds
// rounds, each one wavebus run and one bare run, in alternating order (this host is noisy).
// Hops: where each wave's time goes (see `hops` in the output), and the CPU of each step (lib/bus-hops.ts).
// Baseline: bench/gloo_bcast.py, the seeds' mechanism (gloo broadcast + barrier) on N ranks.
import { spawn, spawnSync, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { AgentBus } from '../src/bus/agent-bus';
import { BusToken, createTokenFile } from '../src/bus/auth';
import { Coordinator } from '../src/bus/coordinator';
import { MailboxReader, MailboxWriter } from '../src/client/mailbox';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { freePort, freePortPair } from '../src/bus/ports';
import { bareBus } from './lib/bus-bare';
import { cpuHops } from './lib/bus-hops';
import { hop, lastReceipt, p50p99, ReceiptLog, Receipts, round, type ReceiptTimes } from './lib/bus-receipts';
import type { BenchArgs, BenchFlags } from './lib/flags';

export const summary = 'Wave-head latency from the coordinator to N agent processes on loopback, against bare zeromq.js PUB/SUB (and gloo when torch is there), in the same run.';
export const flags = {
  agents: { type: 'int', default: 8, describe: 'agent processes' },
  waves: { type: 'int', default: 1000, describe: 'waves per round' },
  'pace-ms': { type: 'number', default: 2, describe: 'ms between two published waves (an engine stepping every 2 ms)' },
  rounds: { type: 'int', default: 3, describe: 'rounds of (wavebus run, bare run), interleaved' },
  'bus-token': { type: 'boolean', default: true, describe: 'MAC every frame with a bus token, as `wavebus launch` does on one host' },
  mailbox: { type: 'boolean', default: true, describe: "agents write each vector to a mailbox; a client stand-in waits on rank 0's" },
  bare: { type: 'boolean', default: true, describe: 'also run the floor: bare zeromq.js PUB to N SUB processes' },
  'bare-subscribers': { type: 'int', default: 0, describe: 'SUB processes of the floor (0: as many as --agents; 1: the floor a host receiver is held to)' },
  baseline: { type: 'boolean', describe: 'also run the gloo baseline (default: when /usr/bin/python3 has torch)' },
  'bare-one': { type: 'boolean', default: true, describe: "also run bare zeromq.js PUB to ONE SUB process each round (issue #34's floor: one subscriber per host)" },
} satisfies BenchFlags;

const PYTHON = '/usr/bin/python3';
/** How long to wait for every agent's receipts after the end wave. */
const REPORT_TIMEOUT_MS = 10000;
const WARMUP = 20;
/** The receipt rank of the engine-client stand-in that waits on rank 0's mailbox. */
const READER = 1000000;

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

/** Bench-only instrumentation: the time the last SUB message left zeromq.js, before the bus read it. */
function arrivalStamps(bus: AgentBus): () => bigint {
  let arrived = 0n;
  const inner = bus as unknown as { onSubMessage(parts: Buffer[]): void };
  const onSubMessage = inner.onSubMessage.bind(bus);
  inner.onSubMessage = (parts) => {
    arrived = process.hrtime.bigint();
    onSubMessage(parts);
  };
  return () => arrived;
}

/**
 * Child mode: one agent. As on a host of `wavebus launch` (docs/bus.md, "One receiver per host"),
 * agent 0 is the host's receiver (it writes every rank's mailbox); the others follow only heads
 * with work, so they never wake here (the bench publishes plain heads).
 */
async function child(rank: number, world: number, port: number, reportPort: number, endWave: number, tokenFile: string, mailboxDir: string): Promise<void> {
  const identity = resolveIdentity({}, { rank, worldSize: world });
  const busToken = tokenFile === '-' ? undefined : BusToken.load(tokenFile, 'bench bus token');
  const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity, busToken, lanesOnly: rank !== 0, logger: createLogger(`bench-agent-${rank}`, 'warn') });
  if (rank !== 0) return keepAlive(bus);
  const owned = Array.from({ length: world }, (_, r) => r);
  const mailboxes = mailboxDir === '-' ? [] : owned.map((r) => MailboxWriter.create(path.join(mailboxDir, `mailbox-${r}`), r));
  return receiver(bus, mailboxes, owned, reportPort, endWave);
}

/** A lanes-only agent: on the bus, asleep through plain waves. */
async function keepAlive(bus: AgentBus): Promise<void> {
  await bus.start();
  const stop = async () => {
    await bus.stop();
    process.exit(0);
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}

/**
 * The host receiver: per wave it writes every rank's mailbox and notes, under
 * each rank, [the 'wave' event, the frame's arrival, that rank's vector written].
 */
async function receiver(bus: AgentBus, mailboxes: MailboxWriter[], ranks: number[], reportPort: number, endWave: number): Promise<void> {
  const logs = ranks.map((r) => new ReceiptLog(r, reportPort));
  const arrived = arrivalStamps(bus);
  const written: bigint[] = ranks.map(() => 0n);
  bus.on('wave', (w) => {
    const t = process.hrtime.bigint();
    const v = { wave: w.head.wave, configDue: w.head.configDue, dumpDue: w.head.dumpDue };
    // As the agent's HostFanout does: every slot, then the wakes.
    for (let i = 0; i < mailboxes.length; i++) {
      mailboxes[i].publish(v, undefined, false);
      written[i] = process.hrtime.bigint();
    }
    for (const m of mailboxes) m.announce();
    for (let i = 0; i < logs.length; i++) logs[i].note(w.head.wave, t, arrived(), mailboxes.length > 0 ? written[i] : t);
    if (w.head.wave >= endWave) for (const l of logs) void l.flush();
  });
  await bus.start();
  const stop = async () => {
    await bus.stop();
    for (const l of logs) l.close();
    for (const m of mailboxes) m.close();
    process.exit(0);
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  process.once('disconnect', stop);
}

/** Reader mode: an engine client's stand-in, waiting on rank 0's mailbox for every wave in turn. */
async function reader(file: string, reportPort: number, endWave: number): Promise<void> {
  const log = new ReceiptLog(READER, reportPort);
  process.once('SIGTERM', () => process.exit(0));
  let r: MailboxReader | undefined;
  while (!r) {
    try {
      r = MailboxReader.open(file);
    } catch {
      await new Promise((res) => setTimeout(res, 10));
    }
  }
  for (let w = 1; w <= endWave; ) {
    const got = await r.waitFor(w, 1000);
    if (got === 'timeout') continue;
    if (got !== 'overwritten') log.note(w, process.hrtime.bigint());
    w++;
  }
  await log.flush();
}

interface WavebusRun {
  times: ReceiptTimes;
  reader?: Map<number, bigint[]>;
  published: Map<number, bigint>;
  begun: Map<number, bigint>;
}

async function wavebusRun(n: number, endWave: number, pace: number, tokenFile: string | undefined, mailbox: boolean): Promise<WavebusRun> {
  const port = await freePortPair();
  const busToken = tokenFile ? BusToken.load(tokenFile, 'bench bus token') : undefined;
  const coordinator = new Coordinator({ port, layout: { worldSize: n, tp: n, pp: 1, dp: 1, cp: 1 }, busToken, logger: createLogger('bench-bus', 'warn') });
  const receipts = new Receipts();
  await receipts.start();
  await coordinator.start();
  const mailboxDir = mailbox ? fs.mkdtempSync(path.join(fs.existsSync('/dev/shm') ? '/dev/shm' : os.tmpdir(), 'wavebus-bench-')) : '-';
  const children: ChildProcess[] = [];
  for (let r = 0; r < n; r++) {
    const args = [__filename, '--child', String(r), String(n), String(port), String(receipts.port), String(endWave), tokenFile ?? '-', mailboxDir];
    children.push(spawn(process.execPath, args, { stdio: ['ignore', 'ignore', 'inherit'] }));
  }
  if (mailbox) children.push(spawn(process.execPath, [__filename, '--reader', path.join(mailboxDir, 'mailbox-0'), String(receipts.port), String(endWave)], { stdio: ['ignore', 'ignore', 'inherit'] }));
  const published = new Map<number, bigint>();
  const begun = new Map<number, bigint>();
  try {
    const deadline = Date.now() + 60000;
    while (!coordinator.ready) {
      if (Date.now() > deadline) throw new Error(`bench bus: agents not ready after 60 s (live: ${coordinator.liveRanks().join(',')})`);
      await new Promise((r) => setTimeout(r, 20));
    }
    for (let w = 1; w <= endWave; w++) {
      // The head of w publishes the vector of w + DEFAULT_LOOKAHEAD_WAVES, and the agents note receipts by
      // the vector's wave: the times are kept under that wave too (keyed by w, every latency came
      // out one pace too short and pub_to_sub went negative).
      const t0 = process.hrtime.bigint();
      const head = coordinator.beginWave(w, null);
      published.set(head.wave, t0);
      begun.set(head.wave, process.hrtime.bigint());
      await new Promise((r) => setTimeout(r, pace));
    }
    await receipts.waitFor(n + (mailbox ? 1 : 0), REPORT_TIMEOUT_MS);
  } finally {
    for (const c of children) c.kill('SIGTERM');
    await Promise.all(children.map((c) => (c.exitCode !== null ? null : new Promise((r) => c.once('exit', r)))));
    await receipts.close();
    await coordinator.stop();
    if (mailbox) fs.rmSync(mailboxDir, { recursive: true, force: true });
  }
  const reader = receipts.times.get(READER);
  receipts.times.delete(READER);
  return { times: receipts.times, reader, published, begun };
}

export async function run(args: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  const n = args.agents;
  const waves = args.waves;
  const rounds = args.rounds;
  const pace = args['pace-ms'];
  const bareN = args['bare-subscribers'] > 0 ? args['bare-subscribers'] : n;

  const endWave = WARMUP + waves + 1;
  const from = WARMUP + 1;
  const tokenDir = args['bus-token'] ? fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-bench-token-')) : undefined;
  const tokenFile = tokenDir ? createTokenFile(tokenDir) : undefined;
  const lat: number[] = [];
  /** Publish → the last rank's vector written in its mailbox (readable by its engine). */
  const readable: number[] = [];
  const bareLat: number[] = [];
  const bare1Lat: number[] = [];
  let bare1Lost = 0;
  const roundP50: { wavebus: number[]; bare: number[]; bare_one: number[] } = { wavebus: [], bare: [], bare_one: [] };
  let lost = 0;
  let bareLost = 0;
  const hops: Record<string, number[]> = { coordinator_begin_wave: [], pub_to_sub: [], agent_frame_to_wave: [], agent_mailbox_write: [], wave_to_client: [], bare_send: [], bare_pub_to_sub: [] };
  try {
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? ['wavebus', 'bare', 'bare_one'] : ['bare_one', 'bare', 'wavebus'];
      for (const what of order) {
        if (what === 'bare' && !args.bare) continue;
        if (what === 'bare_one') {
          if (!args['bare-one']) continue;
          const b = await bareBus(1, endWave, pace);
          const got = lastReceipt(b.receipts.times, b.published, from, endWave, 1);
          bare1Lat.push(...got.lat);
          bare1Lost += got.lost;
          roundP50.bare_one.push(p50p99([...got.lat]).p50_us);
        } else if (what === 'wavebus') {
          const w = await wavebusRun(n, endWave, pace, tokenFile, args.mailbox);
          const got = lastReceipt(w.times, w.published, from, endWave, n);
          lat.push(...got.lat);
          lost += got.lost;
          if (args.mailbox) readable.push(...lastReceipt(w.times, w.published, from, endWave, n, 2).lat);
          roundP50.wavebus.push(p50p99([...got.lat]).p50_us);
          for (let x = from; x < endWave; x++) hops.coordinator_begin_wave.push(Number(w.begun.get(x)! - w.published.get(x)!) / 1000);
          hops.pub_to_sub.push(...hop(w.times, from, endWave, (x) => w.begun.get(x), 1));
          hops.agent_frame_to_wave.push(...hop(w.times, from, endWave, (_, t) => t[1], 0));
          if (args.mailbox) hops.agent_mailbox_write.push(...hop(w.times, from, endWave, (_, t) => t[0], 2));
          const rank0 = w.times.get(0);
          if (w.reader && rank0) hops.wave_to_client.push(...hop(new Map([[0, w.reader]]), from, endWave, (x) => rank0.get(x)?.[0], 0));
        } else {
          const b = await bareBus(bareN, endWave, pace);
          const got = lastReceipt(b.receipts.times, b.published, from, endWave, bareN);
          bareLat.push(...got.lat);
          bareLost += got.lost;
          roundP50.bare.push(p50p99([...got.lat]).p50_us);
          for (let x = from; x < endWave; x++) hops.bare_send.push(Number(b.sent.get(x)! - b.published.get(x)!) / 1000);
          hops.bare_pub_to_sub.push(...hop(b.receipts.times, from, endWave, (x) => b.sent.get(x), 0));
        }
      }
    }
  } finally {
    if (tokenDir) fs.rmSync(tokenDir, { recursive: true, force: true });
  }
  const main = p50p99(lat);
  const result: Record<string, unknown> = { agents: n, waves, pace_ms: pace, rounds, bus_token: args['bus-token'], curve: false, mailbox: args.mailbox, p50_us: main.p50_us, p99_us: main.p99_us, lost };
  const read = args.mailbox ? p50p99(readable) : undefined;
  if (read) Object.assign(result, { readable_p50_us: read.p50_us, readable_p99_us: read.p99_us });
  if (args.bare) {
    const bare = p50p99(bareLat);
    Object.assign(result, {
      bare_subscribers: bareN,
      bare_p50_us: bare.p50_us,
      bare_p99_us: bare.p99_us,
      bare_lost: bareLost,
      ratio_p50_bare: Math.round((main.p50_us / bare.p50_us) * 1000) / 1000,
      ratio_p99_bare: Math.round((main.p99_us / bare.p99_us) * 1000) / 1000,
    });
    if (read) Object.assign(result, { ratio_readable_p50_bare: Math.round((read.p50_us / bare.p50_us) * 1000) / 1000, ratio_readable_p99_bare: Math.round((read.p99_us / bare.p99_us) * 1000) / 1000 });
  }
  if (args['bare-one']) {
    // Issue #34: from the publish to the last rank's vector, against one bare subscriber: ≤ 1.0 at p50, ≤ 1.5 at p99.
    const one = p50p99(bare1Lat);
    Object.assign(result, {
      bare_one_p50_us: one.p50_us,
      bare_one_p99_us: one.p99_us,
      bare_one_lost: bare1Lost,
      ratio_p50_bare_one: Math.round((main.p50_us / one.p50_us) * 1000) / 1000,
      ratio_p99_bare_one: Math.round((main.p99_us / one.p99_us) * 1000) / 1000,
      target: { ratio_p50_bare_one: 1.0, ratio_p99_bare_one: 1.5 },
    });
  }
  result.round_p50_us = roundP50;
  result.hops = Object.fromEntries(Object.entries(hops).filter(([, xs]) => xs.length > 0).map(([k, xs]) => { const s = p50p99(xs); return [k, { p50_us: s.p50_us, p99_us: s.p99_us }]; }));
  result.cpu_hops = cpuHops();
  const baseline = args.baseline ?? hasTorch();
  if (baseline) {
    const g = await glooBaseline(n);
    Object.assign(result, g);
    if (g.gloo_p50_us) result.ratio = result.ratio_p50_gloo = Math.round((main.p50_us / g.gloo_p50_us) * 1000) / 1000;
  }
  return result;
}

if (require.main === module && process.argv[2] === '--child') {
  const [rank, world, port, reportPort, endWave] = process.argv.slice(3, 8).map(Number);
  const [tokenFile, mailboxDir] = process.argv.slice(8, 10);
  child(rank, world, port, reportPort, endWave, tokenFile, mailboxDir).catch((e) => {
    process.stderr.write(`bench agent ${rank}: ${String(e)}\n`);
    process.exit(1);
  });
}
if (require.main === module && process.argv[2] === '--reader') {
  const [file, reportPort, endWave] = process.argv.slice(3, 6);
  reader(file, Number(reportPort), Number(endWave)).catch((e) => {
    process.stderr.write(`bench mailbox reader: ${String(e)}\n`);
    process.exit(1);
  });
}
