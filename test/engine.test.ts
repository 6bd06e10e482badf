// The engine's view, end to end in one process: a coordinator running the guard, one agent per
// rank, and a TypeScript client per rank driving waves over real sockets and shared memory.
import * as fs from 'fs';
import * as path from 'path';
import { Agent } from '../src/agent/agent';
import { WavebusClient } from '../src/client/client';
import { MailboxReader } from '../src/client/mailbox';
import { mailboxPath } from '../src/paths';
import { inspectTree } from '../src/tools/inspect';
import type { StepTelemetry } from '../src/messages';
import { readBytes } from '../src/artifacts/read-range';
import { readPt } from '../src/artifacts/pt-reader';
import { kvBlockBytes } from '../src/sim/kv-pattern';
import { resolveSnapshotConfig } from '../src/snapshot/config';
import { loadCallDir } from '../src/snapshot/loader';
import { registry } from '../src/metrics';
import { cleanup, runPython, waitFor } from './helpers';
import { G, startHarnessJob, step, stopHarnessJob, type HarnessJob } from './job-harness';
import { DEFAULT_LOOKAHEAD_WAVES } from '../src/bus/constants';

let jobs: HarnessJob[] = [];

afterEach(async () => {
  for (const j of jobs) await stopHarnessJob(j);
  jobs = [];
  await cleanup();
});

/**
 * One engine step on every rank: TP0 opens the wave with last wave's telemetry; all end it. Unlike
 * the harness's runWave it does not wait for the coordinator to handle the head: these tests watch
 * what the engine sees, including heads that go nowhere.
 */
async function runWave(job: HarnessJob, wave: number, prev: StepTelemetry | undefined) {
  await job.ranks[0].client.waveHead(wave, prev);
  return Promise.all(job.ranks.map((r) => r.client.endOfWave(wave)));
}

const REPEAT_ON = { detector: { token_repeat: { enabled: true, on_trigger: ['report', 'dump_kv'] } }, dump: { auto_max_times: 4, auto_cooldown_seconds: 0, free_headroom_bytes: 0 } };

test('with every feature off, no client call sends anything and end_of_wave returns at once', async () => {
  const job = await startHarnessJob({ tp: 2, runtimeConfig: {} });
  jobs.push(job);
  for (let w = 1; w <= 1000; w++) {
    await job.ranks[0].client.waveHead(w, { requests: [step('r', [1], [0])], nonFinite: [] });
    for (const r of job.ranks) expect(await r.client.endOfWave(w)).toEqual({ due: false, timedOut: false });
  }
  for (const r of job.ranks) {
    expect(r.client.featureFlags()).toBe(0);
    expect(r.client.stats.sent).toBe(0);
    expect(r.agent.stats.clientRequests).toBe(0);
  }
  expect(job.coordinator.wave).toBe(0);
});

