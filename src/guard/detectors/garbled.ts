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
import type { GarbledConfig } from '../config';

export class GarbledState {
  readonly mbits: Int32Array;
  readonly surprising: Uint8Array;
  pos = 0;
  len = 0;
  sumMbits = 0;
  nSurprising = 0;
  seen = 0;
  constructor(window: number) {
    this.mbits = new Int32Array(window);
    this.surprising = new Uint8Array(window);
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
  private readonly limitMbits: number;
  constructor(readonly cfg: GarbledConfig) {
    this.limitMbits = Math.round(cfg.mean_surprisal_bits * 1000);
  }

  newState(): GarbledState {
    return new GarbledState(this.cfg.window);
  }

  onTokens(s: GarbledState, logprobs: readonly number[], ranks: readonly number[], count: number): GarbledHit | null {
    const cfg = this.cfg;
    const w = cfg.window;
    const n = Math.min(count, logprobs.length);
    for (let k = 0; k < n; k++) {
      const lp = logprobs[k];
      if (Number.isNaN(lp) || typeof lp !== 'number') continue;
      const mb = lp >= 0 ? 0 : Math.min(MAX_MBITS, Math.round(-lp * MBITS_PER_NAT));
      const sur = lp < cfg.surprise_logprob || (k < ranks.length && ranks[k] >= cfg.surprise_rank) ? 1 : 0;
      if (s.len === w) {
        s.sumMbits -= s.mbits[s.pos];
        s.nSurprising -= s.surprising[s.pos];
      } else {
        s.len++;
      }
      s.mbits[s.pos] = mb;
      s.surprising[s.pos] = sur;
      s.sumMbits += mb;
      s.nSurprising += sur;
      s.pos = s.pos + 1 === w ? 0 : s.pos + 1;
      s.seen++;
      if (s.len < w || s.seen < cfg.min_tokens) continue;
      const fraction = s.nSurprising / w;
      if (fraction > cfg.surprise_fraction && s.sumMbits > this.limitMbits * w) {
        const hit: GarbledHit = {
          surprising_fraction: fraction,
          mean_surprisal_bits: s.sumMbits / w / 1000,
          window: w,
          tokens_with_logprob: s.seen,
          thresholds: {
            surprise_logprob: cfg.surprise_logprob,
            surprise_rank: cfg.surprise_rank,
            surprise_fraction: cfg.surprise_fraction,
            mean_surprisal_bits: cfg.mean_surprisal_bits,
          },
        };
        s.pos = s.len = s.sumMbits = s.nSurprising = 0;
        return hit;
      }
    }
    return null;
  }
}
