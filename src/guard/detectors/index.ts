// The enabled detectors for one effective config, and the per-request state they keep: one
// record per request slot in a StateSlab. A record starts with every enabled detector's counters
// (their headers, 22 words in all: about one cache line) followed by their rings and the
// token_repeat table, so a wave head touches a few cache lines per request and allocates nothing.
import type { TelemetryColumns } from '../../telemetry';
import type { DetectorName, RuntimeConfig } from '../config';
import { GarbledDetector, GARBLED_HEADER_WORDS } from './garbled';
import { StateSlab } from './slab';
import { SpecAcceptanceDetector, SPEC_HEADER_WORDS } from './spec-acceptance';
import { TokenRepeatDetector, TOKEN_REPEAT_HEADER_WORDS } from './token-repeat';

export { splitNonFinite, NON_FINITE_KINDS } from './logits-finite';
export { TokenRepeatDetector, TokenRepeatState } from './token-repeat';
export { SpecAcceptanceDetector, SpecAcceptanceState } from './spec-acceptance';
export { GarbledDetector, GarbledState } from './garbled';
export { StateSlab } from './slab';

export interface Hit {
  type: DetectorName;
  detail: Record<string, unknown>;
}

/** Bit of each detector in a request's muted mask (a detector the quota stopped for it). */
const MUTE_TOKEN_REPEAT = 1;
const MUTE_LOGITS_FINITE = 2;
const MUTE_SPEC = 4;
const MUTE_GARBLED = 8;
export const MUTE_BIT: Readonly<Record<DetectorName, number>> = {
  token_repeat: MUTE_TOKEN_REPEAT,
  logits_finite: MUTE_LOGITS_FINITE,
  spec_acceptance: MUTE_SPEC,
  garbled: MUTE_GARBLED,
};

export class DetectorSet {
  readonly tokenRepeat: TokenRepeatDetector | null;
  readonly spec: SpecAcceptanceDetector | null;
  readonly garbled: GarbledDetector | null;
  readonly logitsFinite: boolean;
  readonly anyPerStep: boolean;
  /** Word offsets of each detector's header and body in a request's record (all even). */
  private readonly repeatHead: number;
  private readonly repeatBody: number;
  private readonly specHead: number;
  private readonly specBody: number;
  private readonly garbledHead: number;
  private readonly garbledBody: number;
  private readonly slab: StateSlab;

  constructor(cfg: RuntimeConfig) {
    const d = cfg.detector;
    this.tokenRepeat = d.token_repeat.enabled ? new TokenRepeatDetector(d.token_repeat) : null;
    this.spec = d.spec_acceptance.enabled ? new SpecAcceptanceDetector(d.spec_acceptance) : null;
    this.garbled = d.garbled.enabled ? new GarbledDetector(d.garbled) : null;
    this.logitsFinite = d.logits_finite.enabled;
    this.anyPerStep = this.tokenRepeat !== null || this.spec !== null || this.garbled !== null;
    // headers first (each an even number of words), then the bodies: spec's float64 ring first
    let at = 0;
    this.repeatHead = at;
    at += this.tokenRepeat ? TOKEN_REPEAT_HEADER_WORDS : 0;
    this.specHead = at;
    at += this.spec ? SPEC_HEADER_WORDS : 0;
    this.garbledHead = at;
    at += this.garbled ? GARBLED_HEADER_WORDS : 0;
    this.specBody = at;
    at += this.spec?.bodyWords ?? 0;
    this.repeatBody = at;
    at += this.tokenRepeat?.bodyWords ?? 0;
    this.garbledBody = at;
    at += this.garbled?.bodyWords ?? 0;
    this.slab = new StateSlab(at);
  }

  /** A slot gets a new request: its record starts fresh. */
  resetSlot(slot: number): void {
    this.slab.reset(slot);
  }

  /**
   * Run the per-step detectors on row `row` of a step's columns (the request in `slot`), whose
   * tokens are [tokStart, tokEnd) of the per-token columns; hits are appended to `out`.
   */
  onStep(slot: number, muted: number, c: TelemetryColumns, row: number, tokStart: number, tokEnd: number, out: Hit[]): void {
    const runRepeat = this.tokenRepeat !== null && tokEnd > tokStart && (muted & MUTE_TOKEN_REPEAT) === 0;
    const runSpec = this.spec !== null && c.draftLen.length > 0 && c.draftLen[row] > 0 && (muted & MUTE_SPEC) === 0;
    const runGarbled = this.garbled !== null && tokEnd > tokStart && c.tokenLogprobs.length > 0 && (muted & MUTE_GARBLED) === 0;
    if (!runRepeat && !runSpec && !runGarbled) return;
    const page = this.slab.page(slot);
    const m = page.i32;
    const f = page.f64;
    const b = this.slab.base(slot);
    if (runRepeat) {
      const h = this.tokenRepeat!.onTokensAt(m, f, b + this.repeatHead, b + this.repeatBody, c.tokenIds, tokStart, tokEnd);
      if (h) out.push({ type: 'token_repeat', detail: h as unknown as Record<string, unknown> });
    }
    if (runSpec) {
      const h = this.spec!.onStepAt(m, f, b + this.specHead, b + this.specBody, c.draftLen[row], c.accepted[row]);
      if (h) out.push({ type: 'spec_acceptance', detail: h as unknown as Record<string, unknown> });
    }
    if (runGarbled) {
      const ranks = c.tokenRanks.length > 0 ? c.tokenRanks : null;
      const h = this.garbled!.onTokensAt(m, f, b + this.garbledHead, b + this.garbledBody, c.tokenLogprobs, ranks, tokStart, tokEnd);
      if (h) out.push({ type: 'garbled', detail: h as unknown as Record<string, unknown> });
    }
  }
}
