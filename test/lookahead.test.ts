// Decide ahead (docs/architecture.md, "Waves"), on a whole job of real processes (coordinator, one
// agent per rank, `wavebus sim`): with nothing due no end_of_wave ever waits, a dump detected in
// wave N-1 is copied at the end of wave N+1 by every rank, an engine that keeps a finished request's
// blocks while pendingDump says so gets a complete dump, and one that frees them anyway gets a
// manifest that says freed_before_copy. Then the coordinator's --lookahead-waves, on a real
// coordinator with the guard and real agents and clients (test/job-harness.ts): the head of wave N
// publishes the vector of N + lookahead (+ pp - 1), every agent learns that from its snapshot and
// raises its mailbox floor that far, so an engine ends up to `lookahead` waves past the last head
// without waiting, and a dump is copied `lookahead` waves after its detection, from the state of
// that wave on every rank.
import * as fs from 'fs';
import * as path from 'path';
import { DEFAULT_LOOKAHEAD_WAVES, checkLookahead, decideAheadWaves, maxLookahead, validDecideAhead } from '../src/bus/constants';
import { Coordinator } from '../src/bus/coordinator';
import { statusJson } from '../src/bus/coordinator-replies';
import { MailboxReader } from '../src/client/mailbox';
import { readNpyHeader } from '../src/artifacts/npy-reader';
import type { StepTelemetry } from '../src/messages';
import { inspectTree } from '../src/tools/inspect';
import { mailboxPath } from '../src/paths';
import { SimScheduler } from '../src/sim/scheduler';
import { runWavebus, tmpDir, waitFor } from './helpers';
import { G, POOL, startHarnessJob, step, stopHarnessJob, type HarnessJob } from './job-harness';
import { jobStarter, type Job } from './sim-job';

jest.setTimeout(180000);

const startJob = jobStarter();

interface LookaheadResult {
  rank: number;
  steps: number;
  vectorWaits: number;
  lateVectors: number;
  deferredFrees: number;
  endOfWaveTimeouts: number;
}

const REQUESTS = 3;
/**
 * The simulated engine is a pure function of its options: find the step F at which request 0
 * finishes (its blocks go back at the scheduling of F+1), and check F-1 is a decode step with it in
 * the batch, so a non-finite row planted there is detected at the head of F and armed for F+1.
 */
function finishStep(): number {
  const s = new SimScheduler({ requests: REQUESTS, numBlocks: 256, blockSize: 16, speculative: 2 });
  const batches = [];
  for (let step = 1; step <= 200; step++) batches[step] = s.step(step);
  const r0 = s.requests[0];
  const f = r0.finishedAt!;
  expect(f).toBeGreaterThan(10);
  expect(batches[f - 1].isPrompt).toBe(false);
  expect(batches[f - 1].reqIds).toContain(r0.id);
  return f;
}

function dumpOf(job: Job): { dir: string; info: Record<string, any>; manifest: Record<string, any> } | undefined {
  const root = path.join(job.kvRoot, 'logits_finite');
  if (!fs.existsSync(root)) return undefined;
  for (const req of fs.readdirSync(root)) {
    for (const w of fs.readdirSync(path.join(root, req))) {
      const dir = path.join(root, req, w);
      const m = path.join(dir, 'manifest.json');
      if (fs.existsSync(m)) return { dir, info: JSON.parse(fs.readFileSync(path.join(dir, 'request_info.json'), 'utf8')), manifest: JSON.parse(fs.readFileSync(m, 'utf8')) };
    }
  }
  return undefined;
}

