// The simulated engine is the test bed for everything else: it must be deterministic across ranks
// and its faults must be exactly where the config says.
import { parseFaults } from '../src/sim/faults';
import { fillKvPool, kvBlockBytes, type KvGeometry } from '../src/sim/kv-pattern';
import { SimScheduler } from '../src/sim/scheduler';
import { TpBarrier } from '../src/sim/tp-barrier';
import * as fs from 'fs';
import * as path from 'path';
import { cleanup, runWavebus, tmpDir } from './helpers';

afterAll(cleanup);

const G: KvGeometry = { layers: 2, numBlocks: 8, blockSize: 4, kvHeads: 2, headDim: 4, dtype: 'bfloat16' };

test('every rank computes the same batches and block tables', () => {
  const a = new SimScheduler({ requests: 6, numBlocks: 64, blockSize: 16, speculative: 2 });
  const b = new SimScheduler({ requests: 6, numBlocks: 64, blockSize: 16, speculative: 2 });
  for (let s = 1; s <= 120; s++) expect(JSON.stringify(a.step(s))).toBe(JSON.stringify(b.step(s)));
});

test('requests are prefilled, decode, finish, then free their blocks', () => {
  const s = new SimScheduler({ requests: 2, numBlocks: 64, blockSize: 16, speculative: 0 });
  const first = s.step(1);
  expect(first.isPrompt).toBe(true);
  expect(first.reqIds).toEqual([expect.stringMatching(/^req-0-[0-9a-f]{8}$/), expect.stringMatching(/^req-1-[0-9a-f]{8}$/)]);
  let finishedAt = 0;
  let freedAt = 0;
  for (let step = 2; step < 200 && !freedAt; step++) {
    const b = s.step(step);
    const r0 = b.telemetry.requests.find((r) => r.reqId.startsWith('req-0-'));
    if (r0?.finished) finishedAt = step;
    if (r0?.freed) freedAt = step;
  }
  expect(finishedAt).toBeGreaterThan(0);
  expect(freedAt).toBe(finishedAt + 1);
});

test('faults land on the configured request and step', () => {
  const s = new SimScheduler({ requests: 4, numBlocks: 128, blockSize: 16, speculative: 2 }, parseFaults('{"nonFinite":{"request":2,"at":9,"kind":"pos_inf"},"repetition":{"request":1,"from":5,"period":2},"specDrift":{"request":3,"from":4}}'));
  const tokens: number[] = [];
  for (let step = 1; step <= 12; step++) {
    const b = s.step(step);
    expect(b.telemetry.nonFinite.length).toBe(step === 9 ? 1 : 0);
    if (step === 9) expect(b.telemetry.nonFinite[0]).toMatchObject({ reqId: expect.stringMatching(/^req-2-/), kind: 'pos_inf' });
    const r1 = b.telemetry.requests.find((r) => r.reqId.startsWith('req-1-'));
    if (step >= 6 && r1) tokens.push(r1.newTokenIds[0]);
    const r3 = b.telemetry.requests.find((r) => r.reqId.startsWith('req-3-'));
    if (step >= 4 && r3 && !b.isPrompt) expect(r3.accepted).toBe(1);
  }
  expect(new Set(tokens).size).toBe(2);
});

test('fault config errors name the field', () => {
  expect(() => parseFaults('{"bogus":{}}')).toThrow(/unknown fault 'bogus'/);
  expect(() => parseFaults('{"rankDies":{"rank":-1,"at":3}}')).toThrow(/--faults.rankDies.rank: must be a non-negative integer/);
  expect(() => parseFaults('{"nonFinite":{"request":1,"at":2,"kind":"zero"}}')).toThrow(/kind: must be nan, pos_inf or neg_inf/);
  expect(() => parseFaults('{oops')).toThrow(/not valid JSON/);
  expect(() => parseFaults('/nonexistent/faults.json')).toThrow(/cannot read/);
});

test('KV contents are a pure function of (layer, kv, block, slot, head, dim, rank) and finite', () => {
  const pool = Buffer.alloc(G.numBlocks * G.blockSize * G.kvHeads * G.headDim * 2);
  fillKvPool(pool, G, 1, 'v', 3);
  const per = G.blockSize * G.kvHeads * G.headDim * 2;
  for (let b = 0; b < G.numBlocks; b++) expect(pool.subarray(b * per, (b + 1) * per).equals(kvBlockBytes(G, 1, 'v', b, 3))).toBe(true);
  expect(kvBlockBytes(G, 1, 'v', 2, 3).equals(kvBlockBytes(G, 1, 'v', 2, 2))).toBe(false);
  expect(kvBlockBytes(G, 1, 'k', 2, 3).equals(kvBlockBytes(G, 1, 'v', 2, 3))).toBe(false);
  for (let i = 0; i < pool.length; i += 2) expect((pool.readUInt16LE(i) & 0x7f80) === 0x7f80).toBe(false); // no NaN/Inf exponent
});

test('TP lockstep: no rank of the group passes a step before every rank reached it', async () => {
  const dir = tmpDir('wavebus-tp-barrier-');
  // Three ranks of one group, opened in any order (a peer not listening yet is retried).
  const opening = [0, 1, 2].map((t) => TpBarrier.open(dir, 0, t, [0, 1, 2].filter((p) => p !== t)));
  const [a, b, c] = await Promise.all(opening);
  try {
    const passed: string[] = [];
    const pa = a.arrive(1).then(() => passed.push('a1'));
    const pb = b.arrive(1).then(() => passed.push('b1'));
    await new Promise((r) => setTimeout(r, 50));
    expect(passed).toEqual([]); // c has not reached step 1: a and b wait
    await c.arrive(1);
    await Promise.all([pa, pb]);
    expect(passed.sort()).toEqual(['a1', 'b1']);
    // Steps in quick succession, each rank running ahead by one send: nobody is let through early.
    for (let step = 2; step <= 50; step++) await Promise.all([a.arrive(step), b.arrive(step), c.arrive(step)]);
  } finally {
    for (const x of [a, b, c]) x.close();
  }
  // A peer that goes away releases the others (the simulated job goes on; a real one would fail).
  const [d, e] = await Promise.all([TpBarrier.open(dir, 1, 0, [1]), TpBarrier.open(dir, 1, 1, [0])]);
  const waiting = d.arrive(1);
  e.close();
  await waiting;
  d.close();
});

test('wavebus sim: a slow TP rank holds its group back in lockstep, not without it', () => {
  // Rank 1's forward is 20 ms longer each step. In lockstep (the default) rank 0 cannot end its
  // steps sooner; with --no-tp-lockstep it runs on alone. Lower bounds only, no speed asserted.
  const run = (extra: string[]) => {
    const dir = tmpDir('wavebus-sim-lockstep-');
    const r = runWavebus(['sim', '--detached', '--nproc-per-node', '2', '--steps', '10', '--step-ms', '0', '--requests', '4', '--result-dir', dir, '--faults', '{"slowRank":{"rank":1,"extraMs":20}}', ...extra]);
    expect(r.code).toBe(0);
    return [0, 1].map((g) => JSON.parse(fs.readFileSync(path.join(dir, `rank${g}.json`), 'utf8')) as { wallMs: number; steps: number });
  };
  const [r0] = run([]);
  expect(r0.steps).toBe(10);
  expect(r0.wallMs).toBeGreaterThanOrEqual(10 * 20);
  const [alone, slow] = run(['--no-tp-lockstep']);
  expect(slow.wallMs).toBeGreaterThanOrEqual(10 * 20);
  expect(alone.wallMs).toBeLessThan(slow.wallMs);
}, 60000);