test('a detector hit dumps the request from every TP rank, byte for byte, loadable by torch', async () => {
  const job = await startHarnessJob({ tp: 4, runtimeConfig: REPEAT_ON });
  jobs.push(job);
  await waitFor(() => job.ranks.every((r) => r.client.featureFlags() !== 0), 'bus active on every rank');
  const blocks = [3, 9, 4];
  let prev: StepTelemetry | undefined;
  let armed = 0;
  for (let w = 1; w <= 80 && armed === 0; w++) {
    const results = await runWave(job, w, prev);
    expect(results.every((r) => !r.timedOut)).toBe(true);
    if (results.some((r) => r.due) && job.coordinator.pendingDumpLanes().length > 0) armed = w;
    // request 'loop-1' repeats a period-2 pattern: token_repeat fires after min_tokens (32).
    prev = { wave: w, requests: [step('loop-1-abcd', [500 + (w % 2)], blocks, { numOutputTokens: w }), step('ok-2-ef01', [1000 + w * 7], [0, 1])], nonFinite: [] };
  }
  // The next head carries the copy wave's telemetry: the request still held its blocks, the manifest can say complete.
  expect((await runWave(job, armed + 1, prev)).every((r) => !r.timedOut)).toBe(true);
  for (const r of job.ranks) await r.agent.drain();
  // TP0's agent forwarded every wave head as the client's bytes (src/bus/wave-head-relay.ts).
  expect(job.ranks[0].agent.stats.waveHeadsRelayed).toBe(armed + 1);
  expect(job.ranks[0].agent.stats.waveHeadsReencoded).toBe(0);
  await waitFor(() => fs.existsSync(path.join(job.dumpRoot, 'token_repeat')), 'dump dir');
  const [reqDir] = fs.readdirSync(path.join(job.dumpRoot, 'token_repeat'));
  expect(reqDir).toBe('loop-1-abcd');
  const waveDir = path.join(job.dumpRoot, 'token_repeat', reqDir, fs.readdirSync(path.join(job.dumpRoot, 'token_repeat', reqDir))[0]);
  await waitFor(() => {
    const m = fs.existsSync(path.join(waveDir, 'manifest.json')) && JSON.parse(fs.readFileSync(path.join(waveDir, 'manifest.json'), 'utf8'));
    return m && m.complete;
  }, 'manifest complete');
  const manifest = JSON.parse(fs.readFileSync(path.join(waveDir, 'manifest.json'), 'utf8'));
  expect(manifest.completed_ranks).toEqual([0, 1, 2, 3]);
  expect(manifest.missing_ranks).toEqual([]);
  const inspected = inspectTree(waveDir, { verify: true });
  expect(inspected.problems).toEqual([]);
  for (let g = 0; g < 4; g++) {
    for (let l = 0; l < G.layers; l++) {
      const file = path.join(waveDir, `dp0_tp${g}_pp0_cp0`, `layers.${l}.pt`);
      const pt = readPt(file);
      const names = [...(pt.value as Map<string, unknown>).keys()];
      expect(names).toEqual(expect.arrayContaining(['req_id', 'block_ids', 'layer', 'tp_rank', 'k', 'v']));
      for (const [i, kv] of (['k', 'v'] as const).entries()) {
        const t = pt.tensors[i];
        expect(t.shape).toEqual([blocks.length, G.blockSize, G.kvHeads, G.headDim]);
        const want = Buffer.concat(blocks.map((b) => kvBlockBytes(G, l, kv, b, g)));
        expect(readBytes(file, t.dataOffset, t.nbytes).equals(want)).toBe(true);
      }
    }
  }
  // torch reads the dump: the dict, its identity and the bf16 bytes.
  const out = runPython(
    `import sys, torch, hashlib
d = torch.load(sys.argv[1], weights_only=True)
print(d['req_id'], d['tp_rank'], list(d['block_ids']), d['k'].dtype, tuple(d['k'].shape), hashlib.sha256(d['k'].contiguous().view(torch.int16).numpy().tobytes()).hexdigest())`,
    [path.join(waveDir, 'dp0_tp2_pp0_cp0', 'layers.1.pt')],
  ).trim();
  const wantHash = require('crypto').createHash('sha256').update(Buffer.concat(blocks.map((b) => kvBlockBytes(G, 1, 'k', b, 2)))).digest('hex');
  expect(out).toBe(`loop-1-abcd 2 [3, 9, 4] torch.bfloat16 (3, 4, 2, 8) ${wantHash}`);
  const reports = fs.readdirSync(path.join(job.root, 'runtime', 'report', 'token_repeat'));
  expect(reports).toHaveLength(1);
  const report = JSON.parse(fs.readFileSync(path.join(job.root, 'runtime', 'report', 'token_repeat', reports[0]), 'utf8'));
  expect(report).toMatchObject({ incident_type: 'token_repeat', req_id: 'loop-1-abcd', dump_attempted: true });
});

test('a rank that never acks is named missing in the manifest; the others are complete', async () => {
  // Four ranks expected, three agents running: rank 3 never answers.
  const job = await startHarnessJob({ tp: 4, agents: 3, runtimeConfig: { ...REPEAT_ON, dump: { ...REPEAT_ON.dump, manual_dump: 1 } }, dumpAckTimeoutMs: 1500 });
  jobs.push(job);
  await waitFor(() => job.ranks.every((r) => r.client.featureFlags() !== 0), 'bus active');
  const tel: StepTelemetry = { wave: 0, requests: [step('req-a-1', [1], [1, 2])], nonFinite: [] };
  for (let w = 1; w <= 3; w++) await runWave(job, w, { ...tel, wave: w - 1 });
  for (const r of job.ranks) await r.agent.drain();
  const manualRoot = path.join(job.dumpRoot, 'manual_trigger', 'req-a-1');
  await waitFor(() => fs.existsSync(manualRoot) && fs.readdirSync(manualRoot).length > 0, 'manual dump');
  const waveDir = path.join(manualRoot, fs.readdirSync(manualRoot)[0]);
  await waitFor(() => {
    const p = path.join(waveDir, 'manifest.json');
    return fs.existsSync(p) && JSON.parse(fs.readFileSync(p, 'utf8')).timed_out;
  }, 'manifest after the ack timeout', 20000);
  const m = JSON.parse(fs.readFileSync(path.join(waveDir, 'manifest.json'), 'utf8'));
  expect(m.completed_ranks).toEqual([0, 1, 2]);
  expect(m.missing_ranks).toEqual([3]);
  expect(inspectTree(waveDir, { verify: true }).problems).toEqual([`rank 3 missing`].map((p) => expect.stringContaining(p)));
});

