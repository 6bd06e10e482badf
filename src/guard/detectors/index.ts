// The enabled detectors for one effective config, and the per-request state they keep: one
// record per request slot in a StateSlab. A record starts with every enabled detector's counters
// (their headers, 22 words in all: about one cache line) followed by their rings and the
// token_repeat table, so a wave head touches a few cache lines per request and allocates nothing.
import type { RuntimeConfig } from '../config';
import { detectStep, HIT_TYPE, HIT_WORDS, HitBuffer, MUTE_BIT, nativeDetector, newParams, type StepColumns } from './kernel';
import { DETECTORS, type DetectorName } from './registry';
import { StateSlab } from './slab';
import type { PerStepDetector } from './spec';

export { splitNonFinite, NON_FINITE_KINDS } from './logits-finite';
export { TokenRepeatDetector, TokenRepeatState } from './token-repeat';
export { SpecAcceptanceDetector, SpecAcceptanceState } from './spec-acceptance';
export { GarbledDetector, GarbledState } from './garbled';
export { StateSlab } from './slab';

// Every detector has its mute bit in the native pass, and every per-step one its hit type: a
// registry and an addon that disagree fail here, at load.
for (const d of DETECTORS) nativeDetector(d.name, d.perStep !== undefined);

export interface Hit {
  type: DetectorName;
  detail: Record<string, unknown>;
}

export { MUTE_BIT };

export class DetectorSet {
  /** The enabled per-step detectors, by the hit type (index into HIT_TYPE) they report. */
  private readonly byHitType: (PerStepDetector | undefined)[] = [];
  /** The enabled detectors. */
  readonly enabled: ReadonlySet<DetectorName>;
  readonly logitsFinite: boolean;
  readonly anyPerStep: boolean;
  private readonly slab: StateSlab;
  private readonly params: Float64Array;
  private readonly ignore: Uint32Array;
  private readonly hitBuffer = new HitBuffer();

  constructor(cfg: RuntimeConfig) {
    const d = cfg.detector;
    this.enabled = new Set(DETECTORS.filter((s) => d[s.name].enabled).map((s) => s.name));
    this.logitsFinite = this.enabled.has('logits_finite');
    const on: [DetectorName, PerStepDetector][] = [];
    for (const s of DETECTORS) {
      if (!s.perStep || !this.enabled.has(s.name)) continue;
      const det = (s.perStep as (c: unknown) => PerStepDetector)(d[s.name]);
      on.push([s.name, det]);
      this.byHitType[HIT_TYPE.indexOf(s.name)] = det;
    }
    this.anyPerStep = on.length > 0;
    // Headers first, then the bodies; every part is an even number of words, so each float64
    // inside stays 8-byte aligned. A request's counters then share a cache line or two.
    let at = 0;
    const heads = on.map(([, det]) => {
      const h = at;
      at += det.headerWords;
      return h;
    });
    const bodies = on.map(([, det]) => {
      const b = at;
      at += det.bodyWords;
      return b;
    });
    this.slab = new StateSlab(at);
    this.params = newParams(this.slab.words);
    on.forEach(([, det], k) => det.fill(this.params, heads[k], bodies[k]));
    this.ignore = on.find(([, det]) => det.ignore)?.[1].ignore ?? new Uint32Array(0);
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
      const type = HIT_TYPE[h[at + 1]] as DetectorName;
      const detector = this.byHitType[h[at + 1]]!;
      onHit(h[at], { type, detail: detector.detail(h, at + 2) as Record<string, unknown> });
    }
  }
}
