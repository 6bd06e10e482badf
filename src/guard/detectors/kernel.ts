// The per-step detector pass runs natively (native/detector_pass.cc): one call per wave head for
// every row of the step, on the state slab, with each detector's parameters in one Float64Array.
// The layouts both sides share (parameter slots, hit records, mute bits, header words) come from
// the addon. TypeScript checks everything before the call (columns in telemetry.ts, offsets here).
import { native, type HeaderLayout } from '../../native';
import { NativeError } from '../../errors';
import type { TelemetryColumns } from '../../messages';

/**
 * The record layout, defined once in native/detector_pass.cc (which checks at load that every
 * offset lies inside its record) and read from there: parameter slots, hit records, mute bits and
 * each detector's header words (LAYOUT.tokenRepeat etc.).
 */
export const LAYOUT = native.detectorLayout;

/** Parameter slots by name (kParamNames in native/detector_pass.cc); a detector takes its own through paramSlots. */
export const PARAM = LAYOUT.params;
export const PARAM_COUNT = LAYOUT.paramCount;

/** A hit is HIT_WORDS doubles: row, type (HIT_TYPE index), then the type's figures. */
export const HIT_WORDS = LAYOUT.hitWords;
export const HIT_TYPE = LAYOUT.hitTypes;

/** Bit of each detector in a request's muted mask (a detector the quota stopped for it). */
export const MUTE_BIT = LAYOUT.muteBits;

function layoutMissing(what: string): never {
  throw new NativeError(`the native detector pass has no ${what}: native/detector_pass.cc and src/guard/detectors disagree (rebuild the addon: npx node-gyp rebuild)`, 'ERR_NATIVE_LAYOUT');
}

/** The parameter slots a detector sets, each checked to exist in the native pass at load. */
export function paramSlots<K extends string>(names: readonly K[]): Readonly<Record<K, number>> {
  for (const n of names) if (typeof LAYOUT.params[n] !== 'number') layoutMissing(`parameter ${n}`);
  return LAYOUT.params as Readonly<Record<K, number>>;
}

/** A detector's header words (`LAYOUT[key]`), each checked to exist in the native pass at load. */
export function headerLayout<K extends string>(key: string, words: readonly K[]): HeaderLayout<K> {
  const h = LAYOUT[key] as Record<string, unknown> | undefined;
  for (const w of [...words, 'headerWords']) if (typeof h?.[w] !== 'number') layoutMissing(`header word ${key}.${w}`);
  return h as HeaderLayout<K>;
}

/** A detector's mute bit and hit type index, checked to exist in the native pass at load. */
export function nativeDetector(name: string, perStep: boolean): { muteBit: number; hitType: number } {
  const muteBit = MUTE_BIT[name];
  if (typeof muteBit !== 'number') layoutMissing(`mute bit for ${name}`);
  const hitType = HIT_TYPE.indexOf(name);
  if (perStep && hitType < 0) layoutMissing(`hit type ${name}`);
  return { muteBit, hitType };
}

const RECORD_WORDS = paramSlots(['recordWords']).recordWords;

export function newParams(recordWords: number): Float64Array {
  const p = new Float64Array(PARAM_COUNT);
  p[RECORD_WORDS] = recordWords;
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
