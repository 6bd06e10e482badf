// The shared-memory byte layouts between processes and languages, read from their one
// description, proto/layouts.json (format: docs/layouts.md). TypeScript loads the JSON here; the
// Python client loads the same data (wavebus_client/shm_layout.py, generated shm_layouts_data.py). Each
// layout is checked when first asked for: a field outside its struct, two fields that overlap, a
// misaligned number or an unknown type is a defect of the file, refused naming the field.
import { WavebusError } from './errors';
import layoutFile from '../proto/layouts.json';

/** Bytes of each numeric field type (`bytes` fields give their own length). */
export const FIELD_TYPE_BYTES = { u8: 1, u16: 2, u32: 4, u64: 8, i32: 4, i64: 8, f64: 8 } as const;
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

export interface Layout {
  name: string;
  constants: Readonly<Record<string, number>>;
  structs: Readonly<Record<string, LayoutStruct>>;
  /** The struct's field, or an error naming the layout, the struct and the field. */
  field(struct: string, field: string): LayoutField;
  /** The constant, or an error naming it. */
  constant(name: string): number;
}

type RawField = { at?: unknown; type?: unknown; bytes?: unknown };
type RawStruct = { bytes?: unknown; fields?: Record<string, RawField> };
export type RawLayout = { constants?: Record<string, { value?: unknown }>; structs?: Record<string, RawStruct> };

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

/** A layout description checked as the file's are (exported for tests: the loaders must refuse alike). */
export function checkLayout(name: string, raw: RawLayout): Layout {
  const where = `layouts.${name}`;
  const constants: Record<string, number> = {};
  for (const [c, v] of Object.entries(raw.constants ?? {})) constants[c] = count(v.value, `${where}.constants.${c}.value`);
  const structs: Record<string, LayoutStruct> = {};
  for (const [s, v] of Object.entries(raw.structs ?? {})) structs[s] = checkStruct(s, v, `${where}.structs.${s}`);
  return Object.freeze({
    name,
    constants: Object.freeze(constants),
    structs: Object.freeze(structs),
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
    case 'u64': buf.writeBigUInt64LE(BigInt(v), at); return;
    case 'i64': buf.writeBigInt64LE(BigInt(v), at); return;
    case 'f64': buf.writeDoubleLE(Number(v), at); return;
    default: throw bad(f.name, 'a bytes field is written as bytes');
  }
}
