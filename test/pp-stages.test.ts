// Pipeline stages on the wave bus (docs/runtime-guard.md, "Pipeline stages"), on a real coordinator
// with the guard, one real agent and TypeScript client per rank, KV pools in shared memory
// (TP=2 × PP=2: stage 0 = ranks 0, 1; stage 1 = ranks 2, 3, head 2). The stream decides
// decideAheadWaves(pp) = 2 waves ahead, so a stage-0 rank that runs a wave ahead of its head has
// every vector before it ends that wave: it copies its layers at the same copy wave as the last
// stage, a config switches at the same wave on every stage, and a rank that ended the copy wave
// before its job came acks at once with wave_already_ended.
import * as fs from 'fs';
import * as path from 'path';
import { decideAheadWaves } from '../src/bus/constants';
import { MailboxFeature, MailboxReader } from '../src/client/mailbox';
import { readNpyHeader } from '../src/artifacts/npy-reader';
import type { StepTelemetry } from '../src/messages';
import { inspectTree } from '../src/tools/inspect';
import { mailboxPath } from '../src/paths';
import { cleanup, waitFor } from './helpers';
import { G, POOL, startHarnessJob, step, stopHarnessJob, type HarnessJob } from './job-harness';

jest.setTimeout(180000);

const jobs: HarnessJob[] = [];
afterEach(async () => {
  for (const j of jobs.splice(0)) await stopHarnessJob(j);
});
afterAll(() => cleanup());

const readJson = (...p: string[]) => JSON.parse(fs.readFileSync(path.join(...p), 'utf8'));
const manifestOf = (dir: string) => (fs.existsSync(path.join(dir, 'manifest.json')) ? readJson(dir, 'manifest.json') : undefined);
const STAGE0 = [0, 1];
const STAGE1 = [2, 3];
const HEAD = 2;
const BLOCKS = [3, 9];
const BLOCK_BYTES = G.blockSize * G.kvHeads * G.headDim * 2;
/** The byte the KV blocks of the request hold during wave `w` (the engine's state of that wave). */
const marker = (w: number) => (w % 250) + 1;

async function start(runtimeConfig: Record<string, unknown>, endOfWaveTimeoutMs?: number): Promise<HarnessJob> {
  const job = await startHarnessJob({ tp: 2, pp: 2, hotReload: true, runtimeConfig, endOfWaveTimeoutMs });
  jobs.push(job);
  await waitFor(() => job.ranks[HEAD].client.featureFlags() !== 0, 'the head on the bus');
  return job;
}

/** The engine of rank `g` ends wave `w`: its request's blocks hold marker(w) in every layer it owns, then end_of_wave. */
function endWave(job: HarnessJob, g: number, w: number) {
  const mem = job.ranks[g].seg.buffer();
  const stage = job.ranks[g].agent.identity.ppRank;
  for (let l = 0; l < G.layers; l++) {
    if (Math.floor((l * 2) / G.layers) !== stage) continue;
    for (let kv = 0; kv < 2; kv++) for (const b of BLOCKS) mem.fill(marker(w), (2 * l + kv) * POOL + b * BLOCK_BYTES, (2 * l + kv) * POOL + (b + 1) * BLOCK_BYTES);
  }
  return job.ranks[g].client.endOfWave(w);
}

function tel(w: number, nan = false): StepTelemetry {
  return { wave: w, requests: [step('req-p', [100 + w], BLOCKS, { numOutputTokens: w })], nonFinite: nan ? [{ row: 0, reqId: 'req-p', kind: 'nan' }] : [] };
}

/** Wait until the coordinator handled head `w` and every mailbox has its vector (the forward that follows). */
async function headHandled(job: HarnessJob, readers: MailboxReader[], w: number): Promise<void> {
  await waitFor(() => job.coordinator.streams.stream(0).wave >= w, `head ${w} handled`, 10000, 1);
  const v = w + decideAheadWaves(2);
  await waitFor(() => readers.every((r) => r.floor() > v), `vector ${v} in every mailbox`, 10000, 1);
}

/** Every tensor file of `rank` in the dump holds nothing but marker(copyWave): its state at the copy wave. */
function expectCopiedAt(dir: string, m: any, rank: number, copyWave: number): void {
  const npys = (m.files[rank] as { path: string }[]).map((f) => f.path).filter((p) => p.endsWith('.npy'));
  expect(npys.length).toBe(2); // its stage's one layer, k and v
  for (const rel of npys) {
    const file = path.join(dir, rel);
    const data = fs.readFileSync(file).subarray(readNpyHeader(file).dataOffset);
    expect(data.length).toBe(BLOCKS.length * BLOCK_BYTES);
    expect({ rank, rel, bytes: [...new Set(data)] }).toEqual({ rank, rel, bytes: [marker(copyWave)] });
  }
}

