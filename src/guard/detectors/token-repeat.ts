// token_repeat: stutter / repetition (seed; reference algorithm). For each new content token t,
// score = occurrences of t among the previous `window` content tokens; t is then pushed.
// repeat_sum = sum of the last `window` scores. An ignored token is not a content token: it is
// not pushed, not counted, scores 0 (a 0 enters the score window) and is not an evaluation step.
// Over when content_tokens_seen ≥ min_tokens and repeat_sum > repeat_sum_threshold (strict); the
// alert fires when consecutive over-steps reach consecutive_hits; one alert per request.
import type { TokenRepeatConfig } from '../config';

/** Above this window, occurrences come from a count map instead of a scan of the ring. */
const SCAN_MAX = 128;

export class TokenRepeatState {
  readonly tokens: Int32Array; // last `window` content tokens (ring)
  readonly scores: Int32Array; // last `window` scores (ring)
  readonly counts: Map<number, number> | null;
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
    this.counts = window > SCAN_MAX ? new Map() : null;
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

  private occurrences(s: TokenRepeatState, t: number): number {
    if (s.counts) return s.counts.get(t) ?? 0;
    const ring = s.tokens;
    let n = 0;
    for (let i = 0; i < s.tokLen; i++) if (ring[i] === t) n++;
    return n;
  }

  private pushToken(s: TokenRepeatState, t: number): void {
    const w = this.cfg.window;
    if (s.counts) {
      if (s.tokLen === w) {
        const old = s.tokens[s.tokPos];
        const c = s.counts.get(old)! - 1;
        if (c === 0) s.counts.delete(old);
        else s.counts.set(old, c);
      }
      s.counts.set(t, (s.counts.get(t) ?? 0) + 1);
    }
    s.tokens[s.tokPos] = t;
    s.tokPos = s.tokPos + 1 === w ? 0 : s.tokPos + 1;
    if (s.tokLen < w) s.tokLen++;
  }

  /** Feed this step's new tokens; returns the alert (once per request) or null. */
  onTokens(s: TokenRepeatState, tokens: readonly number[]): TokenRepeatHit | null {
    if (s.alerted) return null;
    const cfg = this.cfg;
    for (let k = 0; k < tokens.length; k++) {
      const t = tokens[k];
      if (this.ignore.size > 0 && this.ignore.has(t)) {
        this.pushScore(s, 0);
        continue;
      }
      const score = this.occurrences(s, t);
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
