// Faults on the paths the lookahead design and DP replicas added, on real processes: a
// `wavebus coordinator`, one `wavebus agent` per rank, and this process as the engine (one client
// per rank, bench/lib/proc-job.ts), so a test can act exactly between a wave vector that arms a
// dump and the end_of_wave that copies it. Checked as in test/faults.test.ts: the engine never
// waits past the bound (a loose sanity bound, no speed assertion), nothing under a final rank dir
// lacks its dump.json, and the manifest says what happened.
import * as fs from 'fs';
import * as path from 'path';
import { Dealer } from 'zeromq';
import { ProcJob, alive } from '../bench/lib/proc-job';
import { decodeCoordinatorMessage, encodeAgentMessage } from '../src/bus/frames';
import { tcpEndpoint } from '../src/bus/endpoints';
import { PROTOCOL_VERSION } from '../src/bus/protocol-version';
import { resolveIdentity } from '../src/launch/identity';
import { identityToProto } from '../src/layout';
import type { StepTelemetry } from '../src/messages';
import { isKvRankDirName, kvRankDirFor } from '../src/paths';
import { inspectTree } from '../src/tools/inspect';
import { cleanup, readManifests, waitFor } from './helpers';
import type { Manifest } from './sim-job';

jest.setTimeout(180000);

const BOUND_MS = 1000;
const PACE_MS = 15;
const jobs: ProcJob[] = [];

afterEach(async () => {
  for (const j of jobs.splice(0)) await j.close();
  cleanup();
});

async function startJob(world: number, dp: number, ackTimeoutMs: number): Promise<ProcJob> {
  const config = { detector: { logits_finite: { enabled: true, on_trigger: ['report'] } }, dump: { manual_dump: 0, free_headroom_bytes: 0, format: 'npy' } };
  const j = new ProcJob({ world, dp, boundMs: BOUND_MS, ackTimeoutMs, heartbeatMs: 150, config });
  jobs.push(j);
  await j.start();
  return j;
}

/** Wave w of a replica serving one request (the same id in every replica). */
function tel(w: number, replica: number): StepTelemetry {
  const blocks = [2 * replica, 2 * replica + 1];
  return { wave: w, requests: [{ reqId: 'req-a', newTokenIds: [100 + w], newTokenLogprobs: [-0.5], newTokenRanks: [0], draftLen: 0, accepted: 0, blockIds: blocks, finished: false, freed: false, promptLen: 8, numOutputTokens: w }], nonFinite: [] };
}

/** An engine per replica: its own wave count; step() runs one wave and returns the timed-out ranks. */
class Engine {
  wave = 0;
  timedOut = 0;
  /** Longest endOfWave of any rank, ms (sanity bound only). */
  longestMs = 0;
  constructor(readonly job: ProcJob, readonly replica: number) {}

  async step(): Promise<{ wave: number; due: boolean[]; timedOut: boolean[] }> {
    const w = ++this.wave;
    const j = this.job;
    await j.clients[j.head(this.replica)].waveHead(w, w > 1 ? tel(w - 1, this.replica) : undefined);
    await new Promise((r) => setTimeout(r, PACE_MS));
    const ends = await Promise.all(
      j.ranksOf(this.replica).map(async (g) => {
        const t0 = Date.now();
        const e = await j.clients[g].endOfWave(w);
        this.longestMs = Math.max(this.longestMs, Date.now() - t0);
        return e;
      }),
    );
    this.timedOut += ends.filter((e) => e.timedOut).length;
    return { wave: w, due: ends.map((e) => e.due), timedOut: ends.map((e) => e.timedOut) };
  }

  /** Step until the vector of the next wave arms a dump of req-a (asked as an engine asks before freeing). */
  async untilArmed(what: string, maxWaves = 400): Promise<number> {
    for (let i = 0; i < maxWaves; i++) {
      await this.step();
      if (await this.job.clients[this.job.head(this.replica)].pendingDump('req-a')) return this.wave + 1;
    }
    throw new Error(`${what}: no dump armed within ${maxWaves} waves`);
  }
}

