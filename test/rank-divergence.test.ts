// rank_divergence against a real engine: examples/torch-engine at TP=2 under `wavebus launch`,
// each rank's client writing the digests of its forward's inputs and of its sampled token column
// into its decision ring, the agents carrying them to the coordinator. Faults are made by real
// means inside the engine: one rank's logits row pushed to another argmax, one rank's scheduler
// leaving a request out of its batch; and a healthy greedy run (both ranks sample alike) with one
// rank's agent frozen (SIGSTOP) for a while; and a rank whose engine writes no digests for a few
// forwards (the engine's nodigest fault, a test double for a client that lost its ring). Cross-host:
// the same divergence with TP=2 spanning two network namespaces (needs root), rank 1's digests and
// column coming to the coordinator over the veth link.
import * as fs from 'fs';
import * as path from 'path';
import * as zlib from 'zlib';
import { argsOf, descendants } from './procs';
import { CLI, PYTHON, ROOT, cleanup, cleanupNetns, createNetnsPair, describeAsRoot, exitedWithin, readManifests, runWavebus, freePortPair, sh, spawnOnHost, spawnWavebus, tmpDir } from './helpers';
import { torchRanks } from './torch2';
import { RankCompare } from '../src/guard/rank-compare';
import { DECISION, DecisionRing } from '../src/agent/decision-ring';
import { DecisionWriter, inputDigest, tokenDigest } from '../src/client/digest';
import { spawnSync } from 'child_process';
import type { WorldLayout } from '../src/layout';
import { divergenceReports, expectOutputsDivergence, getMetrics, metric, pollMetrics, type DivergenceReport } from './rank-divergence-checks';

afterAll(async () => {
  await cleanup();
  cleanupNetns();
});

const ENGINE = path.join(ROOT, 'examples', 'torch-engine');

// How the engine's ranks start: torch 2.x's torchrun (the stand-in where torch 2.x is absent); its python for what reads their files.
const RANKS = torchRanks();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));


interface Run {
  reports: DivergenceReport[];
  dumps: { incident_type: string; req_id?: string; arm_wave: number; complete: boolean; completed_ranks: number[] }[];
  metrics: string;
  runtime: string;
}

/** One TP=2 launch of the engine with rank_divergence alone on (report + dump_kv); `during` runs while it does. */
async function runEngine(engineArgs: string[], during?: (launchPid: number, metricsPort: number, control: string[]) => Promise<void>): Promise<Run> {
  const dir = tmpDir('wavebus-rankdiv-');
  const runtimeConfig = {
    detector: { rank_divergence: { enabled: true } },
    actions: { defaults: { on_trigger: ['report', 'dump_kv'] } },
    dump: { auto_max_times: 4, free_headroom_bytes: 0 },
  };
  const port = await freePortPair();
  const metricsPort = await freePortPair();
  fs.mkdirSync(path.join(dir, 'token'), { mode: 0o700 });
  const launch = spawnWavebus(
    [
      'launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--metrics-port', String(metricsPort), '--bus-token-dir', path.join(dir, 'token'),
      '--additional-config', JSON.stringify({ runtime_config: runtimeConfig }),
      '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000',
      '--', ...RANKS.command(path.join(ENGINE, 'engine.py'), { nproc: 2 }), '--out', path.join(dir, 'out'), ...engineArgs,
    ],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache') }, cwd: dir },
  );
  const metricsPoll = pollMetrics(metricsPort);
  // What `wavebus status` needs to reach this job's coordinator.
  const control = ['--coordinator', `127.0.0.1:${port}`, '--bus-token-file', path.join(dir, 'token', 'bus.token')];
  if (during) await during(launch.child.pid!, metricsPort, control);
  const { code } = await launch.exited;
  const metrics = await metricsPoll.stop();
  if (code !== 0) throw new Error(`launch exited ${code}\n${launch.stdout().slice(-4000)}\n${launch.stderr().slice(-6000)}`);
  const reportDir = path.join(dir, 'runtime', 'report');
  return { reports: divergenceReports(reportDir), dumps: readManifests(path.join(reportDir, 'kv_cache')), metrics, runtime: path.join(dir, 'runtime') };
}

