// `wavebus aggregate` end to end: a real coordinator, real agents (AgentBus + FileServer) serving
// real bundles written with Bundle, real ZeroMQ relay, real files. Agents on two simulated hosts.
import * as fs from 'fs';
import * as path from 'path';
import { Dealer } from 'zeromq';
import { aggregate, localPathFor, RelayClient, type AggregateManifest } from '../src/tools/aggregate';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { FileServer } from '../src/agent/file-server';
import { Bundle } from '../src/artifacts/bundle';
import { AgentBus, type RequestHandler } from '../src/bus/agent-bus';
import { Coordinator, requestStatus } from '../src/bus/coordinator';
import { PROTOCOL_VERSION } from '../src/bus/protocol-version';
import { decodeCoordinatorMessage, encodeAgentMessage, type CoordinatorMsg } from '../src/bus/frames';
import { resolveIdentity } from '../src/launch/identity';
import type { WorldLayout } from '../src/layout';
import { inspectTree } from '../src/tools/inspect';
import { createLogger } from '../src/log';
import { Tensor } from '../src/artifacts/tensor';
import { CLI, cleanup, freePortPair, spawnTracked, spawnWavebus, tmpDir, waitFor } from './helpers';

const quiet = createLogger('aggregate-test', 'silent');
const layout: WorldLayout = { worldSize: 4, tp: 4, pp: 1, dp: 1, cp: 1 };
const WAVE = 'token_repeat/req-1/wave_5';

function pattern(n: number, seed: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  let x = seed * 2654435761 + 1;
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    b[i] = x >>> 24;
  }
  return b;
}

/** One rank's KV dump bundle and snapshot call, as the agent would write them. */
async function writeRankBundles(hostRoot: string, rank: number, bigBytes = 0): Promise<void> {
  const dumpDir = path.join(hostRoot, 'dumps', WAVE, `dp0_tp${rank}_pp0_cp0`);
  const b = Bundle.begin(dumpDir);
  const files = [];
  for (let l = 0; l < 2; l++) {
    const k = Tensor.fromBuffer('bfloat16', [2, 4, 1, 8], pattern(2 * 4 * 8 * 2, rank * 10 + l));
    const v = Tensor.fromBuffer('bfloat16', [2, 4, 1, 8], pattern(2 * 4 * 8 * 2, rank * 10 + l + 100));
    files.push(await b.writeTensor(`model.layers.${l}.self_attn.pt`, 'pt', { layer: `model.layers.${l}.self_attn`, k, v }));
  }
  if (bigBytes > 0) files.push(await b.writeTensor('big.npy', 'npy', Tensor.fromBuffer('uint8', [bigBytes], pattern(bigBytes, rank + 7))));
  await b.commit({ name: 'dump.json', value: { schema: 1, req_id: 'req-1', incident_type: 'token_repeat', arm_wave: 5, format: 'pt', identity: { global_rank: rank, tp_rank: rank, dp_rank: 0, pp_rank: 0, cp_rank: 0, tp_size: 4 }, files } });
  const snap = Bundle.begin(path.join(hostRoot, 'snapshots', 'hashA', `rank${rank}`, 'call3'));
  const t0 = await snap.writeTensor('tensor0.npy', 'npy', Tensor.fromBuffer('int32', [8], pattern(32, rank + 50)));
  await snap.commit({ name: 'meta.json', value: { schema: 1, hash: 'hashA', global_rank: rank, call_index: 3, format: 'npy', inputs: [{ index: 0, dtype: 'int32', shape: [8] }], files: [{ name: 'tensor0.npy', bytes: t0.bytes, checksum: t0.checksum }] } });
}

interface Job {
  port: number;
  coord: Coordinator;
  agents: AgentBus[];
  hosts: string[];
  hostOf: (rank: number) => string;
}

const running: Job[] = [];

/** Ranks 0,1 on host A, ranks 2,3 on host B; `handlers` replaces a rank's request handler. */
async function startJob(opts: { ranks?: number[]; bigBytes?: number; handlers?: Record<number, (fs: FileServer) => RequestHandler>; ownFiles?: boolean } = {}): Promise<Job> {
  const port = await freePortPair();
  const hosts = [tmpDir('wavebus-agg-hostA-'), tmpDir('wavebus-agg-hostB-')];
  const hostOf = (r: number) => hosts[r < 2 ? 0 : 1];
  for (let r = 0; r < 4; r++) await writeRankBundles(hostOf(r), r, r === 1 ? opts.bigBytes ?? 0 : 0);
  // The coordinator's host (A) also holds the wave's request_info.json.
  fs.writeFileSync(path.join(hosts[0], 'dumps', WAVE, 'request_info.json'), JSON.stringify({ req_id: 'req-1', expected_ranks: [0, 1, 2, 3] }));
  // With ownFiles, the coordinator serves host A's reports and dump records, as `wavebus coordinator` does its guard's.
  const ownFiles = opts.ownFiles ? () => ({ reports: path.join(hosts[0], 'reports'), dumps: path.join(hosts[0], 'dumps') }) : undefined;
  const coord = new Coordinator({ port, layout, heartbeatMs: 100, deadAfterMs: 5000, logger: quiet, ownFiles });
  await coord.start();
  const agents: AgentBus[] = [];
  for (const r of opts.ranks ?? [0, 1, 2, 3]) {
    const identity = resolveIdentity({}, { rank: r, worldSize: 4, tp: 4, pp: 1 });
    const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity, heartbeatMs: 100, deadAfterMs: 5000, logger: quiet });
    const server = new FileServer(r, () => ({ dumps: path.join(hostOf(r), 'dumps'), snapshots: path.join(hostOf(r), 'snapshots') }), quiet);
    bus.onRequest(opts.handlers?.[r]?.(server) ?? ((req) => server.handle(req)));
    await bus.start();
    agents.push(bus);
  }
  const want = (opts.ranks ?? [0, 1, 2, 3]).length;
  await waitFor(async () => (await requestStatus({ host: '127.0.0.1', port })).liveRanks.length === want, 'agents live');
  const job = { port, coord, agents, hosts, hostOf };
  running.push(job);
  return job;
}

