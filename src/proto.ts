// Loads proto/wavebus.proto once and exposes typed encode/decode helpers.
import * as path from 'path';
import * as protobuf from 'protobufjs';

import * as fs from 'fs';

/** proto/ sits at the package root: one level up from src/ (ts-jest), two from dist/src/ (built). */
function protoFile(): string {
  for (let dir = __dirname, i = 0; i < 4; i++, dir = path.dirname(dir)) {
    const p = path.join(dir, 'proto', 'wavebus.proto');
    if (fs.existsSync(p)) return p;
  }
  throw new Error(`proto/wavebus.proto not found above ${__dirname}`);
}

const root = protobuf.loadSync(protoFile());

export function messageType(name: string): protobuf.Type {
  return root.lookupType(`wavebus.${name}`);
}

/** The name -> number map of a proto enum, e.g. enumValues('RegionRole').ROLE_INPUT. */
export function enumValues(name: string): Readonly<Record<string, number>> {
  return root.lookupEnum(`wavebus.${name}`).values;
}

export const BusFrame = messageType('BusFrame');
export const AgentMessage = messageType('AgentMessage');
export const CoordinatorMessage = messageType('CoordinatorMessage');
export const ClientRequest = messageType('ClientRequest');
export const ClientReply = messageType('ClientReply');
export const RecorderEntry = messageType('RecorderEntry');

/** Encode a plain object as `type`; fields are checked by protobufjs's verify first. */
export function encode(type: protobuf.Type, value: Record<string, unknown>): Buffer {
  const err = type.verify(value);
  if (err) throw new Error(`${type.name}: ${err}`);
  return encodeTrusted(type, type.fromObject(value));
}

/**
 * Encode a message this process built itself from values it already checked (the per-step wave
 * head): protobufjs's generated encoder straight on the plain object, without verify() and
 * fromObject(), which cost several times the encoding itself.
 */
export function encodeTrusted(type: protobuf.Type, value: Record<string, unknown> | protobuf.Message): Buffer {
  const u8 = type.encode(value).finish();
  // A view, not a copy: file chunks carry megabytes.
  return Buffer.from(u8.buffer, u8.byteOffset, u8.byteLength);
}

/**
 * A decoded uint64/int64 field as a number: protobufjs gives a Long for it, and Number(long) goes
 * through Long.toString (a radix-10 division loop, several µs per field on the per-wave path);
 * toNumber() gives the same double (both round the exact value once).
 */
export function longNumber(v: number | { toNumber(): number } | null | undefined): number {
  if (typeof v === 'number') return v;
  return v == null ? 0 : v.toNumber();
}

/** Decode to a plain object with longs as numbers and defaults filled in. Throws on malformed input. */
export function decode<T = Record<string, any>>(type: protobuf.Type, bytes: Uint8Array): T {
  return toPlain<T>(type, type.decode(bytes));
}

/** The plain-object form of a decoded message (what decode() returns). */
export function toPlain<T = Record<string, any>>(type: protobuf.Type, msg: protobuf.Message): T {
  return type.toObject(msg, { longs: Number, defaults: true, arrays: true, oneofs: true, bytes: Buffer }) as T;
}