test('a request that finished in the detect wave is dumped with request_finished_at_dump', async () => {
  const job = await startHarnessJob({ tp: 2, runtimeConfig: REPEAT_ON });
  jobs.push(job);
  await waitFor(() => job.ranks.every((r) => r.client.featureFlags() !== 0), 'bus active');
  let prev: StepTelemetry | undefined;
  let w = 1;
  for (; w <= 60; w++) {
    await runWave(job, w, prev);
    if (fs.existsSync(path.join(job.dumpRoot, 'token_repeat'))) break;
    // The hit and the finish arrive in the same telemetry (wave 40): the dump is armed anyway.
    const finished = w >= 40;
    prev = { wave: w, requests: [step('fin-1', [500 + (w % 2)], [5, 6], { finished, numOutputTokens: w })], nonFinite: [] };
  }
  // The engine goes on wave after wave (as engines do) through the dump's copy wave, decided ahead.
  const copyBy = w + DEFAULT_LOOKAHEAD_WAVES + 2;
  for (w++; w <= copyBy; w++) await runWave(job, w, undefined);
  for (const r of job.ranks) await r.agent.drain();
  const reqDir = path.join(job.dumpRoot, 'token_repeat', 'fin-1');
  await waitFor(() => fs.existsSync(reqDir), 'dump of the finished request');
  const waveDir = path.join(reqDir, fs.readdirSync(reqDir)[0]);
  await waitFor(() => fs.existsSync(path.join(waveDir, 'dp0_tp1_pp0_cp0', 'dump.json')), 'rank 1 bundle');
  const info = JSON.parse(fs.readFileSync(path.join(waveDir, 'request_info.json'), 'utf8'));
  const dump = JSON.parse(fs.readFileSync(path.join(waveDir, 'dp0_tp1_pp0_cp0', 'dump.json'), 'utf8'));
  expect(dump.request_finished_at_dump).toBe(info.request_finished_at_dump);
});

