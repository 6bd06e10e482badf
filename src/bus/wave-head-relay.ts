// The agent forwards its client's one-way wave head to the coordinator once per engine step. The
// client's ClientRequest.wave_head and the AgentMessage.wave_head are the same message
// (WaveHeadRequest), so its bytes are copied as they came instead of being turned into objects
// and encoded again: on this path, each decode/encode pair cost the agent ~50 µs per wave.
import * as protobuf from 'protobufjs';

/**
 * The raw bytes of field 4 (wave_head) of a ClientRequest that protobufjs has already decoded,
 * or undefined when they cannot be taken as they are (the field repeats, or the frame does not
 * walk cleanly): the caller then re-encodes the decoded message.
 */
export function waveHeadBytes(frame: Uint8Array): Uint8Array | undefined {
  const r = protobuf.Reader.create(frame);
  let found: Uint8Array | undefined;
  try {
    while (r.pos < r.len) {
      const tag = r.uint32();
      if (tag >>> 3 === 4 && (tag & 7) === 2) {
        if (found) return undefined; // repeated: protobuf would merge them
        const len = r.uint32();
        const start = r.pos;
        r.skip(len);
        found = frame.subarray(start, start + len);
      } else {
        r.skipType(tag & 7);
      }
    }
  } catch {
    return undefined; // cut short, or a wire type that does not exist
  }
  return found;
}

/**
 * The wave head of a one-way ClientRequest, taken without decoding it: the frame holds only
 * `id` = 0 (or none) and `wave_head` once, and both it and the WaveHeadRequest inside walk cleanly
 * at their top level. Undefined for anything else (the caller decodes the frame in full, and counts
 * it when it is garbage). The agent needs nothing from a wave head but its bytes: the coordinator
 * decodes and validates it (and drops what is wrong), so a full decode here would be paid twice.
 */
export function oneWayWaveHead(frame: Uint8Array): Uint8Array | undefined {
  let found: Uint8Array | undefined;
  let pos = 0;
  const end = frame.length;
  while (pos < end) {
    const tag = varint(frame, pos, end);
    if (tag < 0) return undefined;
    pos = next;
    if (tag === 0x08) {
      // id: a varint whose every bit is 0 (a request id means the client waits for a reply)
      const start = pos;
      if (varint(frame, pos, end) < 0) return undefined;
      for (let i = start; i < next; i++) if ((frame[i] & 0x7f) !== 0) return undefined;
      pos = next;
    } else if (tag === 0x22 && !found) {
      const len = varint(frame, pos, end);
      if (len < 0 || next + len > end) return undefined;
      found = frame.subarray(next, next + len);
      pos = next + len;
    } else {
      return undefined; // another body, a repeated wave_head, an unknown field: the full decode decides
    }
  }
  return found && walks(found) ? found : undefined;
}

/** Position after the last varint read (module state: these walkers allocate nothing). */
let next = 0;

/** A varint below 2^31 at `pos` (sets `next`), or -1 when cut short or larger. */
function varint(b: Uint8Array, pos: number, end: number): number {
  let v = 0;
  for (let shift = 0; shift < 28; shift += 7) {
    if (pos >= end) return -1;
    const x = b[pos++];
    v |= (x & 0x7f) << shift;
    if (x < 0x80) {
      next = pos;
      return v;
    }
  }
  if (pos >= end) return -1;
  const x = b[pos++];
  if (x > 0x07) return -1;
  next = pos;
  return v + x * 2 ** 28;
}

/** Does `msg` split cleanly into fields of known wire types (varint, 64-bit, bytes, 32-bit)? */
function walks(msg: Uint8Array): boolean {
  let pos = 0;
  const end = msg.length;
  while (pos < end) {
    const tag = varint(msg, pos, end);
    if (tag < 8) return false; // field 0, or cut short
    pos = next;
    switch (tag & 7) {
      case 0: {
        // a varint of up to 10 bytes (uint64 fields)
        let n = 0;
        while (pos < end && msg[pos] >= 0x80 && n < 9) (pos++, n++);
        if (pos >= end || msg[pos] >= 0x80) return false;
        pos++;
        break;
      }
      case 1:
        pos += 8;
        break;
      case 2: {
        const len = varint(msg, pos, end);
        if (len < 0) return false;
        pos = next + len;
        break;
      }
      case 5:
        pos += 4;
        break;
      default:
        return false; // groups (3, 4) and wire types that do not exist
    }
    if (pos > end) return false;
  }
  return true;
}

/**
 * AgentMessage { global_rank = 1, epoch_seen = 2, wave_head = 7 (raw WaveHeadRequest bytes) }, in one
 * buffer with `room` bytes left after it (a MAC trailer: BusToken.sealInPlace), so the head's
 * columns are copied once on their way to the coordinator.
 */
export function agentWaveHead(globalRank: number, epochSeen: number, waveHead: Uint8Array, room = 0): Buffer {
  const w = protobuf.Writer.create();
  if (globalRank > 0) w.uint32(0x08).uint32(globalRank);
  if (epochSeen > 0) w.uint32(0x10).uint64(epochSeen);
  w.uint32(0x3a).uint32(waveHead.length);
  const header = w.finish();
  const out = Buffer.allocUnsafe(header.length + waveHead.length + room);
  out.set(header, 0);
  out.set(waveHead, header.length);
  return out;
}
