// `wavebus bench overhead`: the simulated engine's steps/s with wavebus absent, attached with
// everything off, and attached with every detector on, measured in one run and given as ratios
// to the absent baseline. Each step waits `--forward-ms` (the forward on the accelerator, CPU
// idle) and spins `--compute-us` (the engine's host-side work). By default two requests arrive
// every step for the whole run, so the detectors always have a batch (about 40 running requests
// once the KV pool is full, a prefill step about every third step). The TP ranks meet once per
// step (the sim's stand-in for the all-reduce) in every mode, absent included. The CPU of each
// run's process tree (GNU time) is reported too: it moves far less with the host's load.
// --rank-divergence (Python engine) adds a fourth mode: every detector and rank_divergence on,
// each engine rank writing its digests every step.
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import type { BenchArgs, BenchFlags } from './lib/flags';
import { offPathCost } from './lib/off-path';
import { sidecarCpu } from './lib/overhead-probes';
import { cpuWindowRun, type CpuWindow } from './lib/cpu-window';
import { syscallsPerWave } from './lib/overhead-syscalls';
import { seedAvailable, seedRun, type SeedRun } from './lib/seed-baseline';
import { packageRoot } from '../src/paths';
import { ConfigError } from '../src/errors';
import { freePort } from '../src/bus/ports';
import { digestCounts, type DigestCounts } from './lib/rank-digest-counts';

const PY = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

const BIN = path.resolve(__dirname, '..', '..', 'bin', 'wavebus.js');

/** GNU time: the CPU seconds of a run's whole process tree (launcher, coordinator, agents, engine ranks). */
const TIME = '/usr/bin/time';

/** Exit code, and the CPU seconds (user + system) of the run's process tree when GNU time is there (else NaN). */
function runCli(args: string[], env: NodeJS.ProcessEnv, cpuFile: string, onSpawn?: (pid: number) => void, bare = false): Promise<{ code: number; cpuS: number }> {
  return new Promise((resolve) => {
    const timed = fs.existsSync(TIME);
    // bare: `args` is a whole command line (the Python engine without wavebus), not a wavebus command.
    const argv = bare ? args.slice(1) : [BIN, ...args];
    const exe = bare ? args[0] : process.execPath;
    const child = timed
      ? spawn(TIME, ['-f', '%U %S', '-o', cpuFile, exe, ...argv], { env, stdio: ['ignore', 'ignore', 'pipe'] })
      : spawn(exe, argv, { env, stdio: ['ignore', 'ignore', 'pipe'] });
    if (child.pid !== undefined) onSpawn?.(child.pid);
    let err = '';
    child.stderr.on('data', (b) => (err = (err + b.toString()).slice(-4000)));
    child.on('exit', (code) => {
      if (code !== 0) process.stderr.write(`bench overhead: ${args.slice(0, 2).join(' ')} exited ${code}: ${err}\n`);
      let cpuS = NaN;
      if (timed) {
        const [u, sys] = (fs.existsSync(cpuFile) ? fs.readFileSync(cpuFile, 'utf8') : '').trim().split('\n').pop()!.split(' ').map(Number);
        if (Number.isFinite(u) && Number.isFinite(sys)) cpuS = u + sys;
      }
      resolve({ code: code ?? 1, cpuS });
    });
  });
}

interface RunStats {
  rate: number;
  /** The same after the first fifth of the steps (the sidecar's and the engine's warm-up left out). */
  steadyRate: number;
  /** Fraction of end_of_wave calls that slept on the mailbox (a vector not there yet). */
  waitedFraction: number;
  /** The same on TP0 alone. The simulated TP ranks step in lockstep (src/sim/tp-barrier.ts, the
   *  stand-in for the forward's all-reduce), in every mode, so no rank runs ahead of TP0's head. */
  tp0WaitedFraction: number;
  /** The worst rank's 99th percentile µs inside end_of_wave. */
  endOfWaveP99Us: number;
  lateVectors: number;
  timeouts: number;
  /** Fraction of end_of_wave calls over 250 µs (any build that reports per-step times). */
  slowFraction: number;
  /** Mean over ranks: µs per step inside the client's calls, the engine process's own CPU per
   *  step, and how far the forward's idle wait overran its length (the engine woken late). */
  clientUs: number;
  rankCpuUs: number;
  overrunUs: number;
  /** The Python engine's TP0: wave heads its client sent, and those through the telemetry ring. */
  headsSent?: number;
  ringHeads?: number;
  /** The Python engine's TP0 with --rank-digest: waves whose input digest went into the decision ring. */
  digestWaves?: number;
}