test("one rank's logits pushed to another argmax at step 6: the incident names the wave, that rank, the row and the request; both ranks dump", async () => {
  // Requests arrive every 2 steps: at forward 6 the batch holds req-0, req-1, req-2 (rows 0..2).
  // 30 ms forwards (a small real model's): the digests and the column round trip take a few ms.
  const run = await runEngine(['--requests', '3', '--max-tokens', '12', '--step-sleep-ms', '30', '--fault', 'diverge:6:1:1']);
  // Taken at the first head after the digests and the column are in (the head of wave 7 or 8 at
  // this forward length), armed decide_ahead (1) wave after that head, copied on both ranks.
  expectOutputsDivergence(run.reports, run.dumps, { wave: 6, rank: 1, row: 1, req: 'req-1', armedWithin: 3 });
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="diverged"')).toBeGreaterThanOrEqual(1);
  expect(metric(run.metrics, 'wavebus_incidents_total', 'incident_type="rank_divergence",action="report"')).toBeGreaterThanOrEqual(1);
  // The incident page shows it, with its groups and the divergent rank.
  const page = path.join(run.runtime, 'report.html');
  const r = runWavebus(['report', run.runtime, '-o', page]);
  expect(r.code).toBe(0);
  const html = fs.readFileSync(page, 'utf8');
  expect(html).toContain('rank_divergence');
  expect(html).toContain('divergent_ranks');
  expect(html).toContain('req-1');
  // Before the fault every wave agreed.
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="agreed"')).toBeGreaterThanOrEqual(4);
}, 180000);

test("one rank's scheduler leaves a request out of forward 6: the incident says the inputs already differed, and names that row and request", async () => {
  const run = await runEngine(['--requests', '3', '--max-tokens', '12', '--fault', 'drop:6:2:1']);
  expect(run.reports.length).toBeGreaterThanOrEqual(1);
  const first = run.reports[0];
  expect(first.detail.wave).toBe(6);
  expect(first.detail.inputs_differed).toBe(true);
  expect(first.detail.divergence).toBe('inputs');
  expect(first.detail.input_groups.map((g: { ranks: number[] }) => g.ranks)).toEqual([[0], [1]]);
  // This wave's tokens agreed (the padded row still took the same argmax): one token group. The
  // ring kept each rank's inputs with their row starts (query_start_loc): the agents' per-row input
  // digests name the first row whose inputs differ, req-2's (rows: req-0, req-1, req-2).
  expect(first.detail.groups.map((g: { ranks: number[] }) => g.ranks)).toEqual([[0, 1]]);
  expect(first.detail.divergent_ranks).toEqual([1]);
  expect(first.detail.first_input_row).toBe(2);
  expect(first.detail.first_row).toBe(2);
  expect(first.detail.first_token_row).toBeNull();
  expect(first.detail.column_errors).toBeUndefined();
  expect(first.req_id).toBe('req-2');
}, 180000);

