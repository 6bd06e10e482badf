// token_repeat: stutter / repetition (seed; reference algorithm). For each new content token t,
// score = occurrences of t among the previous `window` content tokens; t is then pushed.
// repeat_sum = sum of the last `window` scores. An ignored token is not a content token: it is
// not pushed, not counted, scores 0 (a 0 enters the score window) and is not an evaluation step.
// Over when content_tokens_seen ≥ min_tokens and repeat_sum > repeat_sum_threshold (strict); the
// alert fires when consecutive over-steps reach consecutive_hits; one alert per request.
import type { TokenRepeatConfig } from '../config';

/**
 * Occurrence counts of the tokens in the window: an open-addressing table (linear probing,
 * backward-shift deletion) in two Int32Arrays, at most half full. O(1) per token, no allocation.
 */
export class TokenCounts {
  readonly keys: Int32Array;
  readonly cnts: Int32Array;
  readonly mask: number;
  constructor(window: number) {
    let cap = 8;
    while (cap < 2 * window) cap *= 2;
    this.keys = new Int32Array(cap);
    this.cnts = new Int32Array(cap);
    this.mask = cap - 1;
  }
  private slot(t: number): number {
    const { keys, cnts, mask } = this;
    let i = Math.imul(t, 0x9e3779b1) >>> 16 & mask;
    while (cnts[i] !== 0 && keys[i] !== t) i = (i + 1) & mask;
    return i;
  }
  get(t: number): number {
    return this.cnts[this.slot(t)];
  }
  inc(t: number): void {
    const i = this.slot(t);
    this.keys[i] = t;
    this.cnts[i]++;
  }
  dec(t: number): void {
    const { keys, cnts, mask } = this;
    let i = this.slot(t);
    if (--cnts[i] !== 0) return;
    // backward-shift: pull later entries of the probe run into the hole
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      if (cnts[j] === 0) return;
      const home = Math.imul(keys[j], 0x9e3779b1) >>> 16 & mask;
      const movable = i <= j ? home <= i || home > j : home <= i && home > j;
      if (movable) {
        keys[i] = keys[j];
        cnts[i] = cnts[j];
        cnts[j] = 0;
        i = j;
      }
    }
  }
}

export class TokenRepeatState {
  readonly tokens: Int32Array; // last `window` content tokens (ring)
  readonly scores: Int32Array; // last `window` scores (ring)
  readonly counts: TokenCounts;
  tokPos = 0;
  tokLen = 0;
  scorePos = 0;
  repeatSum = 0;
  contentSeen = 0;
  consecutive = 0;
  lastScore = 0;
  alerted = false;
  constructor(window: number) {
    this.tokens = new Int32Array(window);
    this.scores = new Int32Array(window);
    this.counts = new TokenCounts(window);
  }
}

export interface TokenRepeatHit {
  repeat_sum: number;
  threshold: number;
  window: number;
  content_tokens_seen: number;
  last_score: number;
  consecutive_hits: number;
}

export class TokenRepeatDetector {
  private readonly ignore: Set<number>;
  constructor(readonly cfg: TokenRepeatConfig) {
    this.ignore = new Set(cfg.ignore_token_ids);
  }

  newState(): TokenRepeatState {
    return new TokenRepeatState(this.cfg.window);
  }

  private pushScore(s: TokenRepeatState, score: number): void {
    const w = this.cfg.window;
    s.repeatSum += score - s.scores[s.scorePos];
    s.scores[s.scorePos] = score;
    s.scorePos = s.scorePos + 1 === w ? 0 : s.scorePos + 1;
  }

  private pushToken(s: TokenRepeatState, t: number): void {
    const w = this.cfg.window;
    if (s.tokLen === w) s.counts.dec(s.tokens[s.tokPos]);
    else s.tokLen++;
    s.counts.inc(t);
    s.tokens[s.tokPos] = t;
    s.tokPos = s.tokPos + 1 === w ? 0 : s.tokPos + 1;
  }

  /** Feed this step's new tokens; returns the alert (once per request) or null. */
  onTokens(s: TokenRepeatState, tokens: readonly number[]): TokenRepeatHit | null {
    if (s.alerted) return null;
    const cfg = this.cfg;
    for (let k = 0; k < tokens.length; k++) {
      const t = tokens[k] | 0; // ids are uint32 on the wire; the bit pattern is the identity
      if (this.ignore.size > 0 && this.ignore.has(tokens[k])) {
        this.pushScore(s, 0);
        continue;
      }
      const score = s.counts.get(t);
      this.pushToken(s, t);
      this.pushScore(s, score);
      s.lastScore = score;
      s.contentSeen++;
      if (s.contentSeen >= cfg.min_tokens && s.repeatSum > cfg.repeat_sum_threshold) {
        s.consecutive++;
        if (s.consecutive >= cfg.consecutive_hits) {
          s.alerted = true;
          return {
            repeat_sum: s.repeatSum,
            threshold: cfg.repeat_sum_threshold,
            window: cfg.window,
            content_tokens_seen: s.contentSeen,
            last_score: score,
            consecutive_hits: s.consecutive,
          };
        }
      } else {
        s.consecutive = 0;
      }
    }
    return null;
  }
}
