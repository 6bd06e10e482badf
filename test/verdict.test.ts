// `wavebus verdict` against the PyTorch engine (examples/torch-engine) under `wavebus launch`, DP=2 x
// TP=2 on the CPU, the flight recorder on. A manual dump of replica 0 is the incident: its agents
// flush recorder/incident-wave<w>-dp0/. Two "hosts" share this machine: replica 0 (ranks 0, 1) is
// hostA, replica 1 (ranks 2, 3) hostB; what makes them two is each one's environment (the engine
// ranks get it with --env-on-rank, the replays with --host-env). The faulty device is a test double
// (examples/torch-engine/device_fault.py): a host-level file that every process on hostA reads.
// A verdict run by hand replays here, as the CLI's children (hostB's replay with hostB's
// environment); verdict.auto's, which knows the coordinator, replays on hostB through hostB's head
// agent over the bus (docs/verdict.md "What runs where"). No network namespace separates the hosts
// here (test/verdict-netns.test.ts runs two). The transient case is judged by verdict.auto (replica
// 0's head agent, while the job serves) and told to the coordinator; the bad-device job serves the
// device-local case and, judged as if DP=1, the inconclusive one.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { Coordinator } from '../src/bus/coordinator';
import { createTokenFile, loadBusToken } from '../src/bus/auth';
import { createLogger } from '../src/log';
import { ROOT, cleanup, freePortPair, runPython, runWavebus, spawnTracked, spawnWavebus, tmpDir, waitFor } from './helpers';
import { torchRanks } from './torch2';
import { flushVerdicts, makeVerdictHosts } from './verdict-hosts';

afterAll(cleanup);

const ENGINE = path.join(ROOT, 'examples', 'torch-engine');

// The engine's ranks under torch 2.x's own torchrun (test/torch2.ts).
const RANKS = torchRanks();
// The forward's length: long enough that the live `wavebus dump` below (armed after forward 7 or 8
// of about 31) is served while req-0 still runs. With 50 ms the job's remaining 1.1 s lost that
// race on a loaded host ("the coordinator stopped answering (the job ended?)", at load averages 8
// and 20); 200 ms leaves 4.4 s, and the recorder's 32 forwards still hold every one of the job's.
const STEP_SLEEP_MS = '200';
const CONFIG = {
  runtime_config: {
    report: { save_sensitive_info: true }, // replay needs the token ids (docs/recorder.md)
    detector: { token_repeat: { enabled: true } },
    actions: { defaults: { on_trigger: ['report'] } },
  },
};

interface Job {
  dir: string;
  out: string;
  hostFlags: string[];
}

interface JobOptions {
  dp?: number;
  badDevice?: boolean;
  dumpAfter?: number;
  /** verdict.auto on (allow_live_device: the CPU), its --verdict-args; `whileServing` runs before the job is stopped. */
  auto?: { whileServing: (j: Job, at: { port: number; tokenFile: string }) => Promise<void> };
}

