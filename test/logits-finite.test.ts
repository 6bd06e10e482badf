import * as path from 'path';
import { splitNonFinite } from '../src/guard/detectors/logits-finite';
import { ROOT, runPython } from './helpers';

const ENV: NodeJS.ProcessEnv = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1' };

/** Run a Python snippet (real torch tensors) that prints one JSON line last; returns it parsed. */
function py(code: string): any {
  const out = runPython(code, [], { env: ENV }).trim().split('\n');
  return JSON.parse(out[out.length - 1]);
}

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

describe('logits_finite.item_sync in the Python client (real torch tensors)', () => {
  const PRELUDE = `
import json, math, torch
from wavebus_client import LogitsFiniteGate, PendingNonFinite, nonfinite_rows
from wavebus_client.telemetry import telemetry_proto
def rows(rs): return [[r.row, r.req_id, r.kind] for r in rs]
def logits():
    x = torch.zeros(4, 8)
    x[1, 3] = math.nan
    x[2, 5] = math.inf
    return x
`;

  test('item_sync false (default): "the non-finite check overlaps sampling and is waited on after it"; it checks the logits as they were at the call', () => {
    const got = py(`${PRELUDE}
x = logits()
ids = ["a", "b", "c", "d"]
p = nonfinite_rows(x, ids)             # before sampling: started, not waited on
started_type = type(p).__name__
ids[1] = "renamed"                     # the caller's list may change: the ids are taken at the call
x[0, 0] = -math.inf                    # grammar masking after the check
x[1, 3] = 0.0
sampled = torch.argmax(x, dim=-1)      # sampling
after = rows(p.result())               # after sampling: waited on
gate = LogitsFiniteGate()              # the same through the gate and wave_head's telemetry
y = logits()
r = gate.check(y, ["a", "b", "c", "d"])
y[3, :] = -math.inf
pending = gate.pending
t = telemetry_proto({"requests": [], "non_finite": gate}, 7)
print(json.dumps({"type": started_type, "after": after, "check": r, "pending": pending, "left": gate.pending,
                  "wire": [[n.row, n.req_id, n.kind] for n in t.non_finite], "list_like": p == p.result() and len(p) == 2}))`);
    expect(got.type).toBe('PendingNonFinite');
    expect(got.after).toEqual([
      [1, 'b', 'nan'],
      [2, 'c', 'pos_inf'],
    ]);
    expect(got.check).toBeNull();
    expect(got.pending).toBe(1);
    expect(got.left).toBe(0);
    expect(got.wire).toEqual([
      [1, 'b', 'nan'],
      [2, 'c', 'pos_inf'],
    ]);
    expect(got.list_like).toBe(true);
  });

  test('item_sync true: the check synchronises at once and returns the rows', () => {
    const got = py(`${PRELUDE}
x = logits()
r = nonfinite_rows(x, None, item_sync=True)
gate = LogitsFiniteGate(item_sync=True)
g = gate.check(logits(), ["a", "b", "c", "d"])
print(json.dumps({"type": type(r).__name__, "rows": rows(r), "gate": rows(g), "collected": rows(gate.collect()),
                  "mixed": rows(nonfinite_rows(torch.tensor([[math.nan, math.inf, 0.0]]), item_sync=True)),
                  "ints": rows(nonfinite_rows(torch.zeros(2, 3, dtype=torch.int64), item_sync=True))}))`);
    expect(got.type).toBe('list');
    expect(got.rows).toEqual([
      [1, '', 'nan'],
      [2, '', 'pos_inf'],
    ]);
    expect(got.gate).toEqual([
      [1, 'b', 'nan'],
      [2, 'c', 'pos_inf'],
    ]);
    expect(got.collected).toEqual(got.gate);
    expect(got.mixed).toEqual([[0, '', 'non_finite']]);
    expect(got.ints).toEqual([]);
  });

  test('"a bounded deferred queue (256) drops the oldest"', () => {
    const got = py(`${PRELUDE}
gate = LogitsFiniteGate()
for i in range(300):
    x = torch.zeros(1, 4)
    x[0, 1] = -math.inf
    gate.check(x, [f"r{i}"])
pending, dropped = gate.pending, gate.dropped
out = gate.collect()
print(json.dumps({"pending": pending, "dropped": dropped, "first": out[0].req_id, "last": out[-1].req_id, "n": len(out), "after": gate.pending}))`);
    expect(got).toEqual({ pending: 256, dropped: 44, first: 'r44', last: 'r299', n: 256, after: 0 });
  });

  test('bad input names the argument', () => {
    const got = py(`${PRELUDE}
from wavebus_client import ConfigError
msgs = []
for f in (lambda: nonfinite_rows([1.0]), lambda: nonfinite_rows(torch.zeros(3)), lambda: nonfinite_rows(torch.zeros(2, 2), ["a"]),
          lambda: nonfinite_rows(torch.zeros(2, 2), item_sync="yes"), lambda: LogitsFiniteGate(max_deferred=0),
          lambda: telemetry_proto({"non_finite": 3}, 1)):
    try:
        f(); msgs.append(None)
    except ConfigError as e:
        msgs.append(str(e))
print(json.dumps(msgs))`);
    expect(got).toEqual([
      'nonfinite_rows(): logits must be a torch.Tensor, got list',
      'nonfinite_rows(): logits must be 2-d [rows, vocab], got shape [3]',
      'nonfinite_rows(): row_req_ids has 1 entries for 2 logits rows',
      "nonfinite_rows(): item_sync must be true or false, got 'yes'",
      'LogitsFiniteGate(): max_deferred must be a positive integer, got 0',
      'wave_head(): telemetry.non_finite must be a list, a PendingNonFinite or a LogitsFiniteGate, got int',
    ]);
  });
});
