import { ProtocolError } from '../src/errors';
import type { ForwardContext } from '../src/messages';
import { resolveSnapshotConfig } from '../src/snapshot/config';
import { CaptureSelector, checkForwardContext, requestMatches } from '../src/snapshot/selector';
import { CaptureBudget } from '../src/snapshot/budget';

function selector(env: Record<string, string>): CaptureSelector {
  return new CaptureSelector(resolveSnapshotConfig({ WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_CACHE_ROOT: '/tmp/x', ...env }, {}, () => undefined));
}

function ctx(over: Partial<ForwardContext> = {}): ForwardContext {
  return {
    compilationHash: 'h1',
    globalStep: 0,
    isPrompt: false,
    reqIds: ['abc-9a8546d5'],
    positions: [0],
    rowRequest: [0],
    numSpeculativeTokens: 0,
    warmup: false,
    ...over,
  };
}

describe('call index rule', () => {
  test('no rule configured: call 0 of each compiled graph only', () => {
    const s = selector({});
    const a0 = s.evaluate(ctx());
    expect(a0).toMatchObject({ selected: true, selectedBy: ['call_index'], callIndex: 0, matches: [] });
    expect(s.evaluate(ctx())).toMatchObject({ selected: false, callIndex: 1 });
    // A second graph counts on its own.
    expect(s.evaluate(ctx({ compilationHash: 'h2' }))).toMatchObject({ selected: true, callIndex: 0 });
    expect(s.evaluate(ctx())).toMatchObject({ selected: false, callIndex: 2 });
    expect(s.callsSeen('h1')).toBe(3);
    expect(s.callsSeen('h2')).toBe(1);
  });
  test('warmup forwards are neither counted nor captured', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '-1' });
    expect(s.evaluate(ctx({ warmup: true }))).toEqual({ selected: false, selectedBy: [], matches: [], callIndex: null });
    expect(s.evaluate(ctx({ warmup: true }))).toMatchObject({ selected: false });
    expect(s.callsSeen('h1')).toBe(0);
    expect(s.evaluate(ctx())).toMatchObject({ selected: true, callIndex: 0 });
  });
  test('listed indices', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '1,3' });
    const got = [0, 1, 2, 3, 4].map(() => s.evaluate(ctx()).selected);
    expect(got).toEqual([false, true, false, true, false]);
  });
  test('-1: every call', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '-1' });
    expect([0, 1, 2].map(() => s.evaluate(ctx()).selected)).toEqual([true, true, true]);
  });
  test('only a token rule: call 0 is not selected by call index', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '100' });
    expect(s.evaluate(ctx())).toMatchObject({ selected: false, callIndex: 0, selectedBy: [] });
  });
});