/** A DP=dp x TP=2 job with the recorder on (K=32: every forward up to the dump), dumped on replica 0 once rank 1 saved forward `dumpAfter`. */
async function job(engineArgs: string[], opts: JobOptions = {}): Promise<Job> {
  const dp = opts.dp ?? 2;
  const dir = tmpDir('wavebus-verdict-');
  const out = path.join(dir, 'out');
  const hosts = ['hostA', 'hostB'].slice(0, dp);
  const hostFlags: string[] = [];
  const envOnRank: string[] = [];
  for (const [d, h] of makeVerdictHosts(dir, hosts).entries()) {
    hostFlags.push('--host-env', `${h.name}=${h.envFile}`);
    for (const t of [0, 1]) {
      hostFlags.push('--rank-host', `${d * 2 + t}=${h.name}`);
      envOnRank.push('--env-on-rank', `${d * 2 + t}:TORCH_ENGINE_DEVICE_FAULT_FILE=${h.fault}`);
    }
  }
  // The bad device: hostA's device 1 (rank 1's) adds 0.25 to one column of layer 1's up-projection.
  if (opts.badDevice) fs.writeFileSync(path.join(dir, 'hostA', 'device-fault.json'), JSON.stringify({ device: 1, layer: 1, add: 0.25 }));
  const port = await freePortPair();
  const config = opts.auto ? { runtime_config: { ...CONFIG.runtime_config, verdict: { auto: true, allow_live_device: true } } } : CONFIG;
  // What `wavebus verdict` needs beside the flush: the engine's outputs, the layout, the hosts.
  const auto = opts.auto ? ['--linger-ms', '240000', ...[`--engine-out=${out}`, `--python=${RANKS.python}`, `--dp=${dp}`, '--no-reference', ...flagsWithEq(hostFlags)].map((a) => `--agent-arg=--verdict-arg=${a}`)] : [];
  const launch = spawnWavebus(
    ['launch', '--nproc-per-node', String(2 * dp), '--tp', '2', '--dp', String(dp), '--port', String(port), '--run-dir', path.join(dir, 'run'),
      '--additional-config', JSON.stringify(config), '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000', ...auto,
      '--', ...RANKS.command(path.join(ENGINE, 'engine.py'), { nproc: 2 * dp }), '--out', out, '--dp', String(dp), '--save-every-forward',
      '--requests', '2', '--max-tokens', '30', '--step-sleep-ms', STEP_SLEEP_MS, ...envOnRank, ...engineArgs],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache'), WAVEBUS_RECORD_FORWARDS: '32' }, cwd: dir },
  );
  const after = opts.dumpAfter ?? 8;
  try {
    await waitFor(() => fs.existsSync(path.join(out, `forward_rank1_step${after}.pt`)), `forward ${after} on rank 1`, 120000, 20);
  } catch (e) {
    throw new Error(`${(e as Error).message}\n${launch.stderr().slice(-4000)}`);
  }
  const dump = spawnWavebus(['dump', '--coordinator', `127.0.0.1:${port}`, '--bus-token-file', path.join(dir, 'run', 'bus.token'), '--request', 'req-0', '--replica', '0', '--wait']);
  const d = await dump.exited;
  expect({ code: d.code, stderr: dump.stderr() }).toEqual({ code: 0, stderr: '' });
  if (opts.auto) {
    await opts.auto.whileServing({ dir, out, hostFlags }, { port, tokenFile: path.join(dir, 'run', 'bus.token') });
    launch.child.kill('SIGTERM'); // the agents linger for it; the command itself exited 0
  }
  const { code } = await launch.exited;
  if (code !== 0) throw new Error(`launch exited ${code}\n${launch.stderr().slice(-4000)}`);
  return { dir, out, hostFlags };
}

/** ["--x", "v", ...] as ["--x=v", ...]: each one argument for --verdict-arg. */
function flagsWithEq(flags: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < flags.length; i += 2) out.push(`${flags[i]}=${flags[i + 1]}`);
  return out;
}

/** Once: the DP=2 job with the bad device on hostA (two cases judge it). */
let badDeviceJob: Promise<Job> | undefined;
const badDevice = () => (badDeviceJob ??= job([], { badDevice: true }));

function verdict(j: Job, ...flags: string[]) {
  const r = runWavebus(['verdict', j.dir, '--engine-out', j.out, '--python', RANKS.python, ...j.hostFlags, '--json', ...flags], { timeout: 240000 });
  if (r.code !== 0) throw new Error(`verdict exited ${r.code}\n${r.stdout}${r.stderr}`);
  return JSON.parse(r.stdout);
}

/** `wavebus verdict --json` told to the job's coordinator (its replays on other hosts go through their agents), no reference. */
async function cli(j: Job, at: { port: number; tokenFile: string }, ...flags: string[]) {
  const r = spawnWavebus(['verdict', j.dir, '--engine-out', j.out, '--python', RANKS.python, ...j.hostFlags, '--json', '--no-reference',
    '--coordinator', `127.0.0.1:${at.port}`, '--bus-token-file', at.tokenFile, ...flags]);
  const e = await r.exited;
  if (e.code !== 0) throw new Error(`verdict exited ${e.code}\n${r.stdout()}${r.stderr()}`);
  return JSON.parse(r.stdout());
}

