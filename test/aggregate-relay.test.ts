// The relay's chunk path: a chunk's bytes travel agent → coordinator → tool as their own ZeroMQ
// frame, forwarded untouched; the tool checks each chunk's crc32c once (as it writes it) and folds
// it into the whole-file checksum (crc32cCombine). Real coordinator, agents, sockets and files.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { Dealer } from 'zeromq';
import { aggregate, crc32cCombine, RelayClient } from '../src/tools/aggregate';
import { ChunkBuffers, FileServer } from '../src/agent/file-server';
import { AgentBus, type RequestHandler } from '../src/bus/agent-bus';
import { Coordinator, requestStatus } from '../src/bus/coordinator';
import { MAX_RELAYS_IN_FLIGHT } from '../src/bus/agent-requests';
import { encodeAgentMessage, type CoordinatorMsg } from '../src/bus/frames';
import { payloadOf, withPayload } from '../src/bus/payload';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { cleanup, freePortPair, pseudoRandomBytes, tmpDir, waitFor } from './helpers';

const quiet = createLogger('aggregate-relay-test', 'silent');
const MiB = 2 ** 20;

describe('crc32cCombine', () => {
  test('equals the crc32c of the concatenation, for empty, odd and multi-MiB lengths', () => {
    const sizes = [0, 1, 3, 64, 4095, 65536, 2 * MiB + 17];
    for (const a of sizes) {
      for (const b of sizes) {
        const x = crypto.randomBytes(a);
        const y = crypto.randomBytes(b);
        expect(crc32cCombine(crc32c(x), crc32c(y), y.length)).toBe(crc32c(Buffer.concat([x, y])));
      }
    }
    // Folding chunk by chunk gives the whole-file checksum.
    const file = crypto.randomBytes(5 * MiB + 3);
    let crc = 0;
    for (let o = 0; o < file.length; o += MiB) crc = crc32cCombine(crc, crc32c(file.subarray(o, o + MiB)), Math.min(MiB, file.length - o));
    expect(crc).toBe(crc32c(file));
  });
});

describe('agent chunk buffers', () => {
  const chunkReq = (epoch: number, requestId: number, offset: number, length: number, received: number[] = []) =>
    ({ epoch, requestId, body: 'fileChunk', fileChunk: { root: 'dumps', path: 'f.bin', offset, length, received } }) as unknown as CoordinatorMsg;

  test('a buffer is refilled only after the coordinator acknowledged the answer that carried it', async () => {
    const root = tmpDir('wavebus-agg-bufs-');
    const file = pseudoRandomBytes(4 * MiB, 3);
    fs.mkdirSync(path.join(root, 'dumps'));
    fs.writeFileSync(path.join(root, 'dumps', 'f.bin'), file);
    const server = new FileServer(0, () => ({ dumps: path.join(root, 'dumps') }), quiet);
    const frame = async (req: CoordinatorMsg) => {
      const reply = await server.handle(req);
      const c = reply.fileChunk as { crc32c: number; error?: string };
      expect(c.error).toBeUndefined();
      const data = payloadOf(reply)!;
      expect(crc32c(data)).toBe(c.crc32c);
      return data;
    };
    const a = await frame(chunkReq(7, 1, 0, MiB));
    const b = await frame(chunkReq(7, 2, MiB, MiB));
    expect(b.buffer).not.toBe(a.buffer); // 1 is still lent
    // An acknowledgement from another coordinator epoch releases nothing.
    const c = await frame(chunkReq(8, 3, 2 * MiB, MiB, [1]));
    expect(c.buffer).not.toBe(a.buffer);
    expect(a.equals(file.subarray(0, MiB))).toBe(true);
    // Acknowledged: the next chunk is read into the same memory (what `a` showed is gone).
    const d = await frame(chunkReq(7, 4, 3 * MiB, MiB, [1]));
    expect(d.buffer).toBe(a.buffer);
    expect(d.equals(file.subarray(3 * MiB))).toBe(true);
    expect(a.equals(file.subarray(3 * MiB))).toBe(true);
  });

  test('kept memory is bounded; a small chunk is not kept', () => {
    const bufs = new ChunkBuffers();
    const taken = [];
    for (let i = 0; i < 20; i++) taken.push(bufs.take(4 * MiB));
    expect(taken.filter((t) => t.pooled)).toHaveLength(8); // 32 MiB
    expect(taken.filter((t) => !t.pooled).every((t) => t.buf.length === 4 * MiB)).toBe(true);
    expect(bufs.bytes).toBe(32 * MiB);
    expect(bufs.take(1000)).toMatchObject({ pooled: false });
    const mid = bufs.take(MiB + 1); // over the cap too
    expect(mid.pooled).toBe(false);
    bufs.giveBack(taken[0].buf);
    const again = bufs.take(3 * MiB); // 4 MiB class: the one given back
    expect(again.buf).toBe(taken[0].buf);
  });
});