test('end_of_wave never waits past its bound when the wave vector does not come', async () => {
  const job = await startHarnessJob({ tp: 2, runtimeConfig: REPEAT_ON, endOfWaveTimeoutMs: 30 });
  jobs.push(job);
  await waitFor(() => job.ranks.every((r) => r.client.featureFlags() !== 0), 'bus active');
  // Wave 1 needs no vector: nothing can be due before the first head (the snapshot's floor).
  expect(await job.ranks[1].client.endOfWave(1)).toEqual({ due: false, timedOut: false });
  // Nobody opens waves (TP0's wave head is never sent), so waves 2..6 are never decided: every
  // end_of_wave times out and says so, and only the first waits: the vectors have stalled, nothing
  // is published, so the next four return at once (docs/faults.md, "A dead coordinator").
  const t0 = Date.now();
  for (let w = 2; w <= 6; w++) {
    const res = await job.ranks[1].client.endOfWave(w);
    expect(res).toEqual({ due: false, timedOut: true });
  }
  expect(Date.now() - t0).toBeLessThan(30 + 20 + 1000);
  expect(job.ranks[1].client.stats.endOfWaveTimeouts).toBe(5);
  expect(job.ranks[1].client.stats.stalledSkips).toBe(4);
  // The first call met the agent (hello) and the agent's own bound ran out; the next four told the
  // agent one-way. Either way the agent counts every miss.
  await waitFor(() => job.ranks[1].agent.stats.endOfWaveTimeouts === 5, 'the agent to count 5 timeouts');
  expect(job.ranks[1].agent.stats.missedWaves).toBe(5);
  // The job goes on afterwards: the head of wave 7 decides wave 8 and raises the floor past 7.
  // Rank 0 waits for that head at the end of wave 7 (late); rank 1's vectors are still stalled
  // when it ends wave 7 (nothing published yet): it does not wait, a sixth miss. Wave 8 needs no
  // more waiting on either.
  const ok = await runWave(job, 7, undefined);
  expect(ok.map((r) => r.timedOut)).toEqual([false, true]);
  // (Wave 8 carries the startup config, as the first head's vector does: due, applied by every rank.)
  // Rank 1's vectors still count as stalled, so its end_of_wave reads its mailbox without waiting:
  // the vector of wave 8 is let arrive first (on a loaded host it can take longer than the bound).
  const mailbox = MailboxReader.open(mailboxPath(path.join(job.root, 'run'), 1));
  try {
    await waitFor(() => mailbox.read(8) !== undefined, "wave 8's vector in rank 1's mailbox", 10000, 5);
  } finally {
    mailbox.close();
  }
  expect(await job.ranks[1].client.endOfWave(8)).toEqual({ due: true, timedOut: false });
  await waitFor(() => job.ranks[0].agent.stats.lateVectors >= 1, 'the late vector of wave 7 to be counted');
  // Never silent: the agent's heartbeats carry its counts to the coordinator's /healthz and /metrics, per rank.
  await waitFor(() => {
    const st = job.coordinator.status() as { late_vectors: Record<string, number>; missed_vectors: Record<string, number> };
    return st.late_vectors['0'] >= 1 && st.missed_vectors['1'] === 6;
  }, 'the coordinator to show rank 0 late and rank 1 missed vectors');
  const text = await registry.metrics();
  expect(text).toMatch(/wavebus_missed_vectors\{rank="1"\} 6/);
  expect(text).toMatch(/wavebus_late_vectors\{rank="0"\} [1-9]/);
  // A restarted agent (it knows no client yet) still counts a miss it is told of.
  (job.ranks[1].agent as unknown as { clients: { greeted: Set<string> } }).clients.greeted.clear();
  expect(await job.ranks[1].client.endOfWave(9)).toEqual({ due: false, timedOut: true });
  await waitFor(() => job.ranks[1].agent.stats.endOfWaveTimeouts === 7, 'the agent to count the seventh miss');
});

test('waveHead refuses bad telemetry naming the field, and the next good head still opens its wave', async () => {
  const job = await startHarnessJob({ tp: 2, runtimeConfig: REPEAT_ON });
  jobs.push(job);
  await waitFor(() => job.ranks.every((r) => r.client.featureFlags() !== 0), 'bus active');
  expect((await runWave(job, 1, undefined)).every((r) => !r.timedOut)).toBe(true); // the clients meet their agents
  const c = job.ranks[0].client;
  const good = step('ok-1-aa', [1], [1, 2]);
  await expect(c.waveHead(2, { wave: 1, requests: [good], nonFinite: [{ row: -1, reqId: 'ok-1-aa', kind: 'nan' }] })).rejects.toThrow(/waveHead\(\): telemetry\.nonFinite\[0\]\.row -1 is not a non-negative integer/);
  await expect(c.waveHead(2, { wave: 1, requests: [{ ...good, blockIds: [1, 2.5] }], nonFinite: [] })).rejects.toThrow(/telemetry\.requests\[0\]\.blockIds\[1\] = 2\.5 is not a 32-bit unsigned integer/);
  await expect(c.waveHead(2, { wave: 1, requests: [{ ...step('p-2-bb', [1], [3]), promptTokenIds: [1, -4] }], nonFinite: [] })).rejects.toThrow(/telemetry\.requests\[0\]\.promptTokenIds\[1\] = -4 is not a 32-bit unsigned integer/);
  await expect(c.waveHead(2, { wave: -3, requests: [good], nonFinite: [] })).rejects.toThrow(/telemetry\.wave -3 is not a non-negative integer/);
  const ok = await runWave(job, 2, { wave: 1, requests: [good], nonFinite: [] });
  expect(ok.every((r) => !r.timedOut)).toBe(true);
  expect(c.lastError).toBe('');
});

