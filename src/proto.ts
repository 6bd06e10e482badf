// Loads proto/wavebus.proto once and exposes typed encode/decode helpers.
import * as path from 'path';
import * as protobuf from 'protobufjs';

const root = protobuf.loadSync(path.resolve(__dirname, '..', 'proto', 'wavebus.proto'));

export function messageType(name: string): protobuf.Type {
  return root.lookupType(`wavebus.${name}`);
}

export const BusFrame = messageType('BusFrame');
export const AgentMessage = messageType('AgentMessage');
export const CoordinatorMessage = messageType('CoordinatorMessage');
export const ClientRequest = messageType('ClientRequest');
export const ClientReply = messageType('ClientReply');

/** Encode a plain object as `type`; fields are checked by protobufjs's verify first. */
export function encode(type: protobuf.Type, value: Record<string, unknown>): Buffer {
  const err = type.verify(value);
  if (err) throw new Error(`${type.name}: ${err}`);
  return Buffer.from(type.encode(type.fromObject(value)).finish());
}

/** Decode to a plain object with longs as numbers and defaults filled in. Throws on malformed input. */
export function decode<T = Record<string, any>>(type: protobuf.Type, bytes: Uint8Array): T {
  const msg = type.decode(bytes);
  return type.toObject(msg, { longs: Number, defaults: true, arrays: true, oneofs: true, bytes: Buffer }) as T;
}