/** The call index of the forward at engine step `step` in the incident's flush. */
function callOfStep(v: any, step: number): number | undefined {
  const snaps = fs.readdirSync(v.incident.dir).filter((n) => n.startsWith('torch-engine-'))[0];
  return v.incident.calls.find((c: number) => JSON.parse(fs.readFileSync(path.join(v.incident.dir, snaps, 'rank1', `call${c}`, 'meta.json'), 'utf8')).global_step === step);
}

test('device_fingerprint (the replayer\'s): the host, the CPU\'s model, microcode and a digest of its flags from a cpuinfo file, the torch build; a missing file is named', () => {
  const dir = tmpDir('wavebus-verdict-fp-');
  const info = path.join(dir, 'cpuinfo');
  const block = (p: number, flags: string) => `processor\t: ${p}\nvendor_id\t: GenuineTest\nmodel name\t: Test CPU 9000\nmicrocode\t: 0xdeadbeef\nflags\t\t: ${flags}\n`;
  fs.writeFileSync(info, `${block(0, 'sse2 avx fpu avx')}\n${block(1, 'other flags here')}`);
  const script = `import json, sys, torch\nsys.path.insert(0, ${JSON.stringify(path.join(ROOT, 'clients', 'python'))})\nfrom wavebus_client.fingerprint import device_fingerprint\nprint(json.dumps([device_fingerprint(3, sys.argv[1]), device_fingerprint(0, sys.argv[2])]))`;
  const [fp, missing] = JSON.parse(runPython(script, [info, path.join(dir, 'absent')]));
  // The first processor's block only; the flags sorted and deduplicated before the digest.
  const digest = require('crypto').createHash('sha256').update('avx fpu sse2').digest('hex').slice(0, 16);
  expect(fp).toEqual({ hostname: os.hostname(), index: 3, kind: 'cpu', device_name: 'cpu', torch: expect.stringMatching(/^\d+\.\d+\S* git /), cpu_vendor: 'GenuineTest', cpu_model: 'Test CPU 9000', cpu_microcode: '0xdeadbeef', cpu_flags: `3 flags, sha256 ${digest}` });
  expect(missing.cpu_error).toBe(`${path.join(dir, 'absent')}: No such file or directory`);
});