describe('a wave ahead', () => {
  test('with everything on and nothing due, end_of_wave never waits and sends nothing once the forward has let the vector arrive (counted, not timed)', async () => {
    const ON = { detector: { token_repeat: { enabled: true }, logits_finite: { enabled: true }, garbled: { enabled: true }, spec_acceptance: { enabled: true } } };
    const job: HarnessJob = await startHarnessJob({ tp: 2, runtimeConfig: ON });
    try {
      await waitFor(() => job.ranks.every((r) => r.client.featureFlags() !== 0), 'bus active on every rank');
      const readers = job.ranks.map((_, g) => MailboxReader.open(mailboxPath(path.join(job.root, 'run'), g)));
      let sentBefore: number[] = [];
      let prev;
      for (let w = 1; w <= 200; w++) {
        if (w === 3) sentBefore = job.ranks.map((r) => r.client.stats.sent); // after the startup config (wave 2)
        await job.ranks[0].client.waveHead(w, prev);
        // The forward: long enough for the head of w to publish the vector of w+1 (decided a wave
        // ahead). The vector of w, which end_of_wave(w) needs, was published during wave w-1.
        await waitFor(() => readers.every((r) => r.floor() > w + 1), `vector ${w + 1} in every mailbox`, 20000, 1);
        for (const r of job.ranks) expect(await r.client.endOfWave(w)).toMatchObject({ timedOut: false });
        prev = { wave: w, requests: [step('steady-1', [1000 + w * 7], [1, 2], { numOutputTokens: w })], nonFinite: [] };
      }
      for (const [g, r] of job.ranks.entries()) {
        expect({ g, waits: r.client.stats.vectorWaits, timeouts: r.client.stats.endOfWaveTimeouts }).toEqual({ g, waits: 0, timeouts: 0 });
        // Only the startup config (due in wave 2, the first vector) needed the agent; from wave 3 on
        // TP0 sent its heads (one-way) and nothing else, the other rank nothing at all.
        expect(r.client.stats.dueWaves).toBe(1);
        expect(r.client.stats.sent - sentBefore[g]).toBe(g === 0 ? 198 : 0);
      }
      for (const r of readers) r.close();
    } finally {
      await stopHarnessJob(job);
    }
  });

  test('a dump detected in N-1 is copied at the end of N+1 by every rank, whole because the engine kept the blocks; no end_of_wave went without its vector', async () => {
    const f = finishStep();
    // A step of 40 ms (a 20 ms forward): each vector has a whole forward to arrive, far more than it needs.
    const job = await startJob({ world: 2, steps: f + 12, stepMs: 40, requests: REQUESTS, faults: { nonFinite: { request: 0, at: f - 1 } } });
    const results = (await job.engineResults()) as unknown as LookaheadResult[];
    const d = await job.until(() => dumpOf(job), 'the dump manifest', 30000);
    expect(d.info).toMatchObject({ detect_wave: f - 1, arm_wave: f + 1 });
    expect(d.manifest).toMatchObject({ arm_wave: f + 1, detect_wave: f - 1, completed_ranks: [0, 1], complete: true });
    expect(d.manifest.incomplete_reason).toBeUndefined();
    for (const g of [0, 1]) expect(JSON.parse(fs.readFileSync(path.join(d.dir, d.manifest.dirs[g], 'dump.json'), 'utf8'))).toMatchObject({ req_id: d.info.req_id });
    for (const r of results) {
      // Every rank kept request 0's blocks one step (its dump was pending at the scheduling of F+1).
      expect(r.deferredFrees).toBeGreaterThanOrEqual(1);
      // No end_of_wave went without its vector (the simulated ranks are not in lockstep, so a wait
      // here is scheduling, not the bus: the harness test above counts waits deterministically).
      expect({ rank: r.rank, timeouts: r.endOfWaveTimeouts }).toEqual({ rank: r.rank, timeouts: 0 });
    }
    const st = await job.status();
    expect(Object.keys(st.json.late_vectors).sort()).toEqual(['0', '1']); // reported per rank
    expect(st.json.dumps).toMatchObject({ completed: 1, freed_before_copy: 0 });
  });

  test('an engine that frees the blocks anyway: the manifest says freed_before_copy, never complete', async () => {
    const f = finishStep();
    const job = await startJob({ world: 2, steps: f + 12, stepMs: 40, requests: REQUESTS, faults: { nonFinite: { request: 0, at: f - 1 }, eagerFree: { from: 1 } } });
    const results = (await job.engineResults()) as unknown as LookaheadResult[];
    for (const r of results) expect(r.deferredFrees).toBe(0);
    const d = await job.until(() => dumpOf(job), 'the dump manifest', 30000);
    expect(d.manifest).toMatchObject({ arm_wave: f + 1, complete: false, incomplete_reason: 'freed_before_copy', freed_wave: f + 1, completed_ranks: [0, 1] });
    expect((await job.status()).json.dumps).toMatchObject({ completed: 0, incomplete: 1, freed_before_copy: 1 });
  });
});

const readJson = (...p: string[]) => JSON.parse(fs.readFileSync(path.join(...p), 'utf8'));
const manifestOf = (dir: string) => (fs.existsSync(path.join(dir, 'manifest.json')) ? readJson(dir, 'manifest.json') : undefined);
const BLOCKS = [2, 5];
const BLOCK_BYTES = G.blockSize * G.kvHeads * G.headDim * 2;
/** The byte the request's KV blocks hold during wave `w`. */
const marker = (w: number) => (w % 250) + 1;