const NAN_DUMP = { detector: { logits_finite: { enabled: true, on_trigger: ['report', 'dump_kv'] } }, dump: { auto_max_times: 8, auto_cooldown_seconds: 0, free_headroom_bytes: 0, format: 'npy', pp_stages: 'all' } };

test('pp_stages "all", stage 0 a wave ahead of its head: every stage copies, all from the same copy wave, and no end_of_wave waits', async () => {
  expect(decideAheadWaves(1)).toBe(1);
  expect(decideAheadWaves(2)).toBe(2);
  const job = await start(NAN_DUMP);
  const readers = job.ranks.map((_, g) => MailboxReader.open(mailboxPath(path.join(job.root, 'run'), g)));
  try {
    // A NaN in wave 4 is seen at the head of 5, armed for 5 + 2 = 7.
    let prev: StepTelemetry | undefined;
    await Promise.all(STAGE0.map((g) => endWave(job, g, 1)));
    for (let w = 1; w <= 9; w++) {
      // Stage 0 runs a wave ahead: it ends w+1 while the head is only opening w. It needs vector
      // w+1, which head w-1 published (decided 2 ahead); deciding 1 ahead, it would wait for head w.
      await Promise.all(STAGE0.map((g) => endWave(job, g, w + 1)));
      await job.ranks[HEAD].client.waveHead(w, prev);
      await headHandled(job, readers, w);
      await Promise.all(STAGE1.map((g) => endWave(job, g, w)));
      prev = tel(w, w === 4);
    }
    const dir = path.join(job.dumpRoot, 'logits_finite', 'req-p', 'wave_7');
    await waitFor(() => manifestOf(dir)?.complete === true, 'the dump, every stage');
    const m = manifestOf(dir);
    expect(m).toMatchObject({ detect_wave: 4, arm_wave: 7, pp_stages: 'all', expected_ranks: [0, 1, 2, 3], completed_ranks: [0, 1, 2, 3], skipped_ranks: {}, timed_out: false });
    expect(m.stages).toEqual({ '0': { ranks: [0, 1], layers: ['layers.0'] }, '1': { ranks: [2, 3], layers: ['layers.1'] } });
    // Stage 0 was already in wave 8 (marker 8) when the last stage copied 7: still every file is wave 7's state.
    for (const g of [0, 1, 2, 3]) expectCopiedAt(dir, m, g, 7);
    expect(inspectTree(dir, { verify: true }).problems).toEqual([]);
    for (const [g, r] of job.ranks.entries()) {
      expect({ g, waits: r.client.stats.vectorWaits, timeouts: r.client.stats.endOfWaveTimeouts }).toEqual({ g, waits: 0, timeouts: 0 });
    }
  } finally {
    for (const r of readers) r.close();
  }
});

test('a config switches at the same wave on every stage: a dump before it in the old format everywhere, one at it in the new format everywhere', async () => {
  const job = await start(NAN_DUMP);
  const readers = job.ranks.map((_, g) => MailboxReader.open(mailboxPath(path.join(job.root, 'run'), g)));
  try {
    let prev: StepTelemetry | undefined;
    const H = 6; // the head that takes the edited config: it applies at the end of H + 2
    for (let w = 1; w <= H + 3; w++) {
      if (w === H) {
        // Edited between heads: format npy → safetensors, and a manual dump (armed at head H for H + 2).
        const live = readJson(job.configPath);
        live.dump.format = 'safetensors';
        live.dump.manual_dump = 1;
        fs.writeFileSync(job.configPath, JSON.stringify(live));
      }
      await job.ranks[HEAD].client.waveHead(w, prev);
      await headHandled(job, readers, w);
      // Stage 0 has had the new config since head H, a wave before it applies: it must not take it early.
      await Promise.all(job.ranks.map((_, g) => endWave(job, g, w)));
      prev = tel(w, w === H - 2); // seen at head H - 1, armed for H + 1: copied before the switch
    }
    const before = path.join(job.dumpRoot, 'logits_finite', 'req-p', `wave_${H + 1}`);
    const at = path.join(job.dumpRoot, 'manual_trigger', 'req-p', `wave_${H + 2}`);
    await waitFor(() => manifestOf(before)?.complete === true && manifestOf(at)?.complete === true, 'both dumps');
    const exts = (dir: string) => {
      const m = manifestOf(dir);
      return Object.fromEntries([0, 1, 2, 3].map((g) => [g, [...new Set((m.files[g] as { path: string }[]).map((f) => path.extname(f.path)).filter((e) => e !== '.json'))]]));
    };
    expect(exts(before)).toEqual({ 0: ['.npy'], 1: ['.npy'], 2: ['.npy'], 3: ['.npy'] });
    expect(exts(at)).toEqual({ 0: ['.safetensors'], 1: ['.safetensors'], 2: ['.safetensors'], 3: ['.safetensors'] });
    expect(manifestOf(at)).toMatchObject({ pp_stages: 'all', completed_ranks: [0, 1, 2, 3] });
  } finally {
    for (const r of readers) r.close();
  }
});