test('a one-off bit flip in rank 1\'s output at step 6, in the live process only: verdict.auto judges it transient, naming that forward and rank, and tells the coordinator; --other-host hostB with --coordinator replays through rank 2\'s agent, whose serving check holds', async () => {
  let v: any;
  let doc: any;
  let named: any;
  let refused: any;
  let livePid = 0;
  await job(['--flip-output', '6:1'], {
    dumpAfter: 7,
    auto: {
      whileServing: async (j, at) => {
        // Replica 0's head agent judges its incident flush once it is whole, and the coordinator learns the verdict.
        const file = await waitFor(() => flushVerdicts(path.join(j.dir, 'cache'))[0], 'verdict.auto\'s verdict.json', 200000, 200);
        v = JSON.parse(fs.readFileSync(file, 'utf8'));
        doc = await waitFor(async () => {
          const s = spawnWavebus(['status', '--coordinator', `127.0.0.1:${at.port}`, '--bus-token-file', at.tokenFile, '--json']);
          const e = await s.exited;
          const d = e.code === 0 ? JSON.parse(s.stdout()) : undefined;
          return d?.verdicts?.latest?.length ? d : undefined;
        }, 'the verdict in the coordinator\'s status', 30000, 500);
        // A host the user names, with --coordinator: hostB is where --rank-host places ranks 2 and 3, so
        // rank 2's agent replays there (judged as DP=1: no second replica, only the named host).
        named = await cli(j, at, '--other-host', 'hostB', '--allow-live-device');
        // The serving-device rule holds there too: with hostB's ranks on the incident's device
        // indices and rank 2's engine "serving" (its pid file names a live process), rank 2's agent
        // refuses; rank 0's "serving" keeps the same-host replay here from running at all.
        const live = spawnTracked('sleep', ['60']);
        for (const g of [0, 2]) fs.writeFileSync(path.join(j.out, `pid_rank${g}`), String(live.child.pid));
        refused = await cli(j, at, '--other-host', 'hostB', '--rank-host', '2=hostB:0', '--rank-host', '3=hostB:1');
        livePid = live.child.pid!;
        live.child.kill('SIGKILL');
      },
    },
  });
  expect(doc.verdicts.counts.transient).toBe(1);
  expect(doc.verdicts.latest).toEqual([expect.objectContaining({ incident: v.incident.id, verdict: 'transient', host: 'hostA', devices: [0, 1], ranks: [0, 1], replica: 0 })]);
  expect(v.incident).toMatchObject({ id: expect.stringMatching(/^incident-wave\d+-dp0$/), replica: 0, tp: 2, ranks: [0, 1] });
  const call = callOfStep(v, 6);
  expect(call).toBeDefined(); // the flush holds the forward with the flip
  expect(v.verdict).toBe('transient');
  expect(v.calls).toEqual([{ call, rank: 1 }]);
  // Both replays ran; each gives the same single output out of tolerance, with its per-tensor error.
  expect(v.replays.map((r: any) => [r.role, r.host, r.devices, r.ok])).toEqual([['same', 'hostA', [0, 1], true], ['other', 'hostB', [2, 3], true]]);
  // hostB's replay ran through replica 1's head agent (rank 2), relayed by the coordinator.
  expect([v.replays[0].agent_rank, v.replays[1].agent_rank, v.replays[1].agent_hostname]).toEqual([undefined, 2, os.hostname()]);
  expect(v.replays.map((r: any) => r.ran)).toEqual(['here', "on hostB by rank 2's agent"]);
  for (const r of v.replays) {
    const bad = r.tensors.filter((t: any) => !t.within_tolerance);
    expect(bad.map((t: any) => [t.call, t.rank, t.mismatched])).toEqual([[call, 1, 1]]);
    expect(bad[0].max_abs_diff).toBeGreaterThan(bad[0].atol);
    // On the CPU every other output replays bit for bit.
    expect(r.tensors.filter((t: any) => !t.bit_exact)).toHaveLength(1);
  }
  // --other-host hostB with --coordinator: rank 2's agent ran it, with the incident's device indices, and found the flip too.
  expect(named.verdict).toBe('transient');
  expect(named.replays[1]).toMatchObject({ role: 'other', host: 'hostB', devices: [0, 1], ranksOnDevices: [], ok: true, agent_rank: 2, agent_hostname: os.hostname(), ran: "on hostB by rank 2's agent" });
  expect(named.replays[1].tensors.filter((t: any) => !t.within_tolerance).map((t: any) => [t.call, t.rank])).toEqual([[call, 1]]);
  expect(refused.verdict).toBe('inconclusive');
  expect(refused.replays[1]).toMatchObject({ host: 'hostB', devices: [0, 1], ranksOnDevices: [2, 3], ok: false, agent_rank: 2, ran: "on hostB by rank 2's agent" });
  expect(refused.replays[1].error).toContain(`rank 2's agent: rank 2's engine (pid ${livePid}) still serves on host`);
  expect(refused.replays[1].error).toContain('--allow-live-device');
  const file = path.join(v.incident.dir, 'verdict.json');
  expect((fs.statSync(file).mode & 0o777).toString(8)).toBe('640');
}, 300000);

