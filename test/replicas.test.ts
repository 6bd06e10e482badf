// Data-parallel replicas as separate wave streams, with pipeline stages: a real coordinator with
// the guard, one real agent and TypeScript client per rank (TP=2 × PP=2 × DP=2, 8 ranks), KV
// pools in shared memory. Each replica steps on its own wave numbers; dumps go only to the owning
// replica's ranks; a config switch and a manual dump reach both replicas, each at its own head.
import * as fs from 'fs';
import * as path from 'path';
import type { StepTelemetry } from '../src/messages';
import { inspectTree } from '../src/tools/inspect';
import { isKvRankDirName, kvRankDirFor } from '../src/paths';
import { cleanup, waitFor } from './helpers';
import { runReplicaWave, startHarnessJob, step, stopHarnessJob, type HarnessJob } from './job-harness';

jest.setTimeout(120000);

let job: HarnessJob | undefined;
afterAll(async () => {
  if (job) await stopHarnessJob(job);
  cleanup();
});

const readJson = (...p: string[]) => JSON.parse(fs.readFileSync(path.join(...p), 'utf8'));
const manifestOf = (dir: string) => (fs.existsSync(path.join(dir, 'manifest.json')) ? readJson(dir, 'manifest.json') : undefined);

/** Telemetry of one replica's step: the same request id in both replicas, with that replica's blocks. */
function tel(wave: number, blocks: number[], nan = false): StepTelemetry {
  return { wave, requests: [step('req-x', [100 + wave], blocks, { numOutputTokens: wave })], nonFinite: nan ? [{ row: 0, reqId: 'req-x', kind: 'nan' }] : [] };
}

