// The TypeScript client's tensor hot path (docs/typescript-client.md, "The tensor hot path"):
// typed-array columns through the telemetry ring (mapped with native.mapFile). The coordinator
// gets exactly the columns the dict path (TelemetryColumnizer) gives for the same steps, whether
// the head went whole into the ring or inline (a step with more events than the ring holds);
// a detector fires on them; garbage in the ring is counted per rank and never passed on.
import * as fs from 'fs';
import { spawnSync } from 'child_process';
import * as path from 'path';
import type { RequestStep } from '../src/messages';
import { MailboxFeature } from '../src/client/mailbox';
import { columnsToWire, TelemetryColumnizer } from '../src/client/telemetry';
import type { TensorBatchOptions } from '../src/client/tensor-batch';
import { bindBytes, blocksBytes, HeadBytes, nonFiniteBytes } from '../src/client/head-bytes';
import { encodeTrusted, messageType } from '../src/proto';
import { cleanup, ROOT, tmpDir, waitFor } from './helpers';
import { startHarnessJob, stopHarnessJob, type HarnessJob } from './job-harness';
import { TENSOR_HEAD_CFG as CFG, expectDictColumns, expectEveryWaveInOrder, recordHeads as record } from './tensor-head-parity';

afterAll(cleanup);
jest.setTimeout(120000);

/** The steps of test/tensor-head.test.ts's Python driver: arrivals, a finish, a free, a new request in the freed row, a table change; row 0 repeats a token. */
async function drive(job: HarnessJob, opts: TensorBatchOptions, garbage = false, registered = false) {
  const c = job.ranks[0].client;
  await waitFor(() => (c.featureFlags() & MailboxFeature.BUS_ACTIVE) !== 0, 'the bus on');
  const batch = c.tensorBatch(8, { vocab: 1000, ...opts });
  // registered: the engine's own block table (written in place) given once, instead of blocks() calls.
  const bt = new Int32Array(8 * 4).fill(-1);
  const bn = new Int32Array(8);
  if (registered) batch.blockTable(bt, 4, bn);
  const setBlocks = (r: number, ids: number[]) => {
    tables.set(r, ids);
    if (!registered) return batch.blocks(r, ids);
    bt.fill(-1, r * 4, r * 4 + 4);
    bt.set(ids, r * 4);
    bn[r] = ids.length;
  };
  const ref = new TelemetryColumnizer();
  const dict: ReturnType<typeof columnsToWire>[] = [];
  const live = new Map<number, string>();
  const tables = new Map<number, number[]>();
  let sent = 0;
  for (let wave = 1; wave <= 40; wave++) {
    if (wave === 1) {
      for (const [r, q] of [[0, 'a'], [1, 'b'], [2, 'c']] as const) {
        batch.arrive(r, q, { promptLen: 5 });
        live.set(r, q);
        setBlocks(r, [r, r + 8]);
      }
    }
    if (wave === 12) {
      batch.arrive(1, 'd', { promptLen: 3 });
      live.set(1, 'd');
      setBlocks(1, [9]);
    }
    if (wave === 20) {
      setBlocks(2, [2, 10, 11]);
    }
    const rows = [...live.keys()].sort((a, b) => a - b);
    const toks = rows.map((r) => (r === 0 ? 7 : (wave * 13 + r) % 1000));
    const lps = rows.map((r) => -0.5 - r);
    const fin = wave === 10 ? [1] : [];
    const freed = wave === 11 ? [1] : [];
    for (const r of fin) batch.finish(r);
    for (const r of freed) batch.free(r);
    const reqs: RequestStep[] = rows.map((r, i) => ({
      reqId: live.get(r)!, newTokenIds: [toks[i]], newTokenLogprobs: [lps[i]], blockIds: tables.get(r)!, finished: fin.includes(r), freed: freed.includes(r),
      promptLen: live.get(r) === 'd' ? 3 : 5, draftLen: 0, accepted: 0, numOutputTokens: 0,
    } as RequestStep));
    dict.push(columnsToWire(ref.columns(reqs)));
    if (garbage && wave === 31) toks[0] = 5000;
    // The engine's own arrays: Int32Array rows and ids, Float64Array log-probs (converted in the one copy).
    if (await batch.waveHead(wave, { rows: Int32Array.from(rows), tokenIds: Int32Array.from(toks), logprobs: Float64Array.from(lps) })) sent++;
    for (const r of freed) live.delete(r);
    await c.endOfWave(wave);
  }
  return { dict, sent, stats: batch.stats, blockStats: batch.blockStats, lastError: c.lastError };
}

