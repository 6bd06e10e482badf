// `wavebus bench overhead --engine python`, run tiny: a forked Python TP group (bench/overhead_engine.py)
// on wavebus_client's tensor path at N running requests, absent / off / detectors on, the seed's
// path at the same rows, and the sidecar's CPU per wave in a steady window (--cpu-window). The
// JSON's shape and sanity are checked (every mode stepped, TP0's heads went to the agent, the seed
// ran its collectives, CPU > 0 by process), never a speed: the figures live in docs/benchmarks.md.
// --rank-divergence: the fourth mode's digests written and compared (agreed waves from the
// coordinator's /metrics) and its sidecar CPU per wave.
import * as fs from 'fs';
import { cleanup, runWavebus, tmpDir } from './helpers';

afterAll(cleanup);
jest.setTimeout(300000);

test('bench overhead --engine python --running 256: every mode steps, heads reach the agent, the seed and the CPU window ran, nothing left behind', () => {
  // The bench's own temp dirs go under this test's (TMPDIR): another bench running on the host
  // neither adds to nor takes from what is checked as left behind.
  const tmp = tmpDir('wavebus-bench-py-');
  const steps = 60;
  const r = runWavebus(['bench', 'overhead', '--engine', 'python', '--running', '256', '--steps', String(steps), '--rounds', '1', '--cpu-window', '--cpu-window-s', '2', '--json'], { timeout: 280000, env: { ...process.env, TMPDIR: tmp } });
  expect({ code: r.code, stderr: r.code === 0 ? '' : r.stderr.slice(-3000) }).toEqual({ code: 0, stderr: '' });
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  expect(out).toMatchObject({ bench: 'overhead', engine: 'python', ranks: 2, steps, running: 256 });
  for (const k of ['absent_steps_per_s', 'off_steps_per_s', 'detectors_steps_per_s']) expect([k, out[k] > 0]).toEqual([k, true]);
  // TP0 sent its heads on the tensor path (the agent answered within its bound on nearly every step).
  expect(out.detectors_heads_sent[0]).toBeGreaterThan(0.9 * steps);
  expect(out.detectors_ring_heads[0]).toBeGreaterThan(0);
  // The seed's path at the same rows: one broadcast and one broadcast_object_list per step on each rank.
  if (out.seed_baseline.skipped === undefined) {
    expect(out.seed_baseline.collectives).toEqual({ broadcasts: [steps, steps], broadcast_objects: [steps, steps], detector_runs: [steps, 0] });
  }
  // The steady window: both engine ranks and every sidecar process measured, per wave.
  for (const mode of ['off', 'on']) {
    const w = out.steady_cpu_us_per_wave[mode];
    expect(w.waves).toBeGreaterThan(0);
    expect(Object.keys(w.byProcess)).toEqual(expect.arrayContaining(['py-rank', 'py-rank #2', 'coordinator', 'agent', 'agent #2']));
    expect(w.engine).toBeGreaterThan(0);
  }
  expect(out.steady_cpu_us_per_wave.on.sidecar).toBeGreaterThan(0);
  // Without --rank-divergence no fourth mode runs.
  expect([out.rank_divergence, out.steady_cpu_us_per_wave.rank_divergence]).toEqual([undefined, undefined]);
  expect(fs.readdirSync(tmp)).toEqual([]);
});

test('bench overhead --engine python --rank-divergence: the ranks write digests every step, the coordinator compares them and they agree, the sidecar CPU per wave is reported beside detectors on', () => {
  const tmp = tmpDir('wavebus-bench-py-rd-');
  const steps = 60;
  const r = runWavebus(['bench', 'overhead', '--engine', 'python', '--running', '256', '--steps', String(steps), '--rounds', '1', '--no-seed-baseline', '--cpu-window', '--cpu-window-s', '2', '--rank-divergence', '--json'], { timeout: 280000, env: { ...process.env, TMPDIR: tmp } });
  expect({ code: r.code, stderr: r.code === 0 ? '' : r.stderr.slice(-3000) }).toEqual({ code: 0, stderr: '' });
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  const rd = out.rank_divergence;
  expect(rd.steps_per_s).toBeGreaterThan(0);
  expect(rd.median_ratio).toBeGreaterThan(0);
  // TP0 wrote its digests into the decision ring on nearly every step of the round (the first
  // steps may come before its agent's hello gave the ring).
  expect(rd.digest_waves[0]).toBeGreaterThan(0.8 * steps);
  // The coordinator compared the window run's waves: every rank wrote the same columns, so none
  // diverged. A wave one rank wrote and the other did not (its first waves, before its agent's
  // hello gave it the ring; a ring that moved on while a starved agent slept) is unknown, never
  // divergent: allowed, but the waves compared are mostly agreed.
  const w = rd.compared_waves;
  expect(w.agreed).toBeGreaterThan(100);
  expect(w.diverged).toBe(0);
  expect(w.partial + w.unknown).toBeLessThan(w.agreed / 4);
  // Its steady window beside detectors on: every sidecar process measured per wave.
  for (const mode of ['on', 'rank_divergence']) {
    const w = out.steady_cpu_us_per_wave[mode];
    expect(w.waves).toBeGreaterThan(0);
    expect(Object.keys(w.byProcess)).toEqual(expect.arrayContaining(['py-rank', 'py-rank #2', 'coordinator', 'agent', 'agent #2']));
    expect(w.sidecar).toBeGreaterThan(0);
  }
  expect(fs.readdirSync(tmp)).toEqual([]);
});

test('bench overhead --rank-divergence refuses the simulated engine, naming the flag', () => {
  const r = runWavebus(['bench', 'overhead', '--rank-divergence', '--json'], { timeout: 60000 });
  expect(r.code).not.toBe(0);
  expect(r.stderr).toMatch(/--rank-divergence: .*--engine python/);
});

test('bench overhead --engine python refuses --syscalls, naming the flag', () => {
  const r = runWavebus(['bench', 'overhead', '--engine', 'python', '--syscalls', '--json'], { timeout: 60000 });
  expect(r.code).not.toBe(0);
  expect(r.stderr).toMatch(/--syscalls/);
});
