import { defaultConfig } from '../src/guard/config';
import type { GarbledConfig } from '../src/guard/detectors/garbled';
import { GarbledDetector } from '../src/guard/detectors/garbled';

function det(p: Partial<GarbledConfig> = {}) {
  const d = new GarbledDetector({ ...defaultConfig().detector.garbled, enabled: true, ...p });
  return { d, s: d.newState() };
}
const bits = (b: number) => -b * Math.LN2; // log-prob (nats) of a token with b bits of surprisal

describe('garbled', () => {
  const small = { window: 4, min_tokens: 4, surprise_logprob: -5, surprise_fraction: 0.5, mean_surprisal_bits: 4, surprise_rank: 50 };

  test('surprising fraction exactly at the threshold does not fire; one more does', () => {
    const { d, s } = det(small);
    // 2 of 4 below -5 nats, mean well above 4 bits
    expect(d.onTokens(s, [-9, -9, bits(5), bits(5)], [], 4)).toBeNull();
    const h = d.onTokens(s, [-9], [], 1); // window: -9, bits5, bits5, -9 → still 2 of 4
    expect(h).toBeNull();
    const h2 = d.onTokens(s, [-9], [], 1); // bits5, bits5, -9, -9 → 2 ... then
    expect(h2).toBeNull();
    const h3 = d.onTokens(s, [-9], [], 1); // bits5, -9, -9, -9 → 3 of 4
    expect(h3).toMatchObject({ surprising_fraction: 0.75, window: 4, tokens_with_logprob: 7 });
    expect(h3!.mean_surprisal_bits).toBeGreaterThan(4);
  });

  test('mean surprisal exactly at the threshold does not fire; just over does', () => {
    const { d, s } = det(small);
    const ranks = [100, 100, 100, 100]; // all surprising by rank, so only the mean decides
    expect(d.onTokens(s, [bits(4), bits(4), bits(4), bits(4)], ranks, 4)).toBeNull();
    const h = d.onTokens(s, [bits(4.01)], [100], 1);
    expect(h).toMatchObject({ surprising_fraction: 1 });
    expect(h!.mean_surprisal_bits).toBeCloseTo(4.0025, 6);
  });

  test('both conditions are needed', () => {
    const a = det(small); // high mean from one huge outlier, fraction 1/4
    expect(a.d.onTokens(a.s, [-100, -0.1, -0.1, -0.1], [], 4)).toBeNull();
    const b = det(small); // all surprising by rank but confident log-probs
    expect(b.d.onTokens(b.s, [-0.5, -0.5, -0.5, -0.5], [60, 60, 60, 60], 4)).toBeNull();
  });

  test('ranks count only when sent; rank exactly at surprise_rank is surprising', () => {
    const { d, s } = det(small);
    const h = d.onTokens(s, [bits(6), bits(6), bits(6), bits(6)], [50, 50, 49], 4); // 2 by rank (50, 50)... plus none by lp
    expect(h).toBeNull();
    const { d: d2, s: s2 } = det(small);
    expect(d2.onTokens(s2, [bits(6), bits(6), bits(6), bits(6)], [50, 50, 50], 4)).toMatchObject({ surprising_fraction: 0.75 });
  });

  test('tokens with no log-prob are skipped (missing, NaN); no data never fires', () => {
    const { d, s } = det(small);
    expect(d.onTokens(s, [], [], 10)).toBeNull();
    expect(d.onTokens(s, [NaN, NaN, -9, -9], [], 4)).toBeNull();
    expect(s.seen).toBe(2);
    expect(d.onTokens(s, [-9, -9], [], 5)).not.toBeNull(); // 3 tokens, only 2 log-probs: 2 taken
  });

  test('short requests: min_tokens must be reached even with a full window', () => {
    const { d, s } = det({ ...small, min_tokens: 8 });
    for (let i = 0; i < 7; i++) expect(d.onTokens(s, [-20], [], 1)).toBeNull();
    expect(d.onTokens(s, [-20], [], 1)).toMatchObject({ surprising_fraction: 1, tokens_with_logprob: 8 });
  });

  test('defaults: confident text with occasional unlikely picks stays silent; gibberish fires', () => {
    const { d, s } = det();
    for (let i = 0; i < 1000; i++) {
      const lp = i % 10 === 0 ? -7 : -0.3 - (i % 3) * 0.4; // one surprising pick in ten
      expect(d.onTokens(s, [lp], [i % 10 === 0 ? 80 : 1], 1)).toBeNull();
    }
    let hit = null;
    for (let i = 0; i < 32 && !hit; i++) hit = d.onTokens(s, [-8 - (i % 3)], [500], 1);
    expect(hit).not.toBeNull();
    expect(hit!.mean_surprisal_bits).toBeGreaterThan(4);
  });

  test('positive and -Infinity log-probs are clamped, not poison', () => {
    const { d, s } = det(small);
    expect(d.onTokens(s, [0.5, 0, 0, 0], [], 4)).toBeNull();
    expect(d.onTokens(s, [-Infinity, -Infinity, -Infinity], [], 3)).toMatchObject({ surprising_fraction: 0.75 });
  });
});
