// `wavebus verdict` on two hosts: two network namespaces joined by a veth pair, each running
// `wavebus launch --nnodes 2` with the PyTorch engine (examples/torch-engine), DP=2 x TP=2 on the
// CPU: replica 0 (ranks 0, 1) on host A, replica 1 (ranks 2, 3) on host B. The bus runs with CURVE
// (launch --curve-dir; no --insecure): the coordinator binds host A's veth address, host B's agents
// reach it only over the link. Each host has its own cache root and engine output, as two machines
// would; the gloo process group spans the link too.
// Two faults, each judged by verdict.auto on the host of the incident's replica (its head agent
// runs `wavebus verdict` there and tells the coordinator over the authenticated bus):
// - the bad-device test double (examples/torch-engine/device_fault.py) on host B: a host-level
//   file that host B's engine ranks read (their environment names it) and any replay "on host B"
//   reads: device-local, naming host B and its devices with their fingerprint;
// - a one-off bit flip in rank 1's output (host A), in the live process only: transient.
// What runs where (docs/verdict.md "What runs where"): the same-host replay is a child of the CLI
// in the incident host's namespace; the replay on the other host goes to the other replica's head
// agent through the coordinator (CURVE on both hops) and runs in that host's namespace, with that
// host's environment: no --host-env is given, so only a process on the other host could see the
// fault file differently.
// Needs root (CI runs as root); a failure to create the namespaces fails the test.
import * as fs from 'fs';
import * as path from 'path';
import { writeKeyPair } from '../src/bus/curve';
import { CLI, ROOT, cleanup, cleanupNetns, createNetnsPair, describeAsRoot, spawnInNetns, tmpDir, waitFor, type NetnsPair, type Spawned } from './helpers';
import { torchRanks } from './torch2';
import { flushVerdicts, makeVerdictHosts } from './verdict-hosts';

jest.setTimeout(420000);

const PORT = 29600; // a fresh namespace has every port free
const GLOO_PORT = 29650; // the engines' process group (torch.distributed's TCP store on host A)
const ENGINE = path.join(ROOT, 'examples', 'torch-engine');

// How the engine's ranks start: torch 2.x's torchrun (the stand-in where torch 2.x is absent); its python for what reads their files.
const RANKS = torchRanks();

afterAll(async () => {
  try {
    await cleanup();
  } finally {
    cleanupNetns(); // also when a temp dir could not be removed
  }
});