test('a vector that comes after end_of_wave gave up: that rank acks its job wave_already_ended, the other dumps', async () => {
  const job = await startHarnessJob({ tp: 2, runtimeConfig: { ...REPEAT_ON, dump: { ...REPEAT_ON.dump, manual_dump: 1 } }, endOfWaveTimeoutMs: 200 });
  jobs.push(job);
  await waitFor(() => job.ranks.every((r) => r.client.featureFlags() !== 0), 'bus active');
  // Wave 1 needs no vector (nothing is decided before the first head): it ends at once on both ranks.
  for (const r of job.ranks) expect(await r.client.endOfWave(1)).toEqual({ due: false, timedOut: false });
  // Rank 1 reaches the end of wave 2 before TP0 opens wave 1 (whose head decides wave 2): it waits the bound, goes on.
  expect(await job.ranks[1].client.endOfWave(2)).toEqual({ due: false, timedOut: true });
  await waitFor(() => job.ranks[1].agent.stats.endOfWaveTimeouts === 1, 'rank 1 agent to learn of the miss');
  // Now TP0 opens wave 1; the manual dump of the running request is armed for wave 2.
  const req = step('req-late-1', [1], [1, 2]);
  await job.ranks[0].client.waveHead(1, { wave: 0, requests: [req], nonFinite: [] });
  expect(await job.ranks[0].client.endOfWave(2)).toEqual({ due: true, timedOut: false });
  // The head after the copy wave carries its telemetry (the request still holds its blocks).
  await job.ranks[0].client.waveHead(3, { wave: 2, requests: [req], nonFinite: [] });
  for (const r of job.ranks) await r.agent.drain();
  const dir = path.join(job.dumpRoot, 'manual_trigger', 'req-late-1', 'wave_2');
  await waitFor(() => {
    const p = path.join(dir, 'manifest.json');
    return fs.existsSync(p) && Object.keys(JSON.parse(fs.readFileSync(p, 'utf8')).skipped_ranks).length === 1;
  }, 'the manifest to name rank 1 skipped');
  const m = JSON.parse(fs.readFileSync(path.join(dir, 'manifest.json'), 'utf8'));
  expect(m).toMatchObject({ completed_ranks: [0], missing_ranks: [], failed_ranks: {}, complete: false, timed_out: false });
  // Its engine had ended wave 2 when the job reached its agent: acked at once, with the reason.
  expect(m.skipped_ranks).toEqual({ 1: 'wave_already_ended' });
  expect(job.ranks[1].agent.stats).toMatchObject({ endOfWaveTimeouts: 1, missedWaves: 1, dumpsWritten: 0 });
  expect(fs.existsSync(path.join(dir, 'dp0_tp0_pp0_cp0', 'dump.json'))).toBe(true);
  expect(fs.existsSync(path.join(dir, 'dp0_tp1_pp0_cp0', 'dump.json'))).toBe(false);
});

test('before_forward writes an input snapshot on every rank, and a bad region is refused', async () => {
  const job = await startHarnessJob({ tp: 2, runtimeConfig: {}, snapshotEnv: { WAVEBUS_SNAPSHOT_ENABLE: '1' } });
  jobs.push(job);
  const ctx = { compilationHash: 'graph-a', globalStep: 1, isPrompt: true, reqIds: ['r-1'], positions: [0, 1, 2], rowRequest: [0, 0, 0] };
  for (const [g, r] of job.ranks.entries()) {
    const res = await r.client.beforeForward(ctx, [{ region: 'input0', dtype: 'int32', shape: [3] }]);
    expect(res.captured).toBe(true);
    expect(res.callDir).toBe(path.join(job.root, 'snapshots', 'graph-a', `rank${g}`, 'call0'));
    const call = await loadCallDir(res.callDir!);
    expect(call.tensors[0].data.equals(Buffer.alloc(12, 7))).toBe(true);
    expect(call.meta.global_rank).toBe(g);
  }
  // The next call of the same graph is not selected (call rule defaults to call 0 only).
  expect((await job.ranks[0].client.beforeForward({ ...ctx, globalStep: 2 }, [{ region: 'input0', dtype: 'int32', shape: [3] }])).captured).toBe(false);
  await expect(job.ranks[0].client.beforeForward(ctx, [{ region: 'nope', dtype: 'int32', shape: [3] }])).rejects.toThrow(/inputs\[0\]\.region 'nope'/);
});