function readRun(dir: string): RunStats {
  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.json'));
  if (files.length === 0) throw new Error(`no rank results in ${dir}`);
  const rs = files.map((f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')) as Record<string, number>);
  const sum = (k: string) => rs.reduce((a, r) => a + (r[k] ?? 0), 0);
  return {
    rate: sum('stepsPerSec') / rs.length,
    steadyRate: sum('steadyStepsPerSec') / rs.length,
    // Older builds report no vectorWaits: NaN, so a figure is never made up.
    waitedFraction: rs.every((r) => r.vectorWaits !== undefined) ? sum('vectorWaits') / sum('steps') : NaN,
    tp0WaitedFraction: rs.find((r) => r.rank === 0)?.vectorWaits !== undefined ? rs.find((r) => r.rank === 0)!.vectorWaits / rs.find((r) => r.rank === 0)!.steps : NaN,
    endOfWaveP99Us: rs.every((r) => r.endOfWaveP99Us !== undefined) ? Math.max(...rs.map((r) => r.endOfWaveP99Us)) : NaN,
    lateVectors: sum('lateVectors'),
    slowFraction: rs.every((r) => r.slowEndOfWaves !== undefined) ? sum('slowEndOfWaves') / sum('steps') : NaN,
    timeouts: sum('endOfWaveTimeouts'),
    clientUs: sum('clientUsPerStep') / rs.length,
    rankCpuUs: sum('cpuUsPerStep') / rs.length,
    overrunUs: sum('forwardOverrunUsPerStep') / rs.length,
    headsSent: rs.find((r) => r.rank === 0)?.waveHeadsSent,
    ringHeads: rs.find((r) => r.rank === 0)?.ringHeads,
    digestWaves: rs.find((r) => r.rank === 0)?.digestWaves,
  };
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fixed = (x: number, d: number): number | null => (Number.isFinite(x) ? Number(x.toFixed(d)) : null);

export const summary = "The simulated engine's steps/s with wavebus absent, attached with everything off, and attached with every detector on (--rank-divergence: and rank_divergence with it), as ratios to the absent baseline, in one run.";
export const flags = {
  engine: { type: 'string', default: 'sim', choices: ['sim', 'python'], describe: "the engine: sim (the simulated engine, TypeScript, about 40 running requests) or python (bench/overhead_engine.py: wavebus_client's tensor path at --running requests, a gloo all_reduce per step)" },
  running: { type: 'int', default: 1024, min: 1, describe: "--engine python: running requests per step (the seed baseline's rows follow it)" },
  ranks: { type: 'int', default: 2, describe: 'engine ranks (= agents), one TP group' },
  steps: { type: 'int', default: 1500, describe: 'engine steps per run' },
  'forward-ms': { type: 'int', default: 3, min: 0, describe: 'idle wait per step: the forward runs on the accelerator' },
  'compute-us': { type: 'int', default: 200, min: 0, describe: "CPU work per step: the engine's own host-side work" },
  // The off path costs a few µs per step, below this VM's run-to-run noise (±1.5 %): the best of
  // five interleaved rounds per mode finds each mode's undisturbed rate more reliably than three.
  rounds: { type: 'int', default: 5, describe: 'interleaved rounds; the best of each mode is kept' },
  requests: { type: 'int', describe: 'requests in the workload (default: two arrive every step, 2 x steps)' },
  'lookahead-waves': { type: 'int', min: 1, describe: "the coordinator's --lookahead-waves (default: the coordinator's default)" },
  'cpu-by-process': { type: 'boolean', default: false, describe: "also report each process's CPU per step, by thread (scripts/cpu-by-process.js preloaded into every node process), and the host's sidecar total per wave" },
  'seed-baseline': { type: 'boolean', default: true, describe: "also run the seed's path each round (bench/seed_guard.py: a gloo broadcast of the due vector on the TP group and the detectors in Python, against the same Python engine without it); skipped with a reason when /usr/bin/python3 lacks torch" },
  'seed-rows': { type: 'int', default: 40, describe: "the seed baseline's running requests (token_repeat's rows, the logits' rows)" },
  'seed-vocab': { type: 'int', default: 1024, describe: "the width of the seed baseline's logits (torch.isfinite runs on the CPU here, on the accelerator in the seed)" },
  syscalls: { type: 'boolean', default: false, describe: 'after the rounds, one more detectors-on run with strace attached to each process for --syscall-waves waves: system calls per wave by process (not in the ratios)' },
  'syscall-waves': { type: 'int', default: 300, describe: "the strace window's length in waves (after 50 waves of warm-up; at most 180 s)" },
  'cpu-window': { type: 'boolean', default: false, describe: "after the rounds, one off and one detectors-on run: each process's CPU per wave inside a window of the steady state (from /proc schedstat, start-up and exit left out; the waves are rank 0's steps inside it), the host's sidecar together" },
  'rank-divergence': { type: 'boolean', default: false, describe: "--engine python: a fourth mode in each round and in --cpu-window, every detector and rank_divergence on, each engine rank writing its digests every step (decided_inputs at before_forward, decided after the forward; the same columns on every rank, so the waves agree): its steps/s ratio, its sidecar CPU per wave beside detectors on, and (with --cpu-window) the waves the coordinator compared, from its /metrics" },
  'cpu-window-s': { type: 'int', default: 5, describe: "the CPU window's length in seconds, from the end of the engine's 200th step (sampled for 12 s more than this)" },
} satisfies BenchFlags;

/** µs of CPU per step by process (its command) and thread kind, from scripts/cpu-by-process.js lines. */
function cpuByProcess(file: string, steps: number): Record<string, Record<string, number>> {
  const out: Record<string, Record<string, number>> = {};
  const seen: Record<string, number> = {};
  for (const line of fs.existsSync(file) ? fs.readFileSync(file, 'utf8').split('\n') : []) {
    if (!line) continue;
    const r = JSON.parse(line) as { cmd: string; threads: Record<string, number> };
    // Several agents and ranks: numbered in the order they exited.
    const name = `${r.cmd}${(seen[r.cmd] = (seen[r.cmd] ?? 0) + 1) > 1 ? ` #${seen[r.cmd]}` : ''}`;
    out[name] = Object.fromEntries(Object.entries(r.threads).map(([t, us]) => [t, Math.round(us / steps)]));
  }
  return out;
}

export async function run(a: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  const requests = a.requests ?? 2 * a.steps;
  const port = 20000 + (process.pid % 20000);
  if (a.engine === 'python' && a.syscalls) throw new ConfigError('--syscalls: the strace window counts the simulated engine\'s waves; use it with --engine sim');
  if (a.engine !== 'python' && a['rank-divergence']) throw new ConfigError('--rank-divergence: the simulated engine writes no rank digests; use it with --engine python');
  // After the refusals: a refused run leaves no temp dir behind.
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-bench-overhead-'));
  const pyPort = a.engine === 'python' ? await freePort() : 0;
  const engineCmd = (resultDir: string, extra: string[], steps: number): string[] => {
    const stop = extra.indexOf('--stop-file');
    return [PY, path.join(packageRoot(), 'bench', 'overhead_engine.py'), '--running', String(a.running), '--steps', String(steps),
      '--forward-ms', String(a['forward-ms']), '--compute-us', String(a['compute-us']), '--port', String(pyPort), '--result-dir', resultDir,
      '--nproc', String(a.ranks), ...(extra.includes('--detached') ? ['--detached'] : []), ...(stop >= 0 ? ['--stop-file', extra[stop + 1]] : []),
      ...(extra.includes('--step-times') ? ['--step-times'] : []), ...(extra.includes('--rank-digest') ? ['--rank-digest'] : [])];
  };
  const sim = (resultDir: string, extra: string[] = [], steps = a.steps) => a.engine === 'python' ? engineCmd(resultDir, extra, steps) : [
    'sim', '--steps', String(steps), '--step-ms', '0', '--compute-us', String(a['compute-us']), '--forward-ms', String(a['forward-ms']),
    '--requests', String(requests), '--result-dir', resultDir, '--nproc-per-node', String(a.ranks), ...extra,
  ];
  const launch = (config: string, cmd: string[], metricsPort?: number) => [
    'launch', '--nproc-per-node', String(a.ranks), '--tp', String(a.ranks), '--port', String(port),
    ...(metricsPort !== undefined ? ['--metrics-port', String(metricsPort)] : []),
    `--coordinator-arg=--runtime-config-path`, `--coordinator-arg=${config}`,
    ...(a['lookahead-waves'] !== undefined ? [`--coordinator-arg=--lookahead-waves=${a['lookahead-waves']}`] : []),
    // startup writes defaults <- overlay to the live file (seed): the mode's config is the overlay
    `--coordinator-arg=--additional-config`, `--coordinator-arg=${JSON.stringify({ runtime_config: JSON.parse(fs.readFileSync(config, 'utf8')) })}`,
    '--', ...(a.engine === 'python' ? cmd : [process.execPath, BIN, ...cmd]),
  ];
  const offConfig = path.join(work, 'off', 'config', 'runtime_config.json');
  const onConfig = path.join(work, 'on', 'config', 'runtime_config.json');
  fs.mkdirSync(path.dirname(offConfig), { recursive: true });
  fs.mkdirSync(path.dirname(onConfig), { recursive: true });
  fs.writeFileSync(offConfig, '{}\n');
  const on = { enabled: true };
  const detectorsOn = { token_repeat: on, logits_finite: on, spec_acceptance: on, garbled: on };
  fs.writeFileSync(onConfig, JSON.stringify({ detector: detectorsOn }));
  const digestConfig = path.join(work, 'digest', 'config', 'runtime_config.json');
  fs.mkdirSync(path.dirname(digestConfig), { recursive: true });
  fs.writeFileSync(digestConfig, JSON.stringify({ detector: { ...detectorsOn, rank_divergence: on } }));
  const modes = ['absent', 'off', 'on', ...(a['rank-divergence'] ? ['digest'] : [])] as Mode[];
  const configOf = (mode: Exclude<Mode, 'absent'>) => ({ off: offConfig, on: onConfig, digest: digestConfig })[mode];
  /** The engine's own flags per mode: only `digest` writes rank digests. */
  const modeExtra = (mode: Mode, extra: string[] = []) => (mode === 'digest' ? [...extra, '--rank-digest'] : extra);
  const env: NodeJS.ProcessEnv = { ...process.env, WAVEBUS_LOG_LEVEL: 'error', PYTHONPATH: path.join(packageRoot(), 'clients', 'python'), OMP_NUM_THREADS: '1' };
  const best = { absent: 0, off: 0, on: 0, digest: 0 };
  const runs: Record<Mode, RunStats[]> = { absent: [], off: [], on: [], digest: [] };
  /** CPU µs per step of each run's whole process tree (start-up included). */
  const cpu: Record<Mode, number[]> = { absent: [], off: [], on: [], digest: [] };
  /** With --cpu-by-process: the last round's per-process CPU per step, by mode. */
  const byProcess: Record<string, Record<string, Record<string, number>>> = {};
  const seedRows = a.engine === 'python' ? a.running : a['seed-rows'];
  const seedShape = { ranks: a.ranks, steps: a.steps, forwardMs: a['forward-ms'], computeUs: a['compute-us'], rows: seedRows, vocab: a['seed-vocab'] };
  const seedOk = a['seed-baseline'] && (await seedAvailable());
  const seedRuns: { absent: SeedRun[]; seed: SeedRun[] } = { absent: [], seed: [] };
  let syscalls: Record<string, unknown> | undefined;
  const steadyCpu: Record<string, CpuWindow> = {};
  let digestWaves: DigestCounts | undefined;
  try {
    for (let round = 0; round < a.rounds; round++) {
      for (const mode of modes) {
        const dir = path.join(work, `r${round}-${mode}`);
        const cpuFile = path.join(work, `r${round}-${mode}.cpu`);
        const procFile = path.join(work, `r${round}-${mode}.procs`);
        const runEnv = a['cpu-by-process']
          ? { ...env, NODE_OPTIONS: `${env.NODE_OPTIONS ?? ''} --require ${path.join(packageRoot(), 'scripts', 'cpu-by-process.js')}`.trim(), WAVEBUS_CPU_BY_PROCESS: procFile }
          : env;
        const { code, cpuS } =
          mode === 'absent'
            ? await runCli(sim(dir, ['--detached']), runEnv, cpuFile, undefined, a.engine === 'python')
            : await runCli(launch(configOf(mode), sim(dir, modeExtra(mode))), runEnv, cpuFile);
        if (a['cpu-by-process']) byProcess[mode] = cpuByProcess(procFile, a.steps);
        if (code !== 0) throw new Error(`${mode} run failed (exit ${code})`);
        const r = readRun(dir);
        runs[mode].push(r);
        cpu[mode].push((cpuS * 1e6) / a.steps);
        best[mode] = Math.max(best[mode], r.rate);
      }
      // The seed's path in the same round, on its own Python engine with and without it.
      if (seedOk) for (const m of ['absent', 'seed'] as const) seedRuns[m].push(await seedRun(m, seedShape));
    }
    if (a['cpu-window']) {
      for (const mode of modes.filter((m) => m !== 'absent') as Exclude<Mode, 'absent'>[]) {
        const dir = path.join(work, `window-${mode}`);
        fs.mkdirSync(dir, { recursive: true });
        // rank_divergence's run: the coordinator's /metrics, read once the window is over, says how many waves it compared.
        const metricsPort = mode === 'digest' ? await freePort() : undefined;
        const readCounts = metricsPort !== undefined ? async () => void (digestWaves = await digestCounts(metricsPort)) : undefined;
        steadyCpu[mode === 'digest' ? 'rank_divergence' : mode] = await cpuWindowRun(dir, path.join(dir, 'stop'), (stopFile, onSpawn) => runCli(launch(configOf(mode), sim(dir, modeExtra(mode, ['--stop-file', stopFile, '--step-times']), 1_000_000), metricsPort), env, path.join(dir, 'cpu'), onSpawn), {
          engineRanks: a.ranks, sidecarProcs: a.ranks + 1, warmupS: 12, seconds: a['cpu-window-s'],
        }, readCounts);
      }
    }
    if (a.syscalls) {
      const dir = path.join(work, 'syscalls');
      // Ended by its stop file once the window is over: as long as strace needs, whatever the rate.
      syscalls = await syscallsPerWave(a.ranks, a['syscall-waves'], dir, (stopFile, onSpawn) =>
        runCli(launch(onConfig, sim(dir, ['--stop-file', stopFile], 1_000_000)), env, path.join(work, 'syscalls.cpu'), onSpawn),
      );
    }
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
  // The client's own share of the off ratio, measured in a loop here (no host noise).
  // The TypeScript client's off path (the sim's); the Python client's is `bench client`'s "off" mode.
  const offPath = a.engine === 'sim' ? await offPathCost() : { skipped: 'the Python client: see bench client, mode off' };
  // Per round ratios against that round's absent run (interleaved, so drift hits both), then the median.
  const ratio = (mode: Exclude<Mode, 'absent'>) => median(runs[mode].map((r, i) => r.rate / runs.absent[i].rate));
  const steadyRatio = (mode: Exclude<Mode, 'absent'>) => median(runs[mode].map((r, i) => r.steadyRate / runs.absent[i].steadyRate));
  const onRuns = runs.on;
  return {
    engine: a.engine,
    ranks: a.ranks,
    steps: a.steps,
    ...(a.engine === 'python' ? { running: a.running } : { requests }),
    compute_us: a['compute-us'],
    lookahead_waves: a['lookahead-waves'] ?? null,
    forward_ms: a['forward-ms'],
    absent_steps_per_s: Number(best.absent.toFixed(1)),
    off_steps_per_s: Number(best.off.toFixed(1)),
    detectors_steps_per_s: Number(best.on.toFixed(1)),
    // What wavebus adds to each step, independent of how long the forward is.
    off_us_per_step: Number((1e6 / best.off - 1e6 / best.absent).toFixed(1)),
    detectors_us_per_step: Number((1e6 / best.on - 1e6 / best.absent).toFixed(1)),
    off_ratio: Number((best.off / best.absent).toFixed(4)),
    detectors_ratio: Number((best.on / best.absent).toFixed(4)),
    median_off_ratio: Number(ratio('off').toFixed(4)),
    median_detectors_ratio: Number(ratio('on').toFixed(4)),
    // The same ratios over each run's last four fifths: the steady state a long job lives in (the
    // first fifth holds the sidecar's start-up compilation, which competes for the CPUs).
    median_steady_off_ratio: Number(steadyRatio('off').toFixed(4)),
    median_steady_detectors_ratio: Number(steadyRatio('on').toFixed(4)),
    // Detectors on, every round: the fraction of end_of_wave calls that waited for a late vector
    // (goal 0 with nothing due), the worst rank's p99 µs inside end_of_wave, late vectors and misses.
    detectors_waited_fraction: onRuns.map((r) => fixed(r.waitedFraction, 5)),
    detectors_tp0_waited_fraction: onRuns.map((r) => fixed(r.tp0WaitedFraction, 5)),
    detectors_end_of_wave_p99_us: onRuns.map((r) => fixed(r.endOfWaveP99Us, 1)),
    detectors_slow_end_of_wave_fraction: onRuns.map((r) => fixed(r.slowFraction, 5)),
    detectors_late_vectors: onRuns.map((r) => r.lateVectors),
    detectors_timeouts: onRuns.map((r) => r.timeouts),
    // The Python engine: TP0's heads sent per detectors-on round, and how many went through the ring.
    ...(a.engine === 'python' ? { detectors_heads_sent: onRuns.map((r) => r.headsSent ?? null), detectors_ring_heads: onRuns.map((r) => r.ringHeads ?? null) } : {}),
    // CPU of the whole process tree per step (median of the rounds), and what wavebus adds to it:
    // far less sensitive to this host's load than the rates. Start-up is included (spread over --steps).
    cpu_us_per_step: { absent: fixed(median(cpu.absent), 1), off: fixed(median(cpu.off), 1), on: fixed(median(cpu.on), 1) },
    off_cpu_us_per_step_added: fixed(median(cpu.off.map((c, i) => c - cpu.absent[i])), 1),
    detectors_cpu_us_per_step_added: fixed(median(cpu.on.map((c, i) => c - cpu.absent[i])), 1),
    // Where a step's time goes, per mode (median over rounds, mean over ranks): µs inside the
    // client's calls, the engine process's CPU, and the forward's wake-up overrun.
    per_step_us: Object.fromEntries(
      (['absent', 'off', 'on'] as const).map((m) => [
        m,
        { client: fixed(median(runs[m].map((r) => r.clientUs)), 1), rank_cpu: fixed(median(runs[m].map((r) => r.rankCpuUs)), 1), forward_overrun: fixed(median(runs[m].map((r) => r.overrunUs)), 1) },
      ]),
    ),
    // With everything off, the client's calls of one step in a tight loop (best of 3 x 200 000):
    // what the engine pays per step, against the ±3 % spread of the rates on a busy host.
    off_path: offPath,
    ...(a['cpu-by-process'] ? { cpu_us_per_step_by_process: byProcess, sidecar_cpu_us_per_wave: sidecarByMode(byProcess) } : {}),
    // The comparison a user makes: each path's steps/s against its own engine without it, same run.
    ...(seedOk ? { side_by_side: { wavebus_off: Number(ratio('off').toFixed(4)), wavebus_detectors: Number(ratio('on').toFixed(4)), seed: seedSummary(seedRuns, median).median_ratio } } : {}),
    seed_baseline: seedOk ? seedSummary(seedRuns, median) : { skipped: a['seed-baseline'] ? `${'/usr/bin/python3'} has no torch with gloo` : '--no-seed-baseline' },
    ...(syscalls ? { syscalls } : {}),
    // µs of CPU per wave in the steady state, start-up left out (--cpu-window).
    ...(a['cpu-window'] ? { steady_cpu_us_per_wave: steadyCpu } : {}),
    ...(a['rank-divergence'] ? rankDivergenceFields(runs, best, ratio, steadyRatio, digestWaves) : {}),
    target: { off_ratio: 0.995, detectors_ratio: 0.97, detectors_ratio_1ms: 0.9, sidecar_syscalls_per_wave_tp8: 30, waited_fraction: 0 },
  };
}

type Mode = 'absent' | 'off' | 'on' | 'digest';

/** --rank-divergence: its mode's rates beside detectors on, TP0's digests written, the coordinator's compared waves. */
function rankDivergenceFields(runs: Record<Mode, RunStats[]>, best: Record<Mode, number>, ratio: (m: Exclude<Mode, 'absent'>) => number, steadyRatio: (m: Exclude<Mode, 'absent'>) => number, waves: DigestCounts | undefined): Record<string, unknown> {
  return {
    rank_divergence: {
      steps_per_s: Number(best.digest.toFixed(1)),
      median_ratio: Number(ratio('digest').toFixed(4)),
      median_steady_ratio: Number(steadyRatio('digest').toFixed(4)),
      // Against detectors on in the same rounds: what the detector adds beyond the others.
      median_ratio_to_detectors: Number(median(runs.digest.map((r, i) => r.rate / runs.on[i].rate)).toFixed(4)),
      client_us_per_step: fixed(median(runs.digest.map((r) => r.clientUs)), 1),
      // TP0's waves whose digests went into its decision ring, per round (0: the feature bit never came).
      digest_waves: runs.digest.map((r) => r.digestWaves ?? null),
      // With --cpu-window: the coordinator's count of that run's waves by result.
      ...(waves ? { compared_waves: waves } : {}),
    },
  };
}

/** The host's sidecar CPU per wave by mode (last round, start-up included), from the by-process lines. */
function sidecarByMode(byProcess: Record<string, Record<string, Record<string, number>>>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(byProcess).map(([mode, procs]) => [mode, sidecarCpu(procs)]));
}

/** The seed baseline's figures: its ratio to its own absent engine per round (median), and the proof it ran. */
function seedSummary(runs: { absent: SeedRun[]; seed: SeedRun[] }, median: (xs: number[]) => number): Record<string, unknown> {
  const ratio = (k: 'steps_per_s' | 'steady_steps_per_s') => Number(median(runs.seed.map((r, i) => r[k] / runs.absent[i][k])).toFixed(4));
  const best = (rs: SeedRun[]) => Math.max(...rs.map((r) => r.steps_per_s));
  const last = runs.seed[runs.seed.length - 1];
  return {
    absent_steps_per_s: Number(best(runs.absent).toFixed(1)),
    seed_steps_per_s: Number(best(runs.seed).toFixed(1)),
    ratio: Number((best(runs.seed) / best(runs.absent)).toFixed(4)),
    median_ratio: ratio('steps_per_s'),
    median_steady_ratio: ratio('steady_steps_per_s'),
    rank_cpu_us_per_step: { absent: Number(median(runs.absent.map((r) => r.cpu_us_per_step)).toFixed(1)), seed: Number(median(runs.seed.map((r) => r.cpu_us_per_step)).toFixed(1)) },
    // The last seed round, per rank: the gloo collectives each completed (one broadcast and one
    // broadcast_object_list per step) and TP0's detector passes.
    collectives: { broadcasts: last.broadcasts, broadcast_objects: last.broadcast_objects, detector_runs: last.detector_runs },
    rounds: runs.seed.length,
  };
}
