import { defaultConfig } from '../src/guard/config';
import type { TokenRepeatConfig } from '../src/guard/detectors/token-repeat';
import { TokenRepeatDetector } from '../src/guard/detectors/token-repeat';

function cfg(p: Partial<TokenRepeatConfig>): TokenRepeatConfig {
  return { ...defaultConfig().detector.token_repeat, enabled: true, ...p };
}

interface RefHit {
  step: number;
  repeat_sum: number;
  content_tokens_seen: number;
  last_score: number;
  consecutive_hits: number;
}

/**
 * The reference algorithm, transcribed with lists (seed-implementations.md, token_repeat), with
 * upstream's choices where the seed is silent: every token, an ignored one included, is an
 * evaluation step; a step that alerted is folded in to its end and reports its end state.
 */
function reference(c: TokenRepeatConfig, steps: number[][]): RefHit | null {
  const content: number[] = [];
  const scores: number[] = [];
  let seen = 0;
  let consecutive = 0;
  for (let s = 0; s < steps.length; s++) {
    let hit = false;
    let score = 0;
    for (const t of steps[s]) {
      if (c.ignore_token_ids.includes(t)) {
        score = 0;
      } else {
        score = content.slice(-c.window).filter((x) => x === t).length;
        content.push(t);
        seen++;
      }
      scores.push(score);
      const sum = scores.slice(-c.window).reduce((a, b) => a + b, 0);
      if (seen >= c.min_tokens && sum > c.repeat_sum_threshold) {
        consecutive++;
        if (consecutive >= c.consecutive_hits) hit = true;
      } else consecutive = 0;
    }
    if (hit) {
      const sum = scores.slice(-c.window).reduce((a, b) => a + b, 0);
      return { step: s, repeat_sum: sum, content_tokens_seen: seen, last_score: score, consecutive_hits: consecutive };
    }
  }
  return null;
}

let seed = 4242;
const rnd = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
const int = (n: number) => Math.floor(rnd() * n);

/** One token per step: the alerting token's index and repeat_sum, as firstAlert gives them. */
function naive(c: TokenRepeatConfig, tokens: number[]): { at: number; repeat_sum: number } | null {
  const r = reference(c, tokens.map((x) => [x]));
  return r ? { at: r.step, repeat_sum: r.repeat_sum } : null;
}

/** Feed one token per step; index of the token that alerted. */
function firstAlert(c: TokenRepeatConfig, tokens: number[]) {
  const d = new TokenRepeatDetector(c);
  const s = d.newState();
  for (let i = 0; i < tokens.length; i++) {
    const h = d.onTokens(s, [tokens[i]]);
    if (h) return { at: i, hit: h };
  }
  return null;
}

