// A cluster on one machine: network namespaces act as hosts on one bridge (test/helpers.ts
// createNetnsCluster), each with its own disk folder (runtime dir, dump root, snapshot cache),
// running `wavebus launch` once per host as a user would, with CURVE keys made by `wavebus keys`
// (a key pair per host, the coordinator's key pair, an allow-list of the hosts' public keys).
//   1. PP=2 × TP=2 over two hosts: the coordinator (host 0) holds the reports and dump records,
//      host 1 the last stage's KV files; `wavebus aggregate` run from a third namespace collects
//      one tree that holds them all and passes `inspect --verify`; a rogue namespace whose key
//      is not on the allow-list gets nothing, and the coordinator counts its refusals.
//   2. DP=2 × PP=2 × TP=2 over four hosts, a different fault in each replica: every dump holds
//      exactly its replica's last-stage TP ranks; `dump.pp_stages: "all"` gives both stages;
//      aggregate collects a complete, verified tree. (Needs per-replica DP in the guard.)
// Needs root (CI runs as root); a failure to create the namespaces fails the test.
import * as fs from 'fs';
import * as path from 'path';
import { inspectTree, type BundleReport } from '../src/tools/inspect';
import {
  CLI,
  ROOT,
  cleanup,
  cleanupNetns,
  createNetnsCluster,
  readManifests,
  describeAsRoot,
  exitedWithin,
  runWavebus,
  spawnInNetns,
  spawnOnHost,
  startStatusProber,
  tmpDir,
  waitFor,
  type NetnsCluster,
  type Spawned,
} from './helpers';

jest.setTimeout(150000);

const PORT = 29600; // fresh namespaces have every port free
const STEPS = 40;
/** The DP run hot-reloads pp_stages "all" after its automatic dumps: steps enough for the manual dump that follows. */
const DP_STEPS = 70;
const STEP_MS = 100;
const DIST = (m: string) => JSON.stringify(path.join(ROOT, 'dist', 'src', 'bus', m));

/** Global rank of (dp, pp, cp, tp), TP fastest (src/launch/identity.ts). */
const globalRank = (l: { tp: number; pp: number; cp: number }, d: number, p: number, c: number, t: number) => ((d * l.pp + p) * l.cp + c) * l.tp + t;
/** Replica d's ranks of the given stages (every CP and TP rank of each). */
const replicaRanks = (l: { tp: number; pp: number; cp: number }, d: number, stages: number[]) =>
  stages.flatMap((p) => Array.from({ length: l.cp * l.tp }, (_, k) => globalRank(l, d, p, Math.floor(k / l.tp), k % l.tp))).sort((a, b) => a - b);

interface Keys {
  /** --curve-dir of each host (coordinator.pub, agent.key; host 0 also coordinator.key and the allow-list). */
  hostDirs: string[];
  /** A key pair nobody allowed, with the real coordinator.pub. */
  rogueDir: string;
}

/** Keys as docs/security.md tells a user to make and distribute them, with `wavebus keys`. */
function makeKeys(dir: string, hosts: number): Keys {
  const keys = (out: string, name: string) => {
    const r = runWavebus(['keys', '--out', out, '--name', name]);
    if (r.code !== 0) throw new Error(`wavebus keys --out ${out} --name ${name}: ${r.stderr}`);
  };
  const trusted = path.join(dir, 'keys', 'trusted');
  keys(trusted, 'coordinator');
  const pubs = path.join(dir, 'keys', 'pubs');
  fs.mkdirSync(pubs, { recursive: true });
  const hostDirs = Array.from({ length: hosts }, (_, i) => {
    const d = path.join(dir, 'keys', `host${i}`);
    keys(d, 'agent'); // made on the host; only agent.pub leaves it
    fs.copyFileSync(path.join(d, 'agent.pub'), path.join(pubs, `host${i}.pub`));
    fs.copyFileSync(path.join(trusted, 'coordinator.pub'), path.join(d, 'coordinator.pub'));
    return d;
  });
  // Node 0 runs the coordinator: its key pair and the allow-list built from the hosts' public keys.
  fs.copyFileSync(path.join(trusted, 'coordinator.key'), path.join(hostDirs[0], 'coordinator.key'));
  fs.chmodSync(path.join(hostDirs[0], 'coordinator.key'), 0o600);
  const allow = runWavebus(['keys', '--allow-list', pubs]);
  if (allow.code !== 0) throw new Error(`wavebus keys --allow-list: ${allow.stderr}`);
  fs.writeFileSync(path.join(hostDirs[0], 'allowed'), allow.stdout);
  const rogueDir = path.join(dir, 'keys', 'rogue');
  keys(rogueDir, 'agent');
  fs.copyFileSync(path.join(trusted, 'coordinator.pub'), path.join(rogueDir, 'coordinator.pub'));
  return { hostDirs, rogueDir };
}



