// token_repeat: stutter / repetition (seed; reference algorithm). For each new content token t,
// score = occurrences of t among the previous `window` content tokens; t is then pushed.
// repeat_sum = sum of the last `window` scores. An ignored token is not a content token: it is
// not pushed, not counted, scores 0 (a 0 enters the score window) and is not an evaluation step.
// Over when content_tokens_seen ≥ min_tokens and repeat_sum > repeat_sum_threshold (strict); the
// alert fires when consecutive over-steps reach consecutive_hits; one alert per request.
//
// O(1) per token, no allocation: repeat_sum is a running sum over a ring of scores, and the
// occurrence counts of the window's tokens live in a small open-addressing table (linear probing,
// backward-shift deletion, at most 2/3 full): one probe counts the new token and adds it, one
// more removes the token leaving the window. The state is int32 words (see slab.ts) in two
// parts, so that the guard can keep every detector's counters of a request side by side:
//   header (at h, even): [0] tokPos [1] tokLen [2] scorePos [3] contentSeen [4] consecutive
//     [5] lastScore [6] alerted [8..9] repeatSum (float64: up to window², past 2^31)
//   body (at r): ring of (token, score) pairs (window) | table of (key, count) pairs, count 0 = empty
import type { TokenRepeatConfig } from '../config';
import { StateRecord } from './slab';

const TOK_POS = 0;
const TOK_LEN = 1;
const SCORE_POS = 2;
const SEEN = 3;
const CONSEC = 4;
const LAST_SCORE = 5;
const ALERTED = 6;
const SUM = 8; // float64
export const TOKEN_REPEAT_HEADER_WORDS = 10;

