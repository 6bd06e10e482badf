// The tensor head's sparse part as protobuf bytes, built from pieces encoded once per event (the
// Python client's head_bytes.py is the same). A WaveHeadRequest's wire form is its fields one
// after another and a repeated field's entries may come in any number of runs, so the head a step
// writes into the ring is the bindings and tables it carries, each encoded once when the engine
// reported it (arrive, blocks), inside the few bytes of the wave and two enclosing lengths: a step
// encodes no message. Field numbers come from proto/wavebus.proto through protobufjs's reflection;
// test/tensor-head-ts.test.ts compares the bytes with protobufjs's.
import { encodeTrusted, messageType } from '../proto';

const WaveHeadRequest = messageType('WaveHeadRequest');
const StepTelemetry = messageType('StepTelemetry');
const TelemetryColumns = messageType('TelemetryColumns');

const VARINT = 0;
const LEN = 2;

function tag(type: typeof WaveHeadRequest, name: string, wire: number): number {
  const t = (type.fields[name].id << 3) | wire;
  if (t > 0x7f) throw new Error(`head-bytes: field ${type.name}.${name} needs a tag of more than one byte`);
  return t;
}

const HEAD_WAVE = tag(WaveHeadRequest, 'wave', VARINT);
const HEAD_TELEMETRY = tag(WaveHeadRequest, 'telemetry', LEN);
const TELE_WAVE = tag(StepTelemetry, 'wave', VARINT);
const TELE_COLUMNS = tag(StepTelemetry, 'columns', LEN);

function copy(b: Uint8Array): Uint8Array {
  return Uint8Array.prototype.slice.call(b); // its own memory, not a view into the writer's pool
}

const SlotBinding = messageType('SlotBinding');
const SlotBlocks = messageType('SlotBlocks');
const COL_BIND = tag(TelemetryColumns, 'bind', LEN);
const COL_BLOCKS = tag(TelemetryColumns, 'blocks', LEN);
const BIND_SLOT = tag(SlotBinding, 'slot', VARINT);
const BIND_REQ = tag(SlotBinding, 'reqId', LEN);
const BIND_PLEN = tag(SlotBinding, 'promptLen', VARINT);
const BIND_IDS = tag(SlotBinding, 'promptTokenIds', LEN);
const BLOCKS_SLOT = tag(SlotBlocks, 'slot', VARINT);
const BLOCKS_IDS = tag(SlotBlocks, 'blockIds', LEN);
const utf8 = new TextEncoder();

function putVarint(buf: Uint8Array, at: number, v: number): number {
  while (v > 0x7f) {
    buf[at++] = (v % 128) | 0x80;
    v = shift7(v);
  }
  buf[at++] = v;
  return at;
}

function packedSize(ids: readonly number[] | undefined): number {
  let n = 0;
  if (ids) for (let i = 0; i < ids.length; i++) n += varintSize(ids[i]);
  return n;
}

function putPacked(buf: Uint8Array, at: number, t: number, ids: readonly number[], packed: number): number {
  if (ids.length === 0) return at;
  buf[at++] = t;
  at = putVarint(buf, at, packed);
  for (let i = 0; i < ids.length; i++) at = putVarint(buf, at, ids[i]);
  return at;
}

/** A TelemetryColumns entry of field `t` around an inner message of `inner` bytes: the buffer and where the inner one starts. */
function entry(t: number, inner: number): [Uint8Array, number] {
  const out = new Uint8Array(1 + varintSize(inner) + inner);
  out[0] = t;
  return [out, putVarint(out, 1, inner)];
}

/**
 * One TelemetryColumns.bind entry as its wire bytes (tag and length included), written directly
 * (once per request: no protobufjs writer). Zero and empty fields are left out, fields in number
 * order, as the library's proto3 form and the Python client's (_native_arrive.h) are.
 */
export function bindBytes(slot: number, reqId: string, promptLen: number, promptTokenIds?: number[]): Uint8Array {
  // An ASCII id (the usual one) is its own UTF-8: written char by char, no encoder's array. Else a
  // lone surrogate becomes U+FFFD (TextEncoder): always valid UTF-8 on the wire.
  const req = isAscii(reqId) ? null : utf8.encode(reqId);
  const reqLen = req === null ? reqId.length : req.length;
  const ids = promptTokenIds ?? [];
  const packed = packedSize(ids);
  const inner = (slot > 0 ? 1 + varintSize(slot) : 0) + 1 + varintSize(reqLen) + reqLen + (promptLen > 0 ? 1 + varintSize(promptLen) : 0) + (ids.length > 0 ? 1 + varintSize(packed) + packed : 0);
  const [out, start] = entry(COL_BIND, inner);
  let at = start;
  if (slot > 0) {
    out[at++] = BIND_SLOT;
    at = putVarint(out, at, slot);
  }
  out[at++] = BIND_REQ;
  at = putVarint(out, at, reqLen);
  if (req === null) for (let i = 0; i < reqLen; i++) out[at++] = reqId.charCodeAt(i);
  else {
    out.set(req, at);
    at += reqLen;
  }
  if (promptLen > 0) {
    out[at++] = BIND_PLEN;
    at = putVarint(out, at, promptLen);
  }
  putPacked(out, at, BIND_IDS, ids, packed);
  return out;
}

