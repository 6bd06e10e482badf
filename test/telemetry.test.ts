import * as path from 'path';
import pino from 'pino';
import { decodeAgentMessage, encodeAgentMessage } from '../src/bus/frames';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import type { RequestStep } from '../src/messages';
import { decode, messageType } from '../src/proto';
import { columnsFromWire, columnsToWire, FLAG_FINISHED, FLAG_FREED, TelemetryColumnizer } from '../src/client/telemetry';
import type { TelemetryColumns } from '../src/messages';
import { cleanup, ROOT, runPython, tmpDir } from './helpers';

afterAll(cleanup);

function step(reqId: string, p: Partial<RequestStep> = {}): RequestStep {
  return { reqId, newTokenIds: [], newTokenLogprobs: [], newTokenRanks: [], draftLen: 0, accepted: 0, blockIds: [], finished: false, freed: false, promptLen: 0, numOutputTokens: 0, ...p };
}

/** Through the real wire: an AgentMessage wave head, encoded and decoded as the coordinator does. */
function overWire(c: TelemetryColumns, wave = 1): TelemetryColumns {
  const bytes = encodeAgentMessage({ globalRank: 0, epochSeen: 1, requestId: 0, waveHead: { wave, telemetry: { wave: wave - 1, columns: columnsToWire(c), nonFinite: [] } } });
  const d = decodeAgentMessage(bytes, 1 << 26);
  if (!d.ok) throw new Error(`did not decode: ${d.reason} ${d.detail}`);
  return d.value.waveHead.telemetry.columns;
}

const plain = (c: TelemetryColumns) => ({
  rows: c.rows,
  slot: [...c.slot],
  tokenCount: [...c.tokenCount],
  tokenIds: [...c.tokenIds],
  tokenLogprobs: [...c.tokenLogprobs],
  tokenRanks: [...c.tokenRanks],
  draftLen: [...c.draftLen],
  accepted: [...c.accepted],
  flags: [...c.flags],
  numOutputTokens: [...c.numOutputTokens],
  bind: c.bind,
  blocks: c.blocks,
});