interface Job {
  port: number;
  coord: Coordinator;
  agents: AgentBus[];
  root: string;
}
const running: Job[] = [];

/** Two ranks serving one host's dumps: dp0_tp<r>_pp0_cp0/big.bin (multi-chunk) and a dump.json each. */
async function startJob(handlers: Record<number, (s: FileServer) => RequestHandler> = {}): Promise<Job> {
  const port = await freePortPair();
  const root = tmpDir('wavebus-agg-relay-');
  for (const r of [0, 1]) {
    const dir = path.join(root, 'dumps', 'x', 'wave_1', `dp0_tp${r}_pp0_cp0`);
    fs.mkdirSync(dir, { recursive: true });
    const big = pseudoRandomBytes(3 * MiB + 1234 * (r + 1), r + 1);
    fs.writeFileSync(path.join(dir, 'big.bin'), big);
    fs.writeFileSync(path.join(dir, 'dump.json'), JSON.stringify({ files: [{ path: 'big.bin', bytes: big.length, checksum: formatChecksum(crc32c(big)) }] }));
  }
  const coord = new Coordinator({ port, layout: { worldSize: 2, tp: 2, pp: 1, dp: 1, cp: 1 }, heartbeatMs: 100, deadAfterMs: 5000, logger: quiet });
  await coord.start();
  const agents: AgentBus[] = [];
  for (const r of [0, 1]) {
    const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity: resolveIdentity({}, { rank: r, worldSize: 2, tp: 2, pp: 1 }), heartbeatMs: 100, deadAfterMs: 5000, logger: quiet });
    const server = new FileServer(r, () => ({ dumps: path.join(root, 'dumps') }), quiet);
    bus.onRequest(handlers[r]?.(server) ?? ((req) => server.handle(req)));
    await bus.start();
    agents.push(bus);
  }
  await waitFor(async () => (await requestStatus({ host: '127.0.0.1', port })).liveRanks.length === 2, 'agents live');
  const job = { port, coord, agents, root };
  running.push(job);
  return job;
}

afterEach(async () => {
  for (const j of running.splice(0)) {
    await Promise.all(j.agents.map((a) => a.stop()));
    await j.coord.stop();
  }
  await cleanup();
});

function sameTree(job: Job, out: string): void {
  for (const r of [0, 1]) {
    for (const name of ['big.bin', 'dump.json']) {
      const rel = path.join('dumps', 'x', 'wave_1', `dp0_tp${r}_pp0_cp0`, name);
      expect(fs.readFileSync(path.join(out, rel)).equals(fs.readFileSync(path.join(job.root, rel)))).toBe(true);
    }
  }
}

