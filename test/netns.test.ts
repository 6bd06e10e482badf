// Two hosts on one machine: two network namespaces joined by a veth pair, each running
// `wavebus launch` with the simulated engine (TP=4, two ranks per host). The coordinator binds host
// A's veth address (--insecure). The link is cut mid-run and healed: engines keep stepping within
// their bound, host B's ranks are marked not live, and they rejoin by themselves.
// Needs root (CI runs as root); a failure to create the namespaces fails the test.
import * as fs from 'fs';
import * as path from 'path';
import { inspectTree } from '../src/tools/inspect';
import {
  CLI,
  cleanup,
  cleanupNetns,
  createNetnsPair,
  describeAsRoot,
  exitedWithin,
  sh,
  spawnInNetns,
  startStatusProber,
  tmpDir,
  waitFor,
  type NetnsPair,
  type Spawned,
  readManifests,
} from './helpers';
import { wholeDumpAfter } from './dump-waits';

jest.setTimeout(180000);

const PORT = 29600; // a fresh namespace has every port free
const STEP_MS = 200;
/** At most: the engines step until the test has what it needs (--stop-file), however long its waits take on a loaded host. */
const STEPS = 100000;
const BOUND_MS = 200;



interface Manifest {
  arm_wave: number;
  completed_ranks: number[];
  missing_ranks: number[];
  failed_ranks: Record<string, string>;
  complete: boolean;
  timed_out: boolean;
}

const manifests = (root: string): Manifest[] => readManifests<Manifest>(root);

afterEach(async () => {
  await cleanup();
  cleanupNetns();
});