function isAscii(s: string): boolean {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0x7f) return false;
  return true;
}

/** One TelemetryColumns.blocks entry as its wire bytes, written as bindBytes is. */
export function blocksBytes(slot: number, blockIds: number[]): Uint8Array {
  const packed = packedSize(blockIds);
  const inner = (slot > 0 ? 1 + varintSize(slot) : 0) + (blockIds.length > 0 ? 1 + varintSize(packed) + packed : 0);
  const [out, start] = entry(COL_BLOCKS, inner);
  let at = start;
  if (slot > 0) {
    out[at++] = BLOCKS_SLOT;
    at = putVarint(out, at, slot);
  }
  putPacked(out, at, BLOCKS_IDS, blockIds, packed);
  return out;
}

/** StepTelemetry.non_finite entries as their wire bytes (rare: a step that saw non-finite logits). */
export function nonFiniteBytes(rows: unknown[]): Uint8Array {
  return rows.length > 0 ? copy(encodeTrusted(StepTelemetry, { nonFinite: rows })) : EMPTY;
}

const EMPTY = new Uint8Array(0);

/** A head's buffer at most this long goes into a ring slot whole (telemetry-ring-writer.ts write()). */
export const WHOLE_COPY_MAX = 8192;

/** v / 128 rounded down, in integers while v fits 31 bits (a fraction would be a heap number in V8's baseline code: an allocation per call). */
function shift7(v: number): number {
  return v < 0x80000000 ? v >>> 7 : Math.floor(v / 128);
}

function varintSize(v: number): number {
  let n = 1;
  while (v > 0x7f) {
    v = shift7(v);
    n++;
  }
  return n;
}

/** Joins a head's pieces into one reused buffer: no allocation per step once it is large enough. */
export class HeadBytes {
  /** The last build's bytes are its first `length` (a view of them would be an allocation per step). */
  buf = new Uint8Array(256);
  length = 0;
  private at = 0;

  /**
   * WaveHeadRequest{wave, telemetry{wave, non_finite, columns}}: the first `nBinds` of `binds` then
   * the first `nBlocks` of `blocks` are TelemetryColumns entries' bytes. Zero and empty fields are
   * left out as protobufjs leaves them out; telemetry is always there. Into `buf`; returns the length.
   */
  build(wave: number, teleWave: number, binds: readonly Uint8Array[], nBinds: number, blocks: readonly Uint8Array[], nBlocks: number, nonFinite: Uint8Array): number {
    let cols = 0;
    for (let i = 0; i < nBinds; i++) cols += binds[i].length;
    for (let i = 0; i < nBlocks; i++) cols += blocks[i].length;
    const tele = (teleWave > 0 ? 1 + varintSize(teleWave) : 0) + nonFinite.length + (cols > 0 ? 1 + varintSize(cols) + cols : 0);
    const total = (wave > 0 ? 1 + varintSize(wave) : 0) + 1 + varintSize(tele) + tele;
    // Grown for a large head (every binding after resendAll), shrunk again after it: the usual
    // step's head is copied into the ring with its buffer whole (ring-writer write()), a few hundred bytes.
    if (this.buf.length < total || (this.buf.length > WHOLE_COPY_MAX && this.buf.length > 8 * total)) this.buf = new Uint8Array(Math.max(256, 2 * total));
    this.at = 0;
    if (wave > 0) this.field(HEAD_WAVE, wave);
    this.field(HEAD_TELEMETRY, tele);
    if (teleWave > 0) this.field(TELE_WAVE, teleWave);
    this.put(nonFinite);
    if (cols > 0) {
      this.field(TELE_COLUMNS, cols);
      for (let i = 0; i < nBinds; i++) this.put(binds[i]);
      for (let i = 0; i < nBlocks; i++) this.put(blocks[i]);
    }
    this.length = total;
    return total;
  }

  /** The last build's bytes as a view (a message head, the rare path). */
  bytes(): Uint8Array {
    return this.buf.subarray(0, this.length);
  }

  private field(t: number, v: number): void {
    // Written out here (not putVarint): the per-step head's own loop, as it was measured.
    const buf = this.buf;
    buf[this.at++] = t;
    while (v > 0x7f) {
      buf[this.at++] = (v % 128) | 0x80;
      v = shift7(v);
    }
    buf[this.at++] = v;
  }

  private put(b: Uint8Array): void {
    if (b.length === 0) return;
    this.buf.set(b, this.at);
    this.at += b.length;
  }
}