test('healthy greedy run (both ranks sample alike): no alert over a long run, nor while one agent is frozen (SIGSTOP) and after it runs again', async () => {
  let froze = false;
  let frozenRank = -1;
  const run = await runEngine(['--requests', '4', '--max-tokens', '120', '--num-blocks', '256', '--step-sleep-ms', '10'], async (launchPid, metricsPort) => {
    // An agent that is not its host's receiver (the receiver writes every local mailbox: freezing
    // it stops both engines at their next wave end, so nothing goes unreported), once waves agree.
    // Every agent holds its mailbox's flock; the receiver one more (wave-receiver.r0.lock).
    const flocks = (pid: number) => fs.readFileSync('/proc/locks', 'utf8').split('\n').filter((l) => l.includes('FLOCK') && Number(l.trim().split(/\s+/)[4]) === pid).length;
    let agent: number | undefined;
    const until = Date.now() + 60000;
    while (Date.now() < until) {
      const m = await getMetrics(metricsPort);
      const agents = descendants(launchPid).filter((p) => argsOf(p).includes('agent'));
      const counts = agents.map(flocks);
      agent = agents.length === 2 && counts[0] !== counts[1] ? agents[counts[0] < counts[1] ? 0 : 1] : undefined;
      if (agent && metric(m, 'wavebus_rank_digest_waves_total', 'result="agreed"') >= 10) break;
      await sleep(100);
    }
    expect(agent).toBeDefined();
    const c = argsOf(agent!);
    frozenRank = Number(c[c.indexOf('--rank') + 1]);
    process.kill(agent!, 'SIGSTOP');
    froze = true;
    await sleep(1500);
    process.kill(agent!, 'SIGCONT');
  });
  expect(froze).toBe(true);
  expect(run.reports).toEqual([]);
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="diverged"')).toBe(0);
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="agreed"')).toBeGreaterThanOrEqual(40);
  // Every wave was compared with both ranks: the frozen agent's ring (8 waves) held what its
  // engine decided meanwhile, and it sent them once it ran again (a wave it never sends would be
  // unknown: the comparator's test below).
  expect(frozenRank).toBeGreaterThanOrEqual(0);
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="partial"')).toBe(0);
}, 240000);

test('a rank whose engine writes no digest for forwards 6..9 is unknown there, not divergent: counted per replica and rank in /metrics and `wavebus status`, no incident', async () => {
  let seen: { json: Record<string, any>; table: string; metrics: string } | undefined;
  // nodigest: a test double for a rank whose client lost its ring (engine.py --fault).
  const run = await runEngine(['--requests', '3', '--max-tokens', '60', '--step-sleep-ms', '30', '--fault', 'nodigest:6:4:1'], async (_pid, metricsPort, control) => {
    const until = Date.now() + 60000;
    while (Date.now() < until) {
      const m = await getMetrics(metricsPort);
      if (metric(m, 'wavebus_rank_digest_waves_with_unknown', 'dp_rank="0"') >= 4 && metric(m, 'wavebus_rank_digest_waves_total', 'result="agreed"') >= 8) {
        // Live, while the job runs: the status document and its table.
        const js = spawnWavebus(['status', '--json', ...control]);
        const tb = spawnWavebus(['status', ...control]);
        const [j, t] = await Promise.all([js.exited, tb.exited]);
        if (j.code !== 0 || t.code !== 0) throw new Error(`wavebus status exited ${j.code}/${t.code}: ${js.stderr()} ${tb.stderr()}`);
        seen = { json: JSON.parse(js.stdout()), table: tb.stdout(), metrics: m };
        break;
      }
      await sleep(100);
    }
  });
  expect(seen).toBeDefined();
  const rd = seen!.json.rank_divergence['0'];
  expect(rd.waves_with_unknown).toBe(4);
  expect(rd.unknown).toBe(4); // TP=2: one rank known, nothing to compare it with
  expect(rd.unknown_by_rank).toEqual({ '1': 4 });
  expect(rd.diverged).toBe(0);
  expect(seen!.table).toMatch(/^rank digests replica 0: waves agreed \d+, diverged 0, with an unknown rank 4 \(rank 1: 4\)$/m);
  expect(metric(seen!.metrics, 'wavebus_rank_digest_unknown_waves', 'rank="1"')).toBe(4);
  expect(metric(seen!.metrics, 'wavebus_rank_digest_unknown_waves', 'rank="0"')).toBe(0);
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="unknown"')).toBe(4);
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="diverged"')).toBe(0);
  expect(run.reports).toEqual([]);
}, 180000);