describe('token rule', () => {
  test('seed example: prompt length L, decode step k generates token L+k', () => {
    const L = 7;
    const k = 3;
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: String(L + k) });
    // Prefill of the prompt (positions 0..L-1) never fires the token rule.
    expect(s.evaluate(ctx({ isPrompt: true, positions: [0, 1, 2, 3, 4, 5, 6], rowRequest: [0, 0, 0, 0, 0, 0, 0] })).selected).toBe(false);
    // Decode step j runs on the row at position L+j-1 and generates position L+j.
    const picked: number[] = [];
    for (let j = 1; j <= 5; j++) {
      const r = s.evaluate(ctx({ globalStep: j, positions: [L + j - 1] }));
      if (r.selected) {
        picked.push(j);
        expect(r.selectedBy).toEqual(['token']);
        expect(r.matches).toEqual([{ batch_index: 0, request_id: 'abc-9a8546d5', position: L + k, reason: 'token' }]);
      }
    }
    expect(picked).toEqual([k]);
  });
  test('prefill never fires the token rule even when positions line up', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '5' });
    expect(s.evaluate(ctx({ isPrompt: true, positions: [4] })).selected).toBe(false);
    expect(s.evaluate(ctx({ isPrompt: false, positions: [4] })).selected).toBe(true);
  });
  test('speculative decode with 2 draft tokens: a row at p fires for p+1..p+3, first offset wins', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '12,13' });
    const at = (p: number) => s.evaluate(ctx({ positions: [p], numSpeculativeTokens: 2 }));
    expect(at(8).selected).toBe(false); // 9..11
    expect(at(9).matches).toEqual([{ batch_index: 0, request_id: 'abc-9a8546d5', position: 12, reason: 'token' }]); // 10..12
    expect(at(10).matches.map((m) => m.position)).toEqual([12]); // 11..13: 12 comes first
    expect(at(11).matches.map((m) => m.position)).toEqual([12]); // 12..14
    expect(at(12).matches.map((m) => m.position)).toEqual([13]);
    expect(at(13).selected).toBe(false); // 14..16
  });
  test('without speculation only p+1 counts', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '12' });
    expect(s.evaluate(ctx({ positions: [10] })).selected).toBe(false);
    expect(s.evaluate(ctx({ positions: [11] })).selected).toBe(true);
  });
  test('padding rows (negative position or no request) are ignored; a batch reports every matching row', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '6' });
    const r = s.evaluate(
      ctx({
        reqIds: ['a-1', 'b-2', 'c-3'],
        positions: [5, -1, 5, 5, 3],
        rowRequest: [-1, 1, 1, 2, 0],
      }),
    );
    // batch_index is the request's index in req_ids, as upstream records it; one match per request.
    expect(r.matches).toEqual([
      { batch_index: 1, request_id: 'b-2', position: 6, reason: 'token' },
      { batch_index: 2, request_id: 'c-3', position: 6, reason: 'token' },
    ]);
    expect(s.evaluate(ctx({ positions: [5, -1], rowRequest: [-1, 0] })).selected).toBe(false);
  });
});

describe('request rule', () => {
  test('prefix matching', () => {
    expect(requestMatches('abc-9a8546d5', 'abc')).toBe(true);
    expect(requestMatches('abc', 'abc')).toBe(true);
    expect(requestMatches('abcd-1', 'abc')).toBe(false);
    expect(requestMatches('xabc-1', 'abc')).toBe(false);
    expect(requestMatches('abc-9a8546d5', 'abc-9a8546d5')).toBe(true);
    expect(requestMatches('abc-9a8546d5', 'abc-9a')).toBe(false);
  });
  test('request matches during prefill record the request\'s index in req_ids and position -1 outside decode', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'abc' });
    const r = s.evaluate(
      ctx({
        isPrompt: true,
        reqIds: ['abcd-1', 'abc-9a8546d5', 'xabc-1', 'abc'],
        positions: [0, 1, -1, 0, 1, 0, 0],
        rowRequest: [0, 0, 1, 1, 1, 2, 3],
      }),
    );
    expect(r.selectedBy).toEqual(['request']);
    expect(r.matches).toEqual([
      { batch_index: 1, request_id: 'abc-9a8546d5', position: -1, reason: 'request' },
      { batch_index: 3, request_id: 'abc', position: -1, reason: 'request' },
    ]);
  });
  test('on decode a request match records its row position', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'abc' });
    expect(s.evaluate(ctx({ reqIds: ['abcd-1'] })).selected).toBe(false);
    expect(s.evaluate(ctx({ reqIds: ['x-1', 'abc-77'], positions: [12, 40], rowRequest: [0, 1] })).matches).toEqual([
      { batch_index: 1, request_id: 'abc-77', position: 40, reason: 'request' },
    ]);
    // Rows in another order than req_ids: batch_index stays the index in req_ids.
    expect(s.evaluate(ctx({ reqIds: ['abc-5', 'x-1'], positions: [12, 40], rowRequest: [1, 0] })).matches).toEqual([
      { batch_index: 0, request_id: 'abc-5', position: 40, reason: 'request' },
    ]);
  });
  test('a request in req_ids matches as upstream does, even with only padding rows (position -1)', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'abc' });
    expect(s.evaluate(ctx({ reqIds: ['abc-1'], positions: [-1], rowRequest: [0] })).matches).toEqual([
      { batch_index: 0, request_id: 'abc-1', position: -1, reason: 'request' },
    ]);
  });
});