afterEach(async () => {
  for (const j of running.splice(0)) {
    await Promise.all(j.agents.map((a) => a.stop()));
    await j.coord.stop();
  }
  await cleanup();
});

/** Every file under `src` equals the same relative file under `dst`. Returns how many. */
function expectSameFiles(src: string, dst: string): number {
  let n = 0;
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else {
        const q = path.join(dst, path.relative(src, p));
        expect(fs.existsSync(q) ? q : `missing ${q}`).toBe(q);
        expect(fs.readFileSync(q).equals(fs.readFileSync(p))).toBe(true);
        n++;
      }
    }
  };
  walk(src);
  return n;
}

function listTree(root: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out.push(path.relative(root, p));
    }
  };
  if (fs.existsSync(root)) walk(root);
  return out.sort();
}

describe('localPathFor (untrusted names)', () => {
  test('refuses traversal, absolute paths, NUL and hidden names; keeps ordinary ones under the root', () => {
    const out = '/tmp/agg-out';
    for (const bad of ['../../evil', '/etc/passwd', 'a/../../x', 'a/./b', 'ok\0bad', '.hidden', 'a//b', '', 'x/.y.part']) {
      expect('reason' in localPathFor(out, 'dumps', bad)).toBe(true);
    }
    expect(localPathFor(out, 'dumps', 7 as unknown as string)).toHaveProperty('reason');
    expect(localPathFor(out, 'dumps', 'a/rank0/x.pt')).toEqual({ path: '/tmp/agg-out/dumps/a/rank0/x.pt' });
  });
});

