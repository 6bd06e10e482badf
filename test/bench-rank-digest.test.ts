// `wavebus bench rank-digest` runs end to end at a tiny size: the Python (native and numpy paths)
// and TypeScript clients' digest calls are timed warm and after the forward's sleep, the floor of any Python client taking
// the engine's tensors is measured beside them, and the agent's poll read the waves the engines
// wrote into the real ring. Shapes and sanity only; the figures live in docs/benchmarks.md.
import * as fs from 'fs';
import { runWavebus } from './helpers';
import { runDirBase } from '../src/launch/run-dir';

jest.setTimeout(120000);

const ours = () => fs.readdirSync(runDirBase()).filter((d) => d.startsWith('wavebus-bench-digest-')).sort();

test('bench rank-digest --rows 64: Python and TypeScript calls, the floor beside them, the waves read by the agent side, nothing left behind', () => {
  const before = ours();
  const r = runWavebus(['bench', 'rank-digest', '--rows', '64', '--also-rows', '64', '--steps', '50', '--step-count', '20', '--json'], { timeout: 110000 });
  expect({ code: r.code, stderr: r.code === 0 ? '' : r.stderr.slice(-3000) }).toEqual({ code: 0, stderr: '' });
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  expect(out).toMatchObject({ bench: 'rank-digest', rows: [64], step_count: 20, sleep_ms: 3, python_client: 'this package' });
  // The Python client twice: its native path (the copy and CRC in C) and WAVEBUS_PY_NATIVE=0 (numpy's), each saying which ran.
  expect([out.python_path, out.python_numpy_path]).toEqual(['native', 'numpy']);
  for (const py of [out.python['64'], out.python_numpy['64']]) {
    for (const k of ['decided', 'inputs', 'inputs_rows']) expect([k, py[k].best > 0 && py[k].median >= py[k].best]).toEqual([k, true]);
    for (const k of ['step_p50', 'step_p90', 'step_decided_p50', 'step_inputs_p50', 'crc_floor', 'step_floor_ptr_p50', 'step_floor_copy_p50']) {
      expect([k, Number.isFinite(py[k]) && py[k] > 0]).toEqual([k, true]);
    }
    expect(py.step_p90).toBeGreaterThanOrEqual(py.step_p50);
  }
  const ts = out.typescript['64'];
  for (const k of ['decided', 'inputs_rows', 'step_p50', 'step_p90']) expect([k, Number.isFinite(ts[k]) && ts[k] > 0]).toEqual([k, true]);
  expect(out.waves_in_ring).toBeGreaterThan(0);
  expect(out.agent_poll_us).toBeGreaterThan(0);
  expect(ours()).toEqual(before);
});

test('bench rank-digest refuses rows past the ring, naming the flag', () => {
  const r = runWavebus(['bench', 'rank-digest', '--rows', '5000', '--json'], { timeout: 60000 });
  expect(r.code).not.toBe(0);
  expect(r.stderr).toMatch(/--rows/);
});