describeAsRoot('two hosts in network namespaces', () => {
  test('a TP=4 job over two hosts dumps from every rank; a partition is survived and healed', async () => {
    const net: NetnsPair = createNetnsPair();
    const dir = tmpDir('wavebus-netns-');
    const cfgPath = path.join(dir, 'runtime', 'config', 'runtime_config.json');
    const kvRoot = path.join(dir, 'runtime', 'report', 'kv_cache');
    const resultDir = path.join(dir, 'ranks');
    const stopFile = path.join(dir, 'stop-engines');
    const on = { enabled: true, on_trigger: ['report', 'dump_kv'] };
    const config = { detector: { logits_finite: on }, dump: { auto_max_times: 100, auto_cooldown_seconds: 0, free_headroom_bytes: 0, format: 'pt', manual_dump: 0 } };
    fs.mkdirSync(path.dirname(cfgPath), { recursive: true });
    fs.writeFileSync(cfgPath, JSON.stringify(config));
    const startAt = Date.now() + 8000;
    const launch = (ns: string, node: number): Spawned =>
      spawnInNetns(ns, process.execPath, [
        CLI, 'launch', '--nnodes', '2', '--node-rank', String(node), '--nproc-per-node', '2', '--tp', '4',
        '--master-addr', net.addrA, '--port', String(PORT), '--insecure', '--ready-timeout-ms', '60000', '--grace-ms', '2000',
        `--coordinator-arg=--runtime-config-path`, `--coordinator-arg=${cfgPath}`, '--coordinator-arg=--runtime-config-hot-reload',
        `--coordinator-arg=--additional-config=${JSON.stringify({ runtime_config: config })}`, // startup: defaults ← overlay
        '--coordinator-arg=--heartbeat-ms', '--coordinator-arg=200', '--coordinator-arg=--dump-ack-timeout-ms', '--coordinator-arg=4000',
        '--agent-arg=--heartbeat-ms', '--agent-arg=200', '--agent-arg=--end-of-wave-timeout-ms', `--agent-arg=${BOUND_MS}`,
        '--',
        process.execPath, CLI, 'sim', '--steps', String(STEPS), '--step-ms', String(STEP_MS), '--result-dir', resultDir, '--stop-file', stopFile,
        // A steady stream of requests, two a step (2000 outlast the test's bound of 180 s of 200 ms steps; a small pool keeps the
        // batch small): whenever the dump after the heal is asked for, some are running.
        '--requests', '2000', '--num-blocks', '64',
        '--faults', JSON.stringify({ nonFinite: { request: 0, at: 6 } }), '--start-at', String(startAt),
      ]);
    const hostA = launch(net.a, 0);
    const hostB = launch(net.b, 1);
    const probe = startStatusProber(net.a, net.addrA, PORT);
    const diag = () => `\nhost A: ${hostA.stderr().slice(-2500)}\nhost B: ${hostB.stderr().slice(-2500)}\nstatus: ${JSON.stringify(probe.latest()?.json)}`;
    const until = <T>(fn: () => T, what: string, ms: number) => waitFor(fn, what, ms, 100).catch((e) => Promise.reject(new Error(`${(e as Error).message}${diag()}`)));

    await until(() => probe.latest()?.ready, 'the two-host job to be ready', 60000);
    // Host B reaches the coordinator only over the veth link (its namespace has no other route).
    expect(sh('ip', ['netns', 'exec', net.b, 'ip', '-4', 'route']).trim().split('\n').length).toBe(1);

    // 1) The fault at step 6 is dumped by all four ranks, across both hosts.
    const first = await until(() => manifests(kvRoot).find((m) => m.complete), 'the first dump from all four ranks', 30000);
    expect(first.completed_ranks).toEqual([0, 1, 2, 3]);

    // 2) Partition: host A's end of the link goes down.
    await until(() => (probe.latest()?.wave ?? 0) >= 12, 'wave 12', 30000);
    sh('ip', ['-n', net.a, 'link', 'set', net.vethA, 'down']);
    let healed = false;
    try {
      const cut = await until(() => {
        const s = probe.latest();
        return s && !s.liveRanks.includes(2) && !s.liveRanks.includes(3) ? s : undefined;
      }, "host B's ranks to be marked not live", 15000);
      expect(cut.liveRanks).toEqual([0, 1]);
      const cutWave = cut.wave;
      await until(() => (probe.latest()?.wave ?? 0) >= cutWave + 5, 'host A to keep stepping during the partition', 15000);
    } finally {
      sh('ip', ['-n', net.a, 'link', 'set', net.vethA, 'up']);
      healed = true;
    }
    expect(healed).toBe(true);

    // 3) Healed: host B's agents rejoin by themselves, and a dump after that has all four ranks.
    const back = await until(() => {
      const s = probe.latest();
      return s && s.liveRanks.length === 4 && s.ready ? s : undefined;
    }, "host B's ranks to rejoin", 45000);
    const healWave = back.wave;
    const ask = (n: number): void => {
      fs.writeFileSync(`${cfgPath}.edit`, JSON.stringify({ ...config, dump: { ...config.dump, manual_dump: n } }));
      fs.renameSync(`${cfgPath}.edit`, cfgPath);
    };
    const after = await wholeDumpAfter(() => manifests(kvRoot), healWave, 1, ask, until, 40000);
    expect(after.completed_ranks).toEqual([0, 1, 2, 3]);

    // 4) Aggregation over the link: from host B, through the coordinator on host A, while the job runs.
    const out = path.join(dir, 'aggregated');
    const agg = spawnInNetns(net.b, process.execPath, [CLI, 'aggregate', '--coordinator', `${net.addrA}:${PORT}`, '--out', out, '--what', 'dumps', '--json']);
    const aggExit = await agg.exited;
    expect({ code: aggExit.code, stderr: aggExit.code === 0 ? '' : agg.stderr().slice(-2000) }).toEqual({ code: 0, stderr: '' });
    const pulled = inspectTree(path.join(out, 'dumps'), { verify: true });
    expect(pulled.problems).toEqual([]);
    const pulledRanks = new Set(pulled.bundles.filter((b) => b.kind === 'kv_dump').map((b) => b.ranks[0]));
    expect(pulledRanks).toEqual(new Set([0, 1, 2, 3]));

    // 5) Told to stop, both launches finish; every rank stepped; host B's engines counted bounded waits.
    fs.writeFileSync(stopFile, '');
    const [ea, eb] = await Promise.all([exitedWithin(hostA, 60000, "host A's launch to exit after the stop file"), exitedWithin(hostB, 60000, "host B's launch to exit after the stop file")]);
    expect({ a: ea.code, b: eb.code }).toEqual({ a: 0, b: 0 });
    const results = [0, 1, 2, 3].map((g) => JSON.parse(fs.readFileSync(path.join(resultDir, `rank${g}.json`), 'utf8')));
    for (const r of results) {
      expect(r.steps).toBeGreaterThan(0);
      // Sanity bound only: no step waited much beyond the bound.
      expect(r.wallMs).toBeLessThan(r.steps * STEP_MS + r.endOfWaveTimeouts * (BOUND_MS + 100) + 20000);
    }
    expect(results[2].endOfWaveTimeouts + results[3].endOfWaveTimeouts).toBeGreaterThan(0);

    const tree = inspectTree(kvRoot, { verify: true });
    expect(tree.problems).toEqual([]);
    expect(tree.incomplete).toEqual([]);
    const rankBundles = tree.bundles.filter((b) => b.kind === 'kv_dump');
    expect(new Set(rankBundles.map((b) => b.ranks[0]))).toEqual(new Set([0, 1, 2, 3]));
  });
});
