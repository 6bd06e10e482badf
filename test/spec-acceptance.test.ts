import { defaultConfig } from '../src/guard/config';
import type { SpecAcceptanceConfig } from '../src/guard/detectors/spec-acceptance';
import { SpecAcceptanceDetector } from '../src/guard/detectors/spec-acceptance';

function det(p: Partial<SpecAcceptanceConfig> = {}) {
  const d = new SpecAcceptanceDetector({ ...defaultConfig().detector.spec_acceptance, enabled: true, ...p });
  return { d, s: d.newState() };
}

describe('spec_acceptance', () => {
  test('low drift fires only once the window is full', () => {
    const { d, s } = det();
    for (let i = 0; i < 9; i++) expect(d.onStep(s, 4, 1)).toBeNull(); // nothing accepted but the bonus
    const h = d.onStep(s, 4, 1);
    expect(h).toMatchObject({ direction: 'low', accept_rate: 0, accept_len: 0, window: 10, sum_draft_len: 40, sum_accepted_draft: 0 });
  });

  test('low edge: rate exactly at low_accept_rate does not fire, just under does', () => {
    const { d, s } = det({ window: 2, low_accept_rate: 0.5, low_accept_len: 1 });
    expect(d.onStep(s, 2, 2)).toBeNull(); // accepted_draft 1 of 2
    expect(d.onStep(s, 2, 2)).toBeNull(); // rate 2/4 = 0.5 exactly, len 1: not below either
    const h = d.onStep(s, 2, 1); // window [1, 0]: rate 0.25, len 0.5
    expect(h).toMatchObject({ direction: 'low', accept_rate: 0.25, accept_len: 0.5 });
  });

  test('low needs both: a low rate with a long mean length does not fire', () => {
    const { d, s } = det({ window: 2, low_accept_rate: 0.5, low_accept_len: 1 });
    d.onStep(s, 10, 3);
    expect(d.onStep(s, 10, 3)).toBeNull(); // rate 0.2 but len 2
  });

  test('high edge: mean length exactly at high_accept_len does not fire, over does', () => {
    const { d, s } = det({ window: 5, high_accept_rate: 0.9 });
    const acc = [2, 3, 3, 3, 3]; // accepted_draft with draft 3: sum 14 → len 2.8 exactly, rate 14/15
    for (const a of acc) expect(d.onStep(s, 3, a + 1)).toBeNull();
    const h = d.onStep(s, 3, 4); // drops the 2: sum 15, len 3, rate 1
    expect(h).toMatchObject({ direction: 'high', accept_rate: 1, accept_len: 3 });
  });

  test('default high thresholds: everything accepted with long drafts', () => {
    const { d, s } = det();
    let hit = null;
    for (let i = 0; i < 10; i++) hit = d.onStep(s, 3, 4) ?? hit;
    expect(hit).toMatchObject({ direction: 'high', accept_rate: 1, accept_len: 3 });
  });

  test('draft_len 0 steps are skipped; "accepted_draft = max(0, accepted − 1)" without a cap', () => {
    const { d, s } = det({ window: 2 });
    expect(d.onStep(s, 0, 0)).toBeNull();
    expect(d.onStep(s, 0, 5)).toBeNull();
    expect(s.len).toBe(0);
    d.onStep(s, 2, 99); // more accepted than drafted is counted as it comes: 98, not min(98, 2)
    expect(s.sumAcc).toBe(98);
    d.onStep(s, 2, 0); // max(0, 0 − 1) = 0
    expect(s.sumAcc).toBe(98);
    // uint32 counts: the float64 sums stay exact
    const big = det({ window: 2 });
    big.d.onStep(big.s, 2 ** 32 - 1, 2 ** 32 - 1);
    big.d.onStep(big.s, 2 ** 32 - 1, 2 ** 32 - 1);
    expect(big.s.sumAcc).toBe(2 * (2 ** 32 - 2));
  });

  test('"the detector alerts on every full-window step while the condition holds"', () => {
    const { d, s } = det({ window: 3 });
    for (let i = 0; i < 2; i++) expect(d.onStep(s, 4, 1)).toBeNull();
    for (let i = 0; i < 5; i++) expect(d.onStep(s, 4, 1)).toMatchObject({ direction: 'low', window: 3, sum_draft_len: 12 });
    // the window slides on: it takes three healthy steps to push the bad ones out
    expect(d.onStep(s, 4, 4)).not.toBeNull(); // [0, 0, 3]: rate 0.25, len 1
    expect(d.onStep(s, 4, 4)).toBeNull(); // [0, 3, 3]: rate 0.5
    expect(d.onStep(s, 4, 4)).toBeNull();
  });

  test('healthy acceptance stays silent', () => {
    const { d, s } = det();
    for (let i = 0; i < 200; i++) expect(d.onStep(s, 4, 1 + (i % 4))).toBeNull();
  });
});