test('typed arrays through the ring give the coordinator the dict path\'s columns, every head whole in the ring; token_repeat fires on them', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: CFG });
  try {
    const seen = record(job);
    const got = await drive(job, {});
    if (got.sent !== 40) throw new Error(`sent ${got.sent} of 40 heads: ${got.lastError}`);
    expect(got.stats).toEqual({ ringHeads: 40, inlineHeads: 0 });
    await waitFor(() => seen.length === 40, 'every head at the coordinator');
    expectEveryWaveInOrder(seen);
    expectDictColumns(seen, got.dict);
    expect(job.ranks[0].agent.ringStats.ringGarbage).toBe(0);
    await waitFor(() => fs.existsSync(job.reportRoot) && fs.readdirSync(job.reportRoot).length > 0, 'the token_repeat incident report');
  } finally {
    await stopHarnessJob(job);
  }
});


test('a registered block table (written in place, no blocks() calls) gives the coordinator the same columns', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: CFG });
  try {
    const seen = record(job);
    const got = await drive(job, {}, false, true);
    if (got.sent !== 40) throw new Error(`sent ${got.sent} of 40 heads: ${got.lastError}`);
    // Rows 0-2 at wave 1, row 1's new request at wave 12, row 2's third block at wave 20.
    expect(got.blockStats).toEqual({ blockRowsSent: 5, badBlockRows: 0 });
    await waitFor(() => seen.length === 40, 'every head at the coordinator');
    expectDictColumns(seen, got.dict);
  } finally {
    await stopHarnessJob(job);
  }
});
test('a step with more finish/free events than the ring holds goes inline with the same columns, in order', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: CFG });
  try {
    const seen = record(job);
    const got = await drive(job, { maxEvents: 0 });
    expect(got.sent).toBe(40);
    expect(got.stats).toEqual({ ringHeads: 38, inlineHeads: 2 }); // waves 10 (finish) and 11 (free)
    await waitFor(() => seen.length === 40, 'every head at the coordinator');
    expectEveryWaveInOrder(seen);
    expectDictColumns(seen, got.dict);
  } finally {
    await stopHarnessJob(job);
  }
});

test('garbage in the ring (a token id past the vocab) is dropped and counted per rank; the step keeps its rows; the heads go on', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: CFG });
  try {
    const seen = record(job);
    const got = await drive(job, {}, true);
    expect(got.sent).toBe(40);
    await waitFor(() => seen.length === 40, 'every head at the coordinator');
    expect(job.ranks[0].agent.ringStats.ringGarbageByKind).toEqual({ token_out_of_range: 1 });
    expect(seen[30].columns!.tokenIds.length).toBe(0);
    expect(seen[30].columns!.rows).toBe(3);
    expect(seen[31].columns!.tokenIds.length).toBe(3);
    await waitFor(() => (job.coordinator as any).vectors.status().ringGarbage['0'] === 1, 'ring garbage in the coordinator status (heartbeat)');
  } finally {
    await stopHarnessJob(job);
  }
});