test('the bad-device double on hostA: device-local, naming hostA and its devices; hostB does not reproduce the outputs', async () => {
  const j = await badDevice();
  const v = verdict(j, '--dp', '2');
  expect(v.verdict).toBe('device-local');
  expect([v.host, v.devices]).toEqual(['hostA', [0, 1]]);
  const [same, other] = v.replays;
  expect(same.tensors.length).toBeGreaterThan(0);
  expect(same.tensors.every((t: any) => t.bit_exact)).toBe(true);
  expect(other.tensors.every((t: any) => !t.within_tolerance)).toBe(true);
  expect(v.reason).toContain('host hostB devices 2,3');
  // Judged by hand without --coordinator: hostB's replay ran here, with hostB's environment.
  expect([same.ran, other.ran, other.agent_rank]).toEqual(['here', "here, with hostB's environment (--host-env)", undefined]);
  // The devices named, as the replay on hostA saw them: this machine's name, CPU (from /proc/cpuinfo) and torch.
  const cpu = (key: string) => new RegExp(`^${key}\\s*:\\s*(.*)$`, 'm').exec(fs.readFileSync('/proc/cpuinfo', 'utf8'))?.[1].trim();
  expect(v.fingerprint).toEqual([0, 1].map((index) => expect.objectContaining({
    index, tp_rank: index, kind: 'cpu', hostname: os.hostname(), cpu_model: cpu('model name'), cpu_flags: expect.stringMatching(/^\d+ flags, sha256 [0-9a-f]{16}$/),
    ...(cpu('microcode') ? { cpu_microcode: cpu('microcode') } : {}), torch: expect.stringMatching(/^\d+\.\d+/),
  })));
  expect(same.fingerprint).toEqual(v.fingerprint);
  expect(other.fingerprint).toHaveLength(2);
  // The page: the flush's row carries the verdict and the replays' per-tensor errors.
  const page = path.join(j.dir, 'report.html');
  const rep = runWavebus(['report', j.dir, '-o', page], { timeout: 120000 });
  expect(rep.code).toBe(0);
  const html = fs.readFileSync(page, 'utf8');
  expect(html).toContain('<div class="verdict" data-verdict="device-local"><b>device-local</b>: the recorded outputs reproduce on host hostA devices 0,1 only');
  expect(html).toContain(`same on hostA devices 0,1: ${same.tensors.length}/${same.tensors.length} outputs reproduce (${same.tensors.length} bit-exact)`);
  expect(html).toContain(`other on hostB devices 2,3 (here, with hostB&#39;s environment (--host-env)): 0/${other.tensors.length} outputs reproduce`);
  expect(html).toContain(`<span class="verdict-device">device 1 on hostA: hostname ${os.hostname()}, cpu ${cpu('model name')}`);
  expect(html).toMatch(/<li>call \d+ rank 1: max\|diff\| [0-9.e-]+, \d+\/\d+ out of tolerance<\/li>/);
}, 300000);

test('a wrong value in tp_rank 1\'s checkpoint shard: deterministic, and bisect against TP=1 names layer 1\'s up_proj on rank 1', async () => {
  const dir = tmpDir('wavebus-verdict-patch-');
  const patch = path.join(dir, 'shard-patch.json');
  fs.writeFileSync(patch, JSON.stringify([{ tp_size: 2, tp_rank: 1, weight: 'layers.1.up', index: 5, add: 2.0 }]));
  const j = await job(['--shard-patch', patch]);
  // verdict.auto is off by default: the job's agents judged nothing.
  expect(flushVerdicts(path.join(j.dir, 'cache'))).toEqual([]);
  const v = verdict(j, '--dp', '2', `--replayer-arg=--shard-patch`, `--replayer-arg=${patch}`);
  expect(v.verdict).toBe('deterministic');
  for (const r of v.replays) expect(r.tensors.every((t: any) => t.bit_exact)).toBe(true);
  expect(v.bisect.first).toMatchObject({ module: 'model.layers.1.mlp.up_proj', ranks: [1] });
  expect(v.bisect.call).toBe(v.incident.calls[v.incident.calls.length - 1]);
  expect(JSON.parse(fs.readFileSync(v.bisect.out, 'utf8')).first.module).toBe('model.layers.1.mlp.up_proj');
  // Without the patch the replays load the right shard: what the engine computed does not reproduce anywhere.
  const without = verdict(j, '--dp', '2', '--no-reference');
  expect(without.verdict).toBe('transient');
}, 300000);

