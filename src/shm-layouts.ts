// The shared-memory byte layouts between processes and languages, read from their one
// description, proto/layouts.json (format: docs/layouts.md). TypeScript loads the JSON here; the
// Python client loads the same data (wavebus_client/shm_layout.py, generated shm_layouts_data.py). Each
// layout is checked when first asked for: a field outside its struct, two fields that overlap, a
// misaligned number or an unknown type is a defect of the file, refused naming the field.
import { WavebusError } from './errors';
import layoutFile from '../proto/layouts.json';

/** Bytes of each numeric field type (`bytes` fields give their own length). */
export const FIELD_TYPE_BYTES = { u8: 1, u16: 2, u32: 4, u64: 8, i32: 4, i64: 8, f32: 4, f64: 8 } as const;
export type NumberType = keyof typeof FIELD_TYPE_BYTES;
export type FieldType = keyof typeof FIELD_TYPE_BYTES | 'bytes';

export interface LayoutField {
  name: string;
  /** Byte offset from the struct's start. */
  at: number;
  type: FieldType;
  /** The field's length in bytes. */
  bytes: number;
}

export interface LayoutStruct {
  name: string;
  bytes: number;
  fields: Readonly<Record<string, LayoutField>>;
}

/** One array of a layout's `columns`: `count` values of `type`, the count a header field names. */
export interface LayoutColumn {
  name: string;
  type: NumberType;
  /** Bytes of one value. */
  size: number;
  /** The struct and the field whose value is the column's capacity. */
  count: { struct: string; field: string };
  /** The column's index: its bit in a `present` word. */
  bit: number;
}

/** One column's place in its repeated unit (a ring's slot). */
export interface ColumnPlace {
  name: string;
  type: NumberType;
  /** Byte offset from the unit's start. */
  at: number;
  /** Values it holds. */
  capacity: number;
  size: number;
  bit: number;
  /** The name of the field that gives its capacity (e.g. max_rows). */
  count: string;
}

export interface Layout {
  name: string;
  constants: Readonly<Record<string, number>>;
  structs: Readonly<Record<string, LayoutStruct>>;
  /** The arrays that follow a struct (`columns.after`), in order; [] where the layout has none. */
  columns: readonly LayoutColumn[];
  /** The struct the columns follow, or null. */
  columnsAfter: string | null;
  /**
   * Every column's place for these capacities (keyed by the count field's name, e.g. max_rows), and
   * the unit's bytes: the struct, then each column 8-aligned after the one before.
   */
  placeColumns(counts: Readonly<Record<string, number>>): { places: ColumnPlace[]; bytes: number };
  /** The struct's field, or an error naming the layout, the struct and the field. */
  field(struct: string, field: string): LayoutField;
  /** The constant, or an error naming it. */
  constant(name: string): number;
}

type RawField = { at?: unknown; type?: unknown; bytes?: unknown };
type RawStruct = { bytes?: unknown; fields?: Record<string, RawField> };
type RawColumn = { name?: unknown; type?: unknown; count?: unknown };
export type RawLayout = {
  constants?: Record<string, { value?: unknown }>;
  structs?: Record<string, RawStruct>;
  columns?: { after?: unknown; items?: RawColumn[] };
};

const FILE = 'proto/layouts.json';

function bad(where: string, why: string): WavebusError {
  return new WavebusError('ERR_LAYOUT', `${FILE}: ${where}: ${why}`);
}

function count(v: unknown, where: string): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) throw bad(where, `expected a non-negative integer, got ${JSON.stringify(v)}`);
  return v;
}

function checkStruct(name: string, s: RawStruct, where: string): LayoutStruct {
  const bytes = count(s.bytes, `${where}.bytes`);
  const fields: Record<string, LayoutField> = {};
  const taken: LayoutField[] = [];
  for (const [fname, f] of Object.entries(s.fields ?? {})) {
    const fw = `${where}.fields.${fname}`;
    const type = f.type as FieldType;
    if (type !== 'bytes' && !(type in FIELD_TYPE_BYTES)) throw bad(fw, `unknown type ${JSON.stringify(f.type)} (one of ${[...Object.keys(FIELD_TYPE_BYTES), 'bytes'].join(', ')})`);
    const at = count(f.at, `${fw}.at`);
    const len = type === 'bytes' ? count(f.bytes, `${fw}.bytes`) : FIELD_TYPE_BYTES[type];
    // Numbers at their natural alignment: each side reads them with one aligned load.
    if (at % Math.min(len, 8) !== 0 && type !== 'bytes') throw bad(fw, `a ${type} at ${at} is not ${len}-aligned`);
    if (at + len > bytes) throw bad(fw, `bytes ${at}..${at + len} lie outside the struct's ${bytes}`);
    const hit = taken.find((o) => at < o.at + o.bytes && o.at < at + len);
    if (hit) throw bad(fw, `bytes ${at}..${at + len} overlap field ${hit.name} (${hit.at}..${hit.at + hit.bytes})`);
    const field = Object.freeze({ name: fname, at, type, bytes: len });
    taken.push(field);
    fields[fname] = field;
  }
  return Object.freeze({ name, bytes, fields: Object.freeze(fields) });
}

const align8 = (n: number): number => Math.ceil(n / 8) * 8;