test('bad columns are refused at the call, naming the argument', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: CFG });
  try {
    const c = job.ranks[0].client;
    await waitFor(() => (c.featureFlags() & MailboxFeature.BUS_ACTIVE) !== 0, 'the bus on');
    const batch = c.tensorBatch(4);
    expect(() => c.tensorBatch(0)).toThrow(/maxRows must be in 1\.\./);
    expect(() => batch.arrive(4, 'x')).toThrow(/arrive\(\): row must be an integer in 0\.\.3/);
    batch.arrive(0, 'x');
    expect(() => batch.arrive(0, 'y')).toThrow(/row 0 still holds request 'x'/);
    await expect(batch.waveHead(1, { rows: new BigUint64Array(1) as never })).rejects.toThrow(/rows must be a typed array/);
    await expect(batch.waveHead(1, { rows: Uint32Array.of(0), tokenIds: Uint32Array.of(1, 2) })).rejects.toThrow(/2 tokenIds for 1 rows/);
    await expect(batch.waveHead(1, { rows: Uint32Array.of(0), draftLen: Uint32Array.of(1) })).rejects.toThrow(/draftLen and accepted go together/);
    await expect(batch.waveHead(1.5, { rows: Uint32Array.of(0) })).rejects.toThrow(/wave 1.5 is not a non-negative integer/);
    await expect(batch.waveHead(1, { rows: Uint32Array.of(0), tokenIds: Uint32Array.of(3) })).resolves.toBe(true);
  } finally {
    await stopHarnessJob(job);
  }
});

test("the head's sparse part, joined from bytes encoded once per event, is protobufjs's message byte for byte", () => {
  // head-bytes.ts builds the head from each binding's and table's bytes (encoded when reported)
  // inside a hand-written frame: it must be what protobufjs writes for the same message.
  const WaveHeadRequest = messageType('WaveHeadRequest');
  const hb = new HeadBytes();
  let x = 7;
  const rand = (n: number): number => {
    x = (x * 1103515245 + 12345) % 2 ** 31;
    return x % n;
  };
  for (let i = 0; i < 2000; i++) {
    const wave = [0, 1, 127, 128, 2 ** 40 + i, 2 ** 53 - 1][rand(6)];
    const teleWave = wave > 0 ? wave - 1 : 0;
    // Non-ASCII ids (two-, three- and four-byte UTF-8) and zeros, which the proto3 form leaves out.
    const bind = Array.from({ length: rand(5) }, (_, j) => ({ slot: rand(3) === 0 ? 0 : rand(5000), reqId: [`q${i}-${j}`, `é${i}-ü`, `請求-${j}`, `🦀${i}`.repeat(rand(40))][rand(4)] || 'x', promptLen: rand(3) === 0 ? 0 : rand(300), promptTokenIds: rand(4) === 0 ? [1, 2 ** 32 - 1] : [] }));
    const blocks = Array.from({ length: rand(5) }, () => ({ slot: rand(3) === 0 ? 0 : rand(5000), blockIds: Array.from({ length: rand(40) }, () => rand(2 ** 31) * 2) }));
    const nonFinite = rand(5) === 0 ? [{ row: 1 + rand(9), reqId: 'r', kind: 'nan' }] : [];
    // Lists reused step to step hold stale entries past their counts: those never go.
    const stale = bindBytes(9, 'stale', 1);
    const bb = [...bind.map((b) => bindBytes(b.slot, b.reqId, b.promptLen, b.promptTokenIds)), stale];
    const tb = [...blocks.map((b) => blocksBytes(b.slot, b.blockIds)), stale];
    const len = hb.build(wave, teleWave, bb, bind.length, tb, blocks.length, nonFiniteBytes(nonFinite));
    const got = hb.bytes();
    expect(got.length).toBe(len);
    // protobufjs writes a field that is set, even to zero: the reference sets only what the head carries.
    const tel: Record<string, unknown> = {};
    if (teleWave > 0) tel.wave = teleWave;
    if (nonFinite.length > 0) tel.nonFinite = nonFinite;
    const set = (o: Record<string, unknown>): Record<string, unknown> => Object.fromEntries(Object.entries(o).filter(([, v]) => v !== 0 && !(Array.isArray(v) && v.length === 0)));
    if (bind.length + blocks.length > 0) tel.columns = { bind: bind.map(set), blocks: blocks.map(set) };
    const ref = encodeTrusted(WaveHeadRequest, wave > 0 ? { wave, telemetry: tel } : { telemetry: tel });
    expect(Buffer.from(got).equals(ref)).toBe(true);
  }
});