test('TP2 x PP2 x DP2: own wave streams, own dumps, one config and manual dump for both, pp_stages "all"', async () => {
  job = await startHarnessJob({
    tp: 2,
    pp: 2,
    dp: 2,
    hotReload: true,
    runtimeConfig: {
      detector: { logits_finite: { enabled: true, on_trigger: ['report', 'dump_kv'] } },
      dump: { auto_max_times: 4, auto_cooldown_seconds: 0, free_headroom_bytes: 0 },
    },
    snapshotEnv: { WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_RANKS: '0' },
  });
  const j = job;
  // Ranks: dp0 = 0,1 (stage 0), 2,3 (stage 1, head 2); dp1 = 4,5 (stage 0), 6,7 (stage 1, head 6).
  expect(j.coordinator.expectedRanks).toEqual([2, 3, 6, 7]);
  await waitFor(() => j.ranks[2].client.featureFlags() !== 0 && j.ranks[6].client.featureFlags() !== 0, 'both replicas on the bus');

  // Decided pp = 2 waves ahead (decideAheadWaves): the head of wave N (telemetry of N-1) publishes the
  // vector of N+2, so a dump detected in N-1 is copied at the end of N+2, and its manifest is written
  // once the head of N+3 brought the copy wave's telemetry (the copy window).
  const A = [1, 2];
  const B = [5, 6, 7];
  const blocks = [A, B];
  const prev: Array<StepTelemetry | undefined> = [undefined, undefined];
  const wave = async (replica: number, w: number, nan = false) => {
    const r = await runReplicaWave(j, replica, w, prev[replica]);
    prev[replica] = tel(w, blocks[replica], nan);
    return r;
  };
  // Replica 0 runs ahead: waves 1..5; replica 1 only 1..2. Same request id, other blocks.
  for (let w = 1; w <= 5; w++) await wave(0, w);
  await wave(1, 1);
  await wave(1, 2, true); // replica 1's req-x turns NaN in wave 2
  // Head of replica 1's wave 3 detects it: the dump, due in wave 5, goes to replica 1's last-PP ranks only.
  // Wave 3 is due on every rank of the replica, stage 0 too: the startup config (head 1's vector).
  expect((await wave(1, 3)).map((r) => r.due)).toEqual([true, true, true, true]);
  expect((await wave(1, 4)).some((r) => r.due)).toBe(false);
  expect((await wave(1, 5)).some((r) => r.due)).toBe(true);
  const st = j.coordinator.status() as any;
  expect(st.replicas['0']).toMatchObject({ wave: 5 });
  expect(st.replicas['1']).toMatchObject({ wave: 5 });
  await wave(1, 6); // its telemetry of wave 5 closes the copy window
  const dir1 = path.join(j.dumpRoot, 'logits_finite', 'req-x', 'wave_5_dp1');
  await waitFor(() => manifestOf(dir1)?.complete === true, 'replica 1 dump complete');
  const m1 = manifestOf(dir1);
  expect(m1).toMatchObject({ job_id: '5/logits_finite/req-x@dp1', dp_rank: 1, expected_ranks: [6, 7], completed_ranks: [6, 7], pp_stages: 'last' });
  expect(readJson(dir1, 'request_info.json')).toMatchObject({ dp_rank: 1, block_ids: B, expected_ranks: [6, 7], rank: 6 });
  expect(fs.readdirSync(dir1).filter(isKvRankDirName).sort()).toEqual([6, 7].map((g) => kvRankDirFor(g, job!.layout)).sort());
  expect(readJson(dir1, kvRankDirFor(6, job!.layout), 'dump.json')).toMatchObject({ block_ids: B, dp_rank: 1 });
  expect(inspectTree(dir1, { verify: true }).problems).toEqual([]);
  // Nothing for replica 0 (its req-x is healthy), and the report names replica 1's head.
  expect(fs.readdirSync(path.join(j.dumpRoot, 'logits_finite', 'req-x'))).toEqual(['wave_5_dp1']);
  const reports = fs.readdirSync(path.join(j.reportRoot, 'logits_finite'));
  expect(reports).toHaveLength(1);
  expect(readJson(j.reportRoot, 'logits_finite', reports[0])).toMatchObject({ req_id: 'req-x', dp_rank: 1, rank: 6, detect_wave: 2 });
  expect((st.guard_replicas as Record<string, { tracked_requests: number }>)['0'].tracked_requests).toBe(1);

  // A config switch with a manual dump: each replica takes the config at its own next head (in
  // the vector that head publishes, applied at the end of that vector's wave on every stage).
  const live = readJson(j.configPath);
  live.dump.manual_dump = 1;
  live.dump.pp_stages = 'all';
  fs.writeFileSync(j.configPath, JSON.stringify(live));
  const heads: Array<{ replica: number; wave: number }> = [];
  j.coordinator.on('wave', (h: { wave: number; configDue: boolean }, replica: number) => h.configDue && heads.push({ replica, wave: h.wave }));
  await wave(0, 6);
  expect(heads).toEqual([{ replica: 0, wave: 8 }]);
  // The manual dump asked for in the same edit is armed at once, for the same wave the config
  // applies at: it follows the config in force at its copy wave (pp_stages "all"), and every stage
  // has both from the same vector, decided far enough ahead, before its engine reaches that wave.
  await wave(0, 7);
  await wave(0, 8); // the copy wave
  await wave(0, 9);
  const all0 = path.join(j.dumpRoot, 'manual_trigger', 'req-x', 'wave_8_dp0');
  await waitFor(() => manifestOf(all0)?.complete === true, 'replica 0\'s manual dump, every stage');
  // Each replica's manual dump: its own blocks, its own ranks, every stage copying its own layers.
  expect(readJson(all0, 'request_info.json')).toMatchObject({ dp_rank: 0, block_ids: A, expected_ranks: [0, 1, 2, 3] });
  const m = manifestOf(all0);
  expect(m).toMatchObject({ dp_rank: 0, pp_stages: 'all', expected_ranks: [0, 1, 2, 3], completed_ranks: [0, 1, 2, 3] });
  expect(m.stages).toEqual({ '0': { ranks: [0, 1], layers: ['layers.0'] }, '1': { ranks: [2, 3], layers: ['layers.1'] } });
  expect(fs.readdirSync(all0).filter(isKvRankDirName).sort()).toEqual([0, 1, 2, 3].map((g) => kvRankDirFor(g, job!.layout)).sort());
  expect(readJson(all0, kvRankDirFor(0, job!.layout), 'dump.json').layers.map((l: { layer: string }) => l.layer)).toEqual(['layers.0']);
  expect(inspectTree(all0, { verify: true }).problems).toEqual([]);
  expect((j.guard.status() as any).guard_replicas['0'].manual_dump_done).toBe(1);
  // Replica 1 has not reached a head since the edit: no manual dump there yet.
  expect((j.guard.status() as any).guard_replicas['1'].manual_dump_done).toBe(0);
  for (const w of [7, 8, 9, 10]) await wave(1, w); // its next head is 7: config and manual dump for 9
  expect(heads).toEqual([{ replica: 0, wave: 8 }, { replica: 1, wave: 9 }]);
  const all1 = path.join(j.dumpRoot, 'manual_trigger', 'req-x', 'wave_9_dp1');
  await waitFor(() => manifestOf(all1)?.complete === true, 'replica 1\'s manual dump, every stage');
  expect(readJson(all1, 'request_info.json')).toMatchObject({ dp_rank: 1, block_ids: B, expected_ranks: [4, 5, 6, 7] });

  // A second manual dump reaches each replica at its own next head (due two waves later).
  live.dump.manual_dump = 2;
  fs.writeFileSync(j.configPath, JSON.stringify(live));
  for (const w of [10, 11, 12, 13]) await wave(0, w);
  await waitFor(() => manifestOf(path.join(j.dumpRoot, 'manual_trigger', 'req-x', 'wave_12_dp0'))?.complete === true, 'replica 0 reaches manual dump 2');
  expect(fs.existsSync(path.join(j.dumpRoot, 'manual_trigger', 'req-x', 'wave_13_dp1'))).toBe(false);
  for (const w of [11, 12, 13, 14]) await wave(1, w);
  await waitFor(() => manifestOf(path.join(j.dumpRoot, 'manual_trigger', 'req-x', 'wave_13_dp1'))?.complete === true, 'replica 1 reaches manual dump 2');
  expect(manifestOf(path.join(j.dumpRoot, 'manual_trigger', 'req-x', 'wave_13_dp1')).expected_ranks).toEqual([4, 5, 6, 7]);

  // Snapshot rank narrowing (tp ranks {0}) holds in every replica and stage.
  const ctx = { compilationHash: 'graph-r', globalStep: 1, isPrompt: true, reqIds: ['req-x'], positions: [0, 1], rowRequest: [0, 0] };
  const captured: number[] = [];
  for (const [g, r] of j.ranks.entries()) {
    const res = await r.client.beforeForward(ctx, [{ region: 'input0', dtype: 'int32', shape: [2] }]);
    if (res.captured) captured.push(g);
  }
  expect(captured).toEqual([0, 2, 4, 6]);
});
