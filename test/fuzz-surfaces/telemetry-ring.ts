// The telemetry ring as the agent reads it (test/fuzz-surfaces.ts SURFACES; docs/fuzzing.md): a ring
// made by the agent's own code (TelemetryRingReader.create), four whole heads written in the layout
// of proto/layouts.json's "telemetry" as the Python writer lays them out (columns at columnPlaces, the head's
// sparse part in the extra column), then per input one part rewritten in place (a slot's header,
// one of its columns, its extra, the written word) and the slot taken as the poll takes it
// (RingHeads.take). Every input comes out as a relayed head (whose columns the coordinator's
// columnsFromWire must accept: garbage is never passed on) or a named garbage kind.
import * as fs from 'fs';
import * as path from 'path';
import type { Mutator } from '../../bench/lib/fuzz-mutator';
import { newRingStats, RingHeads } from '../../src/agent/ring-heads';
import { checkRingAsk } from '../../src/agent/telemetry-ring';
import { columnPlaces, RING_HEADER, RING_LAYOUT, RING_SLOT } from '../../src/client/ring-layout';
import { columnsFromWire } from '../../src/client/telemetry';
import { createLogger } from '../../src/log';
import { decode, encodeTrusted, messageType } from '../../src/proto';
import type { Outcome, Surface } from '../fuzz-surfaces';

const WaveHeadRequest = messageType('WaveHeadRequest');
const ASK = { ringRows: 8, ringTokens: 8, ringEvents: 4, ringVocab: 1000 };

export const telemetryRingSurface: Surface = {
  name: 'telemetry_ring',
  from: 'the telemetry ring file the engine client fills per wave head and the agent polls (agent/telemetry-ring.ts, client/ring-columns.ts, agent/ring-heads.ts)',
  async open(dir) {
    const relayed: Uint8Array[] = [];
    const heads = new RingHeads(path.join(dir, 'telemetry-ring-local0'), newRingStats(), createLogger('fuzz-ring', 'silent'), (h) => relayed.push(h));
    const file = heads.open(checkRingAsk(ASK));
    const { places, slotBytes } = columnPlaces(checkRingAsk(ASK));
    const fd = fs.openSync(file, 'r+');
    const slotAt = (i: number) => RING_LAYOUT.header_bytes + i * slotBytes;
    // Four whole heads: waves 11..14, three rows (one with a finish and a free event), tokens with log-probs.
    for (let k = 1; k <= 4; k++) {
      const base = slotAt(k - 1);
      const wave = 10 + k;
      const extra = encodeTrusted(WaveHeadRequest, WaveHeadRequest.fromObject({ wave, telemetry: { wave: wave - 1, columns: { bind: k === 1 ? [{ slot: 0, reqId: 'a', promptLen: 4 }] : [], blocks: [{ slot: 1, blockIds: [3, 4] }] } } }));
      const cols: Record<string, Buffer> = {
        row: Buffer.from(new Uint32Array([0, 1, 2]).buffer),
        token_ids: Buffer.from(new Uint32Array([7, 8, 9 + k]).buffer),
        token_logprobs: Buffer.from(new Float32Array([-0.5, -1, -2]).buffer),
        event_row: Buffer.from(new Uint32Array([1, 5]).buffer),
        event_flags: Buffer.from([1, 3]),
        extra,
      };
      let present = 0;
      for (const p of places) {
        if (!cols[p.name]) continue;
        fs.writeSync(fd, cols[p.name], 0, cols[p.name].length, base + p.at);
        present |= 1 << p.bit;
      }
      const h = Buffer.alloc(RING_LAYOUT.slot_header_bytes);
      h.writeBigUInt64LE(BigInt(2 * k), RING_SLOT.seq);
      h.writeBigUInt64LE(BigInt(wave), RING_SLOT.wave);
      h.writeUInt32LE(3, RING_SLOT.rows);
      h.writeUInt32LE(3, RING_SLOT.tokens);
      h.writeUInt32LE(2, RING_SLOT.events);
      h.writeUInt32LE(present, RING_SLOT.present);
      h.writeUInt32LE(extra.length, RING_SLOT.extra_len);
      fs.writeSync(fd, h, 0, h.length, base);
    }
    const w = Buffer.alloc(8);
    w.writeBigUInt64LE(8n);
    fs.writeSync(fd, w, 0, 8, RING_HEADER.written);
    const valid = fs.readFileSync(file);
    // Each slot's parts: its header, and every column's used bytes.
    const parts: Array<[number, number, number]> = [];
    for (let k = 1; k <= 4; k++) {
      const base = slotAt(k - 1);
      parts.push([k, base, base + RING_LAYOUT.slot_header_bytes]);
      for (const p of places) parts.push([k, base + p.at, base + p.at + Math.min(p.capacity * p.size, 64)]);
    }
    /** A relayed head: it decodes, and its columns pass the coordinator's own check (else garbage went through). */
    const check = (head: Uint8Array): string => {
      const h = decode<Record<string, any>>(WaveHeadRequest, head);
      const c = columnsFromWire(h.telemetry.columns);
      return `head_${c.rows}rows_${c.tokenIds.length}tokens`;
    };
    const take = (seq: number): Outcome => {
      const r = heads.take(seq);
      if (r.head) return { accepted: r.dropped.length ? `head_dropped_${r.dropped.join('+')}` : check(r.head) };
      return { refused: r.dropped.length ? `ring:${r.dropped.join('+')}` : 'ring:via_message' };
    };
    const feed = (input: Buffer, m: Mutator): Outcome => {
      const [k, from, to] = m.pick(parts);
      const bytes = m.rand() < 0.2 ? input.subarray(0, Math.max(0, valid.length - from)) : m.mutate(valid.subarray(from, to));
      const n = Math.min(bytes.length, valid.length - from);
      fs.writeSync(fd, bytes, 0, n, from);
      try {
        return take(2 * k);
      } finally {
        fs.writeSync(fd, valid, from, n, from);
      }
    };
    const poll = (m: Mutator): void => {
      // Now and then the written word itself: the poll relays, skips or counts, and never loops long.
      const word = Buffer.alloc(8);
      word.writeBigUInt64LE(BigInt(m.int(2 ** 31)) * BigInt(m.int(2 ** 22) + 1));
      fs.writeSync(fd, word, 0, 8, RING_HEADER.written);
      heads.poll();
    };
    let fed = 0;
    return {
      valid: [valid.subarray(slotAt(0), slotAt(0) + 256)],
      feed(input, m) {
        if (++fed % 100 === 0) poll(m);
        return feed(input, m);
      },
      alive() {
        fs.writeSync(fd, valid, 0, valid.length, 0);
        const r = take(8);
        if (!('accepted' in r) || r.accepted !== 'head_4rows_3tokens') throw new Error(`a whole head after the garbage: ${JSON.stringify(r)}`);
      },
      close() {
        fs.closeSync(fd);
        heads.close();
      },
    };
  },
};
