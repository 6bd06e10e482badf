// `wavebus bench aggregate --netns`: the bench runs end to end across two network namespaces with
// CURVE and returns a well-formed result (no speed is asserted: figures live in docs/benchmarks.md),
// the bytes crossed the veth pair, and it leaves no namespace behind. Without root it refuses
// clearly. Needs root (CI runs as root).
import { spawnSync } from 'child_process';
import { cleanup, cleanupUsers, describeAsRoot, otherUser, runAs, runWavebus, CLI } from './helpers';

jest.setTimeout(180000);

afterAll(async () => {
  await cleanup();
  cleanupUsers();
});

describeAsRoot('bench aggregate --netns', () => {
  test('runs over the veth pair with CURVE, reports both throughputs, removes its namespaces', () => {
    const r = runWavebus(['bench', 'aggregate', '--netns', '--size-mb', '2', '--runs', '1', '--json'], { timeout: 170000 });
    expect({ code: r.code, stderr: r.code === 0 ? '' : r.stderr.slice(-3000) }).toEqual({ code: 0, stderr: '' });
    const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
    expect(out).toMatchObject({ bench: 'aggregate', mode: 'netns', curve: true, ranks: 4, files: 8, target_ratio: 0.8, namespaces_removed: true });
    for (const mode of ['tuned', 'untuned']) {
      expect(out[mode].runs).toHaveLength(1);
      const run = out[mode].runs[0];
      expect(run.MBps).toBeGreaterThan(0);
      expect(run.tcp_MBps).toBeGreaterThan(0);
      expect(run.ratio).toBeCloseTo(run.MBps / run.tcp_MBps, 2);
    }
    expect(out.ratio).toBe(out.tuned.ratio_median);
    expect(out.ratio_untuned).toBe(out.untuned.ratio_median);
    // Both copies crossed the veth pair (the tool's namespace has no other way to the job's).
    expect(out.veth_first_run.tcp_rx_mb).toBeGreaterThanOrEqual(out.size_mb);
    expect(out.veth_first_run.aggregate_rx_mb).toBeGreaterThanOrEqual(out.size_mb);
    const left = spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' }).stdout;
    for (const ns of out.namespaces as string[]) expect(left.split('\n').map((l) => l.split(' ')[0])).not.toContain(ns);
  });

  test('without root it says so and exits non-zero', () => {
    const user = otherUser('aggns');
    const r = runAs(user, process.execPath, [CLI, 'bench', 'aggregate', '--netns', '--json']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/bench aggregate --netns needs root \(uid \d+\)/);
    expect(r.stdout).toBe('');
  });
});