test('no second replica (judged as DP=1): inconclusive with the reason; a serving engine is not replayed on; bad flags are named', async () => {
  // The bad-device job judged without its second replica (no --dp: the verdict knows of one replica).
  const j = await badDevice();
  // Judged with --coordinator: the CLI tells a running coordinator (with the job's bus token) the verdict.
  const tokenFile = createTokenFile(tmpDir('wavebus-verdict-token-'));
  const port = await freePortPair();
  const coordinator = new Coordinator({ port, layout: { worldSize: 4, tp: 2, pp: 1, dp: 2, cp: 1 }, busToken: loadBusToken(tokenFile, {}), logger: createLogger('verdict-test', 'error') });
  await coordinator.start();
  let v: any;
  try {
    const told = spawnWavebus(['verdict', j.dir, '--engine-out', j.out, '--python', RANKS.python, ...j.hostFlags, '--json', '--coordinator', `127.0.0.1:${port}`, '--bus-token-file', tokenFile]);
    const e = await told.exited; // asynchronous: this process's coordinator answers it
    expect({ code: e.code, stderr: told.stderr() }).toEqual({ code: 0, stderr: '' });
    v = JSON.parse(told.stdout());
    expect(coordinator.verdicts.status().latest).toEqual([expect.objectContaining({ incident: v.incident.id, verdict: 'inconclusive', host: 'hostA', devices: [0, 1], ranks: [0, 1] })]);
  } finally {
    await coordinator.stop();
  }
  expect(v.verdict).toBe('inconclusive');
  expect(v.reason).toContain('no second replica holds the shard (DP=1');
  expect(v.replays).toHaveLength(1);
  expect(v.replays[0].tensors.every((t: any) => t.bit_exact)).toBe(true);
  // A replay that fails (here: killed by its bound) is named.
  const failed = verdict(j, '--replay-timeout-ms', '1');
  expect(failed.verdict).toBe('inconclusive');
  expect(failed.reason).toMatch(/^the same-host replay failed: the replay exited null: .*killed after 1 ms: --replay-timeout-ms/);
  // A host the user names instead: hostB (no fault file; its --host-env is in j.hostFlags) does not reproduce: device-local.
  const named = verdict(j, '--other-host', 'hostB', '--no-reference');
  expect([named.verdict, named.host, named.replays[1].host]).toEqual(['device-local', 'hostA', 'hostB']);
  // No --coordinator: no agent is asked; the replay ran here with hostB's --host-env, with hostA's device indices.
  expect([named.replays[1].ran, named.replays[1].agent_rank, named.replays[1].devices]).toEqual(["here, with hostB's environment (--host-env)", undefined, [0, 1]]);
  // Rank 0's engine "still serving" (its pid file names a live process): not replayed on its device.
  const live = spawnTracked('sleep', ['60']);
  fs.writeFileSync(path.join(j.out, 'pid_rank0'), String(live.child.pid));
  const refused = verdict(j);
  expect(refused.verdict).toBe('inconclusive');
  expect(refused.reason).toContain(`rank 0's engine (pid ${live.child.pid}) still serves on host hostA device 0`);
  expect(refused.reason).toContain('--allow-live-device');
  expect(verdict(j, '--allow-live-device').replays[0].ok).toBe(true);
  live.child.kill('SIGKILL');
  // Bad input: exit 2, naming what was wrong.
  const bad = (flags: string[], want: string) => {
    const r = runWavebus(['verdict', j.dir, ...flags]);
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 2, stderr: expect.stringContaining(want) });
  };
  bad(['--engine-out', j.out, '--incident', 'incident-wave999'], '--incident incident-wave999: no recorder/incident-wave999 under');
  bad([], '--engine-out: required');
  bad(['--engine-out', j.out, '--rank-host', '0=host A'], '--rank-host: expected G=HOST[:DEVICE]');
  bad(['--engine-out', j.out, '--rank-host', '0=a', '--rank-host', '1=b'], 'lie on hosts a, b');
  fs.writeFileSync(path.join(j.dir, 'bad.env'), 'OK=1\nnot a line\n');
  bad(['--engine-out', j.out, '--host-env', `x=${path.join(j.dir, 'bad.env')}`], 'bad.env:2: expected KEY=VALUE');
  bad(['--engine-out', j.out, '--other-host', 'nowhere'], '--other-host nowhere: no --host-env nowhere');
  // With --coordinator too: no rank placed there, so no agent to ask and no environment to stand for it.
  bad(['--engine-out', j.out, '--other-host', 'nowhere', '--coordinator', '127.0.0.1:1', '--bus-token-file', tokenFile], '--other-host nowhere: no --host-env nowhere=FILE says what a process there sees, and no --rank-host places a rank (an agent) there');
  bad(['--engine-out', j.out, '--coordinator', 'nohost'], '--coordinator');
}, 300000);

