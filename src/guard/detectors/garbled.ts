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
//   header (at h, even): [0] pos [1] len [2] surprising count [3] tokens with a log-prob
//     [4..5] Σmillibits (float64)
//   body (at r): ring of (millibits << 1 | surprising); millibits ≤ 10^9 < 2^30, one word each
import type { GarbledConfig } from '../config';
import { even, StateRecord } from './slab';

const POS = 0;
const LEN = 1;
const N_SURPRISING = 2;
const SEEN = 3;
const SUM = 4; // float64
export const GARBLED_HEADER_WORDS = 6;

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

const MBITS_PER_NAT = 1000 / Math.LN2;
const MAX_MBITS = 1_000_000_000; // -Infinity log-probs clamp here

export class GarbledDetector {
  /** int32 words of one standalone state record (header + body). */
  readonly words: number;
  /** int32 words of the body part. */
  readonly bodyWords: number;
  private readonly limitMbits: number;
  constructor(readonly cfg: GarbledConfig) {
    this.limitMbits = Math.round(cfg.mean_surprisal_bits * 1000);
    this.bodyWords = even(cfg.window);
    this.words = GARBLED_HEADER_WORDS + this.bodyWords;
  }

  newState(): GarbledState {
    return new GarbledState(this.words);
  }

  onTokens(s: GarbledState, logprobs: readonly number[], ranks: readonly number[], count: number): GarbledHit | null {
    const n = Math.min(count, logprobs.length);
    return this.onTokensAt(s.i32, s.f64, s.base, s.base + GARBLED_HEADER_WORDS, logprobs, ranks.length >= n ? ranks : null, 0, n);
  }

  /**
   * As onTokens for the tokens [start, end) of `logprobs` and `ranks` (null: no ranks), on the
   * state with its header at word `b` (even) and its body at `r`. NaN marks a token without one.
   */
  onTokensAt(m: Int32Array, f: Float64Array, b: number, r: number, logprobs: ArrayLike<number>, ranks: ArrayLike<number> | null, start: number, end: number): GarbledHit | null {
    const cfg = this.cfg;
    const w = cfg.window;
    const sumAt = (b + SUM) >> 1;
    const ring = r;
    for (let k = start; k < end; k++) {
      const lp = logprobs[k];
      if (typeof lp !== 'number' || Number.isNaN(lp)) continue;
      const mb = lp >= 0 ? 0 : Math.min(MAX_MBITS, Math.round(-lp * MBITS_PER_NAT));
      const sur = lp < cfg.surprise_logprob || (ranks !== null && ranks[k] >= cfg.surprise_rank) ? 1 : 0;
      const pos = m[b + POS];
      const len = m[b + LEN];
      let sum = f[sumAt];
      let nSur = m[b + N_SURPRISING];
      if (len === w) {
        const old = m[ring + pos];
        sum -= old >>> 1;
        nSur -= old & 1;
      } else {
        m[b + LEN] = len + 1;
      }
      m[ring + pos] = (mb << 1) | sur;
      sum += mb;
      nSur += sur;
      f[sumAt] = sum;
      m[b + N_SURPRISING] = nSur;
      m[b + POS] = pos + 1 === w ? 0 : pos + 1;
      const seen = ++m[b + SEEN];
      if (len + 1 < w || seen < cfg.min_tokens) continue;
      const fraction = nSur / w;
      if (fraction > cfg.surprise_fraction && sum > this.limitMbits * w) {
        // the window restarts
        m[b + POS] = 0;
        m[b + LEN] = 0;
        m[b + N_SURPRISING] = 0;
        f[sumAt] = 0;
        return {
          surprising_fraction: fraction,
          mean_surprisal_bits: sum / w / 1000,
          window: w,
          tokens_with_logprob: seen,
          thresholds: {
            surprise_logprob: cfg.surprise_logprob,
            surprise_rank: cfg.surprise_rank,
            surprise_fraction: cfg.surprise_fraction,
            mean_surprisal_bits: cfg.mean_surprisal_bits,
          },
        };
      }
    }
    return null;
  }
}
