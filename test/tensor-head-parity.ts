// What test/tensor-head.test.ts (the Python client) and test/tensor-head-ts.test.ts (the TypeScript
// client) check alike of the tensor hot path: the columns the coordinator's guard gets for each
// head, against the columns the dict path gives for the same steps.
import type { StepTelemetry } from '../src/messages';
import { columnsFromWire } from '../src/client/telemetry';
import type { HarnessJob } from './job-harness';

/** token_repeat on: the drivers' row 0 repeats a token, so a report shows a detector ran on the ring's columns. */
export const TENSOR_HEAD_CFG = { detector: { token_repeat: { enabled: true, window: 8, min_tokens: 8, repeat_sum_threshold: 20, on_trigger: ['report'] } } };

/** The drivers' steps: waves 1 to 40, one head each. */
export const HEADS = 40;

/** Every head's telemetry as the guard gets it (a copy), in arrival order. */
export function recordHeads(job: HarnessJob): StepTelemetry[] {
  const seen: StepTelemetry[] = [];
  const orig = job.guard.onWaveHead.bind(job.guard);
  job.guard.onWaveHead = (replica, wave, tel, vw) => {
    if (tel?.columns) seen.push(structuredClone({ ...tel, columns: { ...tel.columns } }));
    return orig(replica, wave, tel, vw);
  };
  return seen;
}

/** Every head arrived, in wave order (the telemetry of wave N-1 rides head N). */
export function expectEveryWaveInOrder(seen: StepTelemetry[]): void {
  expect(seen.map((t) => t.wave)).toEqual(Array.from({ length: HEADS }, (_, i) => i));
}

/**
 * Each head's columns are the dict path's (`dict[i]`: TelemetryColumns in wire form): the dense
 * columns element for element; every new binding and changed block table in the same head (the
 * tensor path re-sends a few more).
 */
export function expectDictColumns(seen: StepTelemetry[], dict: Record<string, any>[]): void {
  for (let i = 0; i < HEADS; i++) {
    const want = columnsFromWire(dict[i]);
    const have = seen[i].columns!;
    for (const k of ['rows', 'slot', 'tokenCount', 'tokenIds', 'tokenLogprobs', 'flags', 'draftLen', 'accepted'] as const) {
      expect([k, i, Array.from((have[k] ?? []) as ArrayLike<number>)]).toEqual([k, i, Array.from((want[k] ?? []) as ArrayLike<number>)]);
    }
    for (const b of want.bind) expect(have.bind).toEqual(expect.arrayContaining([expect.objectContaining({ slot: b.slot, reqId: b.reqId })]));
    for (const b of want.blocks) expect(have.blocks).toEqual(expect.arrayContaining([{ slot: b.slot, blockIds: b.blockIds }]));
  }
}
