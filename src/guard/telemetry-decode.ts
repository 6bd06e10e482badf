// Fast path for the coordinator's hottest message: the wave-head AgentMessage that carries the
// engine's StepTelemetry (one RequestStep per running request, every step). protobufjs decodes it
// into message instances and toObject() copies them again into plain objects; for 1024 requests
// that is most of the coordinator's CPU per step. This reads the wire bytes once, straight into
// the plain objects decode() + toObject() would give (same fields, same defaults, same numbers).
//
// It accepts only what it fully understands: the known fields with their expected wire types,
// each message field at most once, varints of sane length. Anything else (unknown fields, another
// body, truncation, garbage) returns null and the caller falls back to the generic decoder, which
// keeps its exact semantics and error classification. So the fast path never decides validity.
import type { NonFiniteRow, RequestStep, StepTelemetry } from '../messages';

/** The decoded wave-head AgentMessage, as decode(AgentMessage) returns it. */
export interface WaveHeadAgentMessage {
  globalRank: number;
  epochSeen: number;
  requestId: number;
  waveHead: { wave: number; telemetry: StepTelemetry | null };
  body: 'waveHead';
}

const WAVE_HEAD_FIELD = 7; // AgentMessage.wave_head

/** Wire cursor; `bad` is set instead of throwing (one flag check per field). */
class Cursor {
  pos = 0;
  bad = false;
  constructor(readonly buf: Buffer) {}

  /** uint32 varint, as protobufjs reads it (≤ 5 bytes; a 5th byte contributes its low 4 bits). */
  u32(end: number): number {
    const buf = this.buf;
    let pos = this.pos;
    if (pos >= end) return this.fail();
    let b = buf[pos++];
    let v = b & 127;
    if (b >= 128) {
      if (pos >= end) return this.fail();
      b = buf[pos++];
      v |= (b & 127) << 7;
      if (b >= 128) {
        if (pos >= end) return this.fail();
        b = buf[pos++];
        v |= (b & 127) << 14;
        if (b >= 128) {
          if (pos >= end) return this.fail();
          b = buf[pos++];
          v |= (b & 127) << 21;
          if (b >= 128) {
            if (pos >= end) return this.fail();
            b = buf[pos++];
            if (b >= 128) return this.fail(); // a longer (negative int32) encoding: generic path
            v |= (b & 15) << 28;
          }
        }
      }
    }
    this.pos = pos;
    return v >>> 0;
  }

  /** uint64 varint as a number; values ≥ 2^49 (more than 7 bytes) go to the generic path. */
  u64(end: number): number {
    const buf = this.buf;
    let pos = this.pos;
    let v = 0;
    let scale = 1;
    for (let k = 0; k < 7; k++) {
      if (pos >= end) return this.fail();
      const b = buf[pos++];
      v += (b & 127) * scale;
      if (b < 128) {
        this.pos = pos;
        return v;
      }
      scale *= 128;
    }
    return this.fail();
  }

  /** Length of a length-delimited field; its end must lie within `end`. */
  len(end: number): number {
    const n = this.u32(end);
    if (this.bad || n > end - this.pos) return this.fail();
    return n;
  }

  str(end: number): string {
    const n = this.len(end);
    if (this.bad) return '';
    const s = n === 0 ? '' : this.buf.toString('utf8', this.pos, this.pos + n);
    this.pos += n;
    return s;
  }

  /** Repeated uint32, packed (wire type 2) or one element (wire type 0). */
  u32s(wire: number, end: number, out: number[]): void {
    if (wire === 0) {
      out.push(this.u32(end));
      return;
    }
    if (wire !== 2) {
      this.fail();
      return;
    }
    const n = this.len(end);
    if (this.bad) return;
    const stop = this.pos + n;
    while (this.pos < stop && !this.bad) out.push(this.u32(stop));
  }

  /** Repeated float, packed (wire type 2) or one element (wire type 5). */
  f32s(wire: number, end: number, out: number[]): void {
    if (wire === 5) {
      if (end - this.pos < 4) {
        this.fail();
        return;
      }
      out.push(this.buf.readFloatLE(this.pos));
      this.pos += 4;
      return;
    }
    if (wire !== 2) {
      this.fail();
      return;
    }
    const n = this.len(end);
    if (this.bad) return;
    if (n % 4 !== 0) {
      this.fail();
      return;
    }
    const buf = this.buf;
    for (let p = this.pos, stop = this.pos + n; p < stop; p += 4) out.push(buf.readFloatLE(p));
    this.pos += n;
  }

  fail(): number {
    this.bad = true;
    return 0;
  }
}