interface Job {
  dir: string;
  hosts: Spawned[];
  /** Per host: its own disk, seen by its processes at <dir>/disk (runtime dir with report/ and kv_cache/, snapshot cache, sim results). */
  hostDirs: string[];
  cfgPath: string;
  config: Record<string, any>;
  probe: ReturnType<typeof startStatusProber>;
  diag: () => string;
  until: <T>(fn: () => T, what: string, ms: number) => Promise<NonNullable<T>>;
}

/**
 * `wavebus launch` once per host (node i in namespace i), as a user runs it: CURVE from the
 * host's key dir, the runtime config as the startup overlay (and hot-reloaded from host 0's file),
 * snapshots on, agents lingering after the engine exits so the job can be aggregated.
 */
function launchJob(net: NetnsCluster, keys: Keys, dir: string, layout: { tp: number; pp: number; dp: number }, faultsOfHost: (i: number) => Record<string, unknown>, steps = STEPS): Job {
  const world = layout.tp * layout.pp * layout.dp;
  const nnodes = world / 2;
  const on = { enabled: true, on_trigger: ['report', 'dump_kv'] };
  const config = { detector: { token_repeat: on, logits_finite: on }, dump: { auto_max_times: 8, auto_cooldown_seconds: 0, free_headroom_bytes: 0, format: 'pt', manual_dump: 0 } };
  // Every host uses the same paths under `disk`, each on its own disk (host<i>/ here).
  const disk = path.join(dir, 'disk');
  fs.mkdirSync(disk, { recursive: true });
  const hostDirs = Array.from({ length: nnodes }, (_, i) => path.join(dir, `host${i}`));
  const cfgPath = path.join(disk, 'runtime', 'config', 'runtime_config.json');
  // One clock for every host's ranks (a real pipeline's stages are tied by their data): the margin
  // covers four launches with CURVE on a loaded 2-core machine, so no host starts behind the others
  // (a stage that runs ahead of its replica's head would end a copy wave before its vector came).
  const startAt = Date.now() + 20000;
  const hosts = hostDirs.map((hd, i) => {
    fs.mkdirSync(path.join(hd, 'runtime', 'config'), { recursive: true });
    return spawnOnHost(
      net.nodes[i].ns,
      { dir: hd, at: disk },
      process.execPath,
      [
        CLI, 'launch', '--nnodes', String(nnodes), '--node-rank', String(i), '--nproc-per-node', '2',
        '--tp', String(layout.tp), '--pp', String(layout.pp), '--dp', String(layout.dp),
        '--master-addr', net.nodes[0].addr, '--port', String(PORT), '--curve-dir', keys.hostDirs[i],
        '--runtime-config-path', cfgPath, '--runtime-config-hot-reload',
        '--additional-config', JSON.stringify({ runtime_config: config }),
        // Input snapshots: decode step 5 of request 0 (prompt length 12), on every rank.
        '--snapshot-enable', '--snapshot-capture-token', '17', '--snapshot-max-captures', '1', '--snapshot-format', 'npy',
        '--ready-timeout-ms', '60000', '--grace-ms', '2000', '--linger-ms', '120000',
        '--coordinator-arg=--heartbeat-ms', '--coordinator-arg=200', '--coordinator-arg=--dump-ack-timeout-ms', '--coordinator-arg=8000',
        '--agent-arg=--heartbeat-ms', '--agent-arg=200', '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=250',
        '--',
        process.execPath, CLI, 'sim', '--steps', String(steps), '--step-ms', String(STEP_MS), '--result-dir', path.join(disk, 'ranks'),
        '--faults', JSON.stringify(faultsOfHost(i)), '--start-at', String(startAt),
      ],
      { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(disk, 'cache') } },
    );
  });
  const probe = startStatusProber(net.nodes[0].ns, net.nodes[0].addr, PORT, keys.hostDirs[0]);
  const diag = () => `${hosts.map((h, i) => `\nhost ${i}: ${h.stderr().slice(-2000)}`).join('')}\nstatus: ${JSON.stringify(probe.latest()?.json)}`;
  const until = <T>(fn: () => T, what: string, ms: number) => waitFor(fn, what, ms, 100).catch((e) => Promise.reject(new Error(`${(e as Error).message}${diag()}`)));
  return { dir, hosts, hostDirs, cfgPath: path.join(hostDirs[0], 'runtime', 'config', 'runtime_config.json'), config, probe, diag, until };
}

