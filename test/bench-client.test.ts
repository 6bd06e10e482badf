// `wavebus bench client` runs end to end at a tiny size: every mode at every size reports per-step
// p50/p99 and each call's (in Python the tensor engine twice: its native ring writes and tensor_py,
// its numpy ones, each saying which path ran), the tensor engine's heads all went through the ring, and the dict and
// tensor engines sent every head (none reported as heads_skipped). No figure is asserted: the
// agent's bound is 2 s (--bound-ms), since what is checked is that every mode runs and reports,
// not how fast this 2-vCPU host answers within the product's 50 ms while other suites run.
import { runWavebus } from './helpers';

jest.setTimeout(180000);

test('bench client --requests 1,16 --steps 5 reports every mode at every size', () => {
  const r = runWavebus(['bench', 'client', '--requests', '1,16', '--steps', '5', '--bound-ms', '2000', '--json'], { timeout: 170000 });
  expect({ code: r.code, stderr: r.code === 0 ? '' : r.stderr }).toEqual({ code: 0, stderr: '' });
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  expect(out).toMatchObject({ bench: 'client', lang: 'python', steps: 5, forward: 'sleep' });
  expect(out.results.map((x: { requests: number }) => x.requests)).toEqual([1, 16]);
  for (const row of out.results) {
    // The tensor engine twice: the client's native ring writes, and tensor_py with WAVEBUS_PY_NATIVE=0 (numpy's).
    expect([row.tensor.ring_path, row.tensor_py.ring_path]).toEqual(['native', 'numpy']);
    expect([row.tensor.slots, row.tensor_py.slots]).toEqual(['native', 'python']);
    for (const mode of ['tensor', 'tensor_py', 'dict', 'off', 'none', 'floor', 'seed']) {
      const m = row[mode];
      expect([mode, Number.isFinite(m.p50_us) && m.p50_us > 0 && m.p99_us >= m.p50_us]).toEqual([mode, true]);
      expect(Object.keys(m.calls).sort()).toEqual(['before_forward', 'end_of_wave', 'events', 'pending_dump', 'wave_head']);
      expect([mode, m.heads_skipped]).toEqual([mode, undefined]);
    }
  }
});

test('bench client --lang ts --forward spin runs the TypeScript engine at every size: every head relayed, the tensor ones all through the ring', () => {
  const r = runWavebus(['bench', 'client', '--lang', 'ts', '--requests', '1,16', '--steps', '5', '--forward', 'spin', '--bound-ms', '2000', '--json'], { timeout: 170000 });
  expect({ code: r.code, stderr: r.code === 0 ? '' : r.stderr }).toEqual({ code: 0, stderr: '' });
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  expect(out).toMatchObject({ bench: 'client', lang: 'ts', steps: 5, forward: 'spin' });
  for (const row of out.results) {
    expect(row.tensor).toMatchObject({ ring_heads: 35, inline_heads: 0 });
    expect(row.tensor_py).toBeUndefined(); // the Python client's numpy path: a Python engine's mode
    for (const mode of ['tensor', 'dict', 'off', 'none', 'floor', 'seed']) {
      const m = row[mode];
      expect([mode, Number.isFinite(m.p50_us) && m.p50_us > 0 && m.p99_us >= m.p50_us]).toEqual([mode, true]);
      expect(Object.keys(m.calls).sort()).toEqual(['before_forward', 'end_of_wave', 'events', 'pending_dump', 'wave_head']);
    }
  }
});

test('bench client --lang ts --warm 40 runs 40 untimed steps first, without the forward, and every head of them is relayed too', () => {
  const r = runWavebus(['bench', 'client', '--lang', 'ts', '--requests', '1', '--steps', '5', '--warm', '40', '--bound-ms', '2000', '--json'], { timeout: 170000 });
  expect({ code: r.code, stderr: r.code === 0 ? '' : r.stderr }).toEqual({ code: 0, stderr: '' });
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  expect(out).toMatchObject({ bench: 'client', lang: 'ts', steps: 5, warm: 40 });
  const row = out.results[0];
  // 45 heads: 40 untimed, 5 timed (the default would have run 30 untimed: 35).
  expect(row.tensor.ring_heads + row.tensor.inline_heads).toBe(45);
  for (const mode of ['tensor', 'dict']) expect([mode, row[mode].heads_skipped]).toEqual([mode, undefined]);
});

test('bench client refuses a bad --requests naming the value', () => {
  const r = runWavebus(['bench', 'client', '--requests', '1,x', '--json'], { timeout: 60000 });
  expect(r.code).not.toBe(0);
  expect(r.stderr).toMatch(/--requests: "x"/);
});
