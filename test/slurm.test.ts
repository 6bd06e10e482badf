// Real Slurm: a one-node cluster started here (munge, slurmctld, slurmd) runs launch/slurm.sbatch,
// the very file users submit, as `sbatch --nodes=1 --ntasks-per-node=4`: its `srun` starts 4 tasks,
// each a `wavebus launch` whose place in the job comes from SLURM_PROCID / SLURM_NTASKS, with CURVE
// keys from `wavebus keys`. The engine is the simulated one, TP 2 x PP 2, with a non-finite logits
// fault; the KV dump it triggers must hold the last stage's ranks, verified, with each rank's
// identity and KV bytes those of the Slurm task of the same SLURM_PROCID.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { readRange } from '../src/artifacts/read-range';
import { readPt } from '../src/artifacts/pt-reader';
import { kvBlockBytes, type KvGeometry } from '../src/sim/kv-pattern';
import { isKvRankDirName } from '../src/paths';
import { CLI, ROOT, cleanup, freePortPair, runWavebus, spawnTracked, tmpDir } from './helpers';
import { startSlurmCluster, type SlurmCluster } from './slurm-cluster';

const TASKS = 4;
const SIM = { layers: 2, numBlocks: 32, blockSize: 4, kvHeads: 2, headDim: 8 };
// Each rank holds kv-heads / tp heads (src/sim/rank.ts).
const G: KvGeometry = { layers: SIM.layers, numBlocks: SIM.numBlocks, blockSize: SIM.blockSize, kvHeads: SIM.kvHeads / 2, headDim: SIM.headDim, dtype: 'bfloat16' };

let cluster: SlurmCluster | undefined;
let dir: string;

beforeAll(async () => {
  dir = tmpDir('wavebus-slurm-');
  fs.chmodSync(dir, 0o711);
  cluster = await startSlurmCluster(path.join(dir, 'cluster'), { cpus: Math.max(TASKS, os.cpus().length) });
}, 60000);

afterAll(async () => {
  await cluster?.stop();
  await cleanup();
});

