// A frame from the network is counted before protobufjs decodes it: protobufjs makes one object per
// element of a repeated message field and one array slot per packed value, so 24 MB of empty
// RequestStep elements (2 bytes each) would become 12 million objects (issue 28: the coordinator's
// heap hit its limit). This walk reads the wire format against the schema, allocates nothing, and
// refuses a frame whose repeated fields hold more than the limits below, or whose fields do not
// have the wire type the schema gives them (protobufjs would read those bytes as something else
// than this walk did, so the counts would not hold for its decode).
import type * as protobuf from 'protobufjs';

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
/** Nesting deeper than any message of the schema goes. */
const MAX_DEPTH = 16;

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

type Kind = 'message' | 'varint' | 'fixed32' | 'fixed64' | 'len';

interface FieldPlan {
  name: string;
  kind: Kind;
  repeated: boolean;
  sub?: TypePlan;
}

interface TypePlan {
  name: string;
  fields: Map<number, FieldPlan>;
}

const VARINT_TYPES = new Set(['int32', 'uint32', 'sint32', 'int64', 'uint64', 'sint64', 'bool']);
const FIXED32_TYPES = new Set(['fixed32', 'sfixed32', 'float']);
const FIXED64_TYPES = new Set(['fixed64', 'sfixed64', 'double']);
/** The wire type each kind arrives in when not packed. */
const WIRE: Record<Kind, number> = { varint: 0, fixed64: 1, len: 2, message: 2, fixed32: 5 };

const plans = new Map<protobuf.Type, TypePlan>();

function planOf(type: protobuf.Type): TypePlan {
  let plan = plans.get(type);
  if (plan) return plan;
  plan = { name: type.name, fields: new Map() };
  plans.set(type, plan); // before the fields: a message that (indirectly) holds itself ends here
  for (const f of type.fieldsArray) {
    f.resolve();
    const rt = f.resolvedType;
    let kind: Kind;
    if (rt && 'fieldsArray' in rt) kind = 'message';
    else if (rt) kind = 'varint'; // an enum
    else if (VARINT_TYPES.has(f.type)) kind = 'varint';
    else if (FIXED32_TYPES.has(f.type)) kind = 'fixed32';
    else if (FIXED64_TYPES.has(f.type)) kind = 'fixed64';
    else kind = 'len'; // string, bytes
    plan.fields.set(f.id, { name: f.name, kind, repeated: f.repeated, sub: kind === 'message' ? planOf(rt as protobuf.Type) : undefined });
  }
  return plan;
}

class Walk {
  messages = 0;
  values = 0;
  pos = 0;
  constructor(
    private readonly b: Uint8Array,
    private readonly limits: WireLimits,
  ) {}

  /** A varint of up to 10 bytes at pos (moves pos); its value exactly when below 2^53. */
  varint(end: number): number {
    let v = 0;
    let mul = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= end) throw refusal('truncated', `a varint cut short at byte ${this.pos}`);
      const x = this.b[this.pos++];
      v += (x & 0x7f) * mul;
      if (x < 0x80) return v;
      mul *= 128;
    }
    throw refusal('undecodable', `a varint longer than 10 bytes ending at byte ${this.pos}`);
  }

  skip(n: number, end: number): void {
    if (n > end - this.pos) throw refusal('truncated', `a field of ${n} bytes at byte ${this.pos} runs past the end (${end})`);
    this.pos += n;
  }

  count(what: 'messages' | 'values', n: number, plan: TypePlan, f: FieldPlan): void {
    this[what] += n;
    if (this[what] > this.limits[what]) {
      throw refusal('over_limit', `${plan.name}.${f.name}: more than ${this.limits[what]} ${what === 'messages' ? 'repeated messages' : 'repeated values'} in one frame (the limit of wire-census.ts)`);
    }
  }

  message(plan: TypePlan, end: number, depth: number): void {
    if (depth > MAX_DEPTH) throw refusal('undecodable', `messages nested more than ${MAX_DEPTH} deep`);
    while (this.pos < end) {
      const at = this.pos;
      const tag = this.varint(end);
      const id = Math.floor(tag / 8);
      const wt = tag % 8;
      if (id === 0) throw refusal('undecodable', `field number 0 at byte ${at}`);
      const f = plan.fields.get(id);
      if (f && wt !== WIRE[f.kind] && !(wt === 2 && f.repeated && f.kind !== 'len')) {
        throw refusal('undecodable', `${plan.name}.${f.name}: wire type ${wt} at byte ${at}, expected ${WIRE[f.kind]}`);
      }
      switch (wt) {
        case 0:
          this.varint(end);
          if (f?.repeated) this.count('values', 1, plan, f);
          break;
        case 1:
          this.skip(8, end);
          if (f?.repeated) this.count('values', 1, plan, f);
          break;
        case 5:
          this.skip(4, end);
          if (f?.repeated) this.count('values', 1, plan, f);
          break;
        case 2: {
          const len = this.varint(end);
          const start = this.pos;
          this.skip(len, end);
          if (!f) break;
          if (f.kind === 'message') {
            this.count('messages', 1, plan, f);
            this.pos = start;
            this.message(f.sub!, start + len, depth + 1);
          } else if (f.kind === 'len') {
            if (f.repeated) this.count('values', 1, plan, f);
          } else if (f.repeated) {
            // packed: fixed-size values by length, varints by their last bytes (high bit clear)
            let n = 0;
            if (f.kind === 'fixed32') n = Math.ceil(len / 4);
            else if (f.kind === 'fixed64') n = Math.ceil(len / 8);
            else for (let i = start; i < start + len; i++) if (this.b[i] < 0x80) n++;
            this.count('values', n, plan, f);
          }
          break;
        }
        default:
          throw refusal('undecodable', `wire type ${wt} at byte ${at}`);
      }
    }
    if (this.pos !== end) throw refusal('truncated', `a message runs past its end (${end})`);
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
 * Whether `bytes`, as a `type`, stays within `limits` (undefined) or why not. O(bytes), allocates
 * nothing per field; call it before protobufjs's decode of anything from another process.
 */
export function wireCensus(type: protobuf.Type, bytes: Uint8Array, limits: WireLimits = WIRE_LIMITS): CensusRefusal | undefined {
  const w = new Walk(bytes, limits);
  try {
    w.message(planOf(type), bytes.length, 0);
    return undefined;
  } catch (e) {
    if (e instanceof Refusal) return e.refusal;
    throw e;
  }
}
