// spec_acceptance: speculative-decoding acceptance drift (reference algorithm). Per step with
// draft_len > 0: accepted_draft = max(0, accepted − 1) (accepted counts the bonus token), capped at
// draft_len so that a garbled counter cannot fake a perfect rate. Over the last `window` such steps:
// rate = Σaccepted_draft / Σdraft_len and len = Σaccepted_draft / steps. Alert when the window is
// full and (rate < low_accept_rate and len < low_accept_len) — drafts almost never accepted, the
// target model or the draft went wrong — or (rate > high_accept_rate and len > high_accept_len) —
// suspiciously everything accepted, e.g. verification skipped or both models degenerate alike.
// After an alert the window restarts, so a further alert needs a fresh full window.
import type { SpecAcceptanceConfig } from '../config';

export class SpecAcceptanceState {
  readonly draft: Int32Array;
  readonly acc: Int32Array;
  pos = 0;
  len = 0;
  sumDraft = 0;
  sumAcc = 0;
  constructor(window: number) {
    this.draft = new Int32Array(window);
    this.acc = new Int32Array(window);
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
  constructor(readonly cfg: SpecAcceptanceConfig) {}

  newState(): SpecAcceptanceState {
    return new SpecAcceptanceState(this.cfg.window);
  }

  onStep(s: SpecAcceptanceState, draftLen: number, accepted: number): SpecAcceptanceHit | null {
    if (!(draftLen > 0)) return null;
    const cfg = this.cfg;
    const w = cfg.window;
    const a = Math.min(draftLen, Math.max(0, accepted - 1));
    if (s.len === w) {
      s.sumDraft -= s.draft[s.pos];
      s.sumAcc -= s.acc[s.pos];
    } else {
      s.len++;
    }
    s.draft[s.pos] = draftLen;
    s.acc[s.pos] = a;
    s.sumDraft += draftLen;
    s.sumAcc += a;
    s.pos = s.pos + 1 === w ? 0 : s.pos + 1;
    if (s.len < w) return null;
    const rate = s.sumAcc / s.sumDraft;
    const len = s.sumAcc / w;
    let direction: 'low' | 'high' | null = null;
    if (rate < cfg.low_accept_rate && len < cfg.low_accept_len) direction = 'low';
    else if (rate > cfg.high_accept_rate && len > cfg.high_accept_len) direction = 'high';
    if (direction === null) return null;
    const hit: SpecAcceptanceHit = {
      direction,
      accept_rate: rate,
      accept_len: len,
      window: w,
      sum_draft_len: s.sumDraft,
      sum_accepted_draft: s.sumAcc,
      thresholds: {
        low_accept_rate: cfg.low_accept_rate,
        low_accept_len: cfg.low_accept_len,
        high_accept_rate: cfg.high_accept_rate,
        high_accept_len: cfg.high_accept_len,
      },
    };
    s.pos = s.len = s.sumDraft = s.sumAcc = 0;
    return hit;
  }
}
