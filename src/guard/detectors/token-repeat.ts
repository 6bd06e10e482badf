// token_repeat: stutter / repetition (seed; reference algorithm). For each new content token t,
// score = occurrences of t among the previous `window` content tokens; t is then pushed.
// repeat_sum = sum of the last `window` scores. An ignored token is not a content token: it is
// not pushed, not counted and scores 0 (a 0 enters the score window). Over when
// content_tokens_seen ≥ min_tokens and repeat_sum > repeat_sum_threshold (strict); the alert fires
// when consecutive over-steps reach consecutive_hits; one alert per request.
// Where the seed is silent we follow upstream (vllm-ascend runtime_guard token_repeat): the
// threshold is evaluated after every token, an ignored one included, and when one step brings
// several tokens they are all folded in and the alert's figures are the state at the end of the
// step (last_score is the last token's score, consecutive_hits the run length then).
//
// The pass runs natively (native/detector_pass.cc, Repeat); this file holds the layout and the
// parameters. O(1) per token, no allocation: repeat_sum is a running sum over a ring of scores, and the
// occurrence counts of the window's tokens live in a small open-addressing table (linear probing,
// backward-shift deletion, at most 2/3 full): one probe counts the new token and adds it, one
// more removes the token leaving the window. The state is int32 words (see slab.ts) in two
// parts, so that the guard can keep every detector's counters of a request side by side:
//   header (at h, even; word offsets in native.detectorLayout.tokenRepeat): tokPos, tokLen,
//     scorePos, seen (content tokens), consecutive, lastScore, alerted, sum (repeatSum, float64:
//     up to window², past 2^31)
//   body (at r): ring of (token, score) pairs (window) | table of (key, count) pairs, count 0 = empty
import { int, type DetectorCommon } from '../config-schema';
import { detectOne, headerLayout, HitBuffer, newParams, paramSlots } from './kernel';
import { StateRecord } from './slab';
import type { DetectorSpec, PerStepDetector } from './spec';

export interface TokenRepeatConfig extends DetectorCommon {
  window: number;
  repeat_sum_threshold: number;
  min_tokens: number;
  consecutive_hits: number;
  ignore_token_ids: number[];
}

export const TOKEN_REPEAT: DetectorSpec<'token_repeat', TokenRepeatConfig> = {
  name: 'token_repeat',
  params: {
    window: int(32, 1, 65536),
    repeat_sum_threshold: int(64, 0),
    min_tokens: int(32, 0),
    consecutive_hits: int(1, 1),
    ignore_token_ids: { kind: 'int_list', def: [], min: 0 },
  },
  perStep: (cfg) => new TokenRepeatDetector(cfg),
};

// Header words and parameter slots from native/detector_pass.cc (checked at load).
const HEADER = headerLayout('tokenRepeat', ['tokPos', 'tokLen', 'scorePos', 'seen', 'consecutive', 'lastScore', 'alerted', 'sum']);
const { tokLen: TOK_LEN, seen: SEEN, consecutive: CONSEC, lastScore: LAST_SCORE, alerted: ALERTED, sum: SUM /* float64 */ } = HEADER;
export const TOKEN_REPEAT_HEADER_WORDS = HEADER.headerWords;
const PARAM = paramSlots(['repeatOn', 'repeatHead', 'repeatBody', 'repeatWindow', 'tableMask', 'hashShift', 'tableAt', 'repeatMinTokens', 'repeatThreshold', 'repeatConsecutive']);

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

export class TokenRepeatDetector implements PerStepDetector {
  readonly headerWords = TOKEN_REPEAT_HEADER_WORDS;
  /** int32 words of one standalone state record (header + body). */
  readonly words: number;
  /** int32 words of the body part. */
  readonly bodyWords: number;
  /** ignore_token_ids, sorted (the pass binary-searches them). */
  readonly ignore: Uint32Array;
  private readonly window: number;
  private readonly tableAt: number;
  private readonly tableMask: number; // slots − 1 (power of two)
  private readonly hashShift: number; // 32 − log2(slots): Fibonacci hashing keeps the top bits
  private readonly solo: Float64Array;
  private readonly hits = new HitBuffer();

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
    this.ignore = Uint32Array.from(new Set(cfg.ignore_token_ids.map((t) => t >>> 0))).sort();
    this.solo = newParams(this.words + (this.words & 1));
    this.fill(this.solo, 0, TOKEN_REPEAT_HEADER_WORDS);
  }

  /** This detector's parameters, with its header at word `head` and body at `body` of a record. */
  fill(p: Float64Array, head: number, body: number): void {
    p[PARAM.repeatOn] = 1;
    p[PARAM.repeatHead] = head;
    p[PARAM.repeatBody] = body;
    p[PARAM.repeatWindow] = this.window;
    p[PARAM.tableMask] = this.tableMask;
    p[PARAM.hashShift] = this.hashShift;
    p[PARAM.tableAt] = this.tableAt;
    p[PARAM.repeatMinTokens] = this.cfg.min_tokens;
    p[PARAM.repeatThreshold] = this.cfg.repeat_sum_threshold;
    p[PARAM.repeatConsecutive] = this.cfg.consecutive_hits;
  }

  /** The alert from a hit's figures (kernel.ts HIT_WORDS, after row and type). */
  detail(h: Float64Array, at: number): TokenRepeatHit {
    return {
      repeat_sum: h[at],
      threshold: this.cfg.repeat_sum_threshold,
      window: this.window,
      content_tokens_seen: h[at + 1],
      last_score: h[at + 2],
      consecutive_hits: h[at + 3],
    };
  }

  newState(): TokenRepeatState {
    return new TokenRepeatState(this.words);
  }

  /** Feed this step's new tokens; returns the alert (once per request) or null. */
  onTokens(s: TokenRepeatState, tokens: readonly number[]): TokenRepeatHit | null {
    const h = detectOne(s.i32, this.solo, this.ignore, { tokenIds: Uint32Array.from(tokens, (t) => t >>> 0) }, this.hits);
    return h ? this.detail(h, 0) : null;
  }
}