describe('aggregate', () => {
  test('collects every rank from both hosts byte for byte, manifest lists all ranks; inspect agrees', async () => {
    const job = await startJob({ bigBytes: 9 * 2 ** 20 + 123 }); // a multi-chunk file
    const out = tmpDir('wavebus-agg-out-');
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out, chunkBytes: 2 ** 20, window: 3 });
    expect(m.complete).toBe(true);
    expect(m.expected_ranks).toEqual([0, 1, 2, 3]);
    expect(m.present_ranks).toEqual([0, 1, 2, 3]);
    expect(m.missing_ranks).toEqual([]);
    expect(m.refused).toEqual([]);
    expect(m.files.every((f) => f.verified && f.status === 'fetched')).toBe(true);
    // Ranks on one host share a filesystem: each file is fetched once, and both listers recorded.
    const big = m.files.find((f) => f.path.endsWith('dp0_tp1_pp0_cp0/big.npy'))!;
    expect(big.bytes).toBeGreaterThan(9 * 2 ** 20);
    expect(big.listedBy.sort()).toEqual([0, 1]);
    let n = 0;
    for (const h of job.hosts) {
      n += expectSameFiles(path.join(h, 'dumps'), path.join(out, 'dumps'));
      n += expectSameFiles(path.join(h, 'snapshots'), path.join(out, 'snapshots'));
    }
    expect(m.totals.files).toBe(n);
    expect(m.totals.bytes).toBe(m.files.reduce((s, f) => s + f.bytes, 0));
    expect(listTree(out).filter((p) => p.endsWith('.part'))).toEqual([]);
    const onDisk = JSON.parse(fs.readFileSync(path.join(out, 'manifest.json'), 'utf8')) as AggregateManifest;
    expect(onDisk.kind).toBe('wavebus_aggregate');
    expect(onDisk.totals).toEqual(m.totals);
    // The aggregated tree is a valid tree for inspect: four rank bundles, four snapshot calls, verified.
    const r = inspectTree(out, { verify: true });
    expect(r.problems).toEqual([]);
    expect(r.bundles.filter((b) => b.kind === 'kv_dump').map((b) => b.ranks[0]).sort()).toEqual([0, 1, 2, 3]);
    expect(r.bundles.filter((b) => b.kind === 'snapshot')).toHaveLength(4);

    // A second run finds everything present and fetches nothing.
    const again = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out });
    expect(again.complete).toBe(true);
    expect(again.totals.fetched_files).toBe(0);
    expect(again.totals.present_files).toBe(n);
  });

  test('a prefix and a call filter select one incident / one snapshot call', async () => {
    const job = await startJob();
    const out = tmpDir('wavebus-agg-out-');
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out, what: 'dumps', prefix: WAVE });
    expect(m.complete).toBe(true);
    expect(listTree(path.join(out, 'dumps')).every((p) => p.startsWith(WAVE))).toBe(true);
    expect(fs.existsSync(path.join(out, 'snapshots'))).toBe(false);
    expect(listTree(path.join(out, 'dumps', WAVE)).filter((p) => p.endsWith('dump.json'))).toHaveLength(4);
    const out2 = tmpDir('wavebus-agg-out-');
    const s = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out: out2, what: 'snapshots', prefix: 'hashA/', call: 3 });
    expect(s.complete).toBe(true);
    expect(listTree(out2).filter((p) => p !== 'manifest.json')).toHaveLength(8);
    const none = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out: tmpDir('wavebus-agg-out-'), what: 'snapshots', call: 4 });
    expect(none.totals.files).toBe(0);
  });

  test('CLI: a rank that is not live is listed missing and the exit code is non-zero', async () => {
    const job = await startJob({ ranks: [0, 1, 2] });
    const out = tmpDir('wavebus-agg-out-');
    const p = spawnWavebus(['aggregate', '--coordinator', `127.0.0.1:${job.port}`, '--out', out, '--json']);
    const { code } = await p.exited;
    expect(code).toBe(1);
    const m = JSON.parse(p.stdout()) as AggregateManifest;
    expect(m.missing_ranks).toEqual([3]);
    expect(m.present_ranks).toEqual([0, 1, 2]);
    expect(m.ranks['3'].errors.join(' ')).toMatch(/not live/);
    expect(p.stderr()).toMatch(/rank 3 missing/);
    // Rank 3 lives on host B with rank 2, which served its files: the data is here even so.
    expect(fs.existsSync(path.join(out, 'dumps', WAVE, 'dp0_tp3_pp0_cp0', 'dump.json'))).toBe(true);
    // inspect sees the aggregate manifest's missing rank and fails, naming it.
    const r = inspectTree(out);
    expect(r.problems.join('\n')).toMatch(/rank 3 missing/);

    const ok = spawnWavebus(['aggregate', '--coordinator', `127.0.0.1:${job.port}`, '--out', tmpDir('wavebus-agg-out-'), '--what', 'snapshots', '--chunk-mb', '9']);
    expect((await ok.exited).code).toBe(2);
    expect(ok.stderr()).toMatch(/--chunk-mb/);
  });

  test('interrupted, then rerun: completes without re-fetching finished files; the partial file resumes', async () => {
    const chunkRequests = new Map<string, number>();
    const counting = (server: FileServer): RequestHandler => async (req: CoordinatorMsg) => {
      if (req.body === 'fileChunk') chunkRequests.set(req.fileChunk.path, (chunkRequests.get(req.fileChunk.path) ?? 0) + 1);
      return server.handle(req);
    };
    const big = 6 * 2 ** 20;
    const job = await startJob({ bigBytes: big, handlers: { 0: counting, 1: counting, 2: counting, 3: counting } });
    const out = tmpDir('wavebus-agg-out-');
    const coordinator = { host: '127.0.0.1', port: job.port };
    // Sequential, 1 MiB chunks: the big file (sorted after the layer files of rank 0) breaks half-way.
    const injected = aggregate({ coordinator, out, what: 'dumps', chunkBytes: 2 ** 20, window: 1, parallelFiles: 1, failAfterBytes: 3 * 2 ** 20 + 200000 });
    await expect(injected).rejects.toThrow(/injected failure/);
    const bigRel = path.join('dumps', WAVE, 'dp0_tp1_pp0_cp0', 'big.npy');
    expect(fs.existsSync(path.join(out, bigRel))).toBe(false); // never partial under its final name
    const part = path.join(out, 'dumps', WAVE, 'dp0_tp1_pp0_cp0', '.big.npy.part');
    expect(fs.existsSync(part)).toBe(true);
    const partBytes = fs.statSync(part).size;
    expect(partBytes).toBeGreaterThan(0);
    const before = listTree(out).filter((p) => p.startsWith('dumps/') && !p.endsWith('.part'));
    expect(before.length).toBeGreaterThan(0);

    chunkRequests.clear();
    const m = await aggregate({ coordinator, out, what: 'dumps', chunkBytes: 2 ** 20, window: 2 });
    expect(m.complete).toBe(true);
    for (const rel of before) {
      const f = m.files.find((x) => path.join('dumps', x.path) === rel)!;
      expect(f.status).toBe('present');
      expect(chunkRequests.get(f.path) ?? 0).toBe(0);
    }
    const bigEntry = m.files.find((f) => f.path.endsWith('dp0_tp1_pp0_cp0/big.npy'))!;
    expect(bigEntry.status).toBe('resumed');
    // Only the rest of the big file was asked for.
    expect(chunkRequests.get(bigEntry.path)).toBe(Math.ceil((bigEntry.bytes - partBytes) / 2 ** 20));
    for (const h of job.hosts) expectSameFiles(path.join(h, 'dumps'), path.join(out, 'dumps'));
    expect(fs.existsSync(part)).toBe(false);
  });

  test('a file corrupted after listing fails its whole-file checksum: reported, never under its final name', async () => {
    let flipped = false;
    const corrupting = (server: FileServer): RequestHandler => async (req: CoordinatorMsg) => {
      const reply = await server.handle(req);
      if (req.body === 'fileList' && !flipped) {
        // Flip one byte of a served layer file after its checksum went out in the listing.
        const f = path.join(server['roots']().dumps as string, WAVE, 'dp0_tp2_pp0_cp0', 'model.layers.1.self_attn.pt');
        const b = fs.readFileSync(f);
        b[b.length - 40] ^= 0x10;
        fs.writeFileSync(f, b);
        flipped = true;
      }
      return reply;
    };
    const job = await startJob({ ranks: [2, 0, 1, 3], handlers: { 2: corrupting } });
    const out = tmpDir('wavebus-agg-out-');
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out, what: 'dumps' });
    expect(m.complete).toBe(false);
    const bad = m.files.find((f) => f.path.endsWith('dp0_tp2_pp0_cp0/model.layers.1.self_attn.pt'))!;
    expect(bad.status).toBe('failed');
    expect(bad.verified).toBe(false);
    expect(bad.error).toMatch(/whole-file checksum crc32c:[0-9a-f]{8} .* does not match the listing's crc32c:[0-9a-f]{8}/);
    const local = path.join(out, 'dumps', bad.path);
    expect(fs.existsSync(local)).toBe(false);
    expect(listTree(out).filter((p) => p.endsWith('.part'))).toEqual([]);
    expect(m.totals.failed_files).toBe(1);
    // Everything else arrived.
    expect(m.files.filter((f) => f.status === 'fetched')).toHaveLength(m.files.length - 1);
  });

  test("the coordinator's own reports and dump records: collected from it (rank -1) with the same checks, nothing else it holds is served", async () => {
    const job = await startJob({ ownFiles: true });
    const hostA = job.hosts[0];
    fs.writeFileSync(path.join(hostA, 'dumps', WAVE, 'manifest.json'), JSON.stringify({ req_id: 'req-1', expected_ranks: [0, 1, 2, 3], completed_ranks: [0, 1, 2, 3], missing_ranks: [], complete: true, files: {} }));
    const reports = path.join(hostA, 'reports', 'token_repeat');
    fs.mkdirSync(reports, { recursive: true });
    fs.writeFileSync(path.join(reports, 'report_20260101_000000_000_req-1_pid7.json'), JSON.stringify({ incident_type: 'token_repeat', req_id: 'req-1' }));
    // Not reports: a link to a root-only file, another file, a report one level too deep.
    fs.symlinkSync('/etc/shadow', path.join(reports, 'report_link.json'));
    fs.writeFileSync(path.join(reports, 'notes.txt'), 'x');
    fs.mkdirSync(path.join(reports, 'deeper'));
    fs.writeFileSync(path.join(reports, 'deeper', 'report_deep.json'), '{}');
    const out = tmpDir('wavebus-agg-out-');
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out });
    expect(m.complete).toBe(true);
    expect(m.coordinator_files).toMatchObject({ asked: true, answered: true, files: 3, errors: [] });
    const own = m.files.filter((f) => f.rank === -1).map((f) => `${f.root}/${f.path}`).sort();
    expect(own).toEqual([`dumps/${WAVE}/manifest.json`, `dumps/${WAVE}/request_info.json`, 'reports/token_repeat/report_20260101_000000_000_req-1_pid7.json']);
    // Host A's agents list the same records: fetched once, from the coordinator, which wrote them.
    for (const f of m.files.filter((x) => x.rank === -1)) expect({ path: f.path, listedBy: f.listedBy, verified: f.verified }).toEqual({ path: f.path, listedBy: [-1], verified: true });
    expect(fs.readFileSync(path.join(out, 'reports', 'token_repeat', 'report_20260101_000000_000_req-1_pid7.json'), 'utf8')).toContain('req-1');
    expect(listTree(path.join(out, 'reports'))).toEqual(['token_repeat/report_20260101_000000_000_req-1_pid7.json']);
    const tree = inspectTree(out, { verify: true });
    expect(tree.problems).toEqual([]);
    expect(tree.bundles.filter((b) => b.kind === 'dump_wave').map((b) => b.ranks)).toEqual([[0, 1, 2, 3]]);

    // Asked directly, the coordinator serves nothing beyond its records and reports.
    const client = new RelayClient({ host: '127.0.0.1', port: job.port });
    try {
      await expect(client.relay(0, 'fileChunk', { root: 'dump_records', path: `${WAVE}/rank0/dump.json`, offset: 0, length: 100 }, 5000)).rejects.toThrow(/not served by the coordinator/);
      await expect(client.relay(0, 'fileChunk', { root: 'reports', path: 'token_repeat/report_link.json', offset: 0, length: 100 }, 5000)).rejects.toThrow(/link/);
      await expect(client.relay(0, 'fileChunk', { root: 'reports', path: 'token_repeat/notes.txt', offset: 0, length: 100 }, 5000)).rejects.toThrow(/not served by the coordinator/);
      await expect(client.relay(0, 'fileChunk', { root: 'reports', path: '../dumps/token_repeat/req-1/wave_5/rank0/dump.json', offset: 0, length: 100 }, 5000)).rejects.toThrow();
      // An agent refuses the coordinator's roots: an older coordinator that relays them fails loudly.
      const server = new FileServer(0, () => ({ dumps: path.join(hostA, 'dumps') }), quiet);
      expect(await server.handle({ body: 'fileList', fileList: { root: 'reports', prefix: '' } } as unknown as CoordinatorMsg)).toMatchObject({ fileList: { files: [], error: "root 'reports' is not served by rank 0" } });
    } finally {
      await client.close();
    }
  });

  test('a dump whose manifest.json lists a file no rank serves (written elsewhere, or not ours): missing_files names it and complete is false', async () => {
    const job = await startJob({ ownFiles: true });
    const hostA = job.hosts[0];
    // The dump manifest as the ledger writes it: each completed rank's acked files, relative to the wave dir.
    const acked = (r: number) =>
      (JSON.parse(fs.readFileSync(path.join(job.hostOf(r), 'dumps', WAVE, `dp0_tp${r}_pp0_cp0`, 'dump.json'), 'utf8')).files as { path: string; bytes: number }[]).map((f) => ({ ...f, path: `dp0_tp${r}_pp0_cp0/${f.path}` }));
    const files: Record<number, { path: string; bytes: number }[]> = { 0: acked(0), 1: acked(1), 2: acked(2), 3: acked(3) };
    const manifest = (f: typeof files) => JSON.stringify({ req_id: 'req-1', expected_ranks: [0, 1, 2, 3], completed_ranks: [0, 1, 2, 3], missing_ranks: [], complete: true, dirs: { 0: 'dp0_tp0_pp0_cp0', 1: 'dp0_tp1_pp0_cp0', 2: 'dp0_tp2_pp0_cp0', 3: 'dp0_tp3_pp0_cp0' }, files: f });
    fs.writeFileSync(path.join(hostA, 'dumps', WAVE, 'manifest.json'), manifest(files));
    const whole = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out: tmpDir('wavebus-agg-out-'), what: 'dumps' });
    expect({ complete: whole.complete, missing: whole.missing_files }).toEqual({ complete: true, missing: [] });
    // Rank 2 acked a file its host does not hold (the dump written through a planted link).
    files[2] = [...files[2], { path: 'dp0_tp2_pp0_cp0/model.layers.7.self_attn.pt', bytes: 1234 }];
    fs.writeFileSync(path.join(hostA, 'dumps', WAVE, 'manifest.json'), manifest(files));
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out: tmpDir('wavebus-agg-out-'), what: 'dumps' });
    expect(m.missing_files).toEqual([{ dump: WAVE, path: `${WAVE}/dp0_tp2_pp0_cp0/model.layers.7.self_attn.pt`, rank: 2, reason: 'listed by no rank (written elsewhere, removed, or not ours to serve)' }]);
    expect(m.totals.missing_files).toBe(1);
    expect(m.totals.failed_files).toBe(0);
    expect(m.missing_ranks).toEqual([]);
    expect(m.complete).toBe(false);
  });

  test('a rogue agent listing ../../evil and friends: refused, counted, never written or requested', async () => {
    const asked: string[] = [];
    const rogue = (server: FileServer): RequestHandler => async (req: CoordinatorMsg) => {
      if (req.body === 'fileList') {
        const real = (await server.handle(req)) as { fileList: { files: unknown[] } };
        const evil = ['../../evil', '../evil2', '/tmp/evil-abs', 'ok/../../../evil3', 'nul\0name', '.hidden', 'a//b'].map((p) => ({ path: p, bytes: 4, checksum: 'crc32c:00000000' }));
        return { fileList: { globalRank: 3, files: [...real.fileList.files, ...evil, { path: 'fine.bin', bytes: 3, checksum: 'not-a-checksum' }] } };
      }
      if (req.body === 'fileChunk') asked.push(req.fileChunk.path);
      return server.handle(req);
    };
    const job = await startJob({ handlers: { 3: rogue } });
    const base = tmpDir('wavebus-agg-rogue-');
    const out = path.join(base, 'a', 'b', 'out');
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port: job.port }, out, what: 'dumps' });
    expect(m.refused.map((r) => r.path).sort()).toEqual(['../../evil', '../evil2', '.hidden', '/tmp/evil-abs', 'a//b', 'fine.bin', 'nul\\0name', 'ok/../../../evil3'].sort());
    expect(m.refused.every((r) => r.rank === 3)).toBe(true);
    expect(m.totals.refused).toBe(8);
    expect(m.complete).toBe(false);
    expect(asked.filter((p) => /evil|hidden|nul|fine/.test(p))).toEqual([]);
    expect(listTree(base).filter((p) => /evil|hidden|nul|fine/.test(p))).toEqual([]);
    expect(fs.existsSync('/tmp/evil-abs')).toBe(false);
    // The honest part of the listing still arrived.
    expect(m.files.every((f) => f.verified)).toBe(true);
  });
});

