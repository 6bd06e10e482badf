// Fault injection on a whole job made of real processes: coordinator, one agent per rank and the
// simulated engine (`wavebus sim`). Each test injects one fault and checks the guarantees of
// docs/faults.md: nothing under a final bundle name is partial, the engine's end_of_wave stays
// bounded (timeouts are counted, steps all run), the manifest names exactly the missing ranks,
// every dump whose copy finished verifies, and the job resumes by itself.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { requestStatus, type StatusReplyMsg } from '../src/bus/coordinator';
import { inspectTree } from '../src/tools/inspect';
import { wholeDumpAfter } from './dump-waits';
import { cleanup, cleanupMounts, describeAsRoot, mountTmpfs, tmpDir, waitFor } from './helpers';
import { baseConfig, deadline, Job, sleep, tryKill, type JobOptions, type RankResult } from './sim-job';

jest.setTimeout(180000);

/** The guarantees every fault test checks on the dump tree. */
function checkTree(root: string, allowedMissing: (problem: string) => boolean): ReturnType<typeof inspectTree> {
  const r = inspectTree(root, { verify: true });
  const unexpected = r.problems.filter((p) => !allowedMissing(p));
  expect(unexpected).toEqual([]);
  // Temp dirs of interrupted writers are allowed, but only under a hidden (leading '.') name.
  for (const t of r.incomplete) expect(path.basename(t).startsWith('.')).toBe(true);
  // Every rank bundle under a final name verified (sizes and checksums) and its tensors parse.
  for (const b of r.bundles.filter((x) => x.kind === 'kv_dump')) {
    expect(b.problems).toEqual([]);
    expect(b.files.length).toBeGreaterThan(0);
    for (const f of b.files) expect(f.verified).toBe(true);
    expect(b.tensors.length).toBeGreaterThan(0);
  }
  return r;
}

/** Find a writer's temp dir `.dp0_tp<g>_pp0_cp0.tmp-...` (tp = world) anywhere under root. */
function findTemp(root: string, rank: number): string | undefined {
  const want = `.dp0_tp${rank}_pp0_cp0.tmp-`;
  const walk = (d: string, depth: number): string | undefined => {
    let names: string[];
    try {
      names = fs.readdirSync(d);
    } catch {
      return undefined;
    }
    for (const n of names) {
      if (n.startsWith(want)) return path.join(d, n);
      if (depth < 3 && !n.includes('.')) {
        const hit = walk(path.join(d, n), depth + 1);
        if (hit) return hit;
      }
    }
    return undefined;
  };
  return walk(root, 0);
}

/** Sanity bound only (the machine is noisy): the engine never stalled far beyond its steps and counted waits. */
function checkBounded(r: RankResult, o: JobOptions): void {
  const bound = (o.boundMs ?? 200) + 20;
  expect(r.wallMs).toBeLessThan(r.steps * (o.stepMs + 5) + r.endOfWaveTimeouts * (bound + 50) + 15000);
}

const jobs: Job[] = [];
async function startJob(o: JobOptions): Promise<Job> {
  const j = new Job(o);
  jobs.push(j);
  await j.start();
  return j;
}

afterEach(async () => {
  for (const j of jobs.splice(0)) await j.stop();
  await cleanup();
  cleanupMounts();
});

// KV geometry big enough that a rank's bundle takes a while to write (16 fsynced files of 256 KiB).
const BIG_KV = ['--layers', '16', '--num-blocks', '96', '--kv-heads', '8', '--head-dim', '256'];

