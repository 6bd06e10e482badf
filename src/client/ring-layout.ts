// The telemetry ring's layout: proto/layouts.json's "telemetry" (the one description every side
// loads, docs/layouts.md; the Python writer is clients/python/wavebus_client/ring.py), read into
// plain offsets once. docs/native.md shows it; test/telemetry-ring.test.ts checks the two agree.
import { layout, type ColumnPlace } from '../shm-layouts';

export type { ColumnPlace } from '../shm-layouts';

const L = layout('telemetry');

function offsets(struct: string): Record<string, number> {
  return Object.fromEntries(Object.values(L.structs[struct].fields).map((f) => [f.name, f.at]));
}

/** The ring's fixed numbers. */
export const RING_LAYOUT = Object.freeze({
  /** The file's first 8 bytes as text (the header's magic and magic_hi words). */
  magic: Buffer.concat([u32(L.constant('magic')), u32(L.constant('magic_hi'))]).toString('latin1'),
  version: L.constant('version'),
  slots: L.constant('slots'),
  header_bytes: L.structs.header.bytes,
  slot_header_bytes: L.structs.slot.bytes,
});

function u32(v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(v);
  return b;
}

export const RING_HEADER = offsets('header');
export const RING_SLOT = offsets('slot');

export interface RingSizes {
  maxRows: number;
  maxTokens: number;
  maxEvents: number;
  /** Bytes of the head's sparse part (the extra column) a slot holds. */
  maxExtra: number;
}

/** The sizes a client asked for at hello, and the vocabulary its token ids are checked against. */
export interface RingAsk extends RingSizes {
  vocab: number;
}

/** One slot as the agent read it: its counts and the present columns' bytes (each its own aligned buffer). */
export interface RingSlotRead {
  wave: number;
  rows: number;
  tokens: number;
  events: number;
  /** Bytes of the extra column; 0 when absent. */
  extraLen: number;
  columns: Map<string, Uint8Array>;
}

/** Every column's place in a slot, and the slot's bytes (the Python writer computes the same). */
export function columnPlaces(s: RingSizes): { places: ColumnPlace[]; slotBytes: number } {
  const { places, bytes } = L.placeColumns({ max_rows: s.maxRows, max_tokens: s.maxTokens, max_events: s.maxEvents, max_extra: s.maxExtra });
  return { places, slotBytes: bytes };
}

/** The columns in their layout order (write()'s index of each), and each one's index by name. */
export const RING_COLUMN_NAMES: readonly string[] = Object.freeze(columnPlaces({ maxRows: 0, maxTokens: 0, maxEvents: 0, maxExtra: 0 }).places.map((p) => p.name));
export const RING_COLUMN: Readonly<Record<string, number>> = Object.freeze(Object.fromEntries(RING_COLUMN_NAMES.map((n, i) => [n, i])));