// ------------------------------------------------------------------ hostile peers (issue 13 item 5)

/**
 * A hostile agent-side peer: a raw DEALER speaking the bus protocol as `rank` (optionally with a
 * Hello first, then heartbeats), answering each relayed request with what `serve` returns.
 */
function rawAgent(port: number, rank: number, serve: (m: CoordinatorMsg) => Buffer[] | undefined, opts: { hello: boolean }) {
  const d = new Dealer({ linger: 0 });
  d.connect(`tcp://127.0.0.1:${port + 1}`);
  const asked: CoordinatorMsg[] = [];
  let beats = 0;
  const identity = { globalRank: rank, worldSize: 2, localRank: rank, localWorldSize: 2, tp: 2, pp: 1, dp: 1, cp: 1, pid: process.pid, host: 'peer' };
  const send = (parts: Buffer[]) => d.send(parts).catch(() => undefined);
  if (opts.hello) void send([encodeAgentMessage({ globalRank: rank, hello: { identity, subscribed: false, protocolVersion: PROTOCOL_VERSION } })]);
  const beat = setInterval(() => {
    beats++;
    void send([encodeAgentMessage({ globalRank: rank, heartbeat: { wave: 1, globalRank: rank } })]);
  }, 50);
  const loop = (async () => {
    while (!d.closed) {
      let parts: Buffer[];
      try {
        parts = await d.receive();
      } catch {
        return;
      }
      const m = decodeCoordinatorMessage(parts[0], 1 << 26);
      if (!m.ok || (m.value.body !== 'fileList' && m.value.body !== 'fileChunk')) continue;
      asked.push(m.value);
      const reply = serve(m.value);
      if (reply) await send(reply);
    }
  })();
  return {
    asked,
    beats: () => beats,
    async close() {
      clearInterval(beat);
      d.close();
      await loop;
    },
  };
}