describe('faults', () => {
  test('kill -9 of an agent in the middle of a bundle write', async () => {
    const job = await startJob({ world: 2, steps: 80, stepMs: 60, requests: 3, ackTimeoutMs: 3000, simArgs: BIG_KV, faults: { nonFinite: { request: 0, at: 10 } } });
    const victim = job.agents[1];
    // Kill rank 1's agent the moment its temp bundle dir appears (polled every millisecond).
    const temp = await job.until(
      () => {
        const t = findTemp(job.kvRoot, 1);
        if (t) victim.child.kill('SIGKILL');
        return t;
      },
      "rank 1's bundle write",
      30000,
      1,
    );
    await victim.exited;
    expect(fs.existsSync(temp)).toBe(true); // killed mid-write: the temp dir stays, hidden
    // The job resumes: a new agent for rank 1 takes over its socket and mailbox and rejoins by itself.
    job.startAgent(1);

    // The manifest names rank 1 as not having dumped: missing after the ack timeout, or, when the new
    // agent learns of the job after its engine ended the copy wave, acked at once wave_already_ended.
    const jobDir = path.dirname(temp);
    const m = await job.until(
      () => job.manifests().find((x) => x.dir === jobDir && (x.timed_out || x.skipped_ranks['1'] !== undefined)),
      'the manifest of the interrupted dump',
      20000,
      50,
    );
    if (m.timed_out) expect(m.missing_ranks).toEqual([1]);
    else expect(m.skipped_ranks).toEqual({ 1: 'wave_already_ended' });
    expect(m.complete).toBe(false);
    expect(m.completed_ranks).toEqual([0]);
    expect(fs.existsSync(path.join(jobDir, 'dp0_tp1_pp0_cp0'))).toBe(false);

    await job.until(async () => (await job.status()).liveRanks.includes(1), 'rank 1 to rejoin', 20000, 100);
    const rejoined = (await job.status()).wave;
    job.manualDump(1);
    const later = await job.until(
      () => {
        const ms = job.manifests().filter((x) => x.arm_wave > rejoined);
        return ms.length > 0 && ms.every((x) => x.missing_ranks.length === 0) ? ms : undefined;
      },
      'a dump after the restart acked by every rank',
      40000,
      100,
    );
    for (const x of later) {
      // The new agent refuses the engine's client until it says hello again (ERR_NO_HELLO); the client
      // then re-sends its hello and KV regions within the step's bound, so the dump is whole, unless
      // on a loaded host the vector reached rank 1 after its end_of_wave: then rank 1 says so at once
      // (wave_already_ended), which is the new agent answering too. Any other shortfall fails here.
      if (x.completed_ranks.length === 2) continue;
      expect({ completed: x.completed_ranks, failed: x.failed_ranks, skipped: x.skipped_ranks }).toEqual({ completed: [0], failed: {}, skipped: { 1: 'wave_already_ended' } });
    }

    const results = await job.engineResults();
    for (const r of results) checkBounded(r, job.o);

    const tree = checkTree(job.kvRoot, (p) => p.includes('rank 1 missing'));
    expect(tree.incomplete.map((t) => path.join(job.kvRoot, t))).toContain(temp);
    // Rank 0's bundle of the interrupted dump is complete and recoverable.
    expect(tree.bundles.some((b) => b.kind === 'kv_dump' && b.dir === path.relative(job.kvRoot, path.join(jobDir, 'dp0_tp0_pp0_cp0')))).toBe(true);
  });

  test('coordinator killed and restarted mid-run: agents resync to the new epoch, later incidents still dump', async () => {
    const job = await startJob({ world: 2, steps: 100, stepMs: 60, ackTimeoutMs: 3000 });
    await job.waitWave(8);
    const before = await job.status();
    job.coordinator.child.kill('SIGKILL');
    await job.coordinator.exited;
    await sleep(1000); // the engine keeps stepping with no coordinator
    job.startCoordinator();
    const after = await job.until(
      async () => {
        const s = await job.status();
        const ranks = Object.values(s.json.ranks ?? {}) as { epoch_seen: number; live: boolean }[];
        return s.ready && s.epoch !== before.epoch && ranks.length === 2 && ranks.every((r) => r.live && r.epoch_seen === s.epoch) ? s : undefined;
      },
      'every agent to resync to the new epoch',
      20000,
      100,
    );
    expect(after.liveRanks).toEqual([0, 1]);
    await job.waitWave(after.wave + 1); // waves flow again
    const restartWave = (await job.status()).wave;
    job.manualDump(1);
    const done = await job.until(
      () => {
        const ms = job.manifests().filter((m) => m.arm_wave > restartWave);
        return ms.length > 0 && ms.every((m) => m.complete) ? ms : undefined;
      },
      'a complete dump after the restart',
      30000,
      100,
    );
    for (const m of done) expect(m.completed_ranks).toEqual([0, 1]);
    const results = await job.engineResults();
    for (const r of results) {
      expect(r.endOfWaveTimeouts).toBeGreaterThan(0); // the outage was felt, and bounded
      checkBounded(r, job.o);
    }
    checkTree(job.kvRoot, () => false);
  });

  test('a slow rank: its late ack is first reported missing, then completes the manifest', async () => {
    const job = await startJob({
      world: 2, steps: 20, stepMs: 30, requests: 2, ackTimeoutMs: 500,
      faults: { nonFinite: { request: 0, at: 6 }, slowRank: { rank: 1, extraMs: 250 } },
      // Out of lockstep: in a TP group the all-reduce would hold rank 0 back with it (tp-barrier.ts).
      simArgs: ['--no-tp-lockstep'],
    });
    const first = await job.until(() => job.manifests()[0], 'the manifest of the dump', 30000, 20);
    expect(first.timed_out).toBe(true);
    expect(first.missing_ranks).toEqual([1]);
    expect(first.completed_ranks).toEqual([0]);
    const results = await job.engineResults();
    const last = await job.until(() => job.manifests().find((m) => m.complete), 'the late ack to complete the manifest', 20000, 50);
    expect(last.completed_ranks).toEqual([0, 1]);
    expect(last.missing_ranks).toEqual([]);
    for (const r of results) checkBounded(r, job.o);
    checkTree(job.kvRoot, () => false);
  });

  test('a frozen agent (SIGSTOP): engine bounded, rank reported missing and not live, then it recovers', async () => {
    // Nothing here may depend on how far the engine gets while the test waits (a loaded host stalls
    // the test, while the engine keeps to its clock): it steps until the test ends it, with a steady
    // stream of requests to dump, and each dump is asked for once the state it tests is seen.
    // Requests arrive two a step: 5000 outlast the test's bound (180 s of 80 ms steps).
    const job = await startJob({ world: 2, steps: 100000, stepMs: 80, requests: 5000, ackTimeoutMs: 1500, boundMs: 100, untilStopped: true, simArgs: ['--num-blocks', '64'], agentEnv: { WAVEBUS_LOG_LEVEL: 'info' } });
    await job.waitWave(14);
    const agent = job.agents[1];
    // Whichever took the host's receiver lock first writes both ranks' vectors (docs/bus.md).
    const frozenIsReceiver = agent.stderr().includes('host receiver: this agent follows the wave stream');
    agent.child.kill('SIGSTOP');
    try {
      await job.until(async () => !(await job.status()).liveRanks.includes(1), 'rank 1 to be marked not live', 10000, 50);
      job.manualDump(1); // armed while rank 1 is frozen, whatever wave the engine is at
      const timedOut = await job.until(() => job.manifests().find((x) => x.timed_out), 'the dump armed during the freeze to time out', 20000, 20);
      expect(timedOut.missing_ranks).toContain(1);
      // Rank 0 copies its part when its vectors still come. A loaded host may make its ack later
      // than the ack timeout (then it is first reported missing, and its late ack updates the
      // manifest), or its own vector later than its 100 ms bound (then its part fails, saying so).
      // When the frozen agent is the host's receiver, a stopped process keeps its lock: rank 0's
      // vectors stop with it, its engine goes on after one bound, and the dump is not captured on
      // rank 0 (skipped, saying why). Rank 1 stays missing while frozen.
      const m = await job.until(
        () => job.manifests().find((x) => x.job_id === timedOut.job_id && !x.missing_ranks.includes(0)),
        "rank 0's ack of the dump armed during the freeze",
        20000,
        20,
      );
      const rank0 = m.completed_ranks.includes(0) ? 'completed' : (m.failed_ranks['0'] ?? `skipped: ${m.skipped_ranks?.['0']}`);
      const expected = frozenIsReceiver ? /^skipped: wave_already_ended$/ : /^completed$|arrived after end_of_wave/;
      expect({ frozenIsReceiver, missing: m.missing_ranks, rank0 }).toEqual({ frozenIsReceiver, missing: [1], rank0: expect.stringMatching(expected) });
    } finally {
      agent.child.kill('SIGCONT');
    }
    await job.until(async () => (await job.status()).liveRanks.includes(1), 'rank 1 to be live again', 20000, 50);
    const resumed = (await job.status()).wave;
    // Rank 1's engine uses its agent again once a probe is answered (within the client's probe
    // interval): a dump due before then fails on rank 1 as a missed wave, and is asked for again.
    const whole = await wholeDumpAfter(() => job.manifests(), resumed, 2, (n) => job.manualDump(n), (fn, what, ms) => job.until(fn, what, ms, 100), 30000);
    expect(whole.completed_ranks).toEqual([0, 1]);
    const results = await job.engineResults();
    expect(results[1].endOfWaveTimeouts).toBeGreaterThan(0);
    for (const r of results) checkBounded(r, job.o);
    checkTree(job.kvRoot, (p) => /rank [01] missing/.test(p));
  });

  describeAsRoot('disk faults (root: tmpfs and capabilities)', () => {
    // One request of 4 blocks; 5 layers × K,V × 4 blocks × 16 KiB = 640 KiB per rank, so the
    // free-space rule (estimate × tp_size + headroom) asks for 1280 KiB with headroom 0. A 1320 KiB
    // tmpfs passes that check, but the 20 .pt files take a header and a partly filled page each
    // beyond their tensor bytes: the writes run out of room.
    const SMALL_KV = ['--layers', '5', '--num-blocks', '16', '--kv-heads', '8', '--head-dim', '128'];

    test('ENOSPC: the free-space check refuses, and a real ENOSPC mid-write leaves nothing partial', async () => {
      const root = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-enospc-'));
      mountTmpfs(root, '1320k');
      const job = await startJob({
        world: 2, steps: 45, stepMs: 60, requests: 1, ackTimeoutMs: 3000, simArgs: SMALL_KV, dumpRoot: root,
        config: baseConfig({ dump: { free_headroom_bytes: 8 * 2 ** 20 } }),
        faults: { nonFinite: { request: 0, at: 5 } },
      });
      // 1) headroom 8 MiB on a 1.3 MiB disk: both ranks refuse before copying.
      const refused = await job.until(() => job.manifests().find((m) => Object.keys(m.skipped_ranks).length === 2), 'the refused dump', 20000, 50);
      expect(refused.skipped_ranks).toEqual({ 0: 'insufficient_free_space', 1: 'insufficient_free_space' });
      expect(refused.missing_ranks).toEqual([]);
      for (const g of [0, 1]) {
        const skipped = JSON.parse(fs.readFileSync(path.join(refused.dir, `dp0_tp${g}_pp0_cp0`, 'dump_skipped.json'), 'utf8'));
        expect(skipped.reason).toBe('insufficient_free_space');
      }
      // 2) headroom 0: both ranks pass the estimate × tp_size, the disk fills during the writes.
      const wave = (await job.status()).wave;
      job.manualDump(1, { free_headroom_bytes: 0 });
      const full = await job.until(
        () => job.manifests().find((m) => m.arm_wave > wave && m.completed_ranks.length + Object.keys(m.failed_ranks).length === 2),
        'the dump that fills the disk',
        30000,
        50,
      );
      const failed = Object.entries(full.failed_ranks);
      expect(failed.length).toBeGreaterThanOrEqual(1);
      for (const [, err] of failed) expect(err).toMatch(/ENOSPC|no space/i);
      expect(full.missing_ranks).toEqual([]);
      const results = await job.engineResults();
      for (const r of results) checkBounded(r, job.o);
      const tree = checkTree(root, (p) => failed.some(([g]) => p.includes(`rank ${g} missing`)) || p.includes('missing (dump_skipped.json present)'));
      expect(tree.incomplete).toEqual([]); // aborted writers removed their temp dirs
      for (const g of full.completed_ranks) expect(tree.bundles.some((b) => b.kind === 'kv_dump' && b.ranks[0] === g)).toBe(true);
    });

    test('EACCES: agents that cannot write the dump dir ack the failure; nothing partial, engine unaffected', async () => {
      // The coordinator creates the dump dirs read-only (umask 0222; it is root and still writes its
      // JSON there); the agents run without CAP_DAC_OVERRIDE, so the dirs refuse them with EACCES.
      const job = await startJob({
        world: 2, steps: 40, stepMs: 50, requests: 2, ackTimeoutMs: 3000, simArgs: SMALL_KV,
        faults: { nonFinite: { request: 0, at: 6 } },
        wrapCoordinator: (argv) => ['sh', ['-c', 'umask 0222; exec "$@"', 'sh', ...argv]],
        wrapAgent: (argv) => ['setpriv', ['--bounding-set', '-dac_override,-dac_read_search', ...argv]],
      });
      const m = await job.until(() => job.manifests().find((x) => Object.keys(x.failed_ranks).length === 2), 'the failed acks', 20000, 50);
      for (const g of ['0', '1']) expect(m.failed_ranks[g]).toMatch(/EACCES|permission denied/i);
      expect(m.missing_ranks).toEqual([]);
      const results = await job.engineResults();
      for (const r of results) checkBounded(r, job.o);
      const tree = checkTree(job.kvRoot, (p) => /rank [01] missing/.test(p));
      expect(tree.incomplete).toEqual([]);
      expect(tree.bundles.filter((b) => b.kind === 'kv_dump')).toEqual([]);
    });
  });
});