const manifests = (j: ProcJob) => readManifests<Manifest>(j.kvRoot);

/** Every final rank dir holds its completion marker (dump.json); temp dirs only under hidden names. */
function checkFinalNames(root: string): ReturnType<typeof inspectTree> {
  const walk = (d: string): void => {
    for (const n of fs.readdirSync(d)) {
      const p = path.join(d, n);
      if (!fs.statSync(p).isDirectory()) continue;
      if (isKvRankDirName(n)) expect({ dir: p, marker: fs.existsSync(path.join(p, 'dump.json')) }).toEqual({ dir: p, marker: true });
      else walk(p);
    }
  };
  walk(root);
  const r = inspectTree(root, { verify: true });
  for (const t of r.incomplete) expect(path.basename(t).startsWith('.')).toBe(true);
  for (const b of r.bundles.filter((x) => x.kind === 'kv_dump')) expect(b.problems).toEqual([]);
  return r;
}

/** Step the engines until `fn` holds (the coordinator's copy windows close on later heads). */
async function stepUntil<T>(engines: Engine[], fn: () => T | undefined | false, what: string, timeoutMs = 30000): Promise<T> {
  const by = Date.now() + timeoutMs;
  for (;;) {
    const v = fn();
    if (v) return v;
    if (Date.now() > by) {
      const brief = engines.length > 0 ? manifests(engines[0].job).map((m) => ({ dir: path.basename(m.dir), arm: m.arm_wave, done: m.completed_ranks, missing: m.missing_ranks, failed: m.failed_ranks, skipped: m.skipped_ranks, complete: m.complete, reason: (m as { incomplete_reason?: string }).incomplete_reason })) : [];
      const st = await engines[0]?.job.status().then((s) => JSON.stringify(s.json), (e) => String(e));
      throw new Error(`timed out waiting for ${what}\nwaves: ${engines.map((e) => e.wave).join(', ')}\nmanifests: ${JSON.stringify(brief)}\nstatus: ${st}\ncoordinator: ${engines[0]?.job.coordinator.stderr.join('').slice(-3000)}`);
    }
    for (const e of engines) await e.step();
  }
}

type DpManifest = Manifest & { dp_rank: number; incomplete_reason?: string };

/**
 * Ask for manual dumps from number `n` on until every replica has a complete one armed after
 * `after[replica]`. A dump may fail honestly on a loaded host (a rank's end_of_wave ran out of
 * bound before its vector came: d2h_failed, counted): then the next one is asked for.
 */
async function completeDumpsAfter(job: ProcJob, engines: Engine[], after: number[], n: number): Promise<DpManifest[]> {
  for (let attempt = 0; ; attempt++) {
    job.manualDump(n + attempt);
    const mine = () => (manifests(job) as DpManifest[]).filter((x) => x.arm_wave > after[x.dp_rank ?? 0]);
    const all = await stepUntil(engines, () => {
      const ms = mine();
      return engines.every((e) => ms.some((x) => (x.dp_rank ?? 0) === e.replica)) ? ms : undefined;
    }, `manual dump ${n + attempt} in every replica`, 40000);
    const complete = engines.map((e) => all.find((x) => (x.dp_rank ?? 0) === e.replica && x.complete));
    if (complete.every(Boolean)) return complete as DpManifest[];
    if (attempt >= 4) throw new Error(`no complete dump in every replica after ${attempt + 1} manual dumps: ${JSON.stringify(all.map((x) => ({ dir: x.dir, done: x.completed_ranks, missing: x.missing_ranks, failed: x.failed_ranks })))}`);
    for (const e of engines) after[e.replica] = e.wave;
  }
}