describe('hostile listings and routes', () => {
  const peers: Array<{ close: () => Promise<void> }> = [];
  afterEach(async () => {
    for (const p of peers.splice(0)) await p.close();
  });

  async function startCoordinator() {
    const port = await freePortPair();
    const coord = new Coordinator({ port, layout: { worldSize: 2, tp: 2, pp: 1, dp: 1, cp: 1 }, heartbeatMs: 100, deadAfterMs: 5000, logger: quiet });
    await coord.start();
    running.push({ port, coord, agents: [], hosts: [], hostOf: () => '' });
    return { port, coord };
  }

  test('a listing with a 2^53-1 size, a 5000-byte path and ../x: each refused with its reason in the manifest, the good file fetched, no .part, sane RSS', async () => {
    const { port } = await startCoordinator();
    const good = pattern(3 * 2 ** 20 + 17, 9);
    const longPath = `${Array.from({ length: 25 }, (_, i) => `${i}`.padEnd(199, 'd')).join('/')}/f.bin`;
    expect(Buffer.byteLength(longPath)).toBeGreaterThan(5000);
    const listing = [
      { path: 'huge.bin', bytes: 2 ** 53 - 1, checksum: 'crc32c:00000000' },
      { path: longPath, bytes: 10, checksum: 'crc32c:00000000' },
      { path: '../x', bytes: 10, checksum: 'crc32c:00000000' },
      { path: 'good/rank0/data.bin', bytes: good.length, checksum: formatChecksum(crc32c(good)) },
    ];
    const serve = (rank: number) => (m: CoordinatorMsg): Buffer[] | undefined => {
      if (m.body === 'fileList') return [encodeAgentMessage({ globalRank: rank, requestId: m.requestId, fileList: { globalRank: rank, files: m.fileList.root === 'dumps' ? listing : [] } })];
      const c = m.fileChunk as { root: string; path: string; offset: number; length: number };
      if (c.path !== 'good/rank0/data.bin') return [encodeAgentMessage({ globalRank: rank, requestId: m.requestId, fileChunk: { globalRank: rank, error: 'no such file' } })];
      const data = good.subarray(c.offset, c.offset + c.length);
      return [encodeAgentMessage({ globalRank: rank, requestId: m.requestId, fileChunk: { globalRank: rank, root: c.root, path: c.path, offset: c.offset, crc32c: crc32c(data), eof: c.offset + data.length >= good.length } }), Buffer.from(data)];
    };
    const agents = [rawAgent(port, 0, serve(0), { hello: true }), rawAgent(port, 1, serve(1), { hello: true })];
    peers.push(...agents);
    await waitFor(async () => (await requestStatus({ host: '127.0.0.1', port })).liveRanks.length === 2, 'both peers to be live');

    const out = path.join(tmpDir('wavebus-agg-hostile-'), 'out');
    // Record the CLI's peak RSS as it exits (no speed asserted).
    const preload = path.join(tmpDir('wavebus-agg-preload-'), 'rss.js');
    fs.writeFileSync(preload, "process.on('exit', () => require('fs').writeSync(2, `maxrss_kb=${process.resourceUsage().maxRSS}\\n`));\n");
    const p = spawnTracked(process.execPath, ['-r', preload, CLI, 'aggregate', '--coordinator', `127.0.0.1:${port}`, '--out', out, '--what', 'dumps', '--timeout-ms', '5000', '--chunk-mb', '1']);
    const { code } = await p.exited;
    expect(code).toBe(1); // incomplete: entries were refused
    const m = JSON.parse(fs.readFileSync(path.join(out, 'manifest.json'), 'utf8')) as AggregateManifest;
    const reasonOf = (pred: (p: string) => boolean) => m.refused.filter((r) => pred(r.path)).map((r) => r.reason);
    expect(reasonOf((x) => x === 'huge.bin')).toEqual([`size ${2 ** 53 - 1} is over the local limit of ${2 ** 40} bytes (MAX_FILE_BYTES)`, `size ${2 ** 53 - 1} is over the local limit of ${2 ** 40} bytes (MAX_FILE_BYTES)`]);
    expect(reasonOf((x) => x.startsWith('0ddd'))).toEqual([expect.stringMatching(/^path is \d+ bytes, over PATH_MAX \(4095 bytes\)$/), expect.stringMatching(/over PATH_MAX/)]);
    expect(reasonOf((x) => x === '../x')).toEqual(['component ".." is not allowed', 'component ".." is not allowed']);
    expect(m.totals.refused).toBe(6);
    expect(m.files).toEqual([expect.objectContaining({ path: 'good/rank0/data.bin', status: 'fetched', verified: true, listedBy: [0, 1] })]);
    expect(fs.readFileSync(path.join(out, 'dumps', 'good', 'rank0', 'data.bin')).equals(good)).toBe(true);
    expect(listTree(out).filter((f) => f.endsWith('.part'))).toEqual([]);
    expect(listTree(out).sort()).toEqual(['dumps/good/rank0/data.bin', 'manifest.json']);
    const rssKb = Number(/maxrss_kb=(\d+)/.exec(p.stderr())?.[1]);
    expect(rssKb).toBeGreaterThan(0);
    expect(rssKb).toBeLessThan(400 * 1024);
  });

  test('a listing that nests files under a file\'s name (n/a and n/a/b): the nested entries refused with their reason, the file fetched, no .part left; a directory where a file goes: failed, no .part', async () => {
    const { port } = await startCoordinator();
    const bytes: Record<string, Buffer> = { 'n/a': pattern(5000, 1), 'n/a/b': pattern(3000, 2), 'n/a/c/d': pattern(2000, 3), 'm/dir': pattern(1000, 4) };
    const listing = Object.entries(bytes).map(([p, b]) => ({ path: p, bytes: b.length, checksum: formatChecksum(crc32c(b)) }));
    const serve = (rank: number) => (m: CoordinatorMsg): Buffer[] | undefined => {
      if (m.body === 'fileList') return [encodeAgentMessage({ globalRank: rank, requestId: m.requestId, fileList: { globalRank: rank, files: m.fileList.root === 'dumps' ? listing : [] } })];
      const c = m.fileChunk as { root: string; path: string; offset: number; length: number };
      const data = bytes[c.path].subarray(c.offset, c.offset + c.length);
      return [encodeAgentMessage({ globalRank: rank, requestId: m.requestId, fileChunk: { globalRank: rank, root: c.root, path: c.path, offset: c.offset, crc32c: crc32c(data), eof: c.offset + data.length >= bytes[c.path].length } }), Buffer.from(data)];
    };
    const agents = [rawAgent(port, 0, serve(0), { hello: true }), rawAgent(port, 1, serve(1), { hello: true })];
    peers.push(...agents);
    await waitFor(async () => (await requestStatus({ host: '127.0.0.1', port })).liveRanks.length === 2, 'both peers to be live');
    const out = path.join(tmpDir('wavebus-agg-nested-'), 'out');
    // An earlier run (or anything else) left a directory where m/dir, a file, goes.
    fs.mkdirSync(path.join(out, 'dumps', 'm', 'dir'), { recursive: true });
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port }, out, what: 'dumps', requestTimeoutMs: 5000 });
    expect(m.refused.map((r) => [r.path, r.reason]).sort()).toEqual([
      ['n/a/b', 'nested under "n/a", which is listed as a file: a name cannot be both a file and a directory'],
      ['n/a/c/d', 'nested under "n/a", which is listed as a file: a name cannot be both a file and a directory'],
    ]);
    expect(m.files.find((f) => f.path === 'n/a')).toMatchObject({ status: 'fetched', verified: true });
    expect(m.files.find((f) => f.path === 'm/dir')).toMatchObject({ status: 'failed', verified: false, error: expect.stringMatching(/m\/dir: cannot rename .*\.dir\.part to .*m\/dir: EISDIR/) });
    expect(m.complete).toBe(false);
    expect(fs.readFileSync(path.join(out, 'dumps', 'n', 'a')).equals(bytes['n/a'])).toBe(true);
    expect(listTree(out).filter((f) => f.endsWith('.part'))).toEqual([]);
  });

  test('two hosts list one path with different bytes: the rank whose own KV dump dir holds it wins (seed names via the status layout, rank<g> of older dumps)', async () => {
    const { port } = await startCoordinator(); // tp=2: rank 1 is dp0_tp1_pp0_cp0
    const client = new RelayClient({ host: '127.0.0.1', port });
    try {
      expect((await client.status(3000)).layout).toEqual({ worldSize: 2, tp: 2, pp: 1, dp: 1, cp: 1 });
    } finally {
      await client.close();
    }
    const paths = ['w/dp0_tp1_pp0_cp0/x.bin', 'w/rank1/old.bin', 'w/dp0_tp0_pp0_cp0/z.bin'];
    const bytesOf = (rank: number, p: string) => pattern(1000 + paths.indexOf(p), 10 * rank + paths.indexOf(p));
    const serve = (rank: number) => (m: CoordinatorMsg): Buffer[] | undefined => {
      if (m.body === 'fileList') {
        const files = m.fileList.root === 'dumps' ? paths.map((p) => ({ path: p, bytes: bytesOf(rank, p).length, checksum: formatChecksum(crc32c(bytesOf(rank, p))) })) : [];
        return [encodeAgentMessage({ globalRank: rank, requestId: m.requestId, fileList: { globalRank: rank, files } })];
      }
      const c = m.fileChunk as { root: string; path: string; offset: number; length: number };
      const data = bytesOf(rank, c.path).subarray(c.offset, c.offset + c.length);
      return [encodeAgentMessage({ globalRank: rank, requestId: m.requestId, fileChunk: { globalRank: rank, root: c.root, path: c.path, offset: c.offset, crc32c: crc32c(data), eof: c.offset + data.length >= bytesOf(rank, c.path).length } }), Buffer.from(data)];
    };
    peers.push(rawAgent(port, 0, serve(0), { hello: true }), rawAgent(port, 1, serve(1), { hello: true }));
    await waitFor(async () => (await requestStatus({ host: '127.0.0.1', port })).liveRanks.length === 2, 'both peers to be live');
    const out = tmpDir('wavebus-agg-conflict-');
    const m = await aggregate({ coordinator: { host: '127.0.0.1', port }, out, what: 'dumps', requestTimeoutMs: 5000 });
    expect(m.conflicts.map((c) => c.path).sort()).toEqual([...paths].sort());
    const writer = { 'w/dp0_tp1_pp0_cp0/x.bin': 1, 'w/rank1/old.bin': 1, 'w/dp0_tp0_pp0_cp0/z.bin': 0 } as Record<string, number>;
    for (const p of paths) {
      expect(m.files.find((f) => f.path === p)).toMatchObject({ status: 'fetched', verified: true, listedBy: expect.arrayContaining([writer[p]]) });
      expect(m.files.find((f) => f.path === p)!.listedBy[0]).toBe(writer[p]);
      expect(fs.readFileSync(path.join(out, 'dumps', p)).equals(bytesOf(writer[p], p))).toBe(true);
    }
  });

  test('heartbeats claiming rank 0 from a second connection do not take over its relay route; they are dropped and counted', async () => {
    const { port, coord } = await startCoordinator();
    const files = [{ path: 'real/rank0/a.bin', bytes: 1, checksum: 'crc32c:00000000' }];
    const real = rawAgent(port, 0, (m) => [encodeAgentMessage({ globalRank: 0, requestId: m.requestId, fileList: { globalRank: 0, files } })], { hello: true });
    peers.push(real);
    await waitFor(() => coord.liveRanks().includes(0), 'rank 0 to join');
    // The spoofer: same rank, its own connection, no Hello; it would answer with its own listing.
    const spoof = rawAgent(port, 0, (m) => [encodeAgentMessage({ globalRank: 0, requestId: m.requestId, fileList: { globalRank: 0, files: [{ path: 'spoof/x', bytes: 1, checksum: 'crc32c:00000000' }] } })], { hello: false });
    peers.push(spoof);
    await waitFor(() => spoof.beats() >= 5, 'the spoofer to send heartbeats');
    // A status round trip: the coordinator has handled what came before it.
    await requestStatus({ host: '127.0.0.1', port });
    const client = new RelayClient({ host: '127.0.0.1', port });
    try {
      for (let i = 0; i < 5; i++) {
        const r = await client.relay(0, 'fileList', { root: 'dumps', prefix: '' }, 3000);
        expect(r.files.map((f: { path: string }) => f.path)).toEqual(['real/rank0/a.bin']);
      }
    } finally {
      await client.close();
    }
    expect(spoof.asked).toEqual([]);
    expect(real.asked).toHaveLength(5);
    expect(coord.stats.dropped.wrong_connection).toBeGreaterThanOrEqual(4);
  });
});