describe('relayed chunks', () => {
  test('an agent answers a chunk as a small header plus a data frame; the tool gets the bytes whole', async () => {
    const seen: { header: Record<string, unknown>; frame: number }[] = [];
    const watching = (server: FileServer): RequestHandler => async (req: CoordinatorMsg) => {
      const reply = await server.handle(req);
      if (req.body === 'fileChunk') seen.push({ header: reply.fileChunk as Record<string, unknown>, frame: payloadOf(reply)?.length ?? -1 });
      return reply;
    };
    const job = await startJob({ 0: watching, 1: watching });
    // 'relay' per relayed request: `wavebus coordinator` applies its allocator tuning at the first (docs/bus.md, "Memory").
    let relays = 0;
    job.coord.on('relay', () => relays++);
    const out = tmpDir('wavebus-agg-relay-out-');
    expect(relays).toBe(0); // joining agents and status asks relay nothing
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out, what: 'dumps', chunkBytes: MiB, window: 2 });
    expect(m.complete).toBe(true);
    expect(m.dropped).toEqual({});
    sameTree(job, out);
    const chunks = seen.filter((s) => s.frame > 0);
    expect(chunks.length).toBeGreaterThanOrEqual(8); // 2 × 4 chunks of big.bin, plus dump.json
    expect(relays).toBeGreaterThanOrEqual(chunks.length);
    // The protobuf header carries no bytes: they are the frame.
    expect(seen.every((s) => s.header.data === undefined)).toBe(true);
  });

  test('a chunk corrupted in flight is asked for again; the file is verified and complete', async () => {
    let corrupted = 0;
    const flipping = (server: FileServer): RequestHandler => async (req: CoordinatorMsg) => {
      const reply = await server.handle(req);
      const data = payloadOf(reply);
      if (req.body === 'fileChunk' && Number(req.fileChunk.offset) === MiB && corrupted < 2 && data && data.length > 0) {
        corrupted++;
        const bad = Buffer.from(data);
        bad[bad.length >> 1] ^= 0x40;
        return withPayload({ fileChunk: reply.fileChunk }, bad);
      }
      return reply;
    };
    const job = await startJob({ 0: flipping, 1: flipping });
    const out = tmpDir('wavebus-agg-relay-out-');
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out, what: 'dumps', chunkBytes: MiB, window: 3 });
    expect(corrupted).toBe(2);
    expect(m.complete).toBe(true);
    expect(m.files.every((f) => f.verified && f.status === 'fetched')).toBe(true);
    sameTree(job, out);
  });

  test('a rank that always corrupts a chunk: the next lister resumes from the verified prefix; the error names rank and file', async () => {
    const breaking = (server: FileServer): RequestHandler => async (req: CoordinatorMsg) => {
      const reply = await server.handle(req);
      const data = payloadOf(reply);
      if (req.body === 'fileChunk' && req.fileChunk.path.endsWith('dp0_tp1_pp0_cp0/big.bin') && Number(req.fileChunk.offset) === 2 * MiB && data) {
        return withPayload({ fileChunk: reply.fileChunk }, Buffer.alloc(data.length, 7));
      }
      return reply;
    };
    const job = await startJob({ 0: breaking });
    const out = tmpDir('wavebus-agg-relay-out-');
    // Sequential, so rank 0 (the first lister) is asked first for every file.
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out, what: 'dumps', chunkBytes: MiB, window: 2, parallelFiles: 1 });
    expect(m.complete).toBe(true);
    const f = m.files.find((x) => x.path.endsWith('dp0_tp1_pp0_cp0/big.bin'))!;
    expect(f.rank).toBe(1);
    expect(f.status).toBe('resumed');
    sameTree(job, out);

    // With no other lister the file fails, named with its rank, and its .part keeps only verified bytes.
    const lone = await startJob({ 0: breaking, 1: breaking });
    const out2 = tmpDir('wavebus-agg-relay-out-');
    const m2 = await aggregate({ coordinator: { host: '127.0.0.1', port: lone.port }, out: out2, what: 'dumps', chunkBytes: MiB, window: 2 });
    const bad = m2.files.find((x) => x.path.endsWith('dp0_tp1_pp0_cp0/big.bin'))!;
    expect(bad.status).toBe('failed');
    expect(bad.error).toMatch(/dumps\/x\/wave_1\/dp0_tp1_pp0_cp0\/big\.bin from rank 0: chunk at 2097152: crc32c mismatch/);
    expect(bad.error).toMatch(/from rank 1/);
    const part = path.join(out2, 'dumps', 'x', 'wave_1', 'dp0_tp1_pp0_cp0', '.big.bin.part');
    expect(fs.statSync(part).size).toBe(2 * MiB);
    expect(fs.readFileSync(part).equals(fs.readFileSync(path.join(lone.root, 'dumps', 'x', 'wave_1', 'dp0_tp1_pp0_cp0', 'big.bin')).subarray(0, 2 * MiB))).toBe(true);
    expect(fs.existsSync(path.join(out2, 'dumps', 'x', 'wave_1', 'dp0_tp1_pp0_cp0', 'big.bin'))).toBe(false);
  });

  test('the coordinator tells each agent which chunk answers it has whole; a tool cannot say it', async () => {
    const asked: { id: number; received: number[] }[] = [];
    const recording = (server: FileServer): RequestHandler => async (req: CoordinatorMsg) => {
      if (req.body === 'fileChunk') asked.push({ id: req.requestId, received: (req.fileChunk.received ?? []).map(Number) });
      return server.handle(req);
    };
    const job = await startJob({ 0: recording });
    const out = tmpDir('wavebus-agg-relay-out-');
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out, what: 'dumps', chunkBytes: MiB, window: 2, parallelFiles: 1 });
    expect(m.complete).toBe(true);
    sameTree(job, out);
    // Every acknowledged id is one of this rank's earlier chunk requests, acknowledged once.
    const acked = asked.flatMap((a) => a.received);
    expect(acked.length).toBeGreaterThan(0);
    expect(new Set(acked).size).toBe(acked.length);
    for (const a of asked) for (const r of a.received) expect(asked.findIndex((x) => x.id === r)).toBeLessThan(asked.indexOf(a));
    // A tool's own `received` list never reaches the agent.
    asked.length = 0;
    const client = new RelayClient({ host: '127.0.0.1', port: job.port });
    try {
      await client.relay(0, 'fileChunk', { root: 'dumps', path: 'x/wave_1/dp0_tp0_pp0_cp0/big.bin', offset: 0, length: 1000, received: [123456] }, 5000);
    } finally {
      await client.close();
    }
    expect(asked).toHaveLength(1);
    expect(asked[0].received).not.toContain(123456);
  });

  test('an agent that still puts the bytes in the message is served too', async () => {
    const inline = (server: FileServer): RequestHandler => async (req: CoordinatorMsg) => {
      const reply = await server.handle(req);
      const data = payloadOf(reply);
      return data ? { fileChunk: { ...(reply.fileChunk as object), data } } : reply;
    };
    const job = await startJob({ 0: inline, 1: inline });
    const out = tmpDir('wavebus-agg-relay-out-');
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out, what: 'dumps', chunkBytes: MiB });
    expect(m.complete).toBe(true);
    sameTree(job, out);
  });

  test('the ROUTER drops, and counts, a data frame after anything but a chunk, and stray chunks', async () => {
    const job = await startJob();
    const d = new Dealer({ linger: 0 });
    d.connect(`tcp://127.0.0.1:${job.port + 1}`);
    try {
      const before = { ...job.coord.stats.dropped };
      const data = Buffer.alloc(4096, 1);
      await d.send([encodeAgentMessage({ globalRank: 0, heartbeat: { wave: 1, globalRank: 0 } }), data]); // frame_count
      await d.send([encodeAgentMessage({ requestId: 1, status: {} }), data]); // frame_count
      await d.send([encodeAgentMessage({ globalRank: 0, requestId: 424242, fileChunk: { globalRank: 0, offset: 0, crc32c: 0 } }), data]); // unknown_request
      await d.send([encodeAgentMessage({ globalRank: 0, requestId: 1, status: {} }), data, data]); // frame_count
      const grew = (k: string) => (job.coord.stats.dropped[k] ?? 0) - (before[k] ?? 0);
      await waitFor(() => grew('frame_count') === 3 && grew('unknown_request') === 1, 'the drops to be counted');
      // Still serving: a status request and a whole aggregation afterwards.
      expect((await requestStatus({ host: '127.0.0.1', port: job.port })).liveRanks).toEqual([0, 1]);
      const out = tmpDir('wavebus-agg-relay-out-');
      const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out, what: 'dumps' });
      expect(m.complete).toBe(true);
    } finally {
      d.close();
    }
  });

  test('a flood of relays to one rank: each one past the cap is refused at once and counted, none is lost', async () => {
    // Rank 0 holds every file list until released, so the relays pile up at the coordinator.
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let seen = 0;
    const holding = (server: FileServer): RequestHandler => async (req: CoordinatorMsg) => {
      seen++;
      await held;
      return server.handle(req);
    };
    const job = await startJob({ 0: holding });
    const client = new RelayClient({ host: '127.0.0.1', port: job.port });
    try {
      const extra = 10;
      const outcomes = Array.from({ length: MAX_RELAYS_IN_FLIGHT + extra }, () =>
        client.relay(0, 'fileList', { root: 'dumps', path: 'x' }, 20000).then(
          (r) => ({ ok: true as const, r }),
          (e: Error) => ({ ok: false as const, e }),
        ),
      );
      // The refusals come back while the first MAX_RELAYS_IN_FLIGHT are still held by the agent.
      await waitFor(() => job.coord.stats.relaysRefusedBusy === extra && seen === MAX_RELAYS_IN_FLIGHT, 'the cap to refuse the extra relays');
      release();
      const all = await Promise.all(outcomes);
      const refused = all.filter((o) => !o.ok);
      expect(refused).toHaveLength(extra);
      for (const o of refused) expect(String((o as { e: Error }).e.message)).toMatch(new RegExp(`rank 0 already has ${MAX_RELAYS_IN_FLIGHT} relayed requests waiting`));
      expect(all.filter((o) => o.ok)).toHaveLength(MAX_RELAYS_IN_FLIGHT);
      expect(seen).toBe(MAX_RELAYS_IN_FLIGHT);
      const st = JSON.parse((await requestStatus({ host: '127.0.0.1', port: job.port })).statusJson);
      expect(st.relays_refused_busy).toBe(extra);
      // The slots are free again.
      const again = await client.relay(0, 'fileList', { root: 'dumps', path: 'x' }, 5000);
      expect(again).toBeDefined();
    } finally {
      await client.close();
    }
  });
});
