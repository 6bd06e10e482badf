// Issue #34's measurements, run tiny: `bench overhead` with the seed's path as a same-run baseline
// (a real gloo group of Python ranks), the host's sidecar CPU per wave, system calls per wave by
// strace; `bench bus` against one bare subscriber; `bench soak` with its sidecar CPU per wave. The
// JSON's shape and sanity are checked (the collectives really ran, CPU > 0, ratios positive), never
// a speed: the figures live in docs/benchmarks.md.
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { PYTHON, runWavebus } from './helpers';
import { syscallTime } from '../bench/lib/overhead-probes';

jest.setTimeout(300000);

const STRACE = '/usr/bin/strace';
const tmpDirs = (prefix: string) => fs.readdirSync(os.tmpdir()).filter((d) => d.startsWith(prefix)).sort();

function bench(args: string[], timeout = 280000): Record<string, any> {
  const r = runWavebus(['bench', ...args, '--json'], { timeout });
  expect({ code: r.code, stderr: r.code === 0 ? '' : r.stderr.slice(-3000) }).toEqual({ code: 0, stderr: '' });
  return JSON.parse(r.stdout.trim().split('\n').pop()!);
}

describe('bench overhead: the seed baseline, sidecar CPU and system calls per wave', () => {
  test('one tiny round: every ratio beside the seed, the seed ran its collectives, CPU and syscalls per wave measured, nothing left behind', () => {
    const before = tmpDirs('wavebus-bench-overhead-');
    const steps = 60;
    const out = bench(['overhead', '--ranks', '2', '--steps', String(steps), '--rounds', '1', '--forward-ms', '3', '--cpu-by-process', '--syscalls', '--syscall-waves', '20']);
    expect(out).toMatchObject({ bench: 'overhead', ranks: 2, steps });
    expect(out.target).toMatchObject({ off_ratio: 0.995, detectors_ratio: 0.97, detectors_ratio_1ms: 0.9, sidecar_syscalls_per_wave_tp8: 30 });

    // The seed's path: every rank completed one gloo broadcast and one broadcast_object_list per
    // step, TP0 alone ran the detectors each step; the absent Python engine ran none.
    const seed = out.seed_baseline;
    expect(seed.collectives).toEqual({ broadcasts: [steps, steps], broadcast_objects: [steps, steps], detector_runs: [steps, 0] });
    expect(seed.rounds).toBe(1);
    expect(seed.absent_steps_per_s).toBeGreaterThan(0);
    expect(seed.seed_steps_per_s).toBeGreaterThan(0);
    expect(seed.ratio).toBeCloseTo(seed.seed_steps_per_s / seed.absent_steps_per_s, 2);
    // The seed's ranks pay the collectives and the detectors in their own CPU.
    expect(seed.rank_cpu_us_per_step.seed).toBeGreaterThan(seed.rank_cpu_us_per_step.absent);
    expect(out.side_by_side).toEqual({ wavebus_off: out.median_off_ratio, wavebus_detectors: out.median_detectors_ratio, seed: seed.median_ratio });
    for (const r of Object.values(out.side_by_side) as number[]) expect(r).toBeGreaterThan(0);

    // The host's sidecar: coordinator and two agents when attached, nothing when absent.
    const cpu = out.sidecar_cpu_us_per_wave;
    expect(cpu.absent).toMatchObject({ sidecar: 0, processes: 0 });
    for (const m of ['off', 'on']) {
      expect(cpu[m].processes).toBe(3);
      expect(cpu[m].sidecar).toBeGreaterThan(0);
      expect(cpu[m].engine).toBeGreaterThan(0);
    }
    const sidecarSum = Object.entries(out.cpu_us_per_step_by_process.on as Record<string, Record<string, number>>)
      .filter(([name]) => /^(coordinator|agent)( #\d+)?$/.test(name))
      .reduce((a, [, threads]) => a + Object.values(threads).reduce((x, y) => x + y, 0), 0);
    expect(cpu.on.sidecar).toBe(sidecarSum);

    if (fs.existsSync(STRACE)) {
      const sc = out.syscalls;
      expect(sc.skipped).toBeUndefined();
      expect(sc.waves).toBeGreaterThanOrEqual(20);
      expect(Object.keys(sc.by_process_per_wave)).toEqual(expect.arrayContaining(['coordinator', 'agent', 'agent #2', 'sim-rank', 'sim-rank #2']));
      expect(sc.sidecar_per_wave).toBeCloseTo(sc.by_process_per_wave.coordinator + sc.by_process_per_wave.agent + sc.by_process_per_wave['agent #2'], 0);
      expect(sc.sidecar_per_wave).toBeGreaterThan(0);
    } else {
      expect(out.syscalls).toEqual({ skipped: 'strace not installed' });
    }
    expect(tmpDirs('wavebus-bench-overhead-')).toEqual(before);
  });

  test("a real strace -ttt trace's calls are read with their times, and garbage reads as none", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-test-strace-'));
    try {
      if (!fs.existsSync(STRACE)) return expect(syscallTime('')).toBeNull();
      const file = path.join(dir, 'c.txt');
      expect(spawnSync(STRACE, ['-f', '-ttt', '-o', file, process.execPath, '-e', '0'], { stdio: 'ignore' }).status).toBe(0);
      const lines = fs.readFileSync(file, 'utf8').split('\n');
      const times = lines.map(syscallTime).filter((t): t is number => t !== null);
      expect(times.length).toBeGreaterThan(10);
      expect(times.every((t) => Math.abs(t - Date.now()) < 60000)).toBe(true);
      expect(lines.filter((l) => l.includes('resumed>')).map(syscallTime).every((t) => t === null)).toBe(true);
      expect(syscallTime('not a strace line')).toBeNull();
      expect(syscallTime('')).toBeNull();
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('seed_guard.py refuses a mode it does not know', () => {
    const r = spawnSync(PYTHON, [path.join(__dirname, '..', 'bench', 'seed_guard.py'), 'guarded', '2', '1', '1', '0', '0', '1', '1'], { encoding: 'utf8', timeout: 60000 });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain("MODE must be absent or seed, got 'guarded'");
  });
});

describe('bench bus and soak: the floor of one subscriber, the sidecar CPU per wave', () => {
  test('bus: the wave path against one bare subscriber in the same run', () => {
    const out = bench(['bus', '--agents', '2', '--waves', '40', '--rounds', '1', '--no-baseline'], 120000);
    expect(out).toMatchObject({ agents: 2, lost: 0, bare_one_lost: 0, target: { ratio_p50_bare_one: 1.0, ratio_p99_bare_one: 1.5 } });
    expect(out.round_p50_us.bare_one).toHaveLength(1);
    expect(out.bare_one_p50_us).toBeGreaterThan(0);
    expect(out.ratio_p50_bare_one).toBeCloseTo(out.p50_us / out.bare_one_p50_us, 2);
    expect(out.ratio_p99_bare_one).toBeCloseTo(out.p99_us / out.bare_one_p99_us, 2);
  });

  test('soak: nothing lost, and the sidecar CPU per wave is in its JSON', () => {
    const out = bench(['soak', '--agents', '2', '--dp', '2', '--waves', '60', '--dump-every', '30'], 180000);
    expect(out).toMatchObject({ pass: true, lost_waves: 0 });
    expect(out.sidecar_cpu_us_per_wave).toBeGreaterThan(0);
  });
});
