// rank_divergence's decision ring layout: proto/layouts.json's "decision" (the one description every
// side loads, docs/layouts.md; the Python writer is clients/python/wavebus_client/digest.py), read
// into plain offsets once for the agent's reader, the TypeScript writer and the coordinator.
import { WavebusError } from '../errors';
import { layout } from '../shm-layouts';

const L = layout('decision');

function offsets(struct: string): Record<string, number> {
  return Object.fromEntries(Object.values(L.structs[struct].fields).map((f) => [f.name, f.at]));
}

export const DECISION = Object.freeze({
  magic: L.constant('magic'),
  version: L.constant('version'),
  slots: L.constant('slots'),
  /** Slot i's struct at slotHeaders + i * slotBytes. */
  slotHeaders: L.structs.header.bytes,
  slotBytes: L.structs.slot.bytes,
  /** Slot i's token column (int32[max_rows]) at columns + i * 4 * max_rows. */
  columns: L.constant('columns'),
  maxRows: L.constant('max_rows'),
  flagTokens: L.constant('flag_tokens'),
  flagInputs: L.constant('flag_inputs'),
  flagColumn: L.constant('flag_column'),
  flagInputColumns: L.constant('flag_input_columns'),
  /** Input token ids (and positions) a slot's input columns hold (header.max_input_tokens of a new ring). */
  maxInputTokens: L.constant('max_input_tokens'),
  header: offsets('header'),
  slot: offsets('slot'),
});

/**
 * One wave's digests as a ring slot held them, whole: what the agent reads (agent/decision-ring.ts)
 * and sends, and what the coordinator compares (guard/rank-compare.ts).
 */
export interface Decision {
  wave: number;
  tokenCrc: number;
  rows: number;
  inputCrc: number;
  inputTokens: number;
  flags: number;
  /** Rows of the forward's inputs kept in the slot (flag_input_columns). */
  inputRows: number;
}

/** Bytes of one slot's input columns: ids and positions i32[maxInputTokens], row starts i32[maxRows + 1]. */
export function inputSlotBytes(maxRows: number, maxInputTokens: number): number {
  return 4 * (2 * maxInputTokens + maxRows + 1);
}

/** Where slot 0's input columns start: after every slot's token column. */
export function inputColumnsAt(maxRows: number): number {
  return DECISION.columns + DECISION.slots * 4 * maxRows;
}

// The columns follow the slot structs: a description that puts them inside is a defect of the file.
if (DECISION.columns < DECISION.slotHeaders + DECISION.slots * DECISION.slotBytes) {
  throw new WavebusError('ERR_LAYOUT', `proto/layouts.json: layouts.decision.constants.columns: ${DECISION.columns} lies inside the ${DECISION.slots} slot structs`);
}