describe('token_repeat', () => {
  test('repeat_sum exactly at the threshold does not fire; one over does', () => {
    // window 4, one token repeated: scores 0,1,2,3,4,4,... → sums 0,1,3,6,10,13,15,16,16,...
    const same = [7, 7, 7, 7, 7];
    expect(firstAlert(cfg({ window: 4, min_tokens: 0, repeat_sum_threshold: 6 }), same)?.at).toBe(4);
    const r = firstAlert(cfg({ window: 4, min_tokens: 0, repeat_sum_threshold: 5 }), same);
    expect(r?.at).toBe(3);
    expect(r?.hit).toEqual({ repeat_sum: 6, threshold: 5, window: 4, content_tokens_seen: 4, last_score: 3, consecutive_hits: 1 });
    expect(firstAlert(cfg({ window: 4, min_tokens: 0, repeat_sum_threshold: 16 }), [7, 7, 7, 7, 7, 7, 7, 7, 7, 7])).toBeNull();
    expect(firstAlert(cfg({ window: 4, min_tokens: 0, repeat_sum_threshold: 15 }), [7, 7, 7, 7, 7, 7, 7, 7])?.at).toBe(7);
  });

  test('min_tokens: no alert before that many content tokens', () => {
    expect(firstAlert(cfg({ window: 4, min_tokens: 3, repeat_sum_threshold: 0 }), [1, 1, 1])?.at).toBe(2);
    expect(firstAlert(cfg({ window: 4, min_tokens: 4, repeat_sum_threshold: 0 }), [1, 1, 1])).toBeNull();
  });

  test('defaults: a healthy varied sequence stays silent, a loop fires', () => {
    const c = cfg({});
    const varied = Array.from({ length: 500 }, (_, i) => (i * 7919) % 1000);
    expect(firstAlert(c, varied)).toBeNull();
    const loop = Array.from({ length: 200 }, (_, i) => [11, 12, 13, 14][i % 4]);
    const r = firstAlert(c, loop);
    expect(r).not.toBeNull();
    expect(r!.hit.repeat_sum).toBeGreaterThan(64);
    expect(r!.hit.content_tokens_seen).toBeGreaterThanOrEqual(32);
  });

  test('consecutive_hits: needs that many over-steps in a row; a dip resets', () => {
    const c = cfg({ window: 2, min_tokens: 0, repeat_sum_threshold: 2, consecutive_hits: 2 });
    // window 2: scores 0,1,2,0,1,2,2 → sums 0,1,3,2,1,3,4: over at index 2, dip at 3, over at 5 and 6 → alert at 6
    expect(naive(c, [5, 5, 5, 9, 9, 9, 9])?.at).toBe(6);
    expect(firstAlert(c, [5, 5, 5, 9, 9, 9, 9])?.at).toBe(6);
  });

  test('ignored tokens: not content, score 0, and "the threshold is evaluated after every token, ignored tokens included"', () => {
    // window 4, threshold 2, two over-steps in a row: 7,7,7 scores 0,1,2 (sum 3: over, run 1); the
    // ignored 0 scores 0, the sum stays 3: over again, run 2 → the alert is at the ignored token
    // (index 3), not at the next content token (index 4) as when ignored tokens were skipped.
    const c = cfg({ window: 4, min_tokens: 0, repeat_sum_threshold: 2, consecutive_hits: 2, ignore_token_ids: [0] });
    const r = firstAlert(c, [7, 7, 7, 0, 7]);
    expect(r?.at).toBe(3);
    expect(r?.hit).toEqual({ repeat_sum: 3, threshold: 2, window: 4, content_tokens_seen: 3, last_score: 0, consecutive_hits: 2 });
    expect(naive(c, [7, 7, 7, 0, 7])?.at).toBe(3);
    // an ignored token that brings the sum down breaks the run: window 2, scores 0,1,2 then 0 → sum 2
    const c2 = cfg({ window: 2, min_tokens: 0, repeat_sum_threshold: 2, consecutive_hits: 2, ignore_token_ids: [0] });
    expect(firstAlert(c2, [7, 7, 7, 0])).toBeNull();
    const seq = [7, 0, 7, 0, 7, 0, 7, 7, 7];
    const c3 = cfg({ window: 4, min_tokens: 0, repeat_sum_threshold: 5, ignore_token_ids: [0] });
    expect(firstAlert(c3, seq)?.at).toBe(naive(c3, seq)?.at);
    expect(firstAlert(c3, [0, 0, 0, 0, 0, 0, 0, 0])).toBeNull();
  });

  test('one alert per request; "when a step brings several tokens, the report\'s detail is the state at the end of the step"', () => {
    const c = cfg({ window: 4, min_tokens: 0, repeat_sum_threshold: 2 });
    const d = new TokenRepeatDetector(c);
    const s = d.newState();
    // scores 0,1,2,3 → sums 0,1,3,6: over at the third token, the fourth is still folded in
    expect(d.onTokens(s, [3, 3, 3, 3])).toEqual({ repeat_sum: 6, threshold: 2, window: 4, content_tokens_seen: 4, last_score: 3, consecutive_hits: 2 });
    expect(d.onTokens(s, [3, 3, 3, 3])).toBeNull();
    expect(s.repeatSum).toBe(6); // an alerted request is not evaluated any more
    // ending on an ignored token: its score 0 is the last score
    const d2 = new TokenRepeatDetector(cfg({ window: 4, min_tokens: 0, repeat_sum_threshold: 2, ignore_token_ids: [0] }));
    expect(d2.onTokens(d2.newState(), [3, 3, 3, 0])).toEqual({ repeat_sum: 3, threshold: 2, window: 4, content_tokens_seen: 3, last_score: 0, consecutive_hits: 2 });
    // the run can end inside the alerting step: the detail shows it as it is at the end
    const d3 = new TokenRepeatDetector(cfg({ window: 2, min_tokens: 0, repeat_sum_threshold: 2, ignore_token_ids: [0] }));
    expect(d3.onTokens(d3.newState(), [7, 7, 7, 0])).toEqual({ repeat_sum: 2, threshold: 2, window: 2, content_tokens_seen: 3, last_score: 0, consecutive_hits: 0 });
  });

  test('matches the reference transcription on random sequences (ring and map paths)', () => {
    for (const window of [1, 3, 8, 32, 200]) {
      for (let trial = 0; trial < 30; trial++) {
        const alphabet = 2 + Math.floor(rnd() * 20);
        const tokens = Array.from({ length: 400 }, () => Math.floor(rnd() * alphabet));
        const c = cfg({
          window,
          min_tokens: Math.floor(rnd() * 40),
          repeat_sum_threshold: Math.floor(rnd() * window * 6),
          consecutive_hits: 1 + Math.floor(rnd() * 3),
          ignore_token_ids: rnd() < 0.5 ? [0] : [],
        });
        const want = naive(c, tokens);
        const got = firstAlert(c, tokens);
        expect(got ? { at: got.at, repeat_sum: got.hit.repeat_sum } : null).toEqual(want);
      }
    }
  });
});

