// The enabled detectors for one effective config, and the per-request state they keep.
// One object per request holds every detector's state, so the guard does a single map lookup
// per request per step.
import type { RequestStep } from '../../messages';
import type { DetectorName, RuntimeConfig } from '../config';
import { GarbledDetector, GarbledState } from './garbled';
import { SpecAcceptanceDetector, SpecAcceptanceState } from './spec-acceptance';
import { TokenRepeatDetector, TokenRepeatState } from './token-repeat';

export { splitNonFinite, NON_FINITE_KINDS } from './logits-finite';
export { TokenRepeatDetector, TokenRepeatState } from './token-repeat';
export { SpecAcceptanceDetector, SpecAcceptanceState } from './spec-acceptance';
export { GarbledDetector, GarbledState } from './garbled';

export interface Hit {
  type: DetectorName;
  detail: Record<string, unknown>;
}

/** Per-request detector state; a detector the quota stopped for this request is muted here. */
export interface DetectorStates {
  tokenRepeat: TokenRepeatState | null;
  spec: SpecAcceptanceState | null;
  garbled: GarbledState | null;
  muted: Set<DetectorName> | null;
}

export class DetectorSet {
  readonly tokenRepeat: TokenRepeatDetector | null;
  readonly spec: SpecAcceptanceDetector | null;
  readonly garbled: GarbledDetector | null;
  readonly logitsFinite: boolean;

  constructor(cfg: RuntimeConfig) {
    const d = cfg.detector;
    this.tokenRepeat = d.token_repeat.enabled ? new TokenRepeatDetector(d.token_repeat) : null;
    this.spec = d.spec_acceptance.enabled ? new SpecAcceptanceDetector(d.spec_acceptance) : null;
    this.garbled = d.garbled.enabled ? new GarbledDetector(d.garbled) : null;
    this.logitsFinite = d.logits_finite.enabled;
  }

  get anyPerStep(): boolean {
    return this.tokenRepeat !== null || this.spec !== null || this.garbled !== null;
  }

  /** All fields present from the start: one hidden class for every request's state. */
  newStates(muted: Set<DetectorName> | null = null): DetectorStates {
    return { tokenRepeat: null, spec: null, garbled: null, muted };
  }

  /** Run the per-step detectors on one request's step; hits are appended to `out`. */
  onStep(st: DetectorStates, step: RequestStep, out: Hit[]): void {
    const muted = st.muted;
    const tokens = step.newTokenIds;
    if (this.tokenRepeat && tokens.length > 0 && !(muted && muted.has('token_repeat'))) {
      const s = st.tokenRepeat ?? (st.tokenRepeat = this.tokenRepeat.newState());
      const h = this.tokenRepeat.onTokens(s, tokens);
      if (h) out.push({ type: 'token_repeat', detail: h as unknown as Record<string, unknown> });
    }
    if (this.spec && step.draftLen > 0 && !(muted && muted.has('spec_acceptance'))) {
      const s = st.spec ?? (st.spec = this.spec.newState());
      const h = this.spec.onStep(s, step.draftLen, step.accepted);
      if (h) out.push({ type: 'spec_acceptance', detail: h as unknown as Record<string, unknown> });
    }
    if (this.garbled && step.newTokenLogprobs.length > 0 && !(muted && muted.has('garbled'))) {
      const s = st.garbled ?? (st.garbled = this.garbled.newState());
      const h = this.garbled.onTokens(s, step.newTokenLogprobs, step.newTokenRanks, tokens.length > 0 ? tokens.length : step.newTokenLogprobs.length);
      if (h) out.push({ type: 'garbled', detail: h as unknown as Record<string, unknown> });
    }
  }
}
