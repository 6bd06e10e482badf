// A real torchrun-style job: Python workers with real torch tensors in shared memory, started by
// `wavebus launch` with the environment torchrun gives them; a manual dump is armed through the
// hot-reloaded config (edited live, as the seed describes), and every dumped .pt is compared bit-exact with the workers' tensors.
import * as fs from 'fs';
import * as path from 'path';
import { ROOT, cleanup, exitedWithin, freePortPair, runPython, spawnWavebus, tmpDir, waitWhileRunning } from './helpers';
import { torchRanks } from './torch2';

afterAll(cleanup);

// The workers' ranks under torch 2.x's own torchrun (test/torch2.ts; the stand-in only without the venv).
const RANKS = torchRanks();

/** The test's bound; every wait inside takes its share of what is left, so one of them, never jest, reports a slow run. */
const TEST_MS = 180000;

test('python workers under wavebus launch: a manual dump matches the workers\' KV tensors bit for bit', async () => {
  const dir = tmpDir();
  const cfg = path.join(dir, 'runtime', 'config', 'runtime_config.json');
  const by = Date.now() + TEST_MS - 10000; // the last 10 s: explaining and cleaning up
  const within = (ms: number) => Math.max(1000, Math.min(ms, by - Date.now()));
  // The coordinator binds P and P+1, both checked free, below the ephemeral range (src/bus/ports.ts).
  const port = await freePortPair();
  const blocks = '3,11,6';
  const launch = spawnWavebus(
    [
      'launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port),
      '--coordinator-arg=--runtime-config-path', `--coordinator-arg=${cfg}`, '--coordinator-arg=--runtime-config-hot-reload',
      // the seed's startup overlay (startup writes defaults ← overlay to the file)
      '--additional-config', '{"runtime_config": {"dump": {"free_headroom_bytes": 0}}}',
      '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000',
      '--', ...RANKS.command(path.join(ROOT, 'test', 'python', 'kv_worker.py'), { nproc: 2 }), dir, '3000', blocks,
    ],
    // Its own process group: cleanup() kills the command and its workers too, even if launch is gone.
    { env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python') }, cwd: dir, detached: true },
  );
  const reqDir = path.join(dir, 'runtime', 'report', 'kv_cache', 'manual_trigger', 'req-py-1-0a1b2c3d');
  // On a timeout (or launch exiting early), say what was there: the manifest (which rank failed, and why) and what the job printed.
  const explain = (e: Error): never => {
    const waves = fs.existsSync(reqDir) ? fs.readdirSync(reqDir) : [];
    const manifest = waves.length > 0 && fs.existsSync(path.join(reqDir, waves[0], 'manifest.json')) ? fs.readFileSync(path.join(reqDir, waves[0], 'manifest.json'), 'utf8') : '(none)';
    throw new Error(`${e.message}\nmanifest: ${manifest}\nlaunch stdout:\n${launch.stdout().slice(-4000)}\nlaunch stderr:\n${launch.stderr().slice(-8000)}`);
  };
  // The seed's manual dump: with hot reload on, edit the live file (JSONC) and bump manual_dump to 1.
  const until = <T>(fn: () => T, what: string, ms: number) => waitWhileRunning(launch, fn, what, within(ms)).catch(explain);
  await until(() => fs.existsSync(path.join(dir, 'pool_rank0.pt')) && fs.existsSync(path.join(dir, 'pool_rank1.pt')), 'workers started', 60000);
  await until(() => fs.readFileSync(cfg, 'utf8').includes('manual_dump'), 'startup wrote the effective config back', 30000);
  const live = fs.readFileSync(cfg, 'utf8').replace(/"manual_dump":\s*0/, '"manual_dump": 1 /* one more capture */');
  expect(live).toContain('"manual_dump": 1');
  fs.writeFileSync(cfg, live);
  await until(() => {
    const waves = fs.existsSync(reqDir) ? fs.readdirSync(reqDir) : [];
    return waves.length > 0 && fs.existsSync(path.join(reqDir, waves[0], 'manifest.json')) && JSON.parse(fs.readFileSync(path.join(reqDir, waves[0], 'manifest.json'), 'utf8')).complete;
  }, 'the manual dump and its manifest', 60000);
  fs.writeFileSync(path.join(dir, 'stop'), '');
  // Each worker ends within a step of the stop file (a step waits at most the 2 s end-of-wave bound); launch then stops its sidecars.
  const { code } = await exitedWithin(launch, within(60000), 'the job to exit after the stop file (workers that printed "done" are in its stdout)').catch(explain);
  if (code !== 0) throw new Error(`launch exited ${code}\n${launch.stdout()}\n${launch.stderr()}`);
  // Both workers ran to the stop file (a rank that outlives TP0 by a step times out once, by design).
  expect(launch.stdout()).toMatch(/rank 0 done, end_of_wave timeouts \d+/);
  expect(launch.stdout()).toMatch(/rank 1 done, end_of_wave timeouts \d+/);
  const [waveDir] = fs.readdirSync(reqDir);
  const check = runPython(
    `import sys, os, torch
d, pools, blocks = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3].split(',')]
for rank in (0, 1):
    pool = torch.load(os.path.join(pools, f'pool_rank{rank}.pt'))
    for layer in ('model.layers.0.self_attn', 'model.layers.1.self_attn'):
        dump = torch.load(os.path.join(d, f'dp0_tp{rank}_pp0_cp0', f'{layer}.pt'), weights_only=True)
        assert dump['req_id'] == 'req-py-1-0a1b2c3d' and dump['tp_rank'] == rank and list(dump['block_ids']) == blocks, dump
        for kv in ('k', 'v'):
            want = pool[f'{layer}.{kv}'][blocks]
            got = dump[kv]
            assert got.dtype == torch.bfloat16 and got.shape == want.shape, (got.dtype, got.shape)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (rank, layer, kv)
print('bit-exact')`,
    [path.join(reqDir, waveDir), dir, blocks],
    { timeout: within(60000), python: RANKS.python },
  );
  expect(check.trim()).toBe('bit-exact');
  const manifest = JSON.parse(fs.readFileSync(path.join(reqDir, waveDir, 'manifest.json'), 'utf8'));
  expect(manifest).toMatchObject({ incident_type: 'manual_trigger', completed_ranks: [0, 1], missing_ranks: [] });
}, TEST_MS);