describe('faults on the lookahead and replica paths', () => {
  test('kill -9 of an agent between the vector that arms its dump and the copy: bounded, nothing partial, the manifest names the rank', async () => {
    const job = await startJob(2, 1, 1500);
    const eng = new Engine(job, 0);
    for (let i = 0; i < 3; i++) await eng.step();
    job.manualDump(1);
    // The vector of wave W (published at the head of W-1) arms the dump; rank 1's agent dies before end_of_wave(W).
    const W = await eng.untilArmed('the manual dump');
    const victim = job.agents[1];
    victim.child.kill('SIGKILL');
    await victim.exited;
    const copy = await eng.step();
    expect(copy.wave).toBe(W);
    expect(copy.due[0]).toBe(true); // rank 0 copied
    expect(copy.timedOut[1]).toBe(true); // rank 1's end_of_wave gave up at the bound, counted
    expect(eng.longestMs).toBeLessThan(BOUND_MS + 5000); // sanity bound only: never stalled beyond the bound
    const wdir = path.join(job.kvRoot, 'manual_trigger', 'req-a', `wave_${W}`);
    const m = await stepUntil([eng], () => manifests(job).find((x) => x.dir === wdir && x.timed_out), 'the manifest of the interrupted dump');
    expect(m).toMatchObject({ arm_wave: W, expected_ranks: [0, 1], completed_ranks: [0], missing_ranks: [1], complete: false });
    expect(fs.existsSync(path.join(wdir, kvRankDirFor(1, job.layout)))).toBe(false);
    const tree = checkFinalNames(job.kvRoot);
    expect(tree.problems.filter((p) => !p.includes('rank 1 missing'))).toEqual([]);
    expect(tree.bundles.filter((b) => b.kind === 'kv_dump').map((b) => b.ranks)).toEqual([[0]]);

    // The job resumes: a new agent for rank 1 takes over its socket and mailbox; the client says hello again.
    job.startAgent(1);
    const back = await waitFor(async () => {
      await eng.step();
      return (await job.status()).liveRanks.includes(1);
    }, 'rank 1 to rejoin', 30000, 1);
    expect(back).toBe(true);
    const [later] = await completeDumpsAfter(job, [eng], [eng.wave], 2);
    expect(later.completed_ranks).toEqual([0, 1]);
    expect(alive(job.coordinator) && alive(job.agents[0])).toBe(true);
  });
});

describe('a coordinator restart while a replica\'s dump is pending (DP=2)', () => {
  test('the other replica goes on, the pending dump gets a manifest that does not claim complete, later dumps of both replicas work', async () => {
    const job = await startJob(4, 2, 1500);
    const [r0, r1] = [new Engine(job, 0), new Engine(job, 1)];
    for (let i = 0; i < 3; i++) for (const e of [r0, r1]) await e.step();
    job.manualDump(1);
    // Only replica 0 reaches a head after the edit: its dump is armed for wave W; replica 1's is not.
    const W = await r0.untilArmed('replica 0\'s manual dump');
    const before = await job.status();
    job.coordinator.child.kill('SIGKILL');
    await job.coordinator.exited;
    // Replica 0 copies wave W with no coordinator to ack to; replica 1 keeps stepping, bounded.
    await r0.step();
    const outage = r1.wave;
    for (let i = 0; i < 5; i++) await r1.step();
    expect(r1.wave).toBe(outage + 5);
    expect(r1.longestMs).toBeLessThan(BOUND_MS + 5000); // sanity bound only
    job.startCoordinator();
    await waitFor(async () => {
      await r0.step();
      await r1.step();
      const s = await job.status(500).catch(() => undefined);
      const ranks = Object.values(s?.json.ranks ?? {}) as { epoch_seen: number; live: boolean }[];
      return s && s.ready && s.epoch !== before.epoch && ranks.length === 4 && ranks.every((r) => r.live && r.epoch_seen === s.epoch);
    }, 'every agent to resync to the new epoch', 40000, 1);

    // The dump the dead coordinator armed: a manifest that tells the truth, never "complete".
    const wdir = path.join(job.kvRoot, 'manual_trigger', 'req-a', `wave_${W}_dp0`);
    const pending = await stepUntil([r0, r1], () => manifests(job).find((x) => x.dir === wdir), 'a manifest for the dump pending at the restart');
    expect(pending).toMatchObject({ arm_wave: W, dp_rank: 0, expected_ranks: [0, 1], complete: false, incomplete_reason: 'coordinator_restarted' });
    // Every rank it names completed acked to the new coordinator; the others are missing.
    expect([...pending.completed_ranks, ...pending.missing_ranks].sort()).toEqual([0, 1]);
    checkFinalNames(job.kvRoot);

    // Later dumps of both replicas, each exactly its own ranks.
    // (the restarted coordinator rewrote the live file with its overlay: manual_dump counts from 0 again)
    const later = await completeDumpsAfter(job, [r0, r1], [r0.wave, r1.wave], 1);
    expect(later.map((m) => m.dp_rank)).toEqual([0, 1]);
    for (const m of later) {
      expect(m.completed_ranks).toEqual(job.dumpRanks(m.dp_rank));
      expect(fs.readdirSync(m.dir).filter(isKvRankDirName).sort()).toEqual(job.dumpRanks(m.dp_rank).map((g) => kvRankDirFor(g, job.layout)).sort());
    }
    checkFinalNames(job.kvRoot);
  });
});

