import { splitNonFinite } from '../src/guard/detectors/logits-finite';

describe('logits_finite row split', () => {
  test('rows group by request with their kinds; unknown kinds read as non_finite', () => {
    const r = splitNonFinite([
      { row: 0, reqId: 'a', kind: 'nan' },
      { row: 3, reqId: 'b', kind: 'pos_inf' },
      { row: 1, reqId: 'a', kind: 'neg_inf' },
      { row: 2, reqId: 'a', kind: 'nan' },
      { row: 4, reqId: 'c', kind: 'weird' },
    ]);
    expect([...r.byRequest.keys()]).toEqual(['a', 'b', 'c']);
    expect(r.byRequest.get('a')).toEqual({ kind: 'nan', kinds: ['nan', 'neg_inf'], rows: [0, 1, 2] });
    expect(r.byRequest.get('b')).toEqual({ kind: 'pos_inf', kinds: ['pos_inf'], rows: [3] });
    expect(r.byRequest.get('c')!.kind).toBe('non_finite');
    expect(r.unattributed).toEqual([]);
  });

  test('rows without a request id are unattributed, never a request', () => {
    const r = splitNonFinite([
      { row: 5, reqId: '', kind: 'nan' },
      { row: 6, reqId: 'x', kind: 'non_finite' },
    ]);
    expect(r.unattributed).toEqual([{ row: 5, reqId: '', kind: 'nan' }]);
    expect([...r.byRequest.keys()]).toEqual(['x']);
    expect(splitNonFinite([]).byRequest.size).toBe(0);
  });
});