describe('an empty row_request is upstream\'s layout: row r is request r, rows past req_ids are padding', () => {
  test('the token rule reads it so', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '6' });
    const r = s.evaluate(ctx({ reqIds: ['a-1', 'b-2'], positions: [3, 5, 5], rowRequest: [] }));
    expect(r.matches).toEqual([{ batch_index: 1, request_id: 'b-2', position: 6, reason: 'token' }]);
  });
  test('the request rule reads it so', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'b' });
    expect(s.evaluate(ctx({ reqIds: ['a-1', 'b-2'], positions: [3, 5, 9], rowRequest: [] })).matches).toEqual([
      { batch_index: 1, request_id: 'b-2', position: 5, reason: 'request' },
    ]);
  });
  test('checkForwardContext fills it in (meta.json records it)', () => {
    expect(checkForwardContext(ctx({ reqIds: ['a', 'b'], positions: [0, 1, 2], rowRequest: [] })).rowRequest).toEqual([0, 1, -1]);
  });
});

describe('rules are ORed; selected_by is sorted', () => {
  test('all three at once', () => {
    const s = selector({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '0', WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '9', WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'zzz' });
    const r = s.evaluate(ctx({ reqIds: ['zzz-1', 'q-2'], positions: [8, 8], rowRequest: [1, 0] }));
    expect(r.selectedBy).toEqual(['call_index', 'request', 'token']);
    expect(r.matches).toEqual([
      { batch_index: 0, request_id: 'zzz-1', position: 8, reason: 'request' },
      { batch_index: 0, request_id: 'zzz-1', position: 9, reason: 'token' },
      { batch_index: 1, request_id: 'q-2', position: 9, reason: 'token' },
    ]);
    // Call 1: only the token rule.
    expect(s.evaluate(ctx({ positions: [8] })).selectedBy).toEqual(['token']);
  });
});

describe('malformed forward contexts are refused without counting', () => {
  const s = selector({});
  test.each<[Partial<ForwardContext>, RegExp]>([
    [{ positions: [1, 2], rowRequest: [0] }, /positions has 2 rows but rowRequest has 1/],
    [{ positions: [-2] }, /positions\[0\] = -2/],
    [{ globalStep: -1 }, /globalStep = -1/],
    [{ globalStep: 2 ** 60 }, /globalStep/],
    [{ rowRequest: [3] }, /rowRequest\[0\] = 3/],
    [{ rowRequest: [-2] }, /rowRequest\[0\] = -2/],
    [{ positions: [1.5] }, /positions\[0\] = 1.5/],
    [{ numSpeculativeTokens: -1 }, /numSpeculativeTokens/],
    [{ compilationHash: '' }, /compilationHash/],
  ])('%j', (over, re) => {
    expect(() => s.evaluate(ctx(over))).toThrow(ProtocolError);
    expect(() => s.evaluate(ctx(over))).toThrow(re);
    expect(s.callsSeen('h1')).toBe(0);
  });
});

describe('budget', () => {
  test('consumed one by one; exhausted is logged once', () => {
    const lines: string[] = [];
    const b = new CaptureBudget(2, (m) => lines.push(m));
    expect([b.tryConsume(), b.tryConsume(), b.tryConsume(), b.tryConsume()]).toEqual([true, true, false, false]);
    expect(b.consumed).toBe(2);
    expect(b.remaining).toBe(0);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/budget exhausted/);
  });
  test('a non-positive budget is refused', () => {
    expect(() => new CaptureBudget(0)).toThrow(RangeError);
  });
});