/** Every engine rank finished its steps (rank<g>.json on its host), then the launchers linger. */
async function engineDone(job: Job, world: number, steps = STEPS): Promise<void> {
  const rankFile = (g: number) => path.join(job.hostDirs[Math.floor(g / 2)], 'ranks', `rank${g}.json`);
  await job.until(() => Array.from({ length: world }, (_, g) => g).every((g) => fs.existsSync(rankFile(g))), 'every engine rank to finish', 60000);
  for (let g = 0; g < world; g++) expect(JSON.parse(fs.readFileSync(rankFile(g), 'utf8')).steps).toBe(steps);
}

/** SIGTERM ends each launcher's linger; each exits with the engine's code. */
async function stopJob(job: Job): Promise<void> {
  for (const h of job.hosts) h.child.kill('SIGTERM');
  const codes = await Promise.all(job.hosts.map((h) => h.exited));
  expect({ codes: codes.map((c) => c.code), diag: codes.some((c) => c.code !== 0) ? job.diag() : '' }).toEqual({ codes: job.hosts.map(() => 0), diag: '' });
}

/** `wavebus aggregate` with CURVE keys from namespace `ns`; returns its manifest. */
async function aggregateFrom(ns: string, curveDir: string, coordinator: string, out: string): Promise<{ code: number | null; stderr: string; manifest: any }> {
  const agg = spawnInNetns(ns, process.execPath, [CLI, 'aggregate', '--coordinator', `${coordinator}:${PORT}`, '--curve-dir', curveDir, '--out', out, '--json']);
  const exit = await exitedWithin(agg, 60000);
  const mf = path.join(out, 'manifest.json');
  return { code: exit.code, stderr: agg.stderr().slice(-3000), manifest: fs.existsSync(mf) ? JSON.parse(fs.readFileSync(mf, 'utf8')) : undefined };
}

/** Every file under `dir`, relative, sorted (the aggregated tree as a user sees it). */
function filesUnder(dir: string): string[] {
  if (!fs.existsSync(dir)) return [];
  return (fs.readdirSync(dir, { recursive: true }) as string[]).filter((f) => fs.statSync(path.join(dir, f)).isFile()).sort();
}

interface DumpManifest {
  arm_wave: number;
  incident_type: string;
  req_id: string;
  expected_ranks: number[];
  completed_ranks: number[];
  complete: boolean;
  dir: string;
}

/** Snapshot call bundles on the hosts' own disks, by rank (what aggregate must bring). */
function snapshotRanksOnHosts(job: Job): number[] {
  const ranks = new Set<number>();
  for (const hd of job.hostDirs) {
    for (const b of inspectTree(path.join(hd, 'cache'), {}).bundles) if (b.kind === 'snapshot') for (const r of b.ranks) ranks.add(r);
  }
  return [...ranks].sort((a, b) => a - b);
}