/** A standalone state record (the guard keeps its records in a slab), readable for inspection. */
export class TokenRepeatState extends StateRecord {
  get repeatSum(): number {
    return this.f64[SUM >> 1];
  }
  get contentSeen(): number {
    return this.i32[SEEN];
  }
  get consecutive(): number {
    return this.i32[CONSEC];
  }
  get lastScore(): number {
    return this.i32[LAST_SCORE];
  }
  get alerted(): boolean {
    return this.i32[ALERTED] !== 0;
  }
  /** Content tokens in the window. */
  get tokLen(): number {
    return this.i32[TOK_LEN];
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
  /** int32 words of one standalone state record (header + body). */
  readonly words: number;
  /** int32 words of the body part. */
  readonly bodyWords: number;
  private readonly window: number;
  private readonly tableAt: number;
  private readonly tableMask: number; // slots − 1 (power of two)
  private readonly hashShift: number; // 32 − log2(slots): Fibonacci hashing keeps the top bits
  private readonly ignore: Set<number>;
  private readonly hasIgnore: boolean;
  private readonly minTokens: number;
  private readonly threshold: number;

  constructor(readonly cfg: TokenRepeatConfig) {
    const w = cfg.window;
    let slots = 8;
    // w + 1 keys at most (the new token is counted before the oldest leaves): at most 2/3 full
    while (2 * slots < 3 * (w + 1)) slots *= 2;
    this.window = w;
    this.tableAt = 2 * w;
    this.tableMask = slots - 1;
    this.hashShift = 32 - Math.log2(slots);
    this.bodyWords = this.tableAt + 2 * slots;
    this.words = TOKEN_REPEAT_HEADER_WORDS + this.bodyWords;
    this.ignore = new Set(cfg.ignore_token_ids);
    this.hasIgnore = this.ignore.size > 0;
    this.minTokens = cfg.min_tokens;
    this.threshold = cfg.repeat_sum_threshold;
  }

  newState(): TokenRepeatState {
    return new TokenRepeatState(this.words);
  }

  /** Feed this step's new tokens; returns the alert (once per request) or null. */
  onTokens(s: TokenRepeatState, tokens: readonly number[]): TokenRepeatHit | null {
    return this.onTokensAt(s.i32, s.f64, s.base, s.base + TOKEN_REPEAT_HEADER_WORDS, tokens, 0, tokens.length);
  }

  /** As onTokens for tokens[start, end), on the state with its header at word `b` (even) and its body at `r`. */
  onTokensAt(m: Int32Array, f: Float64Array, b: number, r: number, tokens: ArrayLike<number>, start: number, end: number): TokenRepeatHit | null {
    if (m[b + ALERTED] !== 0) return null;
    const w = this.window;
    const minTokens = this.minTokens;
    const threshold = this.threshold;
    const sumAt = (b + SUM) >> 1;
    const hasIgnore = this.hasIgnore;
    for (let k = start; k < end; k++) {
      let score = 0;
      const raw = tokens[k];
      const content = !(hasIgnore && this.ignore.has(raw));
      if (content) {
        const t = raw | 0; // ids are uint32 on the wire; the bit pattern is the identity
        score = this.countAndAdd(m, r, t);
        // the new token is in the window now; the oldest one leaves when the window was full
        const pos = m[b + TOK_POS];
        const at = r + 2 * pos;
        if (m[b + TOK_LEN] === w) this.remove(m, r, m[at]);
        else m[b + TOK_LEN]++;
        m[at] = t;
        m[b + TOK_POS] = pos + 1 === w ? 0 : pos + 1;
      }
      // the score window: a 0 for an ignored token
      const sp = m[b + SCORE_POS];
      const sat = r + 2 * sp + 1;
      const sum = f[sumAt] + score - m[sat];
      f[sumAt] = sum;
      m[sat] = score;
      m[b + SCORE_POS] = sp + 1 === w ? 0 : sp + 1;
      if (!content) continue;
      m[b + LAST_SCORE] = score;
      const seen = ++m[b + SEEN];
      if (seen >= minTokens && sum > threshold) {
        const cfg = this.cfg;
        const consecutive = ++m[b + CONSEC];
        if (consecutive >= cfg.consecutive_hits) {
          m[b + ALERTED] = 1;
          return {
            repeat_sum: sum,
            threshold: cfg.repeat_sum_threshold,
            window: w,
            content_tokens_seen: seen,
            last_score: score,
            consecutive_hits: consecutive,
          };
        }
      } else {
        m[b + CONSEC] = 0;
      }
    }
    return null;
  }

  private home(t: number): number {
    return Math.imul(t, 0x9e3779b1) >>> this.hashShift;
  }

  /** Count of t in the window before this token, then one more: a single probe. */
  private countAndAdd(m: Int32Array, r: number, t: number): number {
    const table = r + this.tableAt;
    const mask = this.tableMask;
    let i = this.home(t);
    for (;;) {
      const e = table + 2 * i;
      const c = m[e + 1];
      if (c === 0) {
        m[e] = t;
        m[e + 1] = 1;
        return 0;
      }
      if (m[e] === t) {
        m[e + 1] = c + 1;
        return c;
      }
      i = (i + 1) & mask;
    }
  }

  /** One occurrence of t (present) leaves the window; an emptied entry is back-shift deleted. */
  private remove(m: Int32Array, r: number, t: number): void {
    const table = r + this.tableAt;
    const mask = this.tableMask;
    let i = this.home(t);
    for (;;) {
      if (m[table + 2 * i + 1] === 0) return; // absent: cannot happen while the ring and table agree
      if (m[table + 2 * i] === t) break;
      i = (i + 1) & mask;
    }
    if (--m[table + 2 * i + 1] !== 0) return;
    // pull later entries of the probe run into the hole, so that lookups never stop early
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      const cj = m[table + 2 * j + 1];
      if (cj === 0) return;
      const kj = m[table + 2 * j];
      const h = this.home(kj);
      // kj may move to i when its home is not in the cyclic range (i, j]
      const movable = i <= j ? h <= i || h > j : h <= i && h > j;
      if (movable) {
        m[table + 2 * i] = kj;
        m[table + 2 * i + 1] = cj;
        m[table + 2 * j + 1] = 0;
        i = j;
      }
    }
  }
}
