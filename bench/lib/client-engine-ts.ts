// `wavebus bench client --lang ts`'s engine: one TypeScript engine loop at N running requests in its
// own process, timing in its own thread the calls it makes every step (the Python engine is
// bench/client_engine.py; the loop is the same). Modes:
//   tensor - TensorBatch.waveHeadNow (typed arrays into the ring) + beforeForwardNow + endOfWaveNow + pendingDumpsNow(finished)
//            (the calls without a promise: a promise only when something is due, docs/typescript-client.md)
//   dict   - the same with WavebusClient.waveHead and the request list (the convenience path)
//   off    - the tensor loop against a mailbox with every feature off (nothing is sent)
//   none   - the same loop without wavebus (the engine's own arrays only)
//   floor  - the same loop with each of the engine's wavebus calls (finishRows, freeRows, arrive,
//            blocks, the four per-step calls) made to a method that does nothing: what the calls alone cost
// Prints one JSON line: per-step p50/p99 µs of the step's calls in all, and per call; "events" is the
// step's sparse calls: the finished requests' finishRows() and freeRows(), and the arrivals (arrive() and
// blocks() of the requests taking the rows freed at the step before), the other four exclude them.
// The forward (not timed) is 3 ms: FORWARD "sleep" (the default) waits it on a timer, "spin" busy-waits
// it, as an engine thread in cudaStreamSynchronize does by default.
// usage: node client-engine-ts.js MODE N STEPS RUN_DIR [FORWARD] [WARM]
import { WavebusClient } from '../../src/client/client';
import { MailboxFeature } from '../../src/client/mailbox';
import type { TensorBatch } from '../../src/client/tensor-batch';
import type { RequestStep } from '../../src/messages';

// Untimed steps first, three times the timed ones (30 to 1000): V8 optimizes a function only after
// enough calls (after 30 steps the per-step calls still ran in its interpreter, at about twice the
// cost), and an engine runs far longer than this. A short run (a test's) stays short.
const warmSteps = (steps: number): number => Math.max(30, Math.min(1000, 3 * steps));
const FINISH_EVERY = 200; // each request runs ~200 steps: about n / 200 finish per step
const FORWARD_MS = 3; // a 3 ms forward, as bench overhead

/** xorshift32: the same random stream every run, without a dependency. */
function rng(seed: number): () => number {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 2 ** 32;
  };
}

const pct = (a: number[], p: number): number => {
  if (a.length === 0) return 0;
  const s = [...a].sort((x, y) => x - y);
  const at = (p / 100) * (s.length - 1);
  const lo = Math.floor(at);
  return s[lo] + (s[Math.min(lo + 1, s.length - 1)] - s[lo]) * (at - lo);
};

