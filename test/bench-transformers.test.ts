// `wavebus bench transformers`, run tiny (16 requests, one layer, 36 steps a mode): transformers'
// continuous batching under torchrun (TP=2) in the four modes. The JSON's shape and sanity are
// checked, never a speed (the figures live in docs/benchmarks.md): every request ran through the
// whole window in every mode, wavebus_client was never imported with wavebus absent or on the
// seed's path, the detectors that were on wrote incident reports and the off run wrote none, the
// seed's token_repeat fired for the same requests (greedy tokens from random weights loop), and the
// bench removed its work directory (made under this test's own TMPDIR).
import * as fs from 'fs';
import { cleanup, runWavebus, tmpDir } from './helpers';
import { torch2 } from './torch2';

jest.setTimeout(300000);

afterAll(() => cleanup());

test('bench transformers: four modes at 16 running requests, TP=2; reports where detectors ran; nothing left behind', () => {
  torch2(); // the venv is there (npm test's preflight); a clear error if not
  const tmp = tmpDir('wavebus-bench-hf-');
  const requests = 16;
  const r = runWavebus(['bench', 'transformers', '--requests', String(requests), '--warmup-steps', '6', '--measure-steps', '30', '--layers', '1', '--rounds', '1', '--json'],
    { timeout: 280000, env: { ...process.env, TMPDIR: tmp } });
  expect({ code: r.code, stderr: r.code === 0 ? '' : r.stderr.slice(-3000) }).toEqual({ code: 0, stderr: '' });
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  expect(out).toMatchObject({ bench: 'transformers', requests, tp: 2, window: { warmup_steps: 6, measure_steps: 30 }, rounds: 1 });
  for (const mode of ['absent', 'off', 'on', 'seed']) {
    const m = out.modes[mode];
    expect({ mode, running: m.running_requests }).toEqual({ mode, running: [requests, requests] });
    expect(m.steps_per_s).toBeGreaterThan(0);
    expect(m.ratio).toBeCloseTo(m.steps_per_s / out.modes.absent.steps_per_s, 2);
    expect(m.layer_us_per_step_by_rank).toHaveLength(2);
    expect({ mode, imported: m.wavebus_imported }).toEqual({ mode, imported: mode === 'off' || mode === 'on' });
  }
  // TP0 sent its wave heads through the tensor path (the ring, or inline when a slot was not taken yet); TP1 sent none.
  const heads = out.modes.on.heads_by_rank;
  expect(heads[0].ring_heads + heads[0].inline_heads).toBeGreaterThan(0);
  expect(heads[1]).toEqual({ ring_heads: 0, inline_heads: 0 });
  // Detectors on: token_repeat reported the looping requests; everything off: no report at all.
  expect(out.modes.off.incident_reports_by_round).toEqual([0]);
  expect(out.modes.on.incident_reports_by_round[0]).toBeGreaterThan(0);
  // The seed's port did its work on TP0: token_repeat alerts for as many requests as wavebus reported.
  expect(out.modes.seed.seed_alerts_tp0).toBe(out.modes.on.incident_reports_by_round[0]);
  // The seed's work and the detectors' telemetry cost TP0 more than the timers alone.
  expect(out.modes.seed.layer_us_per_step_by_rank[0]).toBeGreaterThan(out.modes.absent.layer_us_per_step_by_rank[0]);
  expect(out.modes.on.layer_us_per_step_by_rank[0]).toBeGreaterThan(out.modes.absent.layer_us_per_step_by_rank[0]);
  expect(Object.keys(out.client_us_per_step).sort()).toEqual(['off', 'on', 'seed']);
  expect(fs.readdirSync(tmp).filter((d) => d.startsWith('wavebus-bench-transformers-'))).toEqual([]);
});
