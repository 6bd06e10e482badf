import * as protobuf from 'protobufjs';
import { decodeAgentMessage, encodeAgentMessage } from '../src/bus/frames';
import { decodeWaveHeadMessage } from '../src/guard/telemetry-decode';
import { AgentMessage, decode } from '../src/proto';

let seed = 987654321;
const rnd = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
const int = (n: number) => Math.floor(rnd() * n);
const pick = <T>(xs: T[]): T => xs[int(xs.length)];

const U32_EDGES = [0, 1, 127, 128, 16383, 16384, 2 ** 21, 2 ** 28 - 1, 2 ** 28, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1];
const u32 = () => (rnd() < 0.3 ? pick(U32_EDGES) : int(2 ** 32));
const ids = (n: number) => Array.from({ length: n }, u32);
const REQ_IDS = ['', 'req-1', 'cmpl-00ff-0', 'ünïcødé-✓', 'a/b/../c', 'x'.repeat(300)];

function randomStep(): Record<string, unknown> {
  const n = int(4);
  const s: Record<string, unknown> = {};
  if (rnd() < 0.9) s.reqId = pick(REQ_IDS) + (rnd() < 0.5 ? String(int(1000)) : '');
  if (rnd() < 0.9) s.newTokenIds = ids(n);
  if (rnd() < 0.7) s.newTokenLogprobs = Array.from({ length: n }, () => pick([-0.25, -3.5, 0, -1e30, -Infinity, NaN, -rnd() * 20]));
  if (rnd() < 0.6) s.newTokenRanks = ids(n);
  if (rnd() < 0.7) s.draftLen = u32();
  if (rnd() < 0.7) s.accepted = u32();
  if (rnd() < 0.8) s.blockIds = ids(int(40));
  if (rnd() < 0.3) s.finished = rnd() < 0.5;
  if (rnd() < 0.3) s.freed = rnd() < 0.5;
  if (rnd() < 0.7) s.promptLen = u32();
  if (rnd() < 0.7) s.numOutputTokens = u32();
  return s;
}

function randomWaveHead(): Record<string, unknown> {
  const waveHead: Record<string, unknown> = { wave: pick([0, 1, 300, 2 ** 32 + 5, 2 ** 48 - 1]) };
  if (rnd() < 0.9) {
    waveHead.telemetry = {
      wave: int(1e6),
      requests: Array.from({ length: int(12) }, randomStep),
      nonFinite: Array.from({ length: int(3) }, () => ({ row: u32(), reqId: pick(REQ_IDS), kind: pick(['nan', 'pos_inf', 'weird', '']) })),
    };
  }
  return { globalRank: u32(), epochSeen: pick([0, 1, 7, 2 ** 40]), requestId: pick([0, 3, 2 ** 33]), waveHead };
}

/** What the generic decoder says: the value, or that it throws. */
function generic(bytes: Buffer): { value?: unknown; throws?: boolean } {
  try {
    return { value: decode(AgentMessage, bytes) };
  } catch {
    return { throws: true };
  }
}

