// The telemetry ring's layout, read once from proto/ring-layout.json (the one description: the
// Python client ships a copy, docs/native.md shows it; test/telemetry-ring.test.ts checks all three).
import * as fs from 'fs';
import * as path from 'path';

export interface RingField {
  name: string;
  offset: number;
  type: string;
  what: string;
}

export interface RingColumnSpec {
  name: string;
  type: 'u8' | 'u32' | 'f32';
  per: 'row' | 'token' | 'event' | 'extra';
  what: string;
}

export interface RingLayoutDoc {
  magic: string;
  version: number;
  slots: number;
  header_bytes: number;
  header: RingField[];
  slot_header_bytes: number;
  slot_header: RingField[];
  columns: RingColumnSpec[];
}

export interface RingSizes {
  maxRows: number;
  maxTokens: number;
  maxEvents: number;
  /** Bytes of the head's sparse part (the extra column) a slot holds. */
  maxExtra: number;
}

/** One column's place in a slot: byte offset, capacity in values, element size. */
export interface ColumnPlace {
  name: string;
  offset: number;
  capacity: number;
  size: number;
  bit: number;
  per: RingColumnSpec['per'];
}

function layoutFile(): string {
  for (let dir = __dirname, i = 0; i < 4; i++, dir = path.dirname(dir)) {
    const p = path.join(dir, 'proto', 'ring-layout.json');
    if (fs.existsSync(p)) return p;
  }
  throw new Error(`proto/ring-layout.json not found above ${__dirname}`);
}

export const RING_LAYOUT: RingLayoutDoc = JSON.parse(fs.readFileSync(layoutFile(), 'utf8')) as RingLayoutDoc;

const SIZE: Record<string, number> = { u8: 1, u32: 4, f32: 4 };

function offsets(fields: RingField[]): Record<string, number> {
  return Object.fromEntries(fields.map((f) => [f.name, f.offset]));
}

export const RING_HEADER = offsets(RING_LAYOUT.header);
export const RING_SLOT = offsets(RING_LAYOUT.slot_header);

const align8 = (n: number): number => Math.ceil(n / 8) * 8;

/** Every column's place in a slot, and the slot's bytes (the Python writer computes the same). */
export function columnPlaces(s: RingSizes): { places: ColumnPlace[]; slotBytes: number } {
  const cap = { row: s.maxRows, token: s.maxTokens, event: s.maxEvents, extra: s.maxExtra };
  let at = RING_LAYOUT.slot_header_bytes;
  const places = RING_LAYOUT.columns.map((c, bit) => {
    const p = { name: c.name, offset: at, capacity: cap[c.per], size: SIZE[c.type], bit, per: c.per };
    at += align8(p.capacity * p.size);
    return p;
  });
  return { places, slotBytes: align8(at) };
}