describe('columnizer', () => {
  test('a request binds once, keeps its slot, and sends its block table only when it changes', () => {
    const z = new TelemetryColumnizer();
    const a = z.columns([step('a', { newTokenIds: [5, 6], promptLen: 9, blockIds: [1, 2] }), step('b', { newTokenIds: [7], blockIds: [3] })]);
    expect(plain(a)).toMatchObject({ rows: 2, slot: [0, 1], tokenCount: [2, 1], tokenIds: [5, 6, 7], flags: [0, 0] });
    expect(a.bind).toEqual([{ slot: 0, reqId: 'a', promptLen: 9 }, { slot: 1, reqId: 'b', promptLen: 0 }]);
    expect(a.blocks).toEqual([{ slot: 0, blockIds: [1, 2] }, { slot: 1, blockIds: [3] }]);
    // the engine lists them in another order; b grows a block
    const b = z.columns([step('b', { newTokenIds: [8], blockIds: [3, 4] }), step('a', { newTokenIds: [9], blockIds: [1, 2] })]);
    expect(plain(b)).toMatchObject({ slot: [1, 0], tokenIds: [8, 9], bind: [], blocks: [{ slot: 1, blockIds: [3, 4] }] });
    expect(z.live).toBe(2);
  });

  test('a freed request gives its slot back from the next step; the next request is bound to it', () => {
    const z = new TelemetryColumnizer();
    z.columns([step('a'), step('b')]);
    const f = z.columns([step('a', { finished: true, freed: true }), step('b', { finished: true })]);
    expect([...f.flags]).toEqual([FLAG_FINISHED | FLAG_FREED, FLAG_FINISHED]);
    expect(z.live).toBe(1);
    const n = z.columns([step('b'), step('c', { blockIds: [7] })]);
    expect(n.bind).toEqual([{ slot: 0, reqId: 'c', promptLen: 0 }]);
    expect([...n.slot]).toEqual([1, 0]);
  });

  test('resend() sends every listed binding and block table again (not the prompt ids); rows without an id are skipped', () => {
    const z = new TelemetryColumnizer();
    const first = z.columns([step('a', { blockIds: [1], promptTokenIds: [5, 6] }), step('b', { blockIds: [2] })]);
    expect(first.bind[0]).toEqual({ slot: 0, reqId: 'a', promptLen: 0, promptTokenIds: [5, 6] });
    z.resend();
    const r = z.columns([step('a', { blockIds: [1], promptTokenIds: [5, 6] }), step(''), step('b', { blockIds: [2] })]);
    expect(r.rows).toBe(2);
    expect(r.bind).toEqual([{ slot: 0, reqId: 'a', promptLen: 0 }, { slot: 1, reqId: 'b', promptLen: 0 }]);
    expect(r.blocks).toEqual([{ slot: 0, blockIds: [1] }, { slot: 1, blockIds: [2] }]);
    expect(z.columns([step('a', { blockIds: [1] })]).bind).toEqual([]);
  });

  test('per-token columns: NaN log-probs and rank 0 where a request had none; tokens:false leaves them out', () => {
    const z = new TelemetryColumnizer();
    const rows = [step('a', { newTokenIds: [1, 2], newTokenLogprobs: [-0.5, -1], newTokenRanks: [0, 3] }), step('b', { newTokenIds: [4], draftLen: 3, accepted: 2, numOutputTokens: 40 })];
    const c = z.columns(rows);
    expect([...c.tokenLogprobs.slice(0, 2)]).toEqual([-0.5, -1]);
    expect(Number.isNaN(c.tokenLogprobs[2])).toBe(true);
    expect([...c.tokenRanks]).toEqual([0, 3, 0]);
    expect(plain(c)).toMatchObject({ draftLen: [0, 3], accepted: [0, 2], numOutputTokens: [0, 40] });
    const off = new TelemetryColumnizer().columns(rows, { tokens: false });
    expect(plain(off)).toMatchObject({ tokenCount: [], tokenIds: [], tokenLogprobs: [], tokenRanks: [], draftLen: [0, 3] });
  });

  test('mismatched per-token lists are refused, naming the request', () => {
    const z = new TelemetryColumnizer();
    expect(() => z.columns([step('a'), step('b', { newTokenIds: [1, 2], newTokenLogprobs: [-1] })], { where: 'waveHead(): telemetry' })).toThrow(
      'waveHead(): telemetry.requests[1]: 1 newTokenLogprobs for 2 newTokenIds',
    );
    expect(() => z.columns([step('b', { newTokenIds: [1], newTokenRanks: [1, 2] })])).toThrow('telemetry.requests[0]: 2 newTokenRanks for 1 newTokenIds');
  });
});