async function main(): Promise<void> {
  const [mode, nArg, stepsArg, runDir, forwardArg, warmArg] = process.argv.slice(2);
  const forward = forwardArg ?? 'sleep';
  if (forward !== 'sleep' && forward !== 'spin') throw new Error(`client-engine-ts: FORWARD must be sleep or spin, got ${JSON.stringify(forward)}`);
  const n = Number(nArg);
  const steps = Number(stepsArg);
  // --warm N: N untimed steps without the forward (only the calls: V8 tiers a function up by its
  // calls), so that the timed steps run the code a long-running engine runs.
  const warmGiven = Number(warmArg ?? 0);
  if (!Number.isInteger(warmGiven) || warmGiven < 0) throw new Error(`client-engine-ts: WARM must be a non-negative integer, got ${JSON.stringify(warmArg)}`);
  const WARM = warmGiven > 0 ? warmGiven : warmSteps(steps);
  const rand = rng(1);
  let c: WavebusClient | undefined;
  let batch: TensorBatch | undefined;
  if (mode === 'tensor' || mode === 'dict' || mode === 'off') {
    c = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
    if (mode !== 'dict') batch = c.tensorBatch(Math.max(n, 1), { vocab: 32000 });
    if (mode !== 'off') {
      // The agent turns the bus on once its coordinator's config is in force.
      const end = Date.now() + 20000;
      while ((c.featureFlags() & MailboxFeature.BUS_ACTIVE) === 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 10));
    }
  }
  if (mode === 'floor') {
    // Methods that do nothing, on objects the engine holds as it holds the client and its batch.
    const nothing = (): boolean => false;
    batch = { finishRows: nothing, freeRows: nothing, arrive: nothing, blocks: nothing, waveHeadNow: nothing } as unknown as TensorBatch;
    c = { beforeForwardNow: nothing, endOfWaveNow: nothing, pendingDumpsNow: nothing } as unknown as WavebusClient;
  }
  const rows = new Uint32Array(n).map((_, i) => i);
  const req = Array.from({ length: n }, (_, r) => `req-${r}`);
  const tables = Array.from({ length: n }, (_, r) => [r, r + n]);
  const age = new Uint32Array(n).map(() => Math.floor(rand() * FINISH_EVERY));
  let nextId = n;
  let prev: number[] = [];
  if (batch) {
    for (let r = 0; r < n; r++) {
      batch.arrive(r, req[r], { promptLen: 16 });
      batch.blocks(r, tables[r]);
    }
  }
  const ctx = { compilationHash: 'bench', globalStep: 0, reqIds: [] as string[], positions: [] as number[] };
  const totals: number[] = [];
  const per: Record<string, number[]> = { wave_head: [], before_forward: [], end_of_wave: [], pending_dump: [], events: [] };
  const toks = new Int32Array(n);
  const lps = new Float32Array(n).fill(-1);
  const now = (): number => performance.now() * 1000;
  for (let wave = 1; wave <= steps + WARM; wave++) {
    for (let i = 0; i < n; i++) toks[i] = Math.floor(rand() * 32000); // the engine's sampled ids (not timed)
    const done: number[] = [];
    for (let r = 0; r < n; r++) if (++age[r] >= FINISH_EVERY) done.push(r);
    const t0 = now();
    let te = t0;
    if (batch) {
      batch.finishRows(done); // the step's finished rows in one call
      te = now();
      const sent = batch.waveHeadNow(wave, { rows, tokenIds: toks, logprobs: lps });
      if (sent instanceof Promise) await sent;
    } else if (c) {
      const doneSet = new Set(done);
      const requests = Array.from({ length: n }, (_, r) => ({ reqId: req[r], newTokenIds: [toks[r]], newTokenLogprobs: [-1], blockIds: tables[r], finished: doneSet.has(r), freed: doneSet.has(r) }) as unknown as RequestStep);
      await c.waveHead(wave, { requests, nonFinite: [] });
    }
    const t1 = now();
    if (c) {
      ctx.globalStep = wave;
      const b = c.beforeForwardNow(ctx, []);
      if (b instanceof Promise) await b;
    }
    const t2 = now();
    // The forward on the device (not timed), between beforeForward and endOfWave as in an engine
    // (examples/torch-engine/engine.py): the vector of the next wave, decided by this head, arrives meanwhile.
    if (warmGiven > 0 && wave <= WARM) {
      // --warm's untimed steps: no forward.
    } else if (forward === 'spin') for (const until = performance.now() + FORWARD_MS; performance.now() < until; );
    else await new Promise((r) => setTimeout(r, FORWARD_MS));
    const t2f = now();
    const e = c?.endOfWaveNow(wave);
    if (e instanceof Promise) await e;
    const t3 = now();
    if (c) {
      // The step's finished requests asked in one call (the bench arms no dump: every one is freed).
      const k = c.pendingDumpsNow(done.map((r) => req[r]));
      if (k instanceof Promise) await k;
    }
    const tp = now();
    if (batch) batch.freeRows(done);
    const t4f = now();
    // The engine's own bookkeeping (not timed): the next requests' ids.
    for (const r of done) {
      req[r] = `req-${nextId++}`;
      age[r] = 0;
    }
    const t4 = now();
    if (batch) {
      // Rows freed at the last step take their new requests now, after the head that carried the free.
      for (const r of prev) {
        batch.arrive(r, req[r], { promptLen: 16 });
        batch.blocks(r, tables[r]);
      }
      prev = done;
    }
    const t5 = now();
    if (wave > WARM) {
      totals.push(t5 - t0 - (t2f - t2) - (t4 - t4f));
      per.wave_head.push(t1 - te);
      per.before_forward.push(t2 - t1);
      per.end_of_wave.push(t3 - t2f);
      per.pending_dump.push(tp - t3);
      per.events.push(te - t0 + t4f - tp + t5 - t4); // finishRows(), freeRows() and the arrivals
    }
  }
  const out: Record<string, unknown> = {
    mode, requests: n, steps, forward, warm: WARM, p50_us: pct(totals, 50), p99_us: pct(totals, 99),
    calls: Object.fromEntries(Object.entries(per).map(([k, v]) => [k, { p50_us: pct(v, 50), p99_us: pct(v, 99) }])),
  };
  if (c && mode !== 'floor') {
    // The heads that went are counted where they arrive (bench/client.ts asks the agent).
    if (batch) Object.assign(out, { ring_heads: batch.stats.ringHeads, inline_heads: batch.stats.inlineHeads });
    out.last_error = c.lastError;
    await c.close();
  }
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`${(e as Error).stack ?? String(e)}\n`);
    process.exit(1);
  },
);