test('pp_stages "last": a config reaches stage 0 at its wave too, and its engine is off the vector before and after', async () => {
  const job = await start({ detector: { logits_finite: { enabled: true } }, dump: { free_headroom_bytes: 0 } });
  const readers = job.ranks.map((_, g) => MailboxReader.open(mailboxPath(path.join(job.root, 'run'), g)));
  const bits = (g: number) => readers[g].features();
  try {
    let prev: StepTelemetry | undefined;
    const H = 5;
    for (let w = 1; w <= H + 3; w++) {
      if (w === H) {
        const live = readJson(job.configPath);
        live.detector.logits_finite.enabled = false; // the DETECTORS feature bit goes off at the end of H + 2
        fs.writeFileSync(job.configPath, JSON.stringify(live));
      }
      await job.ranks[HEAD].client.waveHead(w, prev);
      await headHandled(job, readers, w);
      if (w === H + 2) {
        // Stage 0 has the config (on the vector until it applies), still under the old one.
        for (const g of STAGE0) expect({ g, bus: (bits(g) & MailboxFeature.BUS_ACTIVE) !== 0, detectors: (bits(g) & MailboxFeature.DETECTORS) !== 0 }).toEqual({ g, bus: true, detectors: true });
      }
      const results = await Promise.all(job.ranks.map((_, g) => endWave(job, g, w)));
      for (const g of STAGE0) {
        const on = (bits(g) & MailboxFeature.DETECTORS) !== 0;
        expect({ g, w, detectors: on }).toEqual({ g, w, detectors: w < H + 2 });
        // Off the vector once the startup config (due in wave 3) applied, until the new config came,
        // and again once it applied: its engine's end_of_wave costs nothing then.
        if ((w >= 3 && w < H) || w >= H + 2) expect({ g, w, bus: (bits(g) & MailboxFeature.BUS_ACTIVE) !== 0 }).toEqual({ g, w, bus: false });
      }
      for (const g of STAGE1) expect({ g, w, detectors: (bits(g) & MailboxFeature.DETECTORS) !== 0 }).toEqual({ g, w, detectors: w < H + 2 });
      // Only the configs' waves needed the agents: the startup config's (3) and the new one's, on every stage.
      expect({ w, due: results.map((r) => r.due) }).toEqual({ w, due: w === 3 || w === H + 2 ? [true, true, true, true] : [false, false, false, false] });
      prev = tel(w);
    }
    for (const g of STAGE0) expect(job.ranks[g].client.stats.dueWaves).toBe(2);
  } finally {
    for (const r of readers) r.close();
  }
});

test('a stage-0 rank that ended the copy wave before its job came acks at once: wave_already_ended, and the manifest says so', async () => {
  const job = await start({ ...NAN_DUMP, dump: { ...NAN_DUMP.dump, manual_dump: 0 } }, 300);
  try {
    let prev: StepTelemetry | undefined;
    const H = 4;
    // Stage 0 runs 3 waves ahead of its head, further than the stream decides (pp - 1 = 1): its
    // end_of_wave of wave H + 2 comes before head H publishes that vector; it waits the bound and goes on.
    for (let w = 1; w <= 3; w++) await Promise.all(STAGE0.map((g) => endWave(job, g, w)));
    for (let w = 1; w <= H + 3; w++) {
      if (w + 3 <= H + 2) await Promise.all(STAGE0.map((g) => endWave(job, g, w + 3)));
      if (w === H) {
        const live = readJson(job.configPath);
        live.dump.manual_dump = 1;
        fs.writeFileSync(job.configPath, JSON.stringify(live));
      }
      await job.ranks[HEAD].client.waveHead(w, prev);
      await waitFor(() => job.coordinator.streams.stream(0).wave >= w, `head ${w} handled`);
      await Promise.all(STAGE1.map((g) => endWave(job, g, w)));
      prev = tel(w);
    }
    const dir = path.join(job.dumpRoot, 'manual_trigger', 'req-p', `wave_${H + 2}`);
    await waitFor(() => manifestOf(dir) !== undefined, 'the manifest');
    const m = manifestOf(dir);
    // Acked, not timed out (the ledger's timeout is 10 s): the manifest names why each stage-0 rank has nothing.
    expect(m).toMatchObject({ arm_wave: H + 2, pp_stages: 'all', expected_ranks: [0, 1, 2, 3], completed_ranks: [2, 3], missing_ranks: [], failed_ranks: {}, complete: false, timed_out: false });
    expect(m.skipped_ranks).toEqual({ 0: 'wave_already_ended', 1: 'wave_already_ended' });
    expect(m.stages).toEqual({ '1': { ranks: [2, 3], layers: ['layers.1'] } });
    expectCopiedAt(dir, m, 2, H + 2);
    for (const g of STAGE0) expect(job.ranks[g].agent.stats.missedWaves).toBeGreaterThanOrEqual(1);
  } finally {
    /* stopped in afterEach */
  }
});
