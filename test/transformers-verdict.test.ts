// `wavebus verdict` on Hugging Face transformers' continuous batching: a TP=2 job (torch 2.x's
// torchrun under `wavebus launch`, the small random Llama) with the flight recorder on, dumped by
// hand (the incident: its agents flush recorder/incident-wave<w>/). The replayer is
// examples/transformers-engine/replay.py (it runs itself under torchrun for the TP=2 replays; the
// TP=1 reference loads the same saved model dir). The faults are test doubles in
// examples/transformers-engine/faults.py: a wrong value in rank 1's shard of one weight (serve.py
// and the replays load it, the TP=1 reference does not), and a one-off bit flip in rank 1's logits,
// in the live process only, judged by verdict.auto while the job serves. DP=1: for the
// deterministic case the second replay is "another host" named with --other-host and its
// environment (--host-env), run here (docs/verdict.md, "What runs where").
import * as fs from 'fs';
import * as path from 'path';
import { spawnSync } from 'child_process';
import { ROOT, cleanup, freePortPair, runWavebus, spawnWavebus, tmpDir, waitFor, waitWhileRunning } from './helpers';
import { torch2 } from './torch2';
import { flushVerdicts } from './verdict-hosts';

afterAll(cleanup);

const ENGINE = path.join(ROOT, 'examples', 'transformers-engine');
let venv: { python: string; torchrun: string };
let model: string;

beforeAll(() => {
  venv = torch2();
  model = path.join(tmpDir('wavebus-hf-verdict-model-'), 'model');
  const r = spawnSync(venv.python, [path.join(ENGINE, 'make_model.py'), model, '--layers', '2'], { encoding: 'utf8', timeout: 180000 });
  if (r.status !== 0) throw new Error(`make_model.py exited ${r.status}\n${r.stderr}`);
}, 200000);

/** verdict.auto: what the agent of the incident's replica head runs `wavebus verdict` with, and the coordinator's view once judged. */
interface Auto { verdictFile?: string; status?: any }

/**
 * A TP=2 job keeping its last `keep` forwards, every step's logits saved; req-0 dumped once rank 1
 * saved wave `dumpAfter`. With `auto`, verdict.auto judges the flush while the job serves (the CPU:
 * allow_live_device) and tells the coordinator; the test waits for both, then stops the job.
 */
async function job(serveArgs: string[], keep: number, dumpAfter: number, auto?: Auto) {
  const dir = tmpDir('wavebus-hf-verdict-');
  const out = path.join(dir, 'out');
  const port = await freePortPair();
  const runtime = {
    report: { save_sensitive_info: true }, detector: { token_repeat: { enabled: false }, logits_finite: { enabled: true } },
    ...(auto ? { verdict: { auto: true, allow_live_device: true } } : {}),
  };
  const verdictArgs = auto ? ['--linger-ms', '300000', ...[`--engine-out=${out}`, `--python=${venv.python}`, `--replayer=${path.join(ENGINE, 'replay.py')}`, '--replayer-arg=--model', `--replayer-arg=${model}`, '--no-reference']
    .map((a) => `--agent-arg=--verdict-arg=${a}`)] : [];
  const launch = spawnWavebus(
    ['launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--run-dir', path.join(dir, 'run'),
      '--additional-config', JSON.stringify({ runtime_config: runtime }), '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000', ...verdictArgs,
      '--', venv.torchrun, '--standalone', '--nproc-per-node', '2', path.join(ENGINE, 'serve.py'), '--model', model, '--out', out,
      '--requests', '2', '--max-tokens', '80', '--step-sleep-ms', '40', '--save-logits', ...serveArgs],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache'), WAVEBUS_RECORD_FORWARDS: String(keep) }, cwd: dir },
  );
  await waitWhileRunning(launch, () => fs.existsSync(path.join(out, `logits_rank1_wave${dumpAfter}.pt`)), `wave ${dumpAfter} on rank 1`, 120000);
  const token = path.join(dir, 'run', 'bus.token');
  const dump = spawnWavebus(['dump', '--coordinator', `127.0.0.1:${port}`, '--bus-token-file', token, '--request', 'req-0', '--wait']);
  const d = await dump.exited;
  expect({ code: d.code, stderr: dump.stderr() }).toEqual({ code: 0, stderr: '' });
  if (auto) {
    try {
      auto.verdictFile = await waitFor(() => flushVerdicts(path.join(dir, 'cache'))[0], 'verdict.auto\'s verdict.json', 400000, 500);
      auto.status = await waitFor(async () => {
        const s = spawnWavebus(['status', '--coordinator', `127.0.0.1:${port}`, '--bus-token-file', token, '--json']);
        const e = await s.exited;
        const doc = e.code === 0 ? JSON.parse(s.stdout()) : undefined;
        return doc?.verdicts?.latest?.length ? doc : undefined;
      }, 'the verdict in the coordinator\'s status', 30000, 500);
    } catch (e) {
      throw new Error(`${(e as Error).message}\n${launch.stderr().slice(-6000)}`);
    } finally {
      launch.child.kill('SIGTERM'); // the agents linger for it; the command itself exited 0
    }
  }
  const { code } = await launch.exited;
  if (code !== 0) throw new Error(`launch exited ${code}\n${launch.stderr().slice(-4000)}`);
  return { dir, out };
}

