// The enabled detectors for one effective config, and the per-request state they keep: one
// record per request slot in a StateSlab. A record starts with every enabled detector's counters
// (their headers, 22 words in all: about one cache line) followed by their rings and the
// token_repeat table, so a wave head touches a few cache lines per request and allocates nothing.
import type { DetectorName, RuntimeConfig } from '../config';
import { GarbledDetector, GARBLED_HEADER_WORDS } from './garbled';
import { detectStep, HIT_TYPE, HIT_WORDS, HitBuffer, MUTE_BIT, newParams, type StepColumns } from './kernel';
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

export { MUTE_BIT };

export class DetectorSet {
  readonly tokenRepeat: TokenRepeatDetector | null;
  readonly spec: SpecAcceptanceDetector | null;
  readonly garbled: GarbledDetector | null;
  readonly logitsFinite: boolean;
  readonly anyPerStep: boolean;
  private readonly slab: StateSlab;
  private readonly params: Float64Array;
  private readonly ignore: Uint32Array;
  private readonly hitBuffer = new HitBuffer();

  constructor(cfg: RuntimeConfig) {
    const d = cfg.detector;
    this.tokenRepeat = d.token_repeat.enabled ? new TokenRepeatDetector(d.token_repeat) : null;
    this.spec = d.spec_acceptance.enabled ? new SpecAcceptanceDetector(d.spec_acceptance) : null;
    this.garbled = d.garbled.enabled ? new GarbledDetector(d.garbled) : null;
    this.logitsFinite = d.logits_finite.enabled;
    this.anyPerStep = this.tokenRepeat !== null || this.spec !== null || this.garbled !== null;
    // headers first (each an even number of words), then the bodies: spec's float64 ring first
    let at = 0;
    const repeatHead = at;
    at += this.tokenRepeat ? TOKEN_REPEAT_HEADER_WORDS : 0;
    const specHead = at;
    at += this.spec ? SPEC_HEADER_WORDS : 0;
    const garbledHead = at;
    at += this.garbled ? GARBLED_HEADER_WORDS : 0;
    const specBody = at;
    at += this.spec?.bodyWords ?? 0;
    const repeatBody = at;
    at += this.tokenRepeat?.bodyWords ?? 0;
    const garbledBody = at;
    at += this.garbled?.bodyWords ?? 0;
    this.slab = new StateSlab(at);
    this.params = newParams(this.slab.words);
    this.tokenRepeat?.fill(this.params, repeatHead, repeatBody);
    this.spec?.fill(this.params, specHead, specBody);
    this.garbled?.fill(this.params, garbledHead, garbledBody);
    this.ignore = this.tokenRepeat?.ignore ?? new Uint32Array(0);
  }

  /** A slot gets a new request: its record starts fresh. */
  resetSlot(slot: number): void {
    this.slab.reset(slot);
  }

  /** Word offset of `slot`'s record (zero until the request's first step). */
  recordOf(slot: number): number {
    this.slab.ensure(slot);
    return this.slab.base(slot);
  }

  /**
   * Run the per-step detectors over a step's rows: row i on the record at rowRecord[i] (-1: skip),
   * with the detectors in rowMuted[i] muted. Calls onHit(row, hit) for each hit, in row order.
   */
  onStep(c: StepColumns, rowRecord: Int32Array, rowMuted: Int32Array, onHit: (row: number, hit: Hit) => void): void {
    const n = detectStep(this.slab.i32, this.params, this.ignore, rowRecord, rowMuted, c, this.hitBuffer);
    const h = this.hitBuffer.hits;
    for (let k = 0; k < n; k++) {
      const at = k * HIT_WORDS;
      const type = HIT_TYPE[h[at + 1]];
      const detector = type === 'token_repeat' ? this.tokenRepeat! : type === 'spec_acceptance' ? this.spec! : this.garbled!;
      onHit(h[at], { type, detail: detector.detail(h, at + 2) as unknown as Record<string, unknown> });
    }
  }
}