describeAsRoot('cross-host: TP=2 spanning two network namespaces (one rank each, joined by a veth pair)', () => {
  test("rank 1 on host B decides apart at step 6: its digests and its column come over the link, and the incident names it, row 1 and req-1", async () => {
    const net = createNetnsPair();
    const dir = tmpDir('wavebus-rankdiv-netns-');
    const PORT = 29600; // fresh namespaces have every port free
    const runtimeConfig = {
      detector: { rank_divergence: { enabled: true } },
      actions: { defaults: { on_trigger: ['report', 'dump_kv'] } },
      dump: { auto_max_times: 4, free_headroom_bytes: 0 },
    };
    // Every host the same paths under `disk` (runtime dir, cache), each on its own disk (host<i>/),
    // as real hosts; gloo between the engines over the veth pair.
    const disk = path.join(dir, 'disk');
    fs.mkdirSync(disk);
    const launch = (ns: string, node: number, veth: string) => {
      const hd = disk;
      return spawnOnHost(
        ns,
        { dir: path.join(dir, `host${node}`), at: disk },
        process.execPath,
        [
          CLI, 'launch', '--nnodes', '2', '--node-rank', String(node), '--nproc-per-node', '1', '--tp', '2',
          '--master-addr', net.addrA, '--port', String(PORT), '--insecure', '--ready-timeout-ms', '60000',
          '--additional-config', JSON.stringify({ runtime_config: runtimeConfig }),
          '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000',
          '--', ...RANKS.command(path.join(ENGINE, 'engine.py'), { nproc: 1, nnodes: 2, nodeRank: node, masterAddr: net.addrA, masterPort: 29500 }), '--out', path.join(hd, 'out'),
          '--requests', '3', '--max-tokens', '12', '--step-sleep-ms', '30', '--fault', 'diverge:6:1:1',
        ],
        { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(hd, 'cache'), MASTER_ADDR: net.addrA, MASTER_PORT: '29500', GLOO_SOCKET_IFNAME: veth }, cwd: hd },
      );
    };
    // Host B reaches host A only over the veth link (its namespace has no other route).
    expect(sh('ip', ['netns', 'exec', net.b, 'ip', '-4', 'route']).trim().split('\n').length).toBe(1);
    const hostA = launch(net.a, 0, net.vethA);
    const hostB = launch(net.b, 1, net.vethB);
    const [ea, eb] = await Promise.all([exitedWithin(hostA, 150000, "host A's launch"), exitedWithin(hostB, 150000, "host B's launch")]);
    const diag = `\nhost A: ${hostA.stderr().slice(-3000)}\nhost B: ${hostB.stderr().slice(-3000)}`;
    expect({ a: ea.code, b: eb.code, diag: ea.code || eb.code ? diag : '' }).toEqual({ a: 0, b: 0, diag: '' });
    // The coordinator (host A) wrote the report; rank 1's digests and token column came from host B.
    const rd = path.join(dir, 'host0', 'runtime', 'report', 'rank_divergence');
    const reports = (fs.existsSync(rd) ? fs.readdirSync(rd).filter((n) => n.endsWith('.json')) : []).map((n) => JSON.parse(fs.readFileSync(path.join(rd, n), 'utf8')) as DivergenceReport);
    reports.sort((a, b) => a.detect_wave - b.detect_wave);
    expect(reports.length).toBeGreaterThanOrEqual(1);
    const first = reports[0];
    expect(first.detail.wave).toBe(6);
    expect(first.detail.groups.map((g: { ranks: number[] }) => g.ranks)).toEqual([[0], [1]]);
    expect(first.detail.divergent_ranks).toEqual([1]);
    expect(first.detail.first_row).toBe(1);
    expect(first.req_id).toBe('req-1');
    expect(first.detail.row_tokens['1']).not.toBe(first.detail.row_tokens['0']);
    expect(first.detail.column_errors).toBeUndefined();
    // Its KV dump: rank 0's files on host A, rank 1's on host B, the manifest on the coordinator's host.
    const wave = path.join('runtime', 'report', 'kv_cache', 'rank_divergence', 'req-1', `wave_${first.dump_arm_wave}`);
    expect(fs.existsSync(path.join(dir, 'host0', wave, 'dp0_tp0_pp0_cp0', 'dump.json'))).toBe(true);
    expect(fs.existsSync(path.join(dir, 'host1', wave, 'dp0_tp1_pp0_cp0', 'dump.json'))).toBe(true);
    expect(fs.existsSync(path.join(dir, 'host1', wave, 'dp0_tp0_pp0_cp0'))).toBe(false);
    const dump = readManifests<{ incident_type: string; req_id?: string; arm_wave: number; completed_ranks: number[] }>(path.join(dir, 'host0', 'runtime', 'report', 'kv_cache')).find(
      (d) => d.incident_type === 'rank_divergence' && d.req_id === 'req-1' && d.arm_wave === first.dump_arm_wave,
    );
    expect(dump?.completed_ranks).toEqual([0, 1]);
  }, 200000);
});