function verdict(j: { dir: string; out: string }, ...flags: string[]) {
  const r = runWavebus(['verdict', path.join(j.dir, 'cache'), '--engine-out', j.out, '--python', venv.python, '--replayer', path.join(ENGINE, 'replay.py'),
    '--replayer-arg=--model', `--replayer-arg=${model}`, '--json', ...flags], { timeout: 500000 });
  if (r.code !== 0) throw new Error(`verdict exited ${r.code}\n${r.stdout}${r.stderr}`);
  return JSON.parse(r.stdout);
}

/** The recorder's call index of the forward at wave `wave` (its meta.json's global_step). */
function callOfWave(v: any, wave: number): number | undefined {
  const snaps = path.join(v.incident.dir, 'transformers-LlamaForCausalLM-tp2', 'rank1');
  return v.incident.calls.find((c: number) => JSON.parse(fs.readFileSync(path.join(snaps, `call${c}`, 'meta.json'), 'utf8')).global_step === wave);
}

test('a wrong value in rank 1\'s shard of layer 1\'s up_proj (engine and replays load it): deterministic, bisect against TP=1 names model.layers.1.mlp.up_proj on rank 1', async () => {
  const dir = tmpDir('wavebus-hf-verdict-files-');
  const patch = path.join(dir, 'patch.json');
  fs.writeFileSync(patch, JSON.stringify([{ tp_size: 2, tp_rank: 1, weight: 'model.layers.1.mlp.up_proj.weight', index: 700, add: 0.5 }]));
  fs.writeFileSync(path.join(dir, 'hostB.env'), '# what a process on hostB sees (nothing of its own: a healthy host)\n');
  const j = await job(['--shard-patch', patch], 4, 8);
  const v = verdict(j, '--other-host', 'hostB', `--host-env=hostB=${path.join(dir, 'hostB.env')}`, '--replayer-arg=--shard-patch', `--replayer-arg=${patch}`);
  expect(v.verdict).toBe('deterministic');
  expect(v.incident).toMatchObject({ id: expect.stringMatching(/^incident-wave\d+$/), tp: 2, ranks: [0, 1] });
  expect(v.incident.calls.length).toBeGreaterThanOrEqual(2);
  // Both replays ran and reproduced every recorded output bit for bit (the CPU: exact).
  expect(v.replays.map((r: any) => [r.role, r.host, r.ok])).toEqual([['same', 'local', true], ['other', 'hostB', true]]);
  for (const r of v.replays) {
    expect(r.tensors).toHaveLength(2 * v.incident.calls.length);
    expect(r.tensors.every((t: any) => t.bit_exact && t.within_tolerance)).toBe(true);
  }
  expect(v.bisect.first).toMatchObject({ module: 'model.layers.1.mlp.up_proj', ranks: [1] });
  expect(fs.existsSync(path.join(v.incident.dir, 'verdict.json'))).toBe(true);
}, 600000);

test('a one-off bit flip in rank 1\'s logits at wave 10, in the live process only: verdict.auto judges it transient while the job serves, naming that forward and rank, and tells the coordinator', async () => {
  const auto: Auto = {};
  await job(['--flip-output', '10:1'], 32, 10, auto);
  const v = JSON.parse(fs.readFileSync(auto.verdictFile!, 'utf8'));
  const call = callOfWave(v, 10);
  expect(call).toBeDefined();
  expect([v.verdict, v.calls]).toEqual(['transient', [{ call, rank: 1 }]]);
  // Every other recorded output replays bit for bit; the flipped one differs by more than the tolerance.
  const [same] = v.replays;
  const flipped = same.tensors.filter((t: any) => !t.bit_exact);
  expect(flipped.map((t: any) => [t.call, t.rank, t.mismatched])).toEqual([[call, 1, 1]]);
  expect(same.tensors.length).toBe(2 * v.incident.calls.length);
  expect(auto.status.verdicts.counts.transient).toBe(1);
  expect(auto.status.verdicts.latest).toEqual([expect.objectContaining({ incident: v.incident.id, verdict: 'transient', ranks: [0, 1], replica: 0 })]);
}, 600000);
