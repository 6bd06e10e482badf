// garbled: gibberish output, from the log-probability (and rank) of each sampled token.
// A healthy model sampled at a sane temperature mostly picks tokens it gave real probability to;
// an occasional unlikely pick happens, a sustained run of them does not. Corrupted KV or logits
// make the distribution the sampler sees unrelated to the context, so the picks stop being
// likely under the model: surprisal goes up for many tokens in a row. Over the last `window`
// tokens that carry a log-prob, the detector fires when BOTH
//   - the fraction of surprising tokens (logprob < surprise_logprob, or rank ≥ surprise_rank when
//     the client sends ranks) is > surprise_fraction, and
//   - the mean surprisal −logprob/ln 2 is > mean_surprisal_bits,
// once at least min_tokens such tokens were seen and the window is full. Two conditions, because
// one very unlikely token can lift the mean alone, and a run of merely-unlikely tokens (a list of
// names, code identifiers) can lift the fraction alone. Tokens without a log-prob are skipped.
// Surprisal is kept in integer millibits so that window sums do not drift and edges are exact.
// After an alert the window restarts.
//
// Running sums over a ring, in int32 words (see slab.ts):
//   header (at h, even; word offsets in native.detectorLayout.garbled): pos, len, surprising
//     count, seen (tokens with a log-prob), sum (Σmillibits, float64)
//   body (at r): ring of (millibits << 1 | surprising); millibits ≤ 10^9 < 2^30, one word each
import { int, num, type DetectorCommon } from '../config-schema';
import { detectOne, headerLayout, HitBuffer, newParams, paramSlots } from './kernel';
import { even, StateRecord } from './slab';
import type { DetectorSpec, PerStepDetector } from './spec';

export interface GarbledConfig extends DetectorCommon {
  window: number;
  min_tokens: number;
  surprise_logprob: number;
  surprise_rank: number;
  surprise_fraction: number;
  mean_surprisal_bits: number;
}

export const GARBLED: DetectorSpec<'garbled', GarbledConfig> = {
  name: 'garbled',
  params: {
    window: int(32, 1, 65536),
    min_tokens: int(32, 0),
    surprise_logprob: num(-5, undefined, 0),
    surprise_rank: int(50, 1),
    surprise_fraction: num(0.5, 0, 1),
    mean_surprisal_bits: num(4, 0),
  },
  perStep: (cfg) => new GarbledDetector(cfg),
};

// Header words and parameter slots from native/detector_pass.cc (checked at load); the sum is a float64.
const HEADER = headerLayout('garbled', ['pos', 'len', 'surprising', 'seen', 'sum']);
const { pos: POS, len: LEN, surprising: N_SURPRISING, seen: SEEN, sum: SUM } = HEADER;
export const GARBLED_HEADER_WORDS = HEADER.headerWords;
const PARAM = paramSlots(['garbledOn', 'garbledHead', 'garbledBody', 'garbledWindow', 'garbledMinTokens', 'surpriseLogprob', 'surpriseRank', 'surpriseFraction', 'limitMbits']);

/** A standalone state record (the guard keeps its records in a slab), readable for inspection. */
export class GarbledState extends StateRecord {
  get pos(): number {
    return this.i32[POS];
  }
  get len(): number {
    return this.i32[LEN];
  }
  get nSurprising(): number {
    return this.i32[N_SURPRISING];
  }
  /** Tokens with a log-prob seen so far. */
  get seen(): number {
    return this.i32[SEEN];
  }
  get sumMbits(): number {
    return this.f64[SUM >> 1];
  }
}

export interface GarbledHit {
  surprising_fraction: number;
  mean_surprisal_bits: number;
  window: number;
  tokens_with_logprob: number;
  thresholds: { surprise_logprob: number; surprise_rank: number; surprise_fraction: number; mean_surprisal_bits: number };
}

export class GarbledDetector implements PerStepDetector {
  readonly headerWords = GARBLED_HEADER_WORDS;
  /** int32 words of one standalone state record (header + body). */
  readonly words: number;
  /** int32 words of the body part. */
  readonly bodyWords: number;
  private readonly limitMbits: number;
  private readonly solo: Float64Array;
  private readonly hits = new HitBuffer();

  constructor(readonly cfg: GarbledConfig) {
    this.limitMbits = Math.round(cfg.mean_surprisal_bits * 1000);
    this.bodyWords = even(cfg.window);
    this.words = GARBLED_HEADER_WORDS + this.bodyWords;
    this.solo = newParams(this.words);
    this.fill(this.solo, 0, GARBLED_HEADER_WORDS);
  }

  /** This detector's parameters, with its header at word `head` (even) and body at `body`. */
  fill(p: Float64Array, head: number, body: number): void {
    const cfg = this.cfg;
    p[PARAM.garbledOn] = 1;
    p[PARAM.garbledHead] = head;
    p[PARAM.garbledBody] = body;
    p[PARAM.garbledWindow] = cfg.window;
    p[PARAM.garbledMinTokens] = cfg.min_tokens;
    p[PARAM.surpriseLogprob] = cfg.surprise_logprob;
    p[PARAM.surpriseRank] = cfg.surprise_rank;
    p[PARAM.surpriseFraction] = cfg.surprise_fraction;
    p[PARAM.limitMbits] = this.limitMbits;
  }

  /** The alert from a hit's figures (kernel.ts HIT_WORDS, after row and type). */
  detail(h: Float64Array, at: number): GarbledHit {
    const cfg = this.cfg;
    return {
      surprising_fraction: h[at],
      mean_surprisal_bits: h[at + 1],
      window: cfg.window,
      tokens_with_logprob: h[at + 2],
      thresholds: {
        surprise_logprob: cfg.surprise_logprob,
        surprise_rank: cfg.surprise_rank,
        surprise_fraction: cfg.surprise_fraction,
        mean_surprisal_bits: cfg.mean_surprisal_bits,
      },
    };
  }

  newState(): GarbledState {
    return new GarbledState(this.words);
  }

  /**
   * The first `count` tokens' log-probs (NaN: none) and ranks (a shorter list: no ranks); returns
   * the alert or null. Log-probs are float32, as on the wire.
   */
  onTokens(s: GarbledState, logprobs: readonly number[], ranks: readonly number[], count: number): GarbledHit | null {
    const n = Math.min(count, logprobs.length);
    if (n === 0) return null;
    // a token past the end of `ranks` has no rank: 0 (the argmax) never reaches surprise_rank (≥ 1)
    const tokenRanks = ranks.length > 0 ? Uint32Array.from({ length: n }, (_, k) => (k < ranks.length ? ranks[k] : 0)) : undefined;
    const step = { tokenLogprobs: Float32Array.from(logprobs.slice(0, n), (x) => (typeof x === 'number' ? x : NaN)), tokenRanks };
    const h = detectOne(s.i32, this.solo, NO_IGNORE, step, this.hits);
    return h ? this.detail(h, 0) : null;
  }
}

const NO_IGNORE = new Uint32Array(0);