describe('the comparator (src/guard/rank-compare.ts) on the same digests', () => {
  const layout = { worldSize: 4, tp: 4, pp: 1, dp: 1, cp: 1 } as WorldLayout;
  const d = (wave: number, tokenCrc: number, inputCrc = 7) => ({ wave, tokenCrc, rows: 3, inputCrc, inputTokens: 3, flags: 7 });

  test('a rank that reports nothing for a wave is unknown, not divergent; the others are still compared', () => {
    const c = new RankCompare(layout);
    expect(c.add(0, [d(1, 11)], 2)).toEqual([]);
    expect(c.add(1, [d(1, 11)], 2)).toEqual([]);
    expect(c.add(2, [d(1, 11)], 2)).toEqual([]);
    expect((c.status()['0'] as Record<string, any>).open_waves).toBe(1); // waiting for rank 3
    // Rank 3 is silent; wave 1 settles once the replica is grace (2) waves past it.
    expect(c.add(0, [d(2, 5), d(3, 5)], 2)).toEqual([]);
    let s = c.status()['0'] as Record<string, any>;
    expect(s.partial).toBe(1);
    expect(s.agreed).toBe(1);
    expect(s.diverged).toBe(0);
    expect(s.unknown_by_rank).toEqual({ '3': 1 });
    expect(s.waves_with_unknown).toBe(1);
    // A rank that reports a later wave without an earlier one skipped it: unknown at once.
    c.add(1, [d(2, 5)], 100);
    c.add(2, [d(2, 5)], 100);
    c.add(3, [d(3, 5)], 100);
    s = c.status()['0'] as Record<string, any>;
    expect(s.partial).toBe(2);
    expect(s.unknown_by_rank).toEqual({ '3': 2 });
  });

  test('groups of ranks that agree, the largest first; inputs that differ with equal tokens are a divergence too', () => {
    const c = new RankCompare(layout);
    c.add(0, [d(4, 1)], 4);
    c.add(1, [d(4, 1)], 4);
    c.add(2, [d(4, 2)], 4);
    const [div] = c.add(3, [d(4, 1)], 4);
    expect(div.tokenGroups.map((g) => g.ranks)).toEqual([[0, 1, 3], [2]]);
    expect(div.inputsDiffered).toBe(false);
    const c2 = new RankCompare(layout);
    for (const r of [0, 1, 2]) c2.add(r, [d(9, 1)], 4);
    const [inp] = c2.add(3, [d(9, 1, 8)], 4);
    expect(inp.tokenGroups).toHaveLength(1);
    expect(inp.inputGroups.map((g) => g.ranks)).toEqual([[0, 1, 2], [3]]);
    expect(inp.inputsDiffered).toBe(true);
  });
});

