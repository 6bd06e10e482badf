// spec_acceptance: speculative-decoding acceptance drift (reference algorithm). Per step with
// draft_len > 0: accepted_draft = max(0, accepted − 1) (accepted counts the bonus token), capped at
// draft_len so that a garbled counter cannot fake a perfect rate. Over the last `window` such steps:
// rate = Σaccepted_draft / Σdraft_len and len = Σaccepted_draft / steps. Alert when the window is
// full and (rate < low_accept_rate and len < low_accept_len) — drafts almost never accepted, the
// target model or the draft went wrong — or (rate > high_accept_rate and len > high_accept_len) —
// suspiciously everything accepted, e.g. verification skipped or both models degenerate alike.
// After an alert the window restarts, so a further alert needs a fresh full window.
//
// Running sums over a ring, in int32 words (see slab.ts); draft lengths are uint32 on the wire, so
// the ring and the sums are float64 (exact):
//   header (at h, even): [0] pos [1] len [2..3] Σdraft [4..5] Σaccepted
//   body (at r, even): ring of (draft, accepted) float64 pairs
import type { SpecAcceptanceConfig } from '../config';
import { StateRecord } from './slab';

const POS = 0;
const LEN = 1;
const SUM_DRAFT = 2; // float64
const SUM_ACC = 4; // float64
export const SPEC_HEADER_WORDS = 6;

/** A standalone state record (the guard keeps its records in a slab), readable for inspection. */
export class SpecAcceptanceState extends StateRecord {
  get pos(): number {
    return this.i32[POS];
  }
  /** Steps in the window. */
  get len(): number {
    return this.i32[LEN];
  }
  get sumDraft(): number {
    return this.f64[SUM_DRAFT >> 1];
  }
  get sumAcc(): number {
    return this.f64[SUM_ACC >> 1];
  }
}

export interface SpecAcceptanceHit {
  direction: 'low' | 'high';
  accept_rate: number;
  accept_len: number;
  window: number;
  sum_draft_len: number;
  sum_accepted_draft: number;
  thresholds: { low_accept_rate: number; low_accept_len: number; high_accept_rate: number; high_accept_len: number };
}

export class SpecAcceptanceDetector {
  /** int32 words of one standalone state record (header + body). */
  readonly words: number;
  /** int32 words of the body part. */
  readonly bodyWords: number;

  constructor(readonly cfg: SpecAcceptanceConfig) {
    this.bodyWords = 4 * cfg.window;
    this.words = SPEC_HEADER_WORDS + this.bodyWords;
  }

  newState(): SpecAcceptanceState {
    return new SpecAcceptanceState(this.words);
  }

  onStep(s: SpecAcceptanceState, draftLen: number, accepted: number): SpecAcceptanceHit | null {
    return this.onStepAt(s.i32, s.f64, s.base, s.base + SPEC_HEADER_WORDS, draftLen, accepted);
  }

  /** As onStep, on the state with its header at word `b` and its body at `r` (both even). */
  onStepAt(m: Int32Array, f: Float64Array, b: number, r: number, draftLen: number, accepted: number): SpecAcceptanceHit | null {
    if (!(draftLen > 0)) return null;
    const cfg = this.cfg;
    const w = cfg.window;
    const a = Math.min(draftLen, Math.max(0, accepted - 1));
    const pos = m[b + POS];
    const len = m[b + LEN];
    const fb = b >> 1;
    const slot = (r >> 1) + 2 * pos;
    let sumDraft = f[fb + (SUM_DRAFT >> 1)];
    let sumAcc = f[fb + (SUM_ACC >> 1)];
    if (len === w) {
      sumDraft -= f[slot];
      sumAcc -= f[slot + 1];
    } else {
      m[b + LEN] = len + 1;
    }
    f[slot] = draftLen;
    f[slot + 1] = a;
    sumDraft += draftLen;
    sumAcc += a;
    f[fb + (SUM_DRAFT >> 1)] = sumDraft;
    f[fb + (SUM_ACC >> 1)] = sumAcc;
    m[b + POS] = pos + 1 === w ? 0 : pos + 1;
    if (len + 1 < w) return null;
    const rate = sumAcc / sumDraft;
    const meanLen = sumAcc / w;
    let direction: 'low' | 'high' | null = null;
    if (rate < cfg.low_accept_rate && meanLen < cfg.low_accept_len) direction = 'low';
    else if (rate > cfg.high_accept_rate && meanLen > cfg.high_accept_len) direction = 'high';
    if (direction === null) return null;
    // the window restarts
    m[b + POS] = 0;
    m[b + LEN] = 0;
    f[fb + (SUM_DRAFT >> 1)] = 0;
    f[fb + (SUM_ACC >> 1)] = 0;
    return {
      direction,
      accept_rate: rate,
      accept_len: meanLen,
      window: w,
      sum_draft_len: sumDraft,
      sum_accepted_draft: sumAcc,
      thresholds: {
        low_accept_rate: cfg.low_accept_rate,
        low_accept_len: cfg.low_accept_len,
        high_accept_rate: cfg.high_accept_rate,
        high_accept_len: cfg.high_accept_len,
      },
    };
  }
}