test("the usual tensor step allocates nothing: 20000 heads into the ring with their re-sends, no young-generation growth and no GC", () => {
  // A per-step allocation (a closure's context, a BigInt, a view, an object of columns) is work the
  // engine's step pays and garbage its process collects; the usual step makes none. Measured on the
  // young generation (where they land) after a warm-up, in a process of its own as an engine's
  // (the other tests here hand the batch other column kinds), on dist/: a batch of 256 rows.
  const dir = tmpDir('wavebus-step-alloc-');
  const script = `
    const v8 = require('v8');
    v8.setFlagsFromString('--expose-gc');
    const gc = require('vm').runInNewContext('gc');
    const D = ${JSON.stringify(path.join(ROOT, 'dist', 'src'))};
    const { TensorBatch } = require(D + '/client/tensor-batch');
    const { TelemetryRingWriter } = require(D + '/client/telemetry-ring-writer');
    const { TelemetryRingReader, checkRingAsk } = require(D + '/agent/telemetry-ring');
    const { RING_HEADER } = require(D + '/client/ring-layout');
    const n = 256;
    const file = ${JSON.stringify(path.join(dir, 'telemetry-ring-local0'))};
    const reader = TelemetryRingReader.create(file, checkRingAsk({ ringRows: n, ringTokens: n, ringEvents: 64, ringVocab: 32000 }));
    const ring = TelemetryRingWriter.open(file);
    const feats = { tp0: true, bus: true, detectors: ['token_repeat'], itemSync: false, snapshots: false, endOfWaveTimeoutMs: 50 };
    const batch = new TensorBatch({ gate: () => feats, ring: () => ring, send: () => undefined, epoch: () => 1 }, n, { vocab: 32000 });
    for (let r = 0; r < n; r++) { batch.arrive(r, 'req-' + r, { promptLen: 16 }); batch.blocks(r, [r, r + n]); }
    const step = { rows: new Uint32Array(n).map((_, i) => i), tokenIds: new Int32Array(n).fill(7), logprobs: new Float32Array(n).fill(-1) };
    const lo = RING_HEADER.consumed / 4;
    let wave = 1;
    // The agent takes each slot: the consumed word's low half (u32: no BigInt here either).
    const run = (steps) => { for (const end = wave + steps; wave < end; wave++) { batch.waveHeadNow(wave, step); Atomics.store(ring.halves, lo, 2 * wave); } };
    run(20000); // the first head carries every binding (a message naming its slot); then V8 optimizes
    const young = () => v8.getHeapSpaceStatistics().find((s) => s.space_name === 'new_space').space_used_size;
    gc(); // an empty young generation: only the steps could fill it
    const gcs = [];
    const obs = new (require('perf_hooks').PerformanceObserver)((list) => gcs.push(...list.getEntries().map((e) => e.name)));
    obs.observe({ entryTypes: ['gc'] });
    const start = young(); // read twice only: each read allocates its statistics
    run(20000);
    const grown = young() - start;
    setTimeout(() => { obs.disconnect(); reader.close(); console.log(JSON.stringify({ heads: batch.stats.ringHeads, grown, gcs })); }, 50);
  `;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 60000 });
  expect({ code: r.status, stderr: r.status === 0 ? '' : r.stderr }).toEqual({ code: 0, stderr: '' });
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  expect(out.heads).toBe(40000);
  // 20000 steps: one 8-byte allocation per step would be 160 KB (or a scavenge).
  expect({ grown: out.grown < 16384 ? 'none' : out.grown, gcs: out.gcs }).toEqual({ grown: 'none', gcs: [] });
});