describe('token_repeat, optimized vs reference', () => {
  test('random streams: uint32 ids past 2^31, colliding ids, several tokens per step, ignore lists', () => {
    const pools = [
      () => int(3),
      () => 2 ** 32 - 1 - int(4), // the top of the uint32 range: negative as int32
      () => int(8) * 2 ** 26, // equal low bits
      () => int(50000),
    ];
    let fired = 0;
    for (const window of [1, 2, 5, 32, 100, 700]) {
      for (let trial = 0; trial < 25; trial++) {
        const draw = pools[int(pools.length)];
        const steps = Array.from({ length: 300 }, () => Array.from({ length: int(4) }, draw));
        const c: TokenRepeatConfig = {
          ...defaultConfig().detector.token_repeat,
          enabled: true,
          window,
          min_tokens: int(50),
          repeat_sum_threshold: int(window * window + 1),
          consecutive_hits: 1 + int(3),
          ignore_token_ids: rnd() < 0.4 ? [draw(), draw()] : [],
        };
        const d = new TokenRepeatDetector(c);
        const s = d.newState();
        let got: RefHit | null = null;
        for (let i = 0; i < steps.length && !got; i++) {
          const h = d.onTokens(s, steps[i]);
          if (h) got = { step: i, repeat_sum: h.repeat_sum, content_tokens_seen: h.content_tokens_seen, last_score: h.last_score, consecutive_hits: h.consecutive_hits };
        }
        const want = reference(c, steps);
        expect(got).toEqual(want);
        if (want) fired++;
      }
    }
    expect(fired).toBeGreaterThan(20); // the comparison covered alerts, not only silence
  });

  test('a long healthy stream keeps the table exact (window full of distinct, then evicted, ids)', () => {
    const c: TokenRepeatConfig = { ...defaultConfig().detector.token_repeat, enabled: true, window: 64, min_tokens: 0, repeat_sum_threshold: 10_000 };
    const d = new TokenRepeatDetector(c);
    const s = d.newState();
    for (let i = 0; i < 20000; i++) d.onTokens(s, [(i * 2654435761) % 1000003]);
    expect(s.tokLen).toBe(64);
    // ids came back only after 1000003 tokens: every score was 0
    expect(s.repeatSum).toBe(0);
    // now one id 64 times: scores 0..63, all within the window
    for (let i = 0; i < 64; i++) d.onTokens(s, [5]);
    expect(s.repeatSum).toBe((63 * 64) / 2);
  });
});