describe('a version-mismatched agent joining a running job', () => {
  test('refused at once naming both versions, counted; the live ranks, their waves and dumps are unaffected', async () => {
    const job = await startJob(2, 1, 3000);
    const eng = new Engine(job, 0);
    for (let i = 0; i < 3; i++) await eng.step();
    const before = await job.status();
    const dropped0 = Number(before.json.dropped?.protocol_version ?? 0);
    // A peer of another release claims rank 1 (live): one older, one newer.
    const identity = resolveIdentity({}, { rank: 1, worldSize: 2, tp: 2, pp: 1 });
    const answers: string[] = [];
    for (const v of [PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1]) {
      const d = new Dealer({ linger: 0, receiveTimeout: 5000 });
      try {
        d.connect(tcpEndpoint('127.0.0.1', job.port + 1));
        await d.send(encodeAgentMessage({ globalRank: 1, hello: { identity: identityToProto(identity), subscribed: true, agentVersion: 'other', protocolVersion: v } }));
        for (;;) {
          const [buf] = await d.receive();
          const m = decodeCoordinatorMessage(buf, 1 << 20);
          if (m.ok && m.value.body === 'refused') {
            expect(m.value.refused).toMatchObject({ protocolVersion: PROTOCOL_VERSION, peerVersion: v });
            answers.push(m.value.refused.error);
            break;
          }
        }
      } finally {
        d.close();
      }
    }
    expect(answers[0]).toMatch(new RegExp(`version ${PROTOCOL_VERSION - 1}, the coordinator version ${PROTOCOL_VERSION}; upgrade the agent`));
    expect(answers[1]).toMatch(new RegExp(`version ${PROTOCOL_VERSION + 1}, the coordinator version ${PROTOCOL_VERSION}; upgrade the coordinator`));
    const after = await job.status();
    expect(Number(after.json.dropped?.protocol_version ?? 0)).toBeGreaterThanOrEqual(dropped0 + 2);
    expect(after.liveRanks).toEqual([0, 1]);
    expect(after.epoch).toBe(before.epoch);
    // The job is unaffected: its waves flow and a dump has both ranks.
    const [m] = await completeDumpsAfter(job, [eng], [eng.wave], 1);
    expect(m.completed_ranks).toEqual([0, 1]);
    expect((await job.status()).liveRanks).toEqual([0, 1]);
  });
});