function requestStep(c: Cursor, end: number): RequestStep {
  const m: RequestStep = {
    newTokenIds: [],
    newTokenLogprobs: [],
    newTokenRanks: [],
    blockIds: [],
    reqId: '',
    draftLen: 0,
    accepted: 0,
    finished: false,
    freed: false,
    promptLen: 0,
    numOutputTokens: 0,
  };
  while (c.pos < end && !c.bad) {
    const tag = c.u32(end);
    const wire = tag & 7;
    switch (tag >>> 3) {
      case 1:
        if (wire !== 2) c.fail();
        else m.reqId = c.str(end);
        break;
      case 2:
        c.u32s(wire, end, m.newTokenIds);
        break;
      case 3:
        c.f32s(wire, end, m.newTokenLogprobs);
        break;
      case 4:
        c.u32s(wire, end, m.newTokenRanks);
        break;
      case 7:
        c.u32s(wire, end, m.blockIds);
        break;
      default: {
        if (wire !== 0) {
          c.fail();
          break;
        }
        const field = tag >>> 3;
        const v = c.u32(end);
        if (field === 5) m.draftLen = v;
        else if (field === 6) m.accepted = v;
        else if (field === 8) m.finished = v !== 0;
        else if (field === 9) m.freed = v !== 0;
        else if (field === 10) m.promptLen = v;
        else if (field === 11) m.numOutputTokens = v;
        else c.fail();
      }
    }
  }
  return m;
}

function nonFiniteRow(c: Cursor, end: number): NonFiniteRow {
  const m: NonFiniteRow = { row: 0, reqId: '', kind: '' };
  while (c.pos < end && !c.bad) {
    const tag = c.u32(end);
    if (tag === ((1 << 3) | 0)) m.row = c.u32(end);
    else if (tag === ((2 << 3) | 2)) m.reqId = c.str(end);
    else if (tag === ((3 << 3) | 2)) m.kind = c.str(end);
    else c.fail();
  }
  return m;
}

function stepTelemetry(c: Cursor, end: number): StepTelemetry {
  const requests: RequestStep[] = [];
  const nonFinite: NonFiniteRow[] = [];
  let wave = 0;
  while (c.pos < end && !c.bad) {
    const tag = c.u32(end);
    if (tag === ((1 << 3) | 0)) {
      wave = c.u64(end);
    } else if (tag === ((2 << 3) | 2) || tag === ((3 << 3) | 2)) {
      const n = c.len(end);
      if (c.bad) break;
      const stop = c.pos + n;
      if (tag === ((2 << 3) | 2)) requests.push(requestStep(c, stop));
      else nonFinite.push(nonFiniteRow(c, stop));
      if (c.pos !== stop) c.fail();
    } else {
      c.fail();
    }
  }
  return { requests, nonFinite, wave };
}

/**
 * Decode `bytes` as a wave-head AgentMessage, or return null when it is anything else or
 * anything this fast path does not handle (then use the generic decoder).
 */
export function decodeWaveHeadMessage(bytes: Buffer): WaveHeadAgentMessage | null {
  const c = new Cursor(bytes);
  const end = bytes.length;
  let globalRank = 0;
  let epochSeen = 0;
  let requestId = 0;
  let waveHead: WaveHeadAgentMessage['waveHead'] | null = null;
  while (c.pos < end && !c.bad) {
    const tag = c.u32(end);
    if (tag === ((1 << 3) | 0)) globalRank = c.u32(end);
    else if (tag === ((2 << 3) | 0)) epochSeen = c.u64(end);
    else if (tag === ((11 << 3) | 0)) requestId = c.u64(end);
    else if (tag === ((WAVE_HEAD_FIELD << 3) | 2) && waveHead === null) {
      const n = c.len(end);
      if (c.bad) break;
      const stop = c.pos + n;
      let wave = 0;
      let telemetry: StepTelemetry | null = null;
      while (c.pos < stop && !c.bad) {
        const t = c.u32(stop);
        if (t === ((1 << 3) | 0)) wave = c.u64(stop);
        else if (t === ((2 << 3) | 2) && telemetry === null) {
          const tn = c.len(stop);
          if (c.bad) break;
          const tstop = c.pos + tn;
          telemetry = stepTelemetry(c, tstop);
          if (c.pos !== tstop) c.fail();
        } else c.fail();
      }
      if (c.pos !== stop) c.fail();
      waveHead = { wave, telemetry };
    } else c.fail();
  }
  if (c.bad || waveHead === null) return null;
  return { globalRank, epochSeen, requestId, waveHead, body: 'waveHead' };
}