test('an engine that schedules asynchronously is refused at connect when snapshots are on', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: {}, snapshotEnv: { WAVEBUS_SNAPSHOT_ENABLE: '1' } });
  jobs.push(job);
  const env = { WAVEBUS_RUN_DIR: path.join(job.root, 'run'), LOCAL_RANK: '0' };
  await expect(WavebusClient.connect({ env, asyncScheduling: true })).rejects.toThrow(/input snapshots need sync scheduling.*Disable async scheduling/);
  const out = runPython(
    `from wavebus_client import Client, ConfigError
try:
    Client.connect(async_scheduling=True)
except ConfigError as e:
    print('refused:', e)`,
    [],
    { env: { ...process.env, ...env, PYTHONPATH: path.join(__dirname, '..', 'clients', 'python') } },
  );
  expect(out).toMatch(/^refused: input snapshots need sync scheduling/);
});

test('an agent restarted under a running engine learns its regions again and the next dump is whole', async () => {
  const job = await startHarnessJob({ tp: 2, runtimeConfig: REPEAT_ON });
  jobs.push(job);
  await waitFor(() => job.ranks.every((r) => r.client.featureFlags() !== 0), 'bus active');
  await runWave(job, 1, undefined);
  // Rank 1's agent goes away and a new one takes its place; the engine and its client keep running.
  const old = job.ranks[1].agent;
  await old.stop();
  const fresh = new Agent({ identity: old.identity, runDir: path.join(job.root, 'run'), coordinator: { host: '127.0.0.1', port: job.coordinator.port }, heartbeatMs: 300, endOfWaveTimeoutMs: 5000, snapshot: resolveSnapshotConfig({ WAVEBUS_CACHE_ROOT: job.root }), roots: { dumps: job.dumpRoot } });
  await fresh.start();
  job.ranks[1].agent = fresh;
  await waitFor(() => job.ranks[1].client.featureFlags() !== 0, 'the new agent publishes its features');
  let prev: StepTelemetry | undefined;
  let w = 2;
  for (; w <= 80 && !fs.existsSync(path.join(job.dumpRoot, 'token_repeat')); w++) {
    await runWave(job, w, prev);
    prev = { wave: w, requests: [step('after-restart-1', [500 + (w % 2)], [2, 3], { numOutputTokens: w })], nonFinite: [] };
  }
  // Armed at the head of wave w-1: copied at the end of wave w; the next head closes its copy window.
  for (const last = w + 1; w <= last; w++) await runWave(job, w, prev);
  for (const r of job.ranks) await r.agent.drain();
  const reqDir = path.join(job.dumpRoot, 'token_repeat', 'after-restart-1');
  await waitFor(() => fs.existsSync(reqDir), 'the dump after the restart');
  const waveDir = path.join(reqDir, fs.readdirSync(reqDir)[0]);
  await waitFor(() => fs.existsSync(path.join(waveDir, 'manifest.json')) && JSON.parse(fs.readFileSync(path.join(waveDir, 'manifest.json'), 'utf8')).complete, 'a complete manifest');
  expect(inspectTree(waveDir, { verify: true }).problems).toEqual([]);
  expect(fs.existsSync(path.join(waveDir, 'dp0_tp1_pp0_cp0', 'dump.json'))).toBe(true);
});

test('a client the agent has not met (it restarted behind the same mailbox) is asked to rejoin, and the step still completes', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: REPEAT_ON });
  jobs.push(job);
  await waitFor(() => job.ranks[0].client.featureFlags() !== 0, 'bus active');
  await runWave(job, 1, undefined); // the client has said hello and registered
  // What a kill -9 and restart leaves behind: same mailbox, same features, an agent that knows no one.
  (job.ranks[0].agent as unknown as { clients: { greeted: Set<string> } }).clients.greeted.clear();
  let prev: StepTelemetry | undefined;
  let w = 2;
  for (; w <= 80 && !fs.existsSync(path.join(job.dumpRoot, 'token_repeat')); w++) {
    const [res] = await runWave(job, w, prev);
    expect(res.timedOut).toBe(false);
    prev = { wave: w, requests: [step('rejoin-1', [500 + (w % 2)], [4, 5], { numOutputTokens: w })], nonFinite: [] };
  }
  await runWave(job, w, prev); // the copy wave: armed at the head of wave w-1
  await job.ranks[0].agent.drain();
  expect(job.ranks[0].client.stats.rejoins).toBe(1);
  const reqDir = path.join(job.dumpRoot, 'token_repeat', 'rejoin-1');
  await waitFor(() => fs.existsSync(reqDir) && fs.readdirSync(reqDir).some((w) => fs.existsSync(path.join(reqDir, w, 'dp0_tp0_pp0_cp0', 'dump.json'))), 'the dump after the rejoin');
});