describe('how far ahead the stream decides', () => {
  test('the lookahead is checked against the layout, naming where it came from', () => {
    expect(DEFAULT_LOOKAHEAD_WAVES).toBe(1);
    expect(checkLookahead(undefined, 1)).toBe(DEFAULT_LOOKAHEAD_WAVES);
    expect(checkLookahead(3, 1)).toBe(3);
    expect(checkLookahead(3, 2)).toBe(4); // a pipeline adds pp - 1
    expect(checkLookahead(6, 1)).toBe(6);
    expect(() => checkLookahead(7, 1, '--lookahead-waves')).toThrow(/^--lookahead-waves: expected an integer in 1\.\.6 .*got 7$/);
    expect(() => checkLookahead(0, 1)).toThrow(/lookahead-waves: expected an integer in 1\.\.6/);
    expect(() => checkLookahead(1.5, 1)).toThrow(/got 1\.5/);
    expect(() => checkLookahead(5, 3, 'WAVEBUS_LOOKAHEAD_WAVES')).toThrow(/^WAVEBUS_LOOKAHEAD_WAVES: expected an integer in 1\.\.4 /);
    // A pipeline deeper than the ring allows keeps deciding pp waves ahead, and no more.
    expect(maxLookahead(8)).toBe(1);
    expect(checkLookahead(undefined, 8)).toBe(8);
    expect(() => checkLookahead(2, 8)).toThrow(/in 1\.\.1 /);
    // What an agent accepts from a snapshot: lookahead + pp - 1 for an allowed lookahead, nothing else.
    expect([0, 1, 2, 6, 7, 2.5, '3', undefined].map((d) => validDecideAhead(d, 1))).toEqual([false, true, true, true, false, false, false, false]);
    expect([1, 2, 6, 7].map((d) => validDecideAhead(d, 2))).toEqual([false, true, true, false]);
  });

  test('the coordinator says how far ahead it decides (status decide_ahead); a bad option is refused before it binds', () => {
    const layout = { worldSize: 4, tp: 2, pp: 2, dp: 1, cp: 1 };
    const c = new Coordinator({ layout, lookaheadWaves: 2 });
    expect(c.decideAhead).toBe(3);
    expect(statusJson(c).decide_ahead).toBe(3);
    expect(new Coordinator({ layout: { ...layout, pp: 1, worldSize: 2 } }).decideAhead).toBe(decideAheadWaves(1));
    expect(() => new Coordinator({ layout, lookaheadWaves: 6 })).toThrow(/^lookaheadWaves: expected an integer in 1\.\.5 /);
  });

  test('`wavebus coordinator` refuses --lookahead-waves and WAVEBUS_LOOKAHEAD_WAVES out of range or not integers, by name', () => {
    const cwd = tmpDir('wavebus-lookahead-cli-');
    const base = ['coordinator', '--world-size', '2', '--tp', '2', '--pp', '1', '--port', '1'];
    const flag = runWavebus([...base, '--lookahead-waves', '9'], { cwd, timeout: 30000 });
    expect(flag.code).not.toBe(0);
    expect(flag.stderr).toMatch(/--lookahead-waves: expected an integer in 1\.\.6 .*got 9/);
    const env = runWavebus(base, { cwd, timeout: 30000, env: { ...process.env, WAVEBUS_LOOKAHEAD_WAVES: '3x' } });
    expect(env.code).not.toBe(0);
    expect(env.stderr).toMatch(/WAVEBUS_LOOKAHEAD_WAVES: expected an integer >= 1, got "3x"/);
    // The flag wins over the variable; both are checked against the layout (pp=2: 1..5).
    const pp = runWavebus(['coordinator', '--world-size', '4', '--tp', '2', '--pp', '2', '--port', '1', '--lookahead-waves', '6'], { cwd, timeout: 30000, env: { ...process.env, WAVEBUS_LOOKAHEAD_WAVES: '1' } });
    expect(pp.code).not.toBe(0);
    expect(pp.stderr).toMatch(/--lookahead-waves: expected an integer in 1\.\.5 /);
  });
});