function envFile(file: string): Record<string, string> {
  return Object.fromEntries(fs.readFileSync(file, 'utf8').trim().split('\n').map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
}

test('sbatch launch/slurm.sbatch on a one-node cluster: 4 srun tasks, TP 2 x PP 2 over CURVE, a verified KV dump from the Slurm ranks', async () => {
  const c = cluster!;
  const job = path.join(dir, 'job');
  fs.mkdirSync(job);
  const keys = path.join(dir, 'keys');
  for (const name of ['coordinator', 'agent']) {
    const r = runWavebus(['keys', '--out', keys, '--name', name]);
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
  }
  // The engine each task runs under `wavebus launch`: it records what Slurm and the launcher told it.
  const engine = path.join(dir, 'engine.sh');
  const simFlags = [
    '--steps', '30', '--step-ms', '50', '--requests', '2', '--layers', SIM.layers, '--num-blocks', SIM.numBlocks,
    '--block-size', SIM.blockSize, '--kv-heads', SIM.kvHeads, '--head-dim', SIM.headDim, '--dtype', 'bfloat16',
  ].join(' ');
  fs.writeFileSync(engine, [
    '#!/bin/bash',
    'set -eu',
    `env | grep -E '^(SLURM_(PROCID|LOCALID|NODEID|NTASKS|JOB_ID|JOB_NODELIST|TASKS_PER_NODE)|WAVEBUS_(NODE_RANK|NNODES|NPROC_PER_NODE|TP|PP|DP|COORDINATOR))=' > ${job}/task-$SLURM_PROCID.env`,
    `exec ${process.execPath} ${CLI} sim ${simFlags} --faults '{"nonFinite":{"request":0,"at":8}}' --result-dir ${job}/ranks`,
    '',
  ].join('\n'), { mode: 0o755 });

  const report = path.join(dir, 'report');
  const guard = {
    runtime_report_dir: report,
    runtime_config: {
      detector: { logits_finite: { enabled: true, on_trigger: ['report', 'dump_kv'] } },
      dump: { auto_max_times: 4, auto_cooldown_seconds: 0, free_headroom_bytes: 0 },
    },
  };
  // freePortPair draws below the kernel's ephemeral range: srun and the daemons open connections
  // whose source ports come from it, and one of them once took the ROUTER's port between the probe
  // and the coordinator's bind.
  const port = await freePortPair();
  const out = path.join(dir, 'job.out');
  const sbatch = spawnTracked('sbatch', [
    '--wait', '--nodes=1', '--ntasks-per-node=4', '--cpus-per-task=1', '--gpus-per-node=0', '--time=3',
    `--chdir=${dir}`, `--output=${out}`, path.join(ROOT, 'launch', 'slurm.sbatch'), engine,
  ], {
    cwd: dir,
    env: c.env({
      WAVEBUS_NPROC: '1',
      WAVEBUS_LAYOUT: '--tp 2 --pp 2',
      WAVEBUS_CURVE_DIR: keys,
      WAVEBUS_PORT: String(port),
      WAVEBUS_ADDITIONAL_CONFIG: JSON.stringify(guard),
      // A loaded 2-core machine can delay a wave vector by tens of ms; real forwards are longer.
      WAVEBUS_LAUNCH_ARGS: '--agent-arg=--end-of-wave-timeout-ms --agent-arg=250',
      WAVEBUS_BIN: `${process.execPath} ${CLI}`,
      WAVEBUS_LOG_LEVEL: 'info',
    }),
  });
  let timer: NodeJS.Timeout | undefined;
  const done = await Promise.race([sbatch.exited, new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), 150000)))]);
  clearTimeout(timer);
  const explain = () => `sbatch: ${sbatch.stdout()}${sbatch.stderr()}\njob output:\n${fs.existsSync(out) ? fs.readFileSync(out, 'utf8').slice(-6000) : '(none)'}\n${c.logs()}`;
  if (!done) throw new Error(`the job did not finish within 150 s\n${explain()}`);
  if (done.code !== 0) throw new Error(`sbatch --wait exited ${done.code}\n${explain()}`);
  expect(sbatch.stdout()).toMatch(/^Submitted batch job \d+/);
  const log = fs.readFileSync(out, 'utf8');

  // Each task's place came from Slurm: task p is launch node p of 4, one rank each, so global rank p.
  const tasks = Array.from({ length: TASKS }, (_, p) => envFile(path.join(job, `task-${p}.env`)));
  const jobId = tasks[0].SLURM_JOB_ID;
  tasks.forEach((t, p) =>
    expect(t).toEqual({
      SLURM_PROCID: String(p), SLURM_LOCALID: String(p), SLURM_NODEID: '0', SLURM_NTASKS: '4', SLURM_TASKS_PER_NODE: '4',
      SLURM_JOB_ID: jobId, SLURM_JOB_NODELIST: c.host,
      WAVEBUS_NODE_RANK: String(p), WAVEBUS_NNODES: '4', WAVEBUS_NPROC_PER_NODE: '1', WAVEBUS_TP: '2', WAVEBUS_PP: '2', WAVEBUS_DP: '1',
      WAVEBUS_COORDINATOR: tasks[0].WAVEBUS_COORDINATOR,
    }),
  );
  // One coordinator, CURVE on, on the node's address (the sbatch file's MASTER_ADDR), not loopback.
  expect(log.match(/\[coordinator\] \{"event":"started"/g)).toHaveLength(1);
  expect(log).toMatch(/\[coordinator\] \{"event":"started".*"curve":true/);
  expect(tasks[0].WAVEBUS_COORDINATOR).toBe(`${log.match(/"pub":"tcp:\/\/([^:"]+):\d+"/)![1]}:${port}`);
  expect(log.match(/wavebus ready; starting the command/g)).toHaveLength(TASKS);
  // Every sim rank ran all its steps, as the rank its task's SLURM_PROCID says.
  for (let p = 0; p < TASKS; p++) {
    const res = JSON.parse(fs.readFileSync(path.join(job, 'ranks', `rank${p}.json`), 'utf8'));
    expect({ rank: res.rank, steps: res.steps }).toEqual({ rank: p, steps: 30 });
  }

  // The dump: `wavebus inspect --verify` passes on the whole report tree.
  const inspect = runWavebus(['inspect', '--verify', '--json', report]);
  if (inspect.code !== 0) throw new Error(`inspect --verify exited ${inspect.code}: ${inspect.stdout.slice(-3000)}${inspect.stderr}`);
  const tree = JSON.parse(inspect.stdout);
  expect(tree.problems).toEqual([]);
  const waves = tree.bundles.filter((b: { kind: string }) => b.kind === 'dump_wave');
  expect(waves.length).toBeGreaterThanOrEqual(1);
  const waveDir = path.join(report, waves[0].dir);
  const manifest = JSON.parse(fs.readFileSync(path.join(waveDir, 'manifest.json'), 'utf8'));
  // The last PP stage's TP ranks (global 2 and 3, the tasks with SLURM_PROCID 2 and 3), and no other.
  expect(manifest).toMatchObject({ incident_type: 'logits_finite', expected_ranks: [2, 3], completed_ranks: [2, 3], missing_ranks: [], complete: true });
  // The seed's rank dirs: global 2 and 3 are dp0_tp0_pp1_cp0 and dp0_tp1_pp1_cp0.
  expect(fs.readdirSync(waveDir).filter(isKvRankDirName).sort()).toEqual(['dp0_tp0_pp1_cp0', 'dp0_tp1_pp1_cp0']);
  for (const g of [2, 3]) {
    const dumpInfo = JSON.parse(fs.readFileSync(path.join(waveDir, `dp0_tp${g % 2}_pp1_cp0`, 'dump.json'), 'utf8'));
    expect(dumpInfo.identity).toMatchObject({ global_rank: g, tp_rank: g % 2, pp_rank: 1, dp_rank: 0, tp_size: 2, pp_size: 2, host: os.hostname() });
    // The bytes are those of the engine process of SLURM_PROCID g (the sim fills its pool by its global rank).
    // The last stage holds its own layers (the sim splits them: layer l is stage floor(l * pp / layers)).
    for (let l = 0; l < G.layers; l++) {
      if (Math.floor((l * 2) / G.layers) !== 1) continue;
      const file = path.join(waveDir, `dp0_tp${g % 2}_pp1_cp0`, `model.layers.${l}.self_attn.pt`);
      const pt = readPt(file);
      for (const [i, kv] of (['k', 'v'] as const).entries()) {
        const t = pt.tensors[i];
        const want = Buffer.concat(dumpInfo.block_ids.map((b: number) => kvBlockBytes(G, l, kv, b, g)));
        expect(readRange(file, t.dataOffset, t.nbytes).equals(want)).toBe(true);
      }
    }
  }
  // The report names the request and the incident.
  expect(fs.readdirSync(path.join(report, 'logits_finite')).some((f) => f.includes(manifest.req_id))).toBe(true);
}, 180000);