describe('wave-head fast decoder', () => {
  test('gives exactly what protobufjs decode + toObject gives, on random wave heads', () => {
    for (let i = 0; i < 400; i++) {
      const bytes = encodeAgentMessage(randomWaveHead());
      const fast = decodeWaveHeadMessage(bytes);
      expect(fast).not.toBeNull();
      expect(fast).toEqual(generic(bytes).value);
      // the same field set, not merely equal where both have fields
      const steps = (fast!.waveHead.telemetry?.requests ?? []) as unknown as Record<string, unknown>[];
      for (const s of steps) expect(Object.keys(s).sort()).toEqual(['accepted', 'blockIds', 'draftLen', 'finished', 'freed', 'newTokenIds', 'newTokenLogprobs', 'newTokenRanks', 'numOutputTokens', 'promptLen', 'reqId']);
    }
  });

  test('decodeAgentMessage returns the same value through the fast path', () => {
    const msg = randomWaveHead();
    const bytes = encodeAgentMessage(msg);
    const d = decodeAgentMessage(bytes, 1 << 24);
    expect(d.ok).toBe(true);
    expect(d.ok && d.value).toEqual(generic(bytes).value);
  });

  test('truncated or corrupted bytes: null (the generic decoder decides), or the generic result', () => {
    let nulls = 0;
    for (let i = 0; i < 300; i++) {
      const good = encodeAgentMessage(randomWaveHead());
      const bad = Buffer.from(good);
      if (i % 2 === 0) {
        const cut = bad.subarray(0, int(bad.length));
        const fast = decodeWaveHeadMessage(cut);
        const g = generic(cut);
        if (fast === null) nulls++;
        else expect(fast).toEqual(g.value);
      } else {
        for (let k = 0; k < 1 + int(4); k++) bad[int(bad.length)] = int(256);
        const fast = decodeWaveHeadMessage(bad);
        const g = generic(bad);
        if (fast === null) nulls++;
        else {
          expect(g.throws).toBeUndefined();
          expect(fast).toEqual(g.value);
        }
      }
    }
    expect(nulls).toBeGreaterThan(100); // most damage is refused, not guessed at
  });

  test('a truncated wave head still gets the generic drop reason', () => {
    const good = encodeAgentMessage(randomWaveHead());
    const d = decodeAgentMessage(good.subarray(0, good.length - 3), 1 << 24);
    expect(d.ok).toBe(false);
    expect(!d.ok && d.reason).toBe('truncated');
  });

  test('other bodies, unknown fields and an empty buffer go to the generic decoder', () => {
    expect(decodeWaveHeadMessage(encodeAgentMessage({ globalRank: 2, epochSeen: 1, heartbeat: { wave: 5 } }))).toBeNull();
    expect(decodeWaveHeadMessage(encodeAgentMessage({ globalRank: 2, hello: {} }))).toBeNull();
    expect(decodeWaveHeadMessage(Buffer.alloc(0))).toBeNull();
    // a wave head followed by an unknown field 15: protobufjs skips it, the fast path declines
    const w = protobuf.Writer.create();
    w.uint32((7 << 3) | 2).fork().uint32((1 << 3) | 0).uint64(9).ldelim();
    w.uint32((15 << 3) | 0).uint32(1);
    const bytes = Buffer.from(w.finish());
    expect(decodeWaveHeadMessage(bytes)).toBeNull();
    expect(decodeAgentMessage(bytes, 1 << 20)).toMatchObject({ ok: true, value: { body: 'waveHead', waveHead: { wave: 9 } } });
  });

  test('unpacked repeated scalars (legal proto3 encoding) decode the same', () => {
    const w = protobuf.Writer.create();
    w.uint32((1 << 3) | 0).uint32(4); // global_rank
    w.uint32((7 << 3) | 2).fork();
    w.uint32((1 << 3) | 0).uint64(12);
    w.uint32((2 << 3) | 2).fork(); // telemetry
    w.uint32((2 << 3) | 2).fork(); // one request
    w.uint32((1 << 3) | 2).string('r1');
    for (const t of [5, 2 ** 32 - 1, 7]) w.uint32((2 << 3) | 0).uint32(t); // new_token_ids, unpacked
    for (const lp of [-1.5, -0.25]) w.uint32((3 << 3) | 5).float(lp); // logprobs, unpacked fixed32
    w.uint32((7 << 3) | 2).fork().uint32(3).uint32(4).ldelim(); // block_ids packed ...
    w.uint32((7 << 3) | 0).uint32(5); // ... then one more unpacked
    w.uint32((8 << 3) | 0).uint32(2); // finished: any non-zero is true
    w.ldelim().ldelim().ldelim();
    const bytes = Buffer.from(w.finish());
    const fast = decodeWaveHeadMessage(bytes);
    expect(fast).toEqual(generic(bytes).value);
    expect(fast!.waveHead.telemetry!.requests[0]).toMatchObject({ reqId: 'r1', newTokenIds: [5, 2 ** 32 - 1, 7], newTokenLogprobs: [-1.5, -0.25], blockIds: [3, 4, 5], finished: true });
  });
});