/** The aggregated tree holds the reports, every wave dir's request_info.json and manifest, every rank's KV files and the snapshots; --verify passes. */
function checkAggregatedTree(out: string, job: Job, kvRanks: number[], busRanks: number[]): BundleReport[] {
  const tree = inspectTree(out, { verify: true });
  expect(tree.problems).toEqual([]);
  expect(tree.incomplete).toEqual([]);
  for (const b of tree.bundles) expect({ dir: b.dir, problems: b.problems }).toEqual({ dir: b.dir, problems: [] });
  const cli = runWavebus(['inspect', out, '--verify']);
  expect({ code: cli.code, stderr: cli.stderr }).toEqual({ code: 0, stderr: '' });

  const files = filesUnder(out);
  // Reports: the coordinator's, byte for byte, and nothing else under reports/.
  const reportDir = path.join(job.hostDirs[0], 'runtime', 'report');
  const reports = filesUnder(reportDir).filter((f) => /^[^/]+\/report_[^/]*\.json$/.test(f));
  expect(reports.length).toBeGreaterThan(0);
  expect(files.filter((f) => f.startsWith('reports/'))).toEqual(reports.map((f) => `reports/${f}`));
  for (const f of reports) expect(fs.readFileSync(path.join(out, 'reports', f))).toEqual(fs.readFileSync(path.join(reportDir, f)));
  // Dump records: every wave dir the coordinator wrote, with its request_info.json and manifest.json.
  const kvRoot = path.join(reportDir, 'kv_cache');
  const records = filesUnder(kvRoot).filter((f) => /(^|\/)(request_info|manifest|dump_skipped)\.json$/.test(f) && !/(^|\/)rank\d+\//.test(f));
  expect(records.some((f) => f.endsWith('/request_info.json'))).toBe(true);
  for (const f of records) expect(fs.readFileSync(path.join(out, 'dumps', f))).toEqual(fs.readFileSync(path.join(kvRoot, f)));
  const waves = tree.bundles.filter((b) => b.kind === 'dump_wave');
  expect(waves.length).toBe(records.filter((f) => f.endsWith('/request_info.json')).length);
  // Each wave dir's KV files from exactly the ranks its manifest expects, all of them present.
  const kvDumps = tree.bundles.filter((b) => b.kind === 'kv_dump');
  for (const w of waves) {
    const m = JSON.parse(fs.readFileSync(path.join(out, w.dir, 'manifest.json'), 'utf8'));
    expect({ dir: w.dir, complete: m.complete, ranks: w.ranks }).toEqual({ dir: w.dir, complete: true, ranks: m.expected_ranks });
    expect(kvDumps.filter((b) => path.posix.dirname(b.dir) === w.dir).flatMap((b) => b.ranks).sort((a, b) => a - b)).toEqual(m.expected_ranks);
  }
  expect([...new Set(kvDumps.flatMap((b) => b.ranks))].sort((a, b) => a - b)).toEqual(kvRanks);
  // Snapshots: every rank on the bus (`busRanks`) that captured one on its host is in the tree.
  const snaps = [...new Set(tree.bundles.filter((b) => b.kind === 'snapshot').flatMap((b) => b.ranks))].sort((a, b) => a - b);
  expect(snaps).toEqual(snapshotRanksOnHosts(job).filter((r) => busRanks.includes(r)));
  expect(snaps.length).toBeGreaterThan(0);
  // The aggregate's own manifest: complete, the coordinator's files listed.
  const am = JSON.parse(fs.readFileSync(path.join(out, 'manifest.json'), 'utf8'));
  expect({ complete: am.complete, coordinator: am.coordinator_files.answered, errors: am.coordinator_files.errors }).toEqual({ complete: true, coordinator: true, errors: [] });
  return tree.bundles;
}

afterEach(async () => {
  await cleanup();
  cleanupNetns();
});

describeAsRoot('a cluster of network namespaces', () => {
  test('PP=2 × TP=2 over two hosts with CURVE: aggregate from a third host collects reports, dump records, KV files and snapshots into one verified tree; a rogue host gets nothing', async () => {
    // Namespaces 0 and 1 run the job, 2 is a workstation with an allowed key, 3 is the rogue.
    const net = createNetnsCluster(4);
    const dir = tmpDir('wavebus-cluster-');
    const keys = makeKeys(dir, 3);
    const faults = { repetition: { request: 1, from: 8, period: 3 }, nonFinite: { request: 2, at: 12 } };
    const job = launchJob(net, keys, dir, { tp: 2, pp: 2, dp: 1 }, () => faults);
    await job.until(() => job.probe.latest()?.ready, 'the two-host job to be ready', 60000);
    expect(job.probe.latest()!.json.security).toMatchObject({ curve: true, allowed_keys: 3 });

    // `wavebus capture` from the workstation (namespace 2, an allowed key), armed before the engine
    // starts: it takes effect at the engine's first head, on every rank of both stages.
    const workstation = (args: string[]) => spawnInNetns(net.nodes[2].ns, process.execPath, [CLI, ...args, '--coordinator', `${net.nodes[0].addr}:${PORT}`, '--curve-dir', keys.hostDirs[2]]);
    const capture = workstation(['capture', '--next', '--wait', '--timeout', '90000']);

    // The rogue: an agent claiming rank 3, a status poll, subscribers with its key and with none.
    const refusedBefore = Number(job.probe.latest()!.json.security.refused?.unknown_key ?? 0);
    const rogue = net.nodes[3];
    // Control requests from the rogue's key are refused at the handshake: nothing is armed.
    const rogueCapture = spawnInNetns(rogue.ns, process.execPath, [CLI, 'capture', '--next', '--coordinator', `${net.nodes[0].addr}:${PORT}`, '--curve-dir', keys.rogueDir, '--timeout', '10000']);
    expect((await exitedWithin(rogueCapture, 30000)).code).toBe(3);
    expect(rogueCapture.stderr()).toMatch(/refused this tool's CURVE key.*\[ERR_HANDSHAKE\]/);
    const rogueAgent = spawnInNetns(rogue.ns, process.execPath, [
      CLI, 'agent', '--coordinator', `${net.nodes[0].addr}:${PORT}`, '--rank', '3', '--local-rank', '1', '--world-size', '4', '--local-world-size', '2',
      '--node-rank', '1', '--tp', '2', '--pp', '2', '--run-dir', path.join(tmpDir('wavebus-cluster-rogue-'), 'run'),
      '--dump-root', path.join(dir, 'rogue-dumps'), '--curve-server-key', path.join(keys.rogueDir, 'coordinator.pub'), '--curve-key', path.join(keys.rogueDir, 'agent.key'),
    ], { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'rogue-cache') } });
    const rogueProbe = spawnInNetns(rogue.ns, process.execPath, ['-e', `
      const { Subscriber } = require('zeromq');
      const { requestStatus } = require(${DIST('coordinator.js')});
      const { loadCurveDirClient } = require(${DIST('curve.js')});
      const curve = loadCurveDirClient(${JSON.stringify(keys.rogueDir)});
      const ep = 'tcp://${net.nodes[0].addr}:${PORT}';
      const count = async (opts) => {
        const s = new Subscriber({ linger: 0, ...opts });
        s.connect(ep);
        s.subscribe();
        let n = 0;
        const t = setTimeout(() => s.close(), 4000);
        try { for await (const _ of s) n++; } catch {}
        clearTimeout(t);
        return n;
      };
      (async () => {
        const status = await requestStatus({ host: '${net.nodes[0].addr}', port: ${PORT} }, 3000, curve).then(() => 'answered', (e) => e.code || String(e));
        const [withKey, plain] = await Promise.all([
          count({ curveServerKey: curve.serverPublicKey, curvePublicKey: curve.publicKey, curveSecretKey: curve.secretKey }),
          count({}),
        ]);
        process.stdout.write(JSON.stringify({ status, withKey, plain }) + '\\n');
      })();`]);
    const rogueOut = path.join(dir, 'rogue-aggregate');
    const rogueAgg = await aggregateFrom(rogue.ns, keys.rogueDir, net.nodes[0].addr, rogueOut);
    expect(rogueAgg.code).toBe(3); // ERR_HANDSHAKE
    expect(rogueAgg.stderr).toMatch(/refused this tool's CURVE key/);
    expect(filesUnder(rogueOut)).toEqual([]);
    expect((await exitedWithin(rogueProbe, 30000)).code).toBe(0);
    expect(JSON.parse(rogueProbe.stdout())).toEqual({ status: 'ERR_TIMEOUT', withKey: 0, plain: 0 });
    const refused = await job.until(() => {
      const r = job.probe.latest()?.json.security.refused?.unknown_key ?? 0;
      return r > refusedBefore + 2 ? r : undefined;
    }, "the coordinator to count the rogue's refusals", 10000);
    expect(refused).toBeGreaterThan(refusedBefore);
    // Rank 3 is still host 1's agent: the rogue's claim never reached the coordinator (every
    // stage's agent is on the bus; the rogue claimed rank 3 from another host).
    expect(job.probe.latest()!.liveRanks).toEqual([0, 1, 2, 3]);
    expect(filesUnder(path.join(dir, 'rogue-dumps'))).toEqual([]);
    rogueAgent.child.kill('SIGKILL');
    // The workstation's capture, and only it, was armed; every rank wrote the same forward's inputs.
    const captured = await exitedWithin(capture, 120000);
    expect({ code: captured.code, stderr: capture.stderr() }).toEqual({ code: 0, stderr: '' });
    const bundles = [...capture.stdout().matchAll(/^rank (\d+) wave (\d+): (.+)$/gm)];
    expect(bundles.map((m) => Number(m[1])).sort()).toEqual([0, 1, 2, 3]);
    expect(new Set(bundles.map((m) => m[2])).size).toBe(1);
    const st = workstation(['status', '--json']);
    expect((await exitedWithin(st, 30000)).code).toBe(0);
    expect(JSON.parse(st.stdout()).captures.map((c: { id: string; state: string }) => [c.id, c.state])).toEqual([['capture-1', 'done']]);

    // The faults are reported (coordinator, host 0) and dumped by the last stage (host 1).
    await engineDone(job, 4);
    const kvRoot0 = path.join(job.hostDirs[0], 'runtime', 'report', 'kv_cache');
    const ms = await job.until(() => {
      const m = readManifests<DumpManifest>(kvRoot0);
      return m.length > 0 && m.every((x) => x.complete) && new Set(m.map((x) => x.incident_type)).size === 2 ? m : undefined;
    }, 'complete dumps of both incidents', 30000);
    for (const m of ms) expect({ type: m.incident_type, expected: m.expected_ranks, completed: m.completed_ranks }).toEqual({ type: m.incident_type, expected: [2, 3], completed: [2, 3] });
    // Host 0's disk has the records, host 1's the KV files: neither is a whole incident alone.
    expect(inspectTree(kvRoot0, {}).bundles.filter((b) => b.kind === 'kv_dump')).toEqual([]);
    expect(inspectTree(path.join(job.hostDirs[1], 'runtime', 'report', 'kv_cache'), {}).bundles.filter((b) => b.kind === 'kv_dump').length).toBe(2 * ms.length);

    // Aggregate from the workstation (namespace 2, its own allowed key), over the bridge.
    const out = path.join(dir, 'incident');
    const agg = await aggregateFrom(net.nodes[2].ns, keys.hostDirs[2], net.nodes[0].addr, out);
    expect({ code: agg.code, stderr: agg.code === 0 ? '' : agg.stderr }).toEqual({ code: 0, stderr: '' });
    // KV files from the last stage (pp_stages "last"); every stage's agent is on the bus, so every
    // rank's snapshots are collected.
    checkAggregatedTree(out, job, [2, 3], [0, 1, 2, 3]);
    expect(agg.manifest.files.filter((f: any) => f.rank === -1).every((f: any) => f.root === 'reports' || /(request_info|manifest|dump_skipped)\.json$/.test(f.path))).toBe(true);

    // Run again: everything is already there and whole.
    const again = await aggregateFrom(net.nodes[2].ns, keys.hostDirs[2], net.nodes[0].addr, out);
    expect({ code: again.code, fetched: again.manifest.totals.fetched_files, present: again.manifest.totals.present_files }).toEqual({ code: 0, fetched: 0, present: agg.manifest.totals.files });

    await stopJob(job);
  });

  // Waits for per-replica DP in the guard (issue 16, "Data-parallel replicas"): before it, every
  // replica's last-stage ranks copy every dump job, so a dump holds ranks of both replicas.
  test('DP=2 × PP=2 × TP=2 over four hosts: each dump holds exactly its replica\'s ranks, pp_stages "all" gives both stages, aggregate collects a verified tree', async () => {
    const net = createNetnsCluster(4);
    const dir = tmpDir('wavebus-cluster-');
    const keys = makeKeys(dir, 4);
    const layout = { tp: 2, pp: 2, dp: 2, cp: 1 };
    // Hosts 0, 1 are replica 0 (stages 0, 1); hosts 2, 3 replica 1: a different fault in each.
    const FAULT_OF_REPLICA = [
      { type: 'token_repeat', faults: { repetition: { request: 1, from: 8, period: 3 } } },
      { type: 'logits_finite', faults: { nonFinite: { request: 2, at: 12 } } },
    ];
    const job = launchJob(net, keys, dir, layout, (i) => FAULT_OF_REPLICA[i < 2 ? 0 : 1].faults, DP_STEPS);
    await job.until(() => job.probe.latest()?.ready, 'the four-host job to be ready', 60000);
    const kvRoot0 = path.join(job.hostDirs[0], 'runtime', 'report', 'kv_cache');

    // Automatic dumps: each incident's dumps hold exactly the owning replica's last-stage TP ranks.
    const auto = await job.until(() => {
      const m = readManifests<DumpManifest>(kvRoot0);
      return FAULT_OF_REPLICA.every((f) => m.some((x) => x.incident_type === f.type && x.complete)) ? m : undefined;
    }, 'complete dumps of both replicas\' incidents', 40000);
    for (const [d, f] of FAULT_OF_REPLICA.entries()) {
      const mine = replicaRanks(layout, d, [layout.pp - 1]);
      expect(mine).toEqual(d === 0 ? [2, 3] : [6, 7]);
      for (const m of auto.filter((x) => x.incident_type === f.type)) {
        expect({ type: m.incident_type, expected: m.expected_ranks, completed: m.completed_ranks }).toEqual({ type: f.type, expected: mine, completed: mine });
        // And on disk: exactly those ranks' bundles, on the last stage's host of that replica.
        const rankDirs = (hd: string) => inspectTree(path.join(hd, 'runtime', 'report', 'kv_cache', path.relative(kvRoot0, m.dir)), {}).bundles.filter((b) => b.kind === 'kv_dump').flatMap((b) => b.ranks);
        expect(job.hostDirs.map(rankDirs)).toEqual(job.hostDirs.map((_, h) => (h === 2 * d + 1 ? mine : [])));
      }
    }

    // pp_stages "all" with a manual dump (hot reload): each replica dumps from both stages.
    const reloadWave = job.probe.latest()!.wave;
    fs.writeFileSync(`${job.cfgPath}.edit`, JSON.stringify({ ...job.config, dump: { ...job.config.dump, pp_stages: 'all', manual_dump: 1 } }));
    fs.renameSync(`${job.cfgPath}.edit`, job.cfgPath);
    const manual = await job.until(() => {
      const m = readManifests<DumpManifest>(kvRoot0).filter((x) => x.incident_type === 'manual_trigger' && x.arm_wave > reloadWave);
      return m.length > 0 && m.every((x) => x.complete) && new Set(m.flatMap((x) => x.expected_ranks)).size === 8 ? m : undefined;
    }, 'complete manual dumps of both stages in both replicas', 30000);
    for (const m of manual) {
      const d = m.expected_ranks[0] < 4 ? 0 : 1;
      expect({ expected: m.expected_ranks, completed: m.completed_ranks }).toEqual({ expected: replicaRanks(layout, d, [0, 1]), completed: replicaRanks(layout, d, [0, 1]) });
    }

    await engineDone(job, 8, DP_STEPS);
    const out = path.join(dir, 'incident');
    const agg = await aggregateFrom(net.nodes[3].ns, keys.hostDirs[3], net.nodes[0].addr, out);
    expect({ code: agg.code, stderr: agg.code === 0 ? '' : agg.stderr }).toEqual({ code: 0, stderr: '' });
    // Every stage's agent is on the bus (pp_stages "all" needs them): every rank's snapshots too.
    const all = [0, 1, 2, 3, 4, 5, 6, 7];
    checkAggregatedTree(out, job, all, all);
    expect(snapshotRanksOnHosts(job)).toEqual(all);
    await stopJob(job);
  });
});
