// One step's telemetry columns through the guard: slot bindings and block tables into the request
// table, each row's token count, flags and kept token ids, then every per-step detector on every
// row in one native pass. The per-row scratch arrays are reused from step to step.
import { FLAG_FINISHED, FLAG_FREED } from '../client/telemetry';
import type { TelemetryColumns } from '../messages';
import type { DetectorSet, Hit } from './detectors';
import { keepTokens, type ReqState, type RequestTable } from './requests';

/** What the report config says to keep from each step (save_sensitive_info and its caps). */
export interface KeepIds {
  keepTail: boolean;
  maxPromptTokenIds: number;
  maxOutputTokenIds: number;
}

export class StepPass {
  /** Rows whose slot no binding named (bindings lost, e.g. a coordinator restart): not attributable. */
  unboundRows = 0;
  /** Per-step scratch of the detector pass: each row's record, muted mask and request. */
  private rowRecord = new Int32Array(64);
  private rowMuted = new Int32Array(64);
  private readonly rowStates: ReqState[] = [];

  /** Views of the row scratch arrays exactly `rows` long (the pass takes the row count from them). */
  private scratchRows(rows: number): [Int32Array, Int32Array] {
    if (this.rowRecord.length < rows) {
      const cap = Math.max(rows, 2 * this.rowRecord.length);
      this.rowRecord = new Int32Array(cap);
      this.rowMuted = new Int32Array(cap);
    }
    return [this.rowRecord.subarray(0, rows), this.rowMuted.subarray(0, rows)];
  }

  /** One step's columns: bindings, block tables, then each row's bookkeeping and detectors. Returns the requests freed this step. */
  run(c: TelemetryColumns, table: RequestTable, detectors: DetectorSet, keep: KeepIds, hits: Hit[], hitStates: ReqState[]): ReqState[] | null {
    const promptIdsCap = keep.keepTail ? keep.maxPromptTokenIds : null;
    for (let k = 0; k < c.bind.length; k++) table.bind(c.bind[k], detectors, promptIdsCap);
    for (let k = 0; k < c.blocks.length; k++) {
      const st = table.bySlot[c.blocks[k].slot];
      if (st !== undefined && c.blocks[k].blockIds.length > 0) st.blockIds = c.blocks[k].blockIds;
    }
    const perStep = detectors.anyPerStep;
    const bySlot = table.bySlot;
    const keepTail = keep.keepTail;
    const counts = c.tokenCount;
    const hasCounts = counts.length > 0;
    const outCounts = c.numOutputTokens;
    const hasOut = outCounts.length > 0;
    const rows = perStep ? this.scratchRows(c.rows) : null;
    const rowRecord = rows ? rows[0] : null;
    const rowMuted = rows ? rows[1] : this.rowMuted;
    const rowStates = this.rowStates;
    let freedNow: ReqState[] | null = null;
    let t = 0;
    for (let i = 0; i < c.rows; i++) {
      const t0 = t;
      if (hasCounts) t += counts[i];
      const st = bySlot[c.slot[i]];
      if (st === undefined) {
        this.unboundRows++;
        if (rowRecord) rowRecord[i] = -1;
        continue;
      }
      const engineCount = hasOut ? outCounts[i] : 0;
      st.outputTokens = engineCount > 0 ? engineCount : st.outputTokens + (t - t0);
      const fl = c.flags[i];
      if (fl !== 0) {
        if ((fl & FLAG_FINISHED) !== 0) st.finished = true;
        if ((fl & FLAG_FREED) !== 0) {
          st.finished = st.freed = true;
          (freedNow ?? (freedNow = [])).push(st);
        }
      }
      if (keepTail && t > t0) keepTokens(st, c.tokenIds, t0, t, keep.maxOutputTokenIds);
      if (rowRecord) {
        rowRecord[i] = detectors.recordOf(st.slot);
        rowMuted[i] = st.muted;
        rowStates[i] = st;
      }
    }
    // every per-step detector on every row, in one native pass
    if (rowRecord) {
      detectors.onStep(c, rowRecord, rowMuted, (row, hit) => {
        hits.push(hit);
        hitStates.push(rowStates[row]);
      });
    }
    return freedNow;
  }
}