function checkColumns(raw: RawLayout['columns'], structs: Record<string, LayoutStruct>, where: string): { after: string | null; items: LayoutColumn[] } {
  if (raw === undefined) return { after: null, items: [] };
  const cw = `${where}.columns`;
  const after = raw.after;
  if (typeof after !== 'string' || !structs[after]) throw bad(`${cw}.after`, `names no struct of the layout: ${JSON.stringify(after)}`);
  if (structs[after].bytes % 8 !== 0) throw bad(`${cw}.after`, `struct ${after}'s ${structs[after].bytes} bytes are not 8-aligned`);
  const items: LayoutColumn[] = [];
  (Array.isArray(raw.items) ? raw.items : []).forEach((c, bit) => {
    const iw = `${cw}.items[${bit}]`;
    if (typeof c.name !== 'string' || !/^[a-z][a-z0-9_]*$/.test(c.name)) throw bad(`${iw}.name`, `expected a snake_case name, got ${JSON.stringify(c.name)}`);
    if (items.some((o) => o.name === c.name)) throw bad(`${iw}.name`, `a second column ${c.name}`);
    const type = c.type as NumberType;
    if (!(type in FIELD_TYPE_BYTES)) throw bad(`${iw}.type`, `unknown type ${JSON.stringify(c.type)} (one of ${Object.keys(FIELD_TYPE_BYTES).join(', ')})`);
    const [cs, cf] = typeof c.count === 'string' ? c.count.split('.') : [];
    const countField = structs[cs]?.fields[cf];
    if (!countField || countField.type !== 'u32') throw bad(`${iw}.count`, `names no u32 field (struct.field) of the layout: ${JSON.stringify(c.count)}`);
    items.push(Object.freeze({ name: c.name, type, size: FIELD_TYPE_BYTES[type], count: Object.freeze({ struct: cs, field: cf }), bit }));
  });
  return { after, items };
}

/** A layout description checked as the file's are (exported for tests: the loaders must refuse alike). */
export function checkLayout(name: string, raw: RawLayout): Layout {
  const where = `layouts.${name}`;
  const constants: Record<string, number> = {};
  for (const [c, v] of Object.entries(raw.constants ?? {})) constants[c] = count(v.value, `${where}.constants.${c}.value`);
  const structs: Record<string, LayoutStruct> = {};
  for (const [s, v] of Object.entries(raw.structs ?? {})) structs[s] = checkStruct(s, v, `${where}.structs.${s}`);
  const columns = checkColumns(raw.columns, structs, where);
  return Object.freeze({
    name,
    constants: Object.freeze(constants),
    structs: Object.freeze(structs),
    columns: Object.freeze(columns.items),
    columnsAfter: columns.after,
    placeColumns(counts: Readonly<Record<string, number>>): { places: ColumnPlace[]; bytes: number } {
      let at = columns.after ? structs[columns.after].bytes : 0;
      const places = columns.items.map((c) => {
        const capacity = counts[c.count.field];
        if (!Number.isSafeInteger(capacity) || capacity < 0) throw bad(`${where}.columns.${c.name}`, `capacity ${c.count.field} is ${JSON.stringify(capacity)}, not a non-negative integer`);
        const p = { name: c.name, type: c.type, at, capacity, size: c.size, bit: c.bit, count: c.count.field };
        at += align8(capacity * c.size);
        return p;
      });
      return { places, bytes: align8(at) };
    },
    field(struct: string, field: string): LayoutField {
      const f = structs[struct]?.fields[field];
      if (!f) throw bad(where, `no field ${struct}.${field}`);
      return f;
    },
    constant(c: string): number {
      if (!(c in constants)) throw bad(where, `no constant ${c}`);
      return constants[c];
    },
  });
}

const loaded = new Map<string, Layout>();

/** The names of every layout described. */
export function layoutNames(): string[] {
  return Object.keys((layoutFile as { layouts: Record<string, unknown> }).layouts);
}

/** One layout, checked (once). */
export function layout(name: string): Layout {
  let l = loaded.get(name);
  if (!l) {
    const raw = (layoutFile as unknown as { layouts: Record<string, RawLayout> }).layouts[name];
    if (!raw) throw bad('layouts', `no layout ${JSON.stringify(name)} (there are: ${layoutNames().join(', ')})`);
    l = checkLayout(name, raw);
    loaded.set(name, l);
  }
  return l;
}

/** Reads a numeric field of the struct that starts at `base` (u64 / i64 as bigint). */
export function readField(buf: Buffer, base: number, f: LayoutField): number | bigint {
  const at = base + f.at;
  switch (f.type) {
    case 'u8': return buf.readUInt8(at);
    case 'u16': return buf.readUInt16LE(at);
    case 'u32': return buf.readUInt32LE(at);
    case 'i32': return buf.readInt32LE(at);
    case 'f32': return buf.readFloatLE(at);
    case 'u64': return buf.readBigUInt64LE(at);
    case 'i64': return buf.readBigInt64LE(at);
    case 'f64': return buf.readDoubleLE(at);
    default: throw bad(f.name, 'a bytes field has no number to read');
  }
}

/** Writes a numeric field of the struct that starts at `base`. */
export function writeField(buf: Buffer, base: number, f: LayoutField, v: number | bigint): void {
  const at = base + f.at;
  switch (f.type) {
    case 'u8': buf.writeUInt8(Number(v), at); return;
    case 'u16': buf.writeUInt16LE(Number(v), at); return;
    case 'u32': buf.writeUInt32LE(Number(v), at); return;
    case 'i32': buf.writeInt32LE(Number(v), at); return;
    case 'f32': buf.writeFloatLE(Number(v), at); return;
    case 'u64': buf.writeBigUInt64LE(BigInt(v), at); return;
    case 'i64': buf.writeBigInt64LE(BigInt(v), at); return;
    case 'f64': buf.writeDoubleLE(Number(v), at); return;
    default: throw bad(f.name, 'a bytes field is written as bytes');
  }
}