test('lookahead 3: a NaN seen at head 5 is copied at the end of wave 8 on every rank, from that wave\'s state; pendingDump (and pendingDumps) says so from head 5 on; ranks end 3 waves past the last head without waiting, and the 4th waits only to the bound', async () => {
  const job = await startHarnessJob({
    tp: 2,
    lookaheadWaves: 3,
    endOfWaveTimeoutMs: 300,
    runtimeConfig: { detector: { logits_finite: { enabled: true, on_trigger: ['report', 'dump_kv'] } }, dump: { auto_max_times: 8, auto_cooldown_seconds: 0, free_headroom_bytes: 0, format: 'npy' } },
  });
  const readers: MailboxReader[] = [];
  const endWave = (g: number, w: number) => {
    const mem = job.ranks[g].seg.buffer();
    for (let i = 0; i < 2 * G.layers; i++) for (const b of BLOCKS) mem.fill(marker(w), i * POOL + b * BLOCK_BYTES, i * POOL + (b + 1) * BLOCK_BYTES);
    return job.ranks[g].client.endOfWave(w);
  };
  const tel = (w: number): StepTelemetry => ({ wave: w, requests: [step('req-l', [200 + w], BLOCKS, { numOutputTokens: w })], nonFinite: w === 4 ? [{ row: 0, reqId: 'req-l', kind: 'nan' }] : [] });
  try {
    // The head sends wave heads once its agent is on the bus (a feature bit in its mailbox).
    await waitFor(() => job.ranks[0].client.featureFlags() !== 0, 'the head on the bus');
    for (const g of job.ranks.keys()) readers.push(MailboxReader.open(mailboxPath(path.join(job.root, 'run'), g)));
    expect(statusJson(job.coordinator).decide_ahead).toBe(3);
    let prev: StepTelemetry | undefined;
    const LAST_HEAD = 10;
    for (let w = 1; w <= LAST_HEAD; w++) {
      await job.ranks[0].client.waveHead(w, prev);
      await waitFor(() => job.coordinator.streams.stream(0).wave >= w, `head ${w} handled`, 10000, 1);
      // Every agent took decide_ahead = 3 from its snapshot: head w decided every wave up to w + 3.
      await waitFor(() => readers.every((r) => r.floor() > w + 3), `floor past ${w + 3} in every mailbox`, 10000, 1);
      const results = await Promise.all(job.ranks.map((_, g) => endWave(g, w)));
      // Due: the startup config of head 1 (applied at the end of 1 + 3) and the dump.
      expect({ w, due: results.map((r) => r.due) }).toEqual({ w, due: w === 4 || w === 8 ? [true, true] : [false, false] });
      // pendingDump: from the end of wave 5 (head 5 put the dump in vector 8, below the floor) every
      // rank says keep req-l's blocks, three waves before the copy; after the copy nobody does.
      // The step's finished requests in one call (asked first: it settles the step, asking the agent
      // when a dump is due), the kept ones in order; then one by one, the same answers.
      const kept = await Promise.all(job.ranks.map((r) => r.client.pendingDumps(['req-other', 'req-l'])));
      expect({ w, kept }).toEqual({ w, kept: w >= 5 && w <= 7 ? [['req-l'], ['req-l']] : [[], []] });
      const pending = await Promise.all(job.ranks.map((r) => r.client.pendingDump('req-l')));
      expect({ w, pending }).toEqual({ w, pending: w >= 5 && w <= 7 ? [true, true] : [false, false] });
      prev = tel(w);
    }
    expect(() => job.ranks[0].client.pendingDumpsNow('req-l' as unknown as string[])).toThrow(/pendingDumps\(\): reqIds must be an array of request ids, got string/);
    const dir = path.join(job.dumpRoot, 'logits_finite', 'req-l', 'wave_8');
    await waitFor(() => manifestOf(dir)?.complete === true, 'the dump of wave 8');
    const m = manifestOf(dir);
    expect(m).toMatchObject({ detect_wave: 4, arm_wave: 8, expected_ranks: [0, 1], completed_ranks: [0, 1], skipped_ranks: {}, timed_out: false });
    for (const g of [0, 1]) {
      const npys = (m.files[g] as { path: string }[]).map((f) => f.path).filter((p) => p.endsWith('.npy'));
      expect(npys.length).toBe(2 * G.layers);
      for (const rel of npys) {
        const file = path.join(dir, rel);
        const data = fs.readFileSync(file).subarray(readNpyHeader(file).dataOffset);
        expect({ g, rel, bytes: [...new Set(data)] }).toEqual({ g, rel, bytes: [marker(8)] });
      }
    }
    expect(inspectTree(dir, { verify: true }).problems).toEqual([]);
    // No more heads (a stalled head, coordinator or bus): waves 11..13 were decided by heads 8..10,
    // so they end at once; wave 14 is past the floor and waits for its vector, to the bound only.
    for (let w = LAST_HEAD + 1; w <= LAST_HEAD + 3; w++) {
      const results = await Promise.all(job.ranks.map((_, g) => endWave(g, w)));
      expect({ w, results }).toEqual({ w, results: [{ due: false, timedOut: false }, { due: false, timedOut: false }] });
    }
    for (const [g, r] of job.ranks.entries()) expect({ g, waits: r.client.stats.vectorWaits, late: r.client.stats.lateVectors }).toEqual({ g, waits: 0, late: 0 });
    const t0 = performance.now();
    const late = await Promise.all(job.ranks.map((_, g) => endWave(g, LAST_HEAD + 4)));
    expect(late).toEqual([{ due: false, timedOut: true }, { due: false, timedOut: true }]);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(290);
    for (const r of job.ranks) expect({ waits: r.client.stats.vectorWaits, timeouts: r.client.stats.endOfWaveTimeouts }).toEqual({ waits: 1, timeouts: 1 });
  } finally {
    for (const r of readers) r.close();
    await stopHarnessJob(job);
  }
});
