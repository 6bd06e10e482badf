// The agent forwards its client's one-way wave head to the coordinator once per engine step. The
// client's ClientRequest.wave_head and the AgentMessage.wave_head are the same message
// (WaveHeadRequest), so its bytes are copied as they came instead of being turned into objects
// and encoded again: on this path, each decode/encode pair cost the agent ~50 µs per wave.

/**
 * The raw bytes of field 4 (wave_head) of a ClientRequest that protobufjs has already decoded,
 * or undefined when they cannot be taken as they are (the field repeats, or the frame has a
 * wire type this walk does not skip): the caller then re-encodes the decoded message.
 */
export function waveHeadBytes(frame: Uint8Array): Uint8Array | undefined {
  let pos = 0;
  let found: Uint8Array | undefined;
  while (pos < frame.length) {
    const [tag, p1] = readVarint(frame, pos);
    if (p1 < 0) return undefined;
    pos = p1;
    const field = Math.floor(tag / 8);
    switch (tag % 8) {
      case 0: {
        const [, p2] = readVarint(frame, pos);
        if (p2 < 0) return undefined;
        pos = p2;
        break;
      }
      case 1:
        pos += 8;
        break;
      case 5:
        pos += 4;
        break;
      case 2: {
        const [len, p2] = readVarint(frame, pos);
        if (p2 < 0 || p2 + len > frame.length) return undefined;
        if (field === 4) {
          if (found) return undefined; // repeated: protobuf would merge them
          found = frame.subarray(p2, p2 + len);
        }
        pos = p2 + len;
        break;
      }
      default:
        return undefined;
    }
  }
  return pos === frame.length ? found : undefined;
}

/** AgentMessage { global_rank = 1, epoch_seen = 2, wave_head = 7 (raw WaveHeadRequest bytes) }. */
export function agentWaveHead(globalRank: number, epochSeen: number, waveHead: Uint8Array): Buffer {
  const head: number[] = [];
  if (globalRank > 0) {
    head.push(0x08);
    writeVarint(head, globalRank);
  }
  if (epochSeen > 0) {
    head.push(0x10);
    writeVarint(head, epochSeen);
  }
  head.push(0x3a);
  writeVarint(head, waveHead.length);
  const out = Buffer.allocUnsafe(head.length + waveHead.length);
  for (let i = 0; i < head.length; i++) out[i] = head[i];
  out.set(waveHead, head.length);
  return out;
}

/** [value, next position]; position -1 when the varint runs past the end or past 64 bits. */
function readVarint(b: Uint8Array, pos: number): [number, number] {
  let value = 0;
  let scale = 1;
  for (let i = 0; i < 10; i++) {
    if (pos >= b.length) return [0, -1];
    const byte = b[pos++];
    value += (byte & 0x7f) * scale;
    if (byte < 0x80) return [value, pos];
    scale *= 128;
  }
  return [0, -1];
}

/** Unsigned varint of a non-negative safe integer (uint64 fields hold epochs in ms). */
function writeVarint(out: number[], v: number): void {
  while (v >= 0x80) {
    out.push((v % 0x80) | 0x80);
    v = Math.floor(v / 0x80);
  }
  out.push(v);
}