describe('wire', () => {
  test('columns survive encode/decode exactly, as typed arrays (misaligned bytes are copied)', () => {
    const z = new TelemetryColumnizer();
    const c = z.columns([step('x', { newTokenIds: [4000000000, 2], newTokenLogprobs: [-0.25, -7.5], newTokenRanks: [1, 2], blockIds: [9, 8, 7], draftLen: 2, accepted: 1, promptLen: 3 }), step('y', { freed: true, numOutputTokens: 12 })]);
    const back = overWire(c);
    expect(plain(back)).toEqual(plain(c));
    expect(back.tokenIds).toBeInstanceOf(Uint32Array);
    expect(back.tokenLogprobs).toBeInstanceOf(Float32Array);
  });

  test.each([
    ['a column of odd length', { slot: Buffer.alloc(5) }, 'telemetry.columns.slot: 5 bytes is not a whole number of 4-byte values'],
    ['token ids that do not add up', { tokenCount: Buffer.from(new Uint32Array([3]).buffer), tokenIds: Buffer.alloc(8) }, 'telemetry.columns.token_ids: 2 values, expected 3'],
    ['a slot out of range', { slot: Buffer.from(new Uint32Array([1 << 21]).buffer) }, 'telemetry.columns.slot[0] = 2097152 is out of range'],
    ['a binding without an id', { bind: [{ slot: 0, reqId: '' }] }, 'telemetry.columns.bind[0].req_id is empty'],
  ])('%s is refused by name, and the coordinator drops the message as bad_telemetry', (_what, patch, message) => {
    const base = columnsToWire(new TelemetryColumnizer().columns([step('a')]));
    const w = { ...base, ...patch };
    expect(() => columnsFromWire(w)).toThrow(message);
    const bytes = encodeAgentMessage({ globalRank: 0, epochSeen: 1, requestId: 0, waveHead: { wave: 2, telemetry: { wave: 1, columns: w, nonFinite: [] } } });
    const d = decodeAgentMessage(bytes, 1 << 26);
    expect(d.ok).toBe(false);
    if (!d.ok) {
      expect(d.reason).toBe('bad_telemetry');
      expect(d.detail).toContain(message);
    }
  });

  test('the Python client builds the same columns as the TypeScript one', () => {
    const steps = [
      [step('a', { newTokenIds: [1, 2], newTokenLogprobs: [-0.5, -1.5], blockIds: [1], promptLen: 4, promptTokenIds: [7, 8, 9, 10] }), step('b', { newTokenIds: [3], draftLen: 2, accepted: 1, blockIds: [2] })],
      [step('b', { newTokenIds: [4], draftLen: 2, accepted: 3, blockIds: [2, 5] }), step('a', { newTokenIds: [5], newTokenLogprobs: [-2], finished: true, freed: true, blockIds: [1] })],
      [step('c', { newTokenIds: [6], newTokenRanks: [7], blockIds: [3], numOutputTokens: 1 }), step('b', { newTokenIds: [], blockIds: [2, 5] })],
    ];
    const z = new TelemetryColumnizer();
    const ts = steps.map((s) => plain(z.columns(s)));
    const snake = (r: RequestStep) => ({
      req_id: r.reqId, new_token_ids: r.newTokenIds, new_token_logprobs: r.newTokenLogprobs, new_token_ranks: r.newTokenRanks, draft_len: r.draftLen,
      accepted: r.accepted, block_ids: r.blockIds, finished: r.finished, freed: r.freed, prompt_len: r.promptLen, num_output_tokens: r.numOutputTokens,
      prompt_token_ids: r.promptTokenIds ?? [],
    });
    const out = runPython(`
import base64, json, sys
from wavebus_client.telemetry import TelemetryColumnizer, telemetry_proto
z = TelemetryColumnizer()
for rows in json.loads(sys.argv[1]):
    cols = z.columns(telemetry_proto({"requests": rows}, 0).requests)
    print(base64.b64encode(cols.SerializeToString()).decode())
`, [JSON.stringify(steps.map((s) => s.map(snake)))], { env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1' } });
    const T = messageType('TelemetryColumns');
    const py = out.trim().split('\n').map((b64: string) => plain(columnsFromWire(decode(T, Buffer.from(b64, 'base64')))));
    expect(py).toEqual(ts);
  });
});

describe('guard on columns', () => {
  function newGuard() {
    const startup = parseStartupOptions(
      JSON.stringify({ runtime_config: { detector: { token_repeat: { enabled: true, window: 4, min_tokens: 4, repeat_sum_threshold: 2, consecutive_hits: 1 } } } }),
      {},
      tmpDir(),
    );
    return new Guard({ startup, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, log: pino({ level: 'silent' }), pollIntervalMs: 0, verifyIntervalMs: 0 });
  }
  // a repeats one token from its 5th step on; b never repeats
  const rows = (w: number) => [step('a', { newTokenIds: [w < 5 ? w : 42], blockIds: [1] }), step('b', { newTokenIds: [100 + w], blockIds: [2] })];

  test('rows and wire columns give the same incidents at the same wave', () => {
    const byRows = newGuard();
    const byCols = newGuard();
    const z = new TelemetryColumnizer();
    for (let w = 1; w <= 12; w++) {
      byRows.onWaveHead(0, w + 1, { wave: w, requests: rows(w), nonFinite: [] });
      byCols.onWaveHead(0, w + 1, { wave: w, columns: overWire(z.columns(rows(w)), w + 1), nonFinite: [] });
      // the same requests tracked, with the same output counts, at every wave
      expect(byCols.status().tracked_requests).toBe(byRows.status().tracked_requests);
    }
    expect(byCols.status().incidents).toEqual(byRows.status().incidents);
    expect((byCols.status().incidents as Record<string, Record<string, number>>).token_repeat.report).toBe(1);
    byRows.close();
    byCols.close();
  });

  test('a coordinator that missed the bindings counts unbound rows until the client re-sends them', () => {
    const z = new TelemetryColumnizer();
    z.columns(rows(1)); // the step with the bindings went to a coordinator that is gone
    const g = newGuard();
    for (let w = 2; w <= 3; w++) g.onWaveHead(0, w + 1, { wave: w, columns: z.columns(rows(w)), nonFinite: [] });
    expect(g.status()).toMatchObject({ unbound_telemetry_rows: 4, tracked_requests: 0 });
    z.resend(); // what the client does when the mailbox shows a new epoch
    for (let w = 4; w <= 12; w++) g.onWaveHead(0, w + 1, { wave: w, columns: z.columns(rows(w)), nonFinite: [] });
    expect(g.status()).toMatchObject({ unbound_telemetry_rows: 4, tracked_requests: 2 });
    expect((g.status().incidents as Record<string, Record<string, number>>).token_repeat.report).toBe(1);
    g.close();
  });
});

test('the coordinator reads a wave head off the decoded message exactly as the generic decode would give it', () => {
  const z = new TelemetryColumnizer();
  const rowForm = [step('r-1', { newTokenIds: [3, 4], newTokenLogprobs: [-0.5, -1], blockIds: [7, 8], promptLen: 5, promptTokenIds: [1, 2] })];
  const cases: Record<string, unknown>[] = [
    { wave: 12, telemetry: { wave: 11, columns: columnsToWire(z.columns([step('a-1', { newTokenIds: [9], blockIds: [1, 2], promptTokenIds: [4, 5, 6], draftLen: 2, accepted: 1 }), step('b-2', { finished: true })])), nonFinite: [{ row: 1, reqId: 'b-2', kind: 'pos_inf' }] } },
    { wave: 2 ** 40 + 7, telemetry: { wave: 2 ** 40 + 6, requests: rowForm, nonFinite: [] } },
    { wave: 0 },
    { wave: 5, telemetry: { wave: 4 } },
    // empty columns left out, as Python's protobuf writes them
    { wave: 9, telemetry: { wave: 8, columns: { rows: 1, slot: Buffer.from(Uint32Array.of(0).buffer), flags: Buffer.from([1]), bind: [{ slot: 0, reqId: 'x-1', promptLen: 3 }] } } },
  ];
  for (const [i, waveHead] of cases.entries()) {
    const bytes = encodeAgentMessage({ globalRank: 3, epochSeen: 1796112128864, requestId: i, waveHead });
    const got = decodeAgentMessage(bytes, 1 << 26);
    // the generic path: plain object, then the columns into typed arrays
    const want = decode(messageType('AgentMessage'), bytes);
    if (want.waveHead.telemetry?.columns) want.waveHead.telemetry.columns = columnsFromWire(want.waveHead.telemetry.columns);
    // The MAC (bus/auth.ts) is checked before a message is read and is not part of what it says.
    delete want.mac;
    expect(got).toEqual({ ok: true, value: want });
  }
  // bad columns are still refused as bad telemetry
  const bad = encodeAgentMessage({ globalRank: 0, epochSeen: 1, requestId: 0, waveHead: { wave: 3, telemetry: { wave: 2, columns: { rows: 2, slot: Buffer.alloc(4) } } } });
  expect(decodeAgentMessage(bad, 1 << 26)).toMatchObject({ ok: false, reason: 'bad_telemetry' });
});