describeAsRoot('verdict across two hosts in network namespaces', () => {
  test('DP=2 x TP=2 over CURVE: the bad device on host B is device-local naming host B and its fingerprint (host A\'s replay by host A\'s agent); a live-only bit flip on host A is transient; both in the coordinator\'s status; host A\'s serving device refused to a verdict by hand, inconclusive; a wrong shard deterministic with bisect\'s module', async () => {
    const net: NetnsPair = createNetnsPair(7);
    const dir = tmpDir('wavebus-verdict-netns-');
    const keyDir = path.join(dir, 'keys');
    fs.mkdirSync(keyDir, { mode: 0o700 });
    writeKeyPair(keyDir, 'coordinator');
    writeKeyPair(keyDir, 'agent');
    const [ha, hb] = makeVerdictHosts(dir, ['hostA', 'hostB']);
    const hosts = [
      { ...ha, ns: net.a, veth: net.vethA, node: 0 },
      { ...hb, ns: net.b, veth: net.vethB, node: 1 },
    ];
    // A wrong value in tp_rank 1's checkpoint shard, on both hosts (each engine and each replay loads it).
    const patch = path.join(dir, 'shard-patch.json');
    fs.writeFileSync(patch, JSON.stringify([{ tp_size: 2, tp_rank: 1, weight: 'layers.1.up', index: 5, add: 2.0 }]));
    const patchArgs = ['--replayer-arg=--shard-patch', `--replayer-arg=${patch}`];
    // The bad device: host B's device 1 (rank 3's, LOCAL_RANK 1) adds 0.25 to one column of layer 1's up-projection.
    fs.writeFileSync(hosts[1].fault, JSON.stringify({ device: 1, layer: 1, add: 0.25 }));
    // Where each rank runs (device = its local rank): the verdict's layout. No --host-env: each replay runs on its host.
    const layout = ['--dp=2', '--rank-host=0=hostA:0', '--rank-host=1=hostA:1', '--rank-host=2=hostB:0', '--rank-host=3=hostB:1'];
    const config = {
      runtime_config: {
        report: { save_sensitive_info: true }, // replay needs the token ids (docs/recorder.md)
        verdict: { auto: true, allow_live_device: true }, // the CPU: a replay only shares the cores
      },
    };
    const launch = (h: (typeof hosts)[number]): Spawned => {
      const out = path.join(h.dir, 'out');
      const verdictArgs = [`--engine-out=${out}`, `--python=${RANKS.python}`, ...patchArgs, ...layout].map((a) => `--agent-arg=--verdict-arg=${a}`);
      return spawnInNetns(h.ns, process.execPath, [
        CLI, 'launch', '--nnodes', '2', '--node-rank', String(h.node), '--nproc-per-node', '2', '--tp', '2', '--dp', '2',
        '--master-addr', net.addrA, '--port', String(PORT), '--curve-dir', keyDir, '--ready-timeout-ms', '120000', '--linger-ms', '300000',
        '--additional-config', JSON.stringify(config), '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000', ...verdictArgs,
        '--', ...RANKS.command(path.join(ENGINE, 'engine.py'), { nproc: 2, nnodes: 2, nodeRank: h.node, masterAddr: net.addrA, masterPort: GLOO_PORT }), '--out', out, '--dp', '2', '--save-every-forward',
        '--requests', '2', '--max-tokens', '230', '--step-sleep-ms', '400', '--flip-output', '6:1', '--shard-patch', patch,
      ], {
        cwd: dir, // one dump root path on both hosts (each agent checks the coordinator's dump_dir against its own)
        // The host's environment: its fault file (every process on the host), its cache root, its end of the link for gloo.
        env: { ...process.env, TORCH_ENGINE_DEVICE_FAULT_FILE: h.fault, WAVEBUS_CACHE_ROOT: path.join(h.dir, 'cache'),
          // Host B keeps 8 forwards: its second incident (below) holds only forwards computed after its fault file went.
          WAVEBUS_RECORD_FORWARDS: h.node === 0 ? '32' : '8',
          MASTER_ADDR: net.addrA, MASTER_PORT: String(GLOO_PORT), GLOO_SOCKET_IFNAME: h.veth },
      });
    };
    const jobs = hosts.map(launch);
    const diag = () => jobs.map((j, i) => `\n${hosts[i].name}: ${j.stderr().slice(-3000)}`).join('');
    const cli = async (ns: string, args: string[]) => {
      const p = spawnInNetns(ns, process.execPath, [CLI, ...args]);
      const { code } = await p.exited;
      return { code, stdout: p.stdout(), stderr: p.stderr() };
    };
    const coordinator = ['--coordinator', `${net.addrA}:${PORT}`, '--curve-dir', keyDir];
    try {
      // Both replicas past step 8 (rank 1 flipped step 6): dump each replica's req-0; each dump's recorder flush is an incident.
      await waitFor(() => [1, 3].every((g) => fs.existsSync(path.join(hosts[Math.floor(g / 2)].dir, 'out', `forward_rank${g}_step8.pt`))), 'forward 8 on ranks 1 and 3', 180000, 50).catch((e) => Promise.reject(new Error(`${(e as Error).message}${diag()}`)));
      // From host B: the requests cross the link, authenticated with CURVE.
      const dumps = await Promise.all([0, 1].map((replica) => cli(net.b, ['dump', ...coordinator, '--request', 'req-0', '--replica', String(replica), '--wait'])));
      expect(dumps.map((d, replica) => ({ replica, code: d.code, stderr: d.stderr, stdout: d.code ? d.stdout : '' }))).toEqual([0, 1].map((replica) => ({ replica, code: 0, stderr: '', stdout: '' })));
      // Each replica's head agent judges its incident on its own host, and tells the coordinator on host A.
      const [aFile, bFile] = await Promise.all(hosts.map((h) => waitFor(() => flushVerdicts(path.join(h.dir, 'cache'))[0], `${h.name}'s verdict.json`, 300000, 200))).catch((e) => Promise.reject(new Error(`${(e as Error).message}${diag()}`)));
      const a = JSON.parse(fs.readFileSync(aFile, 'utf8'));
      const b = JSON.parse(fs.readFileSync(bFile, 'utf8'));

      // Host B: the recorded outputs reproduce on host B only (the fault file is there), not on host A's devices.
      expect(b.incident).toMatchObject({ id: expect.stringMatching(/^incident-wave\d+-dp1$/), replica: 1, ranks: [2, 3] });
      expect([b.verdict, b.host, b.devices]).toEqual(['device-local', 'hostB', [0, 1]]);
      expect(b.replays.map((r: any) => [r.role, r.host, r.devices, r.ok])).toEqual([['same', 'hostB', [0, 1], true], ['other', 'hostA', [0, 1], true]]);
      // Host A's replay ran in host A's namespace, by replica 0's head agent (rank 0), asked over the bus.
      expect(b.replays.map((r: any) => r.agent_rank)).toEqual([undefined, 0]);
      expect(b.replays[1].fingerprint).toHaveLength(2);
      expect(b.replays[0].tensors.every((t: any) => t.bit_exact)).toBe(true);
      expect(b.replays[1].tensors.every((t: any) => !t.within_tolerance)).toBe(true);
      expect(b.fingerprint).toEqual([0, 1].map((index) => expect.objectContaining({ index, kind: 'cpu', hostname: expect.any(String), cpu_model: expect.any(String), torch: expect.any(String) })));

      // Host A: the flipped output of step 6 on rank 1 does not reproduce in a fresh process there: transient.
      expect(a.incident).toMatchObject({ id: expect.stringMatching(/^incident-wave\d+-dp0$/), replica: 0, ranks: [0, 1] });
      expect([a.verdict, a.replays[0].host]).toEqual(['transient', 'hostA']);
      expect(a.replays.map((r: any) => [r.role, r.host, r.ok, r.agent_rank])).toEqual([['same', 'hostA', true, undefined], ['other', 'hostB', true, 2]]);
      expect(a.calls).toHaveLength(1);
      expect(a.calls[0].rank).toBe(1);
      const snaps = fs.readdirSync(a.incident.dir).find((n) => n.startsWith('torch-engine-'))!;
      const meta = JSON.parse(fs.readFileSync(path.join(a.incident.dir, snaps, 'rank1', `call${a.calls[0].call}`, 'meta.json'), 'utf8'));
      expect(meta.global_step).toBe(6);

      // The coordinator (host A) learned both over the bus; asked from host B with CURVE.
      const doc = await waitFor(async () => {
        const s = await cli(net.b, ['status', ...coordinator, '--json']);
        const j = s.code === 0 ? JSON.parse(s.stdout) : undefined;
        return j?.verdicts?.latest?.length === 2 ? j : undefined;
      }, 'both verdicts in the coordinator\'s status', 60000, 500);
      expect(doc.verdicts.counts).toMatchObject({ 'device-local': 1, transient: 1 });
      const byReplica = Object.fromEntries(doc.verdicts.latest.map((v: any) => [v.replica, v]));
      expect(byReplica[1]).toMatchObject({ incident: b.incident.id, verdict: 'device-local', host: 'hostB', devices: [0, 1], fingerprint: expect.stringContaining('device 0: hostname ') });
      expect(byReplica[0]).toMatchObject({ incident: a.incident.id, verdict: 'transient', host: 'hostA' });

      // A serving device on the other host is left alone: host B's incident judged by hand on host B
      // without --allow-live-device (the engine's outputs copied without their pid files, so host B's
      // own replay runs) while host A's engines still serve. Host A's agent refuses the replay there:
      // inconclusive, naming the rank, its pid and that it serves.
      const copy = path.join(dir, 'hostB-out-copy');
      fs.cpSync(path.join(hosts[1].dir, 'out'), copy, { recursive: true, filter: (src) => !path.basename(src).startsWith('pid_rank') });
      const servingA = Number(fs.readFileSync(path.join(hosts[0].dir, 'out', 'pid_rank0'), 'utf8'));
      expect(fs.existsSync(`/proc/${servingA}`)).toBe(true); // host A's engine still serves (its --max-tokens keeps it busy)
      const refused = spawnInNetns(net.b, process.execPath, [CLI, 'verdict', path.join(hosts[1].dir, 'cache'), '--incident', b.incident.id, '--engine-out', copy,
        '--python', RANKS.python, '--no-reference', ...patchArgs, ...layout, ...coordinator, '--json'], { env: { ...process.env, TORCH_ENGINE_DEVICE_FAULT_FILE: hosts[1].fault } });
      expect({ code: (await refused.exited).code, stderr: refused.stderr() }).toEqual({ code: 0, stderr: '' });
      const r = JSON.parse(refused.stdout());
      expect(r.verdict).toBe('inconclusive');
      expect(r.reason).toContain(`every recorded output reproduces on host hostB; the replay on host hostA devices 0,1 did not run: rank 0's agent: rank 0's engine (pid ${servingA}) still serves`);
      expect(r.replays.map((x: any) => [x.role, x.ok, x.agent_rank])).toEqual([['same', true, undefined], ['other', false, 0]]);

      // The wrong shard: host B's fault file goes, and once 12 more forwards ran (past its 8 recorded),
      // replica 1 is dumped again. Host B's agent judges that incident: it reproduces on host B and on
      // host A (host A's agent, the patched shard there too): deterministic, and bisect against TP=1
      // names layer 1's up-projection.
      fs.rmSync(hosts[1].fault);
      const steps = () => fs.readdirSync(path.join(hosts[1].dir, 'out')).map((n) => /^forward_rank3_step(\d+)\.pt$/.exec(n)).filter((m) => m).map((m) => Number(m![1]));
      const since = Math.max(...steps());
      await waitFor(() => steps().some((st) => st >= since + 12), `forward ${since + 12} on rank 3`, 60000, 50);
      const again = await cli(net.b, ['dump', ...coordinator, '--request', 'req-0', '--replica', '1', '--wait']);
      expect({ code: again.code, stderr: again.stderr }).toEqual({ code: 0, stderr: '' });
      const dFile = await waitFor(() => flushVerdicts(path.join(hosts[1].dir, 'cache')).find((f) => path.dirname(f) !== b.incident.dir), "host B's second verdict.json", 300000, 200)
        .catch((e) => Promise.reject(new Error(`${(e as Error).message}${diag()}`)));
      const d = JSON.parse(fs.readFileSync(dFile, 'utf8'));
      expect(d.incident).toMatchObject({ replica: 1, ranks: [2, 3] });
      expect([d.verdict, d.bisect?.first?.module]).toEqual(['deterministic', 'model.layers.1.mlp.up_proj']);
      expect(d.replays.map((x: any) => [x.role, x.host, x.ok, x.agent_rank, x.tensors.every((t: any) => t.bit_exact)])).toEqual([['same', 'hostB', true, undefined, true], ['other', 'hostA', true, 0, true]]);
    } finally {
      for (const j of jobs) j.child.kill('SIGTERM');
      await Promise.all(jobs.map((j) => j.exited));
    }
  });
});