describe('the decision ring: one layout (proto/layouts.json, "decision") for the agent, the Python and the TypeScript writer', () => {
  test('both clients write the same digests of the same column and inputs; the agent reads both, and the column back', () => {
    const dir = tmpDir('wavebus-ring-');
    const ring = DecisionRing.create(path.join(dir, 'decided-local0'));
    try {
      const column = [101, 7, 65000, 3, 42];
      // Python: the column as int64 numpy, inputs as int64 torch tensors (ids, positions), wave 3.
      const py = spawnSync(PYTHON, ['-c', `import sys, json, numpy as np, torch
from wavebus_client.digest import DecisionRing, token_digest, input_digest
r = DecisionRing(sys.argv[1])
i = r.inputs(3, torch.tensor([5, 6, 7], dtype=torch.int64), torch.tensor([10, 11, 12], dtype=torch.int64), torch.tensor([0, 2, 3], dtype=torch.int32))
t = r.decided(3, np.array(${JSON.stringify(column)}, dtype=np.int64))
plain = [input_digest(np.array([5, 6, 7], dtype=np.int32), np.array([10, 11, 12], dtype=np.int32)), input_digest(torch.tensor([5, 6, 7]), torch.tensor([10, 11, 12]))]
print(json.dumps([t, i, token_digest(${JSON.stringify(column)}), plain]))`, ring.path], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python') } });
      if (py.status !== 0) throw new Error(py.stderr);
      const [pyToken, pyInput, pyDigest, pyPlain] = JSON.parse(py.stdout.trim()) as [number, number, number, number[]];
      // TypeScript: the same column as plain numbers, the same inputs as int64 arrays, wave 4.
      const w = DecisionWriter.open(ring.path);
      const tsInput = w.inputs(4, new BigInt64Array([5n, 6n, 7n]), new BigInt64Array([10n, 11n, 12n]), [0, 2, 3]);
      const tsToken = w.decided(4, column);
      w.close();
      expect(tsToken).toBe(pyToken);
      expect(pyDigest).toBe(pyToken);
      expect(tokenDigest(new Int32Array(column))).toBe(pyToken);
      expect(tsInput).toBe(pyInput);
      // The input digest's one definition: CRC-32 of the ids, then the positions, as int32 LE, whatever
      // integer type the engine holds them in, kept columns (row starts) or not, in either client.
      const i32 = (a: number[]) => Buffer.from(new Int32Array(a).buffer);
      const defined = zlib.crc32(i32([10, 11, 12]), zlib.crc32(i32([5, 6, 7]))) >>> 0;
      expect([pyInput >>> 0, ...pyPlain.map((x) => x >>> 0)]).toEqual([defined, defined, defined]);
      expect(inputDigest(new Int32Array([5, 6, 7]), new Int32Array([10, 11, 12])) >>> 0).toBe(defined);
      expect(inputDigest(new BigInt64Array([5n, 6n, 7n]), new BigInt64Array([10n, 11n, 12n])) >>> 0).toBe(defined);
      expect(inputDigest(new BigInt64Array([5n, 6n, 8n]), new BigInt64Array([10n, 11n, 12n])) >>> 0).not.toBe(defined);
      const got = ring.decided().sort((a, b) => a.wave - b.wave);
      expect(got.map((d) => [d.wave, d.tokenCrc, d.rows, d.inputCrc, d.inputTokens, d.flags])).toEqual([
        [3, pyToken >>> 0, 5, pyInput >>> 0, 3, 15],
        [4, pyToken >>> 0, 5, pyInput >>> 0, 3, 15],
      ]);
      // The inputs kept with their row starts (rows [5, 6] and [7]): the agent's per-row digests,
      // the same from both writers: CRC-32 of the row's ids, then its positions, as int32.
      const want = [zlib.crc32(i32([10, 11]), zlib.crc32(i32([5, 6]))), zlib.crc32(i32([12]), zlib.crc32(i32([7])))];
      for (const wave of [3, 4]) {
        const r = ring.inputRowDigests(wave);
        expect('column' in r && [...new Uint32Array(r.column.buffer, r.column.byteOffset, r.column.length / 4)]).toEqual(want);
      }
      for (const wave of [3, 4]) {
        const c = ring.column(wave);
        expect('column' in c && [...new Int32Array(c.column.buffer, c.column.byteOffset, c.column.length / 4)]).toEqual(column);
      }
      // A slot the engine is writing (odd seq) is left out; a wave in another wave's slot is garbage.
      const fd = fs.openSync(ring.path, 'r+');
      const seq = Buffer.alloc(8);
      seq.writeBigUInt64LE(5n);
      fs.writeSync(fd, seq, 0, 8, DECISION.slotHeaders + 3 * DECISION.slotBytes + DECISION.slot.seq);
      const wrong = Buffer.alloc(8);
      wrong.writeBigUInt64LE(5n);
      fs.writeSync(fd, wrong, 0, 8, DECISION.slotHeaders + 4 * DECISION.slotBytes + DECISION.slot.wave);
      fs.closeSync(fd);
      expect(ring.decided()).toEqual([]);
      expect(ring.column(3)).toEqual({ error: expect.stringContaining('no longer holds wave 3') });
      // Row starts out of order (written by a faulty engine) are an error, never a read past the tokens.
      const bad = DecisionWriter.open(ring.path);
      bad.inputs(5, new Int32Array([1, 2]), new Int32Array([0, 1]), [0, 3, 2]);
      bad.decided(5, [9, 9]);
      bad.close();
      expect(ring.inputRowDigests(5)).toEqual({ error: expect.stringContaining('outside the forward') });
      // Without row starts the digest alone: no per-row digests to give.
      const plain = DecisionWriter.open(ring.path);
      plain.inputs(6, new Int32Array([1, 2]));
      plain.decided(6, [9]);
      plain.close();
      expect(ring.inputRowDigests(6)).toEqual({ error: expect.stringContaining('no input columns') });
    } finally {
      ring.close();
    }
    expect(fs.existsSync(path.join(dir, 'decided-local0'))).toBe(false);
  });

  test("Python: columns sliced from an engine's buffers each step digest their own values, also after the buffer is refilled, moved to new storage or viewed as another dtype", () => {
    const dir = tmpDir('wavebus-ring-');
    const ring = DecisionRing.create(path.join(dir, 'decided-local0'));
    try {
      // Each case: the ring's digest of a torch column against token_digest of its values as a list
      // (no tensor, no cache), and the column the agent reads back.
      const py = spawnSync(PYTHON, ['-c', `import sys, json, torch
from wavebus_client.digest import DecisionRing, token_digest, input_digest
r = DecisionRing(sys.argv[1])
buf = torch.arange(100, 164, dtype=torch.int64)
out = []
def case(w, col):
    vals = [int(x) for x in col.reshape(-1).tolist()]
    out.append([w, r.decided(w, col) == token_digest(vals), r.inputs(w, col, col) == input_digest(vals, vals), vals])
case(0, buf[:5])           # a slice of the buffer
case(1, buf[:5])           # the same slice again, a new tensor object
case(2, buf[3:9])          # another offset of the same root
buf[3:9] = torch.tensor([7, 7, 7, 7, 7, 7])
case(3, buf[3:9])          # refilled in place: the values of now
buf.set_(torch.zeros(4096, dtype=torch.int64))  # moved to new storage: the new values digested
buf[:4] = torch.tensor([1, 2, 3, 4])
case(4, buf[:4])
case(5, buf[:8].view(torch.int32))   # the same root as int32 (two values per int64)
case(6, buf[0:8:2])        # not contiguous
m = torch.zeros(2, 6, dtype=torch.int64)
m[0] = torch.tensor([9, 8, 7, 6, 5, 4])
case(7, m[0, :3])          # a row of a 2-D buffer (as transformers' output_ids)
case(8, m[:, 1])           # a column of it: not contiguous
print(json.dumps(out))`, ring.path], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python') } });
      if (py.status !== 0) throw new Error(py.stderr);
      const cases = JSON.parse(py.stdout.trim()) as [number, boolean, boolean, number[]][];
      expect(cases).toHaveLength(9);
      for (const [wave, tokenSame, inputSame, vals] of cases) {
        expect([wave, tokenSame, inputSame]).toEqual([wave, true, true]);
        const c = ring.column(wave);
        expect('column' in c && [...new Int32Array(c.column.buffer, c.column.byteOffset, c.column.length / 4)]).toEqual(vals);
      }
      expect(cases[3][3]).toEqual([7, 7, 7, 7, 7, 7]);
      expect(cases[4][3]).toEqual([1, 2, 3, 4]);
      expect(cases[8][3]).toEqual([8, 0]);
    } finally {
      ring.close();
    }
  });
});
