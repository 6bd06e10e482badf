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

/** One TelemetryColumns.bind entry as its wire bytes (tag and length included). */
export function bindBytes(slot: number, reqId: string, promptLen: number, promptTokenIds?: number[]): Uint8Array {
  const bind = promptTokenIds && promptTokenIds.length > 0 ? { slot, reqId, promptLen, promptTokenIds } : { slot, reqId, promptLen };
  return copy(encodeTrusted(TelemetryColumns, { bind: [bind] }));
}

/** One TelemetryColumns.blocks entry as its wire bytes. */
export function blocksBytes(slot: number, blockIds: number[]): Uint8Array {
  return copy(encodeTrusted(TelemetryColumns, { blocks: [{ slot, blockIds }] }));
}

/** StepTelemetry.non_finite entries as their wire bytes (rare: a step that saw non-finite logits). */
export function nonFiniteBytes(rows: unknown[]): Uint8Array {
  return rows.length > 0 ? copy(encodeTrusted(StepTelemetry, { nonFinite: rows })) : EMPTY;
}

const EMPTY = new Uint8Array(0);

function varintSize(v: number): number {
  let n = 1;
  while (v > 0x7f) {
    v = Math.floor(v / 128);
    n++;
  }
  return n;
}

/** Joins a head's pieces into one reused buffer: no allocation per step once it is large enough. */
export class HeadBytes {
  private buf = new Uint8Array(256);
  private at = 0;

  /**
   * WaveHeadRequest{wave, telemetry{wave, non_finite, columns}}: `binds` then `blocks` are
   * TelemetryColumns entries' bytes. Zero and empty fields are left out as protobufjs leaves them
   * out; telemetry is always there. The view is valid until the next build.
   */
  build(wave: number, teleWave: number, binds: readonly Uint8Array[], blocks: readonly Uint8Array[], nonFinite: Uint8Array): Uint8Array {
    let cols = 0;
    for (const b of binds) cols += b.length;
    for (const b of blocks) cols += b.length;
    const tele = (teleWave > 0 ? 1 + varintSize(teleWave) : 0) + nonFinite.length + (cols > 0 ? 1 + varintSize(cols) + cols : 0);
    const total = (wave > 0 ? 1 + varintSize(wave) : 0) + 1 + varintSize(tele) + tele;
    if (this.buf.length < total) this.buf = new Uint8Array(2 * total);
    this.at = 0;
    if (wave > 0) this.field(HEAD_WAVE, wave);
    this.field(HEAD_TELEMETRY, tele);
    if (teleWave > 0) this.field(TELE_WAVE, teleWave);
    this.put(nonFinite);
    if (cols > 0) {
      this.field(TELE_COLUMNS, cols);
      for (const b of binds) this.put(b);
      for (const b of blocks) this.put(b);
    }
    return this.buf.subarray(0, total);
  }

  private field(t: number, v: number): void {
    const buf = this.buf;
    buf[this.at++] = t;
    while (v > 0x7f) {
      buf[this.at++] = (v % 128) | 0x80;
      v = Math.floor(v / 128);
    }
    buf[this.at++] = v;
  }

  private put(b: Uint8Array): void {
    if (b.length === 0) return;
    this.buf.set(b, this.at);
    this.at += b.length;
  }
}
