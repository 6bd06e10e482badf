// `wavebus bench fuzz [--frames N] [--seed S] [--oversized|--no-oversized] --json`
//
// Garbage on every socket a wavebus process reads from the network or the engine, then proof
// that the process is alive, still works and counted what it dropped:
//   - coordinator ROUTER (tcp): mutated AgentMessage encodings, random bytes, wrong part counts;
//   - agent SUB (tcp): a rogue PUB the agent is pointed at sends mutated BusFrames with right and
//     wrong topics; afterwards a real coordinator takes over that address and the agent must sync;
//   - agent client ROUTER (ipc): mutated ClientRequest encodings.
// Mutations of valid encodings: bit flips, truncation, extension, wrong wire types, huge length
// prefixes, random bytes, empty frames, multi-part messages with the wrong number of parts. Each
// frame's fate is predicted with the same decoders the processes use; the coordinator's
// /metrics drop counters and the agent's drop log lines must account for exactly those.
import { spawn, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as http from 'http';
import * as os from 'os';
import * as path from 'path';
import yargs from 'yargs';
import { Dealer, XPublisher } from 'zeromq';
import { requestStatus } from '../src/bus/coordinator';
import { PROTOCOL_VERSION, peerVersionOf } from '../src/bus/protocol-version';
import { DEFAULT_MAX_FRAME_BYTES } from '../src/bus/constants';
import { decodeAgentMessage, decodeBusFrame, encodeAgentMessage, encodeBusFrame, replicaTopic, TOPIC } from '../src/bus/frames';
import { isOneWayRequest } from '../src/agent/client-server';
import { WavebusClient } from '../src/client/client';
import { RegionKind, RegionRole } from '../src/client/protocol';
import { agentConfig } from '../src/guard/agent-config';
import { defaultConfig } from '../src/guard/config';
import { agentEndpoint, mailboxPath } from '../src/paths';
import { packageRoot } from '../src/paths';
import { freePortPair } from '../src/bus/ports';
import { prng } from '../src/prng';
import { ClientRequest, decode, encode } from '../src/proto';

export class Mutator {
  readonly rand: () => number;
  constructor(seed: number) {
    this.rand = prng(seed);
  }
  int(n: number): number {
    return Math.floor(this.rand() * n);
  }
  pick<T>(xs: readonly T[]): T {
    return xs[this.int(xs.length)];
  }
  bytes(n: number): Buffer {
    const b = Buffer.allocUnsafe(n);
    for (let i = 0; i < n; i++) b[i] = this.int(256);
    return b;
  }

  /** One mutation of `valid` (or pure noise). */
  mutate(valid: Buffer): Buffer {
    const b = Buffer.from(valid);
    switch (this.int(9)) {
      case 0: {
        // bit flips
        for (let k = 1 + this.int(8); k > 0 && b.length > 0; k--) b[this.int(b.length)] ^= 1 << this.int(8);
        return b;
      }
      case 1:
        return b.subarray(0, this.int(Math.max(1, b.length))); // truncation
      case 2:
        return Buffer.concat([b, this.bytes(1 + this.int(64))]); // extension
      case 3: {
        // wrong field type: change the wire type of a tag byte
        if (b.length > 0) {
          const i = this.int(b.length);
          b[i] = (b[i] & ~7) | this.pick([0, 1, 2, 3, 4, 5, 6, 7]);
        }
        return b;
      }
      case 4: {
        // a huge length prefix on a length-delimited field
        const field = 1 + this.int(15);
        const huge = [0xff, 0xff, 0xff, 0xff, 0x0f];
        const at = this.int(b.length + 1);
        return Buffer.concat([b.subarray(0, at), Buffer.from([(field << 3) | 2, ...huge]), b.subarray(at)]);
      }
      case 5:
        return this.bytes(this.int(200)); // noise
      case 6:
        return Buffer.alloc(0); // empty
      case 7: {
        // duplicated / spliced fields
        const cut = this.int(b.length + 1);
        return Buffer.concat([b.subarray(0, cut), b, b.subarray(cut)]);
      }
      default: {
        // an unknown field number with a random wire type
        const tag = ((20 + this.int(1000)) << 3) | this.int(8);
        const varint: number[] = [];
        for (let t = tag; ; t >>>= 7) {
          if (t < 0x80) {
            varint.push(t);
            break;
          }
          varint.push((t & 0x7f) | 0x80);
        }
        return Buffer.concat([b, Buffer.from(varint), this.bytes(this.int(16))]);
      }
    }
  }

  /** A message of 1..4 parts: the right count most of the time, a wrong one otherwise. */
  parts(make: () => Buffer, right: number): Buffer[] {
    const n = this.rand() < 0.9 ? right : this.pick([1, 2, 3, 4].filter((x) => x !== right));
    return Array.from({ length: n }, () => make());
  }
}

// ---------------------------------------------------------------- valid corpora

const IDENTITY = { globalRank: 0, worldSize: 1, tpSize: 1, ppSize: 1, dpSize: 1, cpSize: 1, isLastPp: true, host: 'fuzz', pid: 1 };

export function agentCorpus(): Buffer[] {
  const files = [{ path: 'rank0/a.pt', bytes: 10, checksum: 'crc32c:00000000' }];
  const telemetry = {
    wave: 4,
    requests: [{ reqId: 'req-1', newTokenIds: [1, 2], newTokenLogprobs: [-0.5, -1], newTokenRanks: [0, 1], draftLen: 2, accepted: 1, blockIds: [3, 4], promptLen: 9, numOutputTokens: 2 }],
    nonFinite: [{ row: 0, reqId: 'req-1', kind: 'nan' }],
  };
  return [
    { globalRank: 7, hello: { identity: { ...IDENTITY, globalRank: 7 }, subscribed: true, agentVersion: 'x', protocolVersion: PROTOCOL_VERSION } },
    { globalRank: 7, requestId: 3, snapshot: { globalRank: 7 } },
    { globalRank: 7, heartbeat: { wave: 5, globalRank: 7, epochSeen: 9, lastSeq: 10, unixMs: 1 } },
    { globalRank: 7, dumpResult: { globalRank: 7, jobId: '5/manual/req', wave: 5, files, bytes: 10, error: '', skippedReason: '' } },
    { globalRank: 7, waveHead: { wave: 5, telemetry } },
    { requestId: 1, status: { protocolVersion: PROTOCOL_VERSION } },
    { requestId: 2, status: {} }, // a tool from before versions: refused
    { globalRank: 7, requestId: 99, fileList: { globalRank: 7, files } },
    { globalRank: 7, requestId: 98, fileChunk: { globalRank: 7, root: 'dumps', path: 'a', offset: 0, data: Buffer.from('abc'), crc32c: 1, eof: true } },
    // the header of a chunk whose bytes follow as a second frame (a rank inside the fuzzed world)
    { globalRank: 0, requestId: 97, fileChunk: { globalRank: 0, root: 'dumps', path: 'a', offset: 0, crc32c: 1, eof: true } },
  ].map((m) => {
    try {
      return encodeAgentMessage(m);
    } catch {
      return encodeAgentMessage({ requestId: 1, status: {} });
    }
  });
}

export function busCorpus(epoch: number): [string, Buffer][] {
  return [
    encodeBusFrame(epoch, 1, 'head', { epoch, seq: 1, wave: 3, configDue: true, dumpDue: true }),
    encodeBusFrame(epoch, 2, 'config', { wave: 3, version: 2, config: agentConfig(defaultConfig(), { hotReload: true, dumpRoot: '' }) }),
    encodeBusFrame(epoch, 3, 'dump', { wave: 3, jobs: [{ incidentType: 'manual_trigger', reqId: 'r', blockIds: [1, 2], armWave: 3, dumpDir: '/nonexistent/wavebus-fuzz', jobId: '3/m/r' }] }),
    encodeBusFrame(epoch, 4, 'heartbeat', { wave: 3, unixMs: 1 }),
    // a frame of another replica's stream, under replica 0's topic: refused
    [`${replicaTopic(0)}${TOPIC.head}`, encodeBusFrame(epoch, 5, 'head', { epoch, seq: 5, wave: 3 }, false, 1)[1]],
  ];
}

export function clientCorpus(): Buffer[] {
  return [
    { id: 1, hello: { pid: 1, asyncScheduling: false, language: 'fuzz' } },
    { id: 2, register: { name: 'x', kind: RegionKind.SHM, shmName: '/wavebus-fuzz-none', offset: 0, nbytes: 64, dtype: 'float32', shape: [4, 4], role: RegionRole.INPUT } },
    { id: 3, register: { name: 'k', kind: RegionKind.SHM, shmName: '/wavebus-fuzz-none', nbytes: 64, dtype: 'bfloat16', shape: [1, 2, 2, 8], role: RegionRole.KV_POOL, layer: 'l', kv: 'k' } },
    { id: 4, waveHead: { wave: 7 } },
    { id: 5, endOfWave: { wave: 7 } },
    { id: 6, beforeForward: { context: { compilationHash: 'h', globalStep: 1, reqIds: ['a'], positions: [1], rowRequest: [0] }, inputs: [{ region: 'x', dtype: 'float32', shape: [2] }] } },
    { id: 7, close: {} },
  ].map((m) => encode(ClientRequest, m));
}

// ---------------------------------------------------------------- fates

/**
 * Why the coordinator's ROUTER drops one message from us (or undefined when it handles it).
 * `conn`: our connection's state as the coordinator's VersionGate keeps it (a Hello of another
 * protocol version refuses the connection until a Hello of the current one).
 */
export function coordinatorFate(parts: Buffer[], worldSize = FUZZ_WORLD, conn = { refused: false }): string | undefined {
  // One message, or a file chunk's message followed by its data frame (src/bus/payload.ts).
  if (parts.length !== 1 && parts.length !== 2) return 'frame_count';
  const d = decodeAgentMessage(parts[0], DEFAULT_MAX_FRAME_BYTES);
  if (!d.ok) return d.reason;
  const m = d.value;
  if (parts.length === 2 && m.body !== 'fileChunk') return 'frame_count';
  if (parts.length === 2 && parts[1].length > DEFAULT_MAX_FRAME_BYTES) return 'oversized';
  const claimed = m.body === 'hello' ? (m.hello?.identity?.globalRank ?? m.globalRank) : m.globalRank;
  if (m.body !== 'status' && m.body !== 'relay' && !(Number.isInteger(claimed) && claimed >= 0 && claimed < worldSize)) return 'rank_out_of_range';
  const v = peerVersionOf(m);
  if (v === undefined && conn.refused) return 'protocol_version';
  if (v !== undefined && v !== PROTOCOL_VERSION) {
    if (m.body === 'hello') conn.refused = true;
    return 'protocol_version';
  }
  if (m.body === 'hello') conn.refused = false;
  if (m.body === 'fileList' || m.body === 'fileChunk') return 'unknown_request';
  return undefined;
}

/** The fuzzed coordinator's world (its --world-size). */
const FUZZ_WORLD = 1;

/** Decode-level drop reason of a bus message at an agent's SUB (state-level drops are not predicted). */
export function subFate(parts: Buffer[]): string | undefined {
  const d = decodeBusFrame(parts, DEFAULT_MAX_FRAME_BYTES);
  return d.ok ? (d.value.replica === 0 ? undefined : 'wrong_topic') : d.reason;
}

/**
 * Whether an agent of replica 0 receives the message at all: its SUB subscribes to that replica's
 * topic prefix only ("r0."), and ZeroMQ drops every other message before the agent sees it.
 */
export function subDelivered(parts: Buffer[]): boolean {
  return parts.length > 0 && parts[0].subarray(0, 3).toString('latin1') === replicaTopic(0);
}

/**
 * What the agent's client ROUTER does with this message: it answers every decodable first part,
 * except a wave head or an end-of-wave notice with id 0 (one-way: taken, never answered).
 */
export function clientFate(parts: Buffer[]): 'answered' | 'one_way' | 'undecodable' {
  try {
    const req = decode(ClientRequest, parts[0]);
    return isOneWayRequest(req) ? 'one_way' : 'answered';
  } catch {
    return 'undecodable';
  }
}

// ---------------------------------------------------------------- processes

interface Proc {
  name: string;
  child: ChildProcess;
  out: string;
  err: string;
  exit?: { code: number | null; signal: string | null };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function startProc(name: string, args: string[], env: NodeJS.ProcessEnv = process.env): Proc {
  const child = spawn(process.execPath, [path.join(packageRoot(), 'bin', 'wavebus.js'), ...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
  const p: Proc = { name, child, out: '', err: '' };
  child.stdout!.on('data', (b) => (p.out = (p.out + b.toString()).slice(-200000)));
  child.stderr!.on('data', (b) => (p.err = (p.err + b.toString()).slice(-2000000)));
  child.on('exit', (code, signal) => (p.exit = { code, signal }));
  return p;
}

async function until<T>(fn: () => T | Promise<T>, what: string, ms = 20000): Promise<NonNullable<T>> {
  const end = Date.now() + ms;
  let last: unknown;
  while (Date.now() < end) {
    try {
      const v = await fn();
      if (v) return v as NonNullable<T>;
    } catch (e) {
      last = e;
    }
    await sleep(50);
  }
  throw new Error(`fuzz: timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
}

function httpGet(host: string, port: number, p: string): Promise<string> {
  return new Promise((resolve, reject) => {
    http.get({ host, port, path: p, timeout: 3000 }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve(body));
    }).on('error', reject);
  });
}

function droppedFromMetrics(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^wavebus_dropped_frames_total\{reason="([a-z_]+)"\} (\d+)/gm)) out[m[1]] = Number(m[2]);
  return out;
}

/** The last drop total the agent logged per reason (its DropCounter logs at most once per reason every 5 s). */
function droppedFromLog(stderr: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of stderr.split('\n')) {
    if (!line.includes('dropped a bus frame')) continue;
    try {
      const j = JSON.parse(line);
      if (typeof j.reason === 'string' && typeof j.total === 'number') out[j.reason] = Math.max(out[j.reason] ?? 0, j.total);
    } catch {
      /* not a log line */
    }
  }
  return out;
}

function count(into: Record<string, number>, reason: string | undefined): void {
  if (reason) into[reason] = (into[reason] ?? 0) + 1;
}

function diff(after: Record<string, number>, before: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(after)) if (v - (before[k] ?? 0) > 0) out[k] = v - (before[k] ?? 0);
  return out;
}

/** A real wave round trip through an agent: head from its engine client, vector back in the mailbox. */
async function roundTrip(runDir: string, wave: number): Promise<boolean> {
  const client = await WavebusClient.connect({ endpoint: agentEndpoint(runDir, 0), mailbox: mailboxPath(runDir, 0) });
  try {
    for (let w = wave; w < wave + 50; w++) {
      await client.waveHead(w);
      const r = await client.endOfWave(w);
      if (!r.timedOut && client.featureFlags() !== 0) return true;
      await sleep(20);
    }
    return false;
  } finally {
    await client.close();
  }
}

export interface FuzzResult {
  frames_per_socket: number;
  sockets: string[];
  seed: number;
  crashes: number;
  hung: boolean;
  dropped: Record<string, Record<string, number>>;
  expected_dropped: Record<string, Record<string, number>>;
  accounted: boolean;
  client_replies: { expected: number; got: number };
  /** Ranks the coordinator tracks after the garbage (garbage Hellos/heartbeats from made-up ranks add entries). */
  coordinator_ranks_after: number;
  problems: string[];
  seconds: number;
}

export async function run(argv: string[]): Promise<Record<string, unknown>> {
  const a = yargs(argv)
    .option('frames', { type: 'number', default: 100000 })
    .option('seed', { type: 'number', default: 20240601 })
    .option('oversized', { type: 'boolean', default: true, describe: 'also send one frame over the 64 MiB limit per tcp socket' })
    .option('json', { type: 'boolean', default: false })
    .strict(false)
    .parseSync();
  return fuzz({ frames: a.frames, seed: a.seed, oversized: a.oversized }) as unknown as Record<string, unknown>;
}

export async function fuzz(opts: { frames: number; seed: number; oversized: boolean }): Promise<FuzzResult> {
  const t0 = Date.now();
  const note = (what: string) => process.env.WAVEBUS_FUZZ_DEBUG && process.stderr.write(`fuzz +${Date.now() - t0} ms: ${what}\n`);
  const m = new Mutator(opts.seed);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-fuzz-'));
  const procs: Proc[] = [];
  const problems: string[] = [];
  const expected: Record<string, Record<string, number>> = { coordinator_router: {}, agent_sub: {}, agent_client: {} };
  const dropped: Record<string, Record<string, number>> = {};
  const replies = { expected: 0, got: 0 };
  let hung = false;
  let ranksAfter = -1;
  const cfg = path.join(dir, 'runtime', 'config', 'runtime_config.json');
  fs.mkdirSync(path.dirname(cfg), { recursive: true });
  // One detector on (report only), so agents use the bus and the round trip exercises it.
  fs.writeFileSync(cfg, JSON.stringify({ detector: { logits_finite: { enabled: true, on_trigger: ['report'] } } }));
  const env = { ...process.env, WAVEBUS_LOG_LEVEL: 'warn' };
  const coordArgs = (port: number) => ['coordinator', '--port', String(port), '--world-size', String(FUZZ_WORLD), '--tp', '1', '--heartbeat-ms', '200', '--metrics-port', '0', '--runtime-config-path', cfg,
    // startup writes defaults <- overlay to the live file (seed): the config is the overlay
    '--additional-config', JSON.stringify({ runtime_config: JSON.parse(fs.readFileSync(cfg, 'utf8')) })];
  const agentArgs = (port: number, runDir: string) => ['agent', '--coordinator', `127.0.0.1:${port}`, '--rank', '0', '--world-size', '1', '--tp', '1', '--run-dir', runDir, '--heartbeat-ms', '200'];
  try {
    // ---- the real job: coordinator + agent A
    const port = await freePortPair();
    const coord = startProc('coordinator', coordArgs(port), env);
    procs.push(coord);
    const started = await until(() => {
      const line = coord.out.split('\n').find((l) => l.includes('"started"'));
      return line ? JSON.parse(line) : undefined;
    }, 'the coordinator to start');
    const metrics = started.metrics as { host: string; port: number };
    const runA = path.join(dir, 'a');
    const agentA = startProc('agent A', agentArgs(port, runA), env);
    procs.push(agentA);
    await until(async () => (await requestStatus({ host: '127.0.0.1', port }, 500)).ready, 'the bus to be ready');

    // ---- 1. coordinator ROUTER
    note('bus ready');
    {
      const before = droppedFromMetrics(await httpGet(metrics.host, metrics.port, '/metrics'));
      const corpus = agentCorpus();
      const d = new Dealer({ linger: 0, sendHighWaterMark: 0 });
      d.connect(`tcp://127.0.0.1:${port + 1}`);
      const drain = (async () => {
        try {
          for await (const _ of d) {
            /* replies to garbage that looked valid: discarded */
          }
        } catch {
          /* closed */
        }
      })();
      const conn = { refused: false };
      for (let i = 0; i < opts.frames; i++) {
        const parts = m.parts(() => m.mutate(m.pick(corpus)), 1);
        count(expected.coordinator_router, coordinatorFate(parts, FUZZ_WORLD, conn));
        await d.send(parts);
      }
      if (opts.oversized) {
        const big = Buffer.alloc(DEFAULT_MAX_FRAME_BYTES + 1);
        count(expected.coordinator_router, coordinatorFate([big], FUZZ_WORLD, conn));
        await d.send(big);
      }
      // The ROUTER handles messages in order: every frame is in once every predicted count is
      // reached and a status request sent after them is answered.
      const want = expected.coordinator_router;
      await until(async () => {
        const got = diff(droppedFromMetrics(await httpGet(metrics.host, metrics.port, '/metrics')), before);
        return Object.keys(want).every((k) => (got[k] ?? 0) >= want[k]) && (await requestStatus({ host: '127.0.0.1', port }, 5000));
      }, 'the coordinator to take every frame', 120000).catch((e) => {
        hung = true;
        problems.push(String(e));
      });
      dropped.coordinator_router = diff(droppedFromMetrics(await httpGet(metrics.host, metrics.port, '/metrics')), before);
      d.close();
      await drain;
    }

    // ---- 2. agent client ROUTER (ipc), agent A
    note('coordinator router done');
    {
      const corpus = clientCorpus();
      let oneWay = 0;
      let undecodable = 0;
      const d = new Dealer({ linger: 0, sendHighWaterMark: 0 });
      d.connect(agentEndpoint(runA, 0));
      const drain = (async () => {
        try {
          for await (const _ of d) replies.got++;
        } catch {
          /* closed */
        }
      })();
      for (let i = 0; i < opts.frames; i++) {
        const parts = m.parts(() => m.mutate(m.pick(corpus)), 1);
        const fate = clientFate(parts);
        if (fate === 'answered') replies.expected++;
        else if (fate === 'one_way') oneWay++;
        else undecodable++;
        await d.send(parts);
      }
      await until(() => replies.got >= replies.expected, `the agent to answer ${replies.expected} decodable requests`, 120000).catch((e) => {
        hung = true;
        problems.push(`${String(e)} (got ${replies.got})`);
      });
      await sleep(300); // anything beyond the expected count would show now
      if (replies.got !== replies.expected) problems.push(`agent client socket: ${replies.got} replies for ${replies.expected} decodable requests`);
      // what got no answer and was not a one-way wave head
      dropped.agent_client = { undecodable: opts.frames - replies.got - oneWay };
      expected.agent_client = { undecodable };
      d.close();
      await drain;
    }

    // ---- 3. agent SUB: agent B is pointed at a rogue PUB
    note('agent client done');
    {
      const rogue = await freePortPair();
      const pub = new XPublisher({ linger: 0, sendHighWaterMark: 1000, noDrop: true });
      await pub.bind(`tcp://127.0.0.1:${rogue}`);
      const runB = path.join(dir, 'b');
      const agentB = startProc('agent B', agentArgs(rogue, runB), env);
      procs.push(agentB);
      await pub.receive(); // its subscription: from here on nothing we send is lost
      const corpus = busCorpus(424242);
      // Replica 0's topics, garbage after its prefix (delivered, refused), and others' (filtered by ZeroMQ).
      const r0 = replicaTopic(0);
      const topics = [...Object.values(TOPIC).map((t) => r0 + t), `${r0}X`, r0, `${r0}WW`, `${r0}H\u0000`, `${r0}99999.W`, 'r1.W', 'r01.W', 'W', ''];
      const samples: Record<string, Buffer[]> = {};
      const send = async (parts: Buffer[]) => {
        const fate = subDelivered(parts) ? subFate(parts) : undefined;
        count(expected.agent_sub, fate);
        if (fate && !samples[fate] && parts.every((x) => x.length < 1 << 20)) samples[fate] = parts;
        await pub.send(parts);
      };
      for (let i = 0; i < opts.frames; i++) {
        const [topic, body] = m.pick(corpus);
        const r = m.rand();
        // right topic and a mutated body; a wrong topic; or a wrong number of parts
        // (a wrong count keeps the right topic first, so the subscription lets it through)
        const parts = r < 0.6 ? [Buffer.from(topic), m.mutate(body)] : r < 0.8 ? [Buffer.from(m.pick(topics)), m.mutate(body)] : [Buffer.from(topic), ...m.parts(() => m.mutate(body), 1)];
        await send(parts);
      }
      if (opts.oversized) await send([Buffer.from(`${r0}W`), Buffer.alloc(DEFAULT_MAX_FRAME_BYTES + 1)]);
      // The agent logs a reason's running total at most every 5 s: wait that out, then one more
      // frame per reason seen makes it log the final total.
      await sleep(5200);
      for (const parts of Object.values(samples)) await send(parts);
      const want = expected.agent_sub;
      await until(() => Object.keys(want).every((k) => (droppedFromLog(agentB.err)[k] ?? 0) >= want[k]), 'agent B to log its drop totals', 30000).catch((e) => {
        hung = true;
        problems.push(String(e));
      });
      dropped.agent_sub = droppedFromLog(agentB.err);
      pub.close();
      // A real coordinator now takes over the address agent B was pointed at: B must sync to it.
      const coordB = startProc('coordinator B', coordArgs(rogue), env);
      procs.push(coordB);
      await until(async () => (await requestStatus({ host: '127.0.0.1', port: rogue }, 500)).ready, 'agent B to join a real coordinator after the garbage', 30000).catch((e) => {
        hung = true;
        problems.push(String(e));
      });
      if (!(await roundTrip(runB, 1000000))) problems.push('agent B: no wave round trip after the garbage');
    }

    // ---- afterwards: everything alive and working
    note('agent sub done');
    try {
      ranksAfter = Object.keys(JSON.parse((await requestStatus({ host: '127.0.0.1', port }, 3000)).statusJson).ranks ?? {}).length;
    } catch {
      /* reported below */
    }
    if (!(await roundTrip(runA, 2000000))) problems.push('agent A: no wave round trip after the garbage');
    try {
      await requestStatus({ host: '127.0.0.1', port }, 3000);
    } catch (e) {
      hung = true;
      problems.push(`coordinator: ${String(e)}`);
    }
  } finally {
    for (const p of procs) if (!p.exit) p.child.kill('SIGTERM');
    await Promise.all(procs.map((p) => (p.exit ? undefined : Promise.race([new Promise((r) => p.child.once('exit', r)), sleep(5000)]))));
    for (const p of procs) if (!p.exit) p.child.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
  // A crash is a process that died before we stopped it, or a stack trace in its output.
  let crashes = 0;
  for (const p of procs) {
    const died = p.exit && p.exit.signal !== 'SIGTERM' && !(p.exit.code === 0 && p.exit.signal === null);
    const trace = /\n\s+at .+\(.+:\d+:\d+\)/.test(p.err) && /TypeError|RangeError|ReferenceError|uncaught/i.test(p.err);
    if (died || trace) {
      crashes++;
      problems.push(`${p.name} ${died ? `exited ${JSON.stringify(p.exit)}` : 'printed a stack trace'}: ${p.err.slice(-1500)}`);
    }
  }
  const accounted = Object.entries(expected).every(([sock, want]) => Object.entries(want).every(([k, v]) => (dropped[sock]?.[k] ?? 0) === v));
  if (!accounted) problems.push(`drop counters differ from the prediction: got ${JSON.stringify(dropped)}, expected ${JSON.stringify(expected)}`);
  return {
    frames_per_socket: opts.frames,
    sockets: ['coordinator_router', 'agent_client', 'agent_sub'],
    seed: opts.seed,
    crashes,
    hung,
    dropped,
    expected_dropped: expected,
    accounted,
    client_replies: replies,
    coordinator_ranks_after: ranksAfter,
    problems,
    seconds: (Date.now() - t0) / 1000,
  };
}
