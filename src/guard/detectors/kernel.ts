// The per-step detector pass runs natively (native/detector_pass.cc): one call per wave head for
// every row of the step, on the state slab, with each detector's parameters in one Float64Array.
// This file owns the layouts both sides share: the parameter slots, the hit records, the mute
// bits. TypeScript checks everything before the call (columns in telemetry.ts, offsets here).
import { native } from '../../native';
import type { TelemetryColumns } from '../../messages';

/** Parameter slots (the Param enum in native/detector_pass.cc, same order). */
export const PARAM = {
  recordWords: 0,
  repeatOn: 1,
  repeatHead: 2,
  repeatBody: 3,
  repeatWindow: 4,
  tableMask: 5,
  hashShift: 6,
  tableAt: 7,
  repeatMinTokens: 8,
  repeatThreshold: 9,
  repeatConsecutive: 10,
  specOn: 11,
  specHead: 12,
  specBody: 13,
  specWindow: 14,
  lowRate: 15,
  lowLen: 16,
  highRate: 17,
  highLen: 18,
  garbledOn: 19,
  garbledHead: 20,
  garbledBody: 21,
  garbledWindow: 22,
  garbledMinTokens: 23,
  surpriseLogprob: 24,
  surpriseRank: 25,
  surpriseFraction: 26,
  limitMbits: 27,
} as const;
export const PARAM_COUNT = 28;

/** A hit is HIT_WORDS doubles: row, type (HIT_TYPE index), then the type's figures. */
export const HIT_WORDS = 8;
export const HIT_TYPE = ['token_repeat', 'spec_acceptance', 'garbled'] as const;

/** Bit of each detector in a request's muted mask (a detector the quota stopped for it). */
export const MUTE_BIT = {
  token_repeat: 1,
  logits_finite: 2,
  spec_acceptance: 4,
  garbled: 8,
} as const;

export function newParams(recordWords: number): Float64Array {
  const p = new Float64Array(PARAM_COUNT);
  p[PARAM.recordWords] = recordWords;
  return p;
}

const EMPTY_U32 = new Uint32Array(0);
const EMPTY_F32 = new Float32Array(0);

/** The columns of one step as the pass reads them. */
export type StepColumns = Pick<TelemetryColumns, 'tokenCount' | 'tokenIds' | 'tokenLogprobs' | 'tokenRanks' | 'draftLen' | 'accepted'>;

/** Scratch reused from step to step: hit records with room for three per row. */
export class HitBuffer {
  hits = new Float64Array(3 * HIT_WORDS * 64);
  room(rows: number): Float64Array {
    if (this.hits.length < 3 * HIT_WORDS * rows) this.hits = new Float64Array(3 * HIT_WORDS * Math.max(rows, 2 * this.hits.length / (3 * HIT_WORDS)));
    return this.hits;
  }
}

/**
 * Run the pass over the rows: row i uses the record at word rowRecord[i] of `state` (-1: skip the
 * row) with the detectors of rowMuted[i] muted. Returns the number of hits written to `hits`.
 */
export function detectStep(
  state: Int32Array,
  params: Float64Array,
  ignore: Uint32Array,
  rowRecord: Int32Array,
  rowMuted: Int32Array,
  c: StepColumns,
  hits: HitBuffer,
): number {
  return native.detectStep(state, params, ignore, rowRecord, rowMuted, c.tokenCount, c.tokenIds, c.tokenLogprobs, c.tokenRanks, c.draftLen, c.accepted, hits.room(rowRecord.length));
}

/**
 * One request's step on a standalone record (the detector classes' onTokens / onStep): a pass
 * over a single row. `params` has only the calling detector on, its header at word 0.
 */
export function detectOne(
  state: Int32Array,
  params: Float64Array,
  ignore: Uint32Array,
  step: { tokenIds?: Uint32Array; tokenLogprobs?: Float32Array; tokenRanks?: Uint32Array; draftLen?: number; accepted?: number },
  hits: HitBuffer,
): Float64Array | null {
  const ids = step.tokenIds ?? EMPTY_U32;
  const n = Math.max(ids.length, step.tokenLogprobs?.length ?? 0);
  const spec = step.draftLen !== undefined;
  const c: StepColumns = {
    tokenCount: n > 0 ? Uint32Array.of(n) : EMPTY_U32,
    tokenIds: ids.length === n ? ids : new Uint32Array(n),
    tokenLogprobs: step.tokenLogprobs ?? EMPTY_F32,
    tokenRanks: step.tokenRanks ?? EMPTY_U32,
    draftLen: spec ? Uint32Array.of(step.draftLen!) : EMPTY_U32,
    accepted: spec ? Uint32Array.of(step.accepted ?? 0) : EMPTY_U32,
  };
  const found = detectStep(state, params, ignore, ONE_ROW, NOT_MUTED, c, hits);
  return found > 0 ? hits.hits.subarray(2, HIT_WORDS) : null;
}

const ONE_ROW = Int32Array.of(0);
const NOT_MUTED = Int32Array.of(0);
