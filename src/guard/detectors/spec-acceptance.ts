// spec_acceptance: speculative-decoding acceptance drift (seed's formula). Per step with
// draft_len > 0: accepted_draft = max(0, accepted − 1) (accepted counts the bonus token), not
// capped at draft_len (neither the seed nor upstream caps it). Over the last `window` such steps:
// rate = Σaccepted_draft / Σdraft_len and len = Σaccepted_draft / steps. Alert when the window is
// full and (rate < low_accept_rate and len < low_accept_len) — drafts almost never accepted, the
// target model or the draft went wrong — or (rate > high_accept_rate and len > high_accept_len) —
// suspiciously everything accepted, e.g. verification skipped or both models degenerate alike.
// As upstream (vllm-ascend runtime_guard spec_acceptance), the window keeps sliding after an
// alert: every full-window step where the condition holds alerts, and the report quotas
// (report.max_per_req, the wave backoff) alone decide which of them are reported.
//
// Running sums over a ring, in int32 words (see slab.ts); draft lengths are uint32 on the wire, so
// the ring and the sums are float64 (exact):
//   header (at h, even; word offsets in native.detectorLayout.specAcceptance): pos, len,
//     sumDraft (Σdraft, float64), sumAcc (Σaccepted, float64)
//   body (at r, even): ring of (draft, accepted) float64 pairs
import { int, num, type DetectorCommon } from '../config-schema';
import { detectOne, headerLayout, HitBuffer, newParams, paramSlots } from './kernel';
import { StateRecord } from './slab';
import type { DetectorSpec, PerStepDetector } from './spec';

export interface SpecAcceptanceConfig extends DetectorCommon {
  window: number;
  low_accept_rate: number;
  low_accept_len: number;
  high_accept_rate: number;
  high_accept_len: number;
}

export const SPEC_ACCEPTANCE: DetectorSpec<'spec_acceptance', SpecAcceptanceConfig> = {
  name: 'spec_acceptance',
  params: {
    window: int(10, 1, 65536),
    low_accept_rate: num(0.3, 0, 1),
    low_accept_len: num(1.4, 0),
    high_accept_rate: num(0.96, 0, 1),
    high_accept_len: num(2.8, 0),
  },
  perStep: (cfg) => new SpecAcceptanceDetector(cfg),
};

// Header words and parameter slots from native/detector_pass.cc (checked at load); the sums are float64s.
const HEADER = headerLayout('specAcceptance', ['pos', 'len', 'sumDraft', 'sumAcc']);
const { pos: POS, len: LEN, sumDraft: SUM_DRAFT, sumAcc: SUM_ACC } = HEADER;
export const SPEC_HEADER_WORDS = HEADER.headerWords;
const PARAM = paramSlots(['specOn', 'specHead', 'specBody', 'specWindow', 'lowRate', 'lowLen', 'highRate', 'highLen']);

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

export class SpecAcceptanceDetector implements PerStepDetector {
  readonly headerWords = SPEC_HEADER_WORDS;
  /** int32 words of one standalone state record (header + body). */
  readonly words: number;
  /** int32 words of the body part. */
  readonly bodyWords: number;
  private readonly solo: Float64Array;
  private readonly hits = new HitBuffer();

  constructor(readonly cfg: SpecAcceptanceConfig) {
    this.bodyWords = 4 * cfg.window;
    this.words = SPEC_HEADER_WORDS + this.bodyWords;
    this.solo = newParams(this.words);
    this.fill(this.solo, 0, SPEC_HEADER_WORDS);
  }

  /** This detector's parameters, with its header at word `head` and body at `body` (both even). */
  fill(p: Float64Array, head: number, body: number): void {
    p[PARAM.specOn] = 1;
    p[PARAM.specHead] = head;
    p[PARAM.specBody] = body;
    p[PARAM.specWindow] = this.cfg.window;
    p[PARAM.lowRate] = this.cfg.low_accept_rate;
    p[PARAM.lowLen] = this.cfg.low_accept_len;
    p[PARAM.highRate] = this.cfg.high_accept_rate;
    p[PARAM.highLen] = this.cfg.high_accept_len;
  }

  /** The alert from a hit's figures (kernel.ts HIT_WORDS, after row and type). */
  detail(h: Float64Array, at: number): SpecAcceptanceHit {
    const cfg = this.cfg;
    return {
      direction: h[at] === 0 ? 'low' : 'high',
      accept_rate: h[at + 1],
      accept_len: h[at + 2],
      window: cfg.window,
      sum_draft_len: h[at + 3],
      sum_accepted_draft: h[at + 4],
      thresholds: {
        low_accept_rate: cfg.low_accept_rate,
        low_accept_len: cfg.low_accept_len,
        high_accept_rate: cfg.high_accept_rate,
        high_accept_len: cfg.high_accept_len,
      },
    };
  }

  newState(): SpecAcceptanceState {
    return new SpecAcceptanceState(this.words);
  }

  onStep(s: SpecAcceptanceState, draftLen: number, accepted: number): SpecAcceptanceHit | null {
    if (!(draftLen > 0)) return null;
    const h = detectOne(s.i32, this.solo, NO_IGNORE, { draftLen, accepted }, this.hits);
    return h ? this.detail(h, 0) : null;
  }
}

const NO_IGNORE = new Uint32Array(0);
