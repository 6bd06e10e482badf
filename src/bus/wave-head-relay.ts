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

/** AgentMessage { global_rank = 1, epoch_seen = 2, wave_head = 7 (raw WaveHeadRequest bytes) }. */
export function agentWaveHead(globalRank: number, epochSeen: number, waveHead: Uint8Array): Buffer {
  const w = protobuf.Writer.create();
  if (globalRank > 0) w.uint32(0x08).uint32(globalRank);
  if (epochSeen > 0) w.uint32(0x10).uint64(epochSeen);
  w.uint32(0x3a).bytes(waveHead);
  const u8 = w.finish();
  return Buffer.from(u8.buffer, u8.byteOffset, u8.byteLength); // a view, as proto.ts gives
}
