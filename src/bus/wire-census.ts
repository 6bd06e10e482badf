// A frame from the network is counted before protobufjs decodes it: protobufjs makes one object per
// element of a repeated message field and one array slot per packed value, so 24 MB of empty
// RequestStep elements (2 bytes each) would become 12 million objects (issue 28: the coordinator's
// heap hit its limit). This walk reads the bytes exactly as protobufjs's generated decoder does
// (the same Reader calls, field by field of the schema, so its counts are the decode's), makes no
// message objects, and refuses a frame whose repeated fields hold more than the limits below.
import * as protobuf from 'protobufjs';

/**
 * What one frame may hold in all, over every repeated field at every depth. Messages: elements of
 * repeated (and occurrences of nested) message fields, such as telemetry rows, slot bindings, block
 * tables, file entries, dump jobs. Values: elements of repeated scalar and string fields, such as
 * token ids and block ids. The largest real frames (a wave head of a full batch, a listing of a
 * rank's dumps) stay far below both; the bound keeps one frame's decode to tens of MB of heap.
 */
export const MAX_FRAME_MESSAGES = 1 << 16;
export const MAX_FRAME_VALUES = 1 << 21;
/**
 * Entries one file listing carries: a frame's messages, less the few around them (the reply, a
 * relay's wrappers). An agent refuses a longer listing with an error instead of sending a frame
 * every receiver would drop; `wavebus aggregate` then lists less at a time (`--prefix`).
 */
export const MAX_LISTING_FILES = MAX_FRAME_MESSAGES - 16;
export interface WireLimits {
  messages: number;
  values: number;
}

export const WIRE_LIMITS: WireLimits = { messages: MAX_FRAME_MESSAGES, values: MAX_FRAME_VALUES };

/** Why a frame was refused: a limit ('over_limit') or bytes that are not this message ('truncated', 'undecodable'). */
export interface CensusRefusal {
  reason: 'over_limit' | 'truncated' | 'undecodable';
  detail: string;
}

interface FieldPlan {
  name: string;
  repeated: boolean;
  /** A Reader method for a scalar (enums read as int32), or undefined for a message. */
  read?: string;
  /** Scalars protobufjs also takes packed (every scalar but string and bytes). */
  packable: boolean;
  sub?: TypePlan;
}

interface TypePlan {
  name: string;
  fields: Map<number, FieldPlan>;
}

const plans = new Map<protobuf.Type, TypePlan>();

function planOf(type: protobuf.Type): TypePlan {
  let plan = plans.get(type);
  if (plan) return plan;
  plan = { name: type.name, fields: new Map() };
  plans.set(type, plan); // before the fields: a message that (indirectly) holds itself ends here
  for (const f of type.fieldsArray) {
    f.resolve();
    if (f.map) throw new Error(`wire-census: map field ${type.name}.${f.name} is not supported`);
    const rt = f.resolvedType;
    const isMessage = rt instanceof protobuf.Type;
    const read = isMessage ? undefined : rt instanceof protobuf.Enum ? 'int32' : f.type;
    plan.fields.set(f.id, { name: f.name, repeated: f.repeated, read, packable: read !== undefined && read !== 'string' && read !== 'bytes', sub: isMessage ? planOf(rt) : undefined });
  }
  return plan;
}

type ReaderAny = protobuf.Reader & Record<string, () => unknown>;

class Walk {
  messages = 0;
  values = 0;
  constructor(
    private readonly r: ReaderAny,
    private readonly limits: WireLimits,
  ) {}

  count(what: 'messages' | 'values', plan: TypePlan, f: FieldPlan): void {
    if (++this[what] > this.limits[what]) {
      throw refusal('over_limit', `${plan.name}.${f.name}: more than ${this.limits[what]} ${what === 'messages' ? 'repeated messages' : 'repeated values'} in one frame (the limit of wire-census.ts)`);
    }
  }

  /** One scalar as the decoder reads it (strings and bytes skipped, not decoded: the same bytes move). */
  scalar(read: string): void {
    const r = this.r;
    if (read === 'string' && r instanceof protobuf.BufferReader) {
      // Node's BufferReader cuts a string that runs past the end at the end, without an error.
      const len = r.uint32();
      r.pos = Math.min(r.pos + len, r.len);
    } else if (read === 'string' || read === 'bytes') r.skip(r.uint32());
    else r[read]();
  }

  /** protobufjs's decoder.js, counting instead of building: `l` is the length of a nested message. */
  message(plan: TypePlan, l: number | undefined, depth: number): void {
    const r = this.r;
    if (depth > protobuf.util.recursionLimit) throw new Error('maximum nesting depth exceeded');
    let c: number;
    let outer = 0;
    if (l === undefined) c = r.len;
    else {
      c = r.pos + l;
      if (c > r.len) throw new RangeError('index out of range');
      outer = r.len;
      r.len = c;
    }
    while (r.pos < c) {
      const t = r.uint32();
      const f = plan.fields.get(t >>> 3);
      if (!f) {
        r.skipType(t & 7, depth);
        continue;
      }
      if (f.repeated && f.packable && (t & 7) === 2) {
        const c2 = r.uint32() + r.pos;
        if (c2 > r.len) throw new RangeError('index out of range');
        r.len = c2;
        while (r.pos < c2) {
          this.scalar(f.read!);
          this.count('values', plan, f);
        }
        if (r.pos !== c2) throw new RangeError('index out of range');
        r.len = c;
      } else if (f.sub) {
        this.count('messages', plan, f);
        this.message(f.sub, r.uint32(), depth + 1);
      } else {
        this.scalar(f.read!);
        if (f.repeated) this.count('values', plan, f);
      }
    }
    if (l !== undefined) {
      if (r.pos !== c) throw new RangeError('index out of range');
      r.len = outer;
    }
  }
}

class Refusal extends Error {
  constructor(readonly refusal: CensusRefusal) {
    super(refusal.detail);
  }
}

function refusal(reason: CensusRefusal['reason'], detail: string): Refusal {
  return new Refusal({ reason, detail });
}

/**
 * Whether `bytes`, as a `type`, stays within `limits` (undefined) or why not: over a limit, or
 * bytes protobufjs would refuse too (classified as frames.ts does: 'truncated' for a field cut
 * short, 'undecodable' for the rest). O(bytes); call it before protobufjs's decode of anything
 * from another process.
 */
export function wireCensus(type: protobuf.Type, bytes: Uint8Array, limits: WireLimits = WIRE_LIMITS): CensusRefusal | undefined {
  const w = new Walk(protobuf.Reader.create(bytes) as ReaderAny, limits);
  try {
    w.message(planOf(type), undefined, 0);
    return undefined;
  } catch (e) {
    if (e instanceof Refusal) return e.refusal;
    const truncated = e instanceof RangeError || /index out of range/.test(String(e));
    return { reason: truncated ? 'truncated' : 'undecodable', detail: String(e) };
  }
}
