// Step telemetry in columns (proto TelemetryColumns): what TP0 of the last PP stage sends with
// each wave head. With ~1000 running requests the row form (one RequestStep message per request,
// its id and whole block table every step) costs the engine an encode and the coordinator a
// decode of ~80 KB and ~1000 objects per step. In columns, a step is a few packed arrays the
// coordinator reads as typed arrays; a request's id travels once, when it takes a slot, and its
// block table only when it changes.
import * as os from 'os';
import { ProtocolError } from '../errors';
import type { RequestStep, SlotBinding, SlotBlocks, TelemetryColumns } from '../messages';

export const FLAG_FINISHED = 1;
export const FLAG_FREED = 2;
/** Slots are small integers handed out from 0; more than this many live requests is garbage. */
export const MAX_SLOTS = 1 << 20;

// The columns are little-endian on the wire and typed arrays use the host's order.
const LITTLE_ENDIAN = os.endianness() === 'LE';

function checkHost(): void {
  if (!LITTLE_ENDIAN) throw new ProtocolError('telemetry columns are little-endian; this host is big-endian (not supported)');
}

const EMPTY_U32 = new Uint32Array(0);
const EMPTY_F32 = new Float32Array(0);

/**
 * The engine side: turns each step's request list (rows) into columns, keeping each request's
 * slot from step to step and its last block table, so only what changed is sent. One per client.
 */
/**
 * What is wrong with one request row of a step's telemetry (undefined: nothing): a reqId that is
 * not a string, or per-token columns whose lengths differ from the token ids'. The coordinator
 * checks every wave head's rows with it when it decodes them (a bad one is a counted drop).
 */
export function requestStepError(r: Pick<RequestStep, 'reqId' | 'newTokenIds' | 'newTokenLogprobs' | 'newTokenRanks'>, i: number, where = 'telemetry', withTokens = true): string | undefined {
  if (typeof r.reqId !== 'string') return `${where}.requests[${i}].reqId must be a string`;
  const n = r.newTokenIds?.length ?? 0;
  if (r.reqId === '' || !withTokens || n === 0) return undefined;
  const lp = r.newTokenLogprobs?.length ?? 0;
  const rk = r.newTokenRanks?.length ?? 0;
  if (lp !== 0 && lp !== n) return `${where}.requests[${i}]: ${lp} newTokenLogprobs for ${n} newTokenIds`;
  if (rk !== 0 && rk !== n) return `${where}.requests[${i}]: ${rk} newTokenRanks for ${n} newTokenIds`;
  return undefined;
}

export class TelemetryColumnizer {
  private readonly slots = new Map<string, number>();
  /** The request holding each slot. */
  private readonly holder: (string | undefined)[] = [];
  private readonly freeSlots: number[] = [];
  private nextSlot = 0;
  /** Last block table sent per slot. */
  private readonly tables: (readonly number[] | undefined)[] = [];
  /** Generation in which each slot's binding was last sent; resend() starts a new one. */
  private readonly sentIn: number[] = [];
  private generation = 0;

  /**
   * Send every live request's binding and block table again with its next step: the receiver may
   * have lost them (a restarted coordinator, a dropped message).
   */
  resend(): void {
    this.generation++;
  }

  /** Requests holding a slot now. */
  get live(): number {
    return this.slots.size;
  }

  /**
   * The columns of one step. `tokens: false` leaves the per-token columns out (no detector reads
   * them; a manual dump needs only requests, blocks and finish/free). Rows with an empty reqId
   * carry nothing attributable and are skipped. A freed request's slot is free from the next step.
   */
  columns(requests: readonly RequestStep[], opts: { tokens?: boolean; where?: string } = {}): TelemetryColumns {
    const where = opts.where ?? 'telemetry';
    const withTokens = opts.tokens ?? true;
    let rows = 0;
    let tokens = 0;
    let anyLogprob = false;
    let anyRank = false;
    let anySpec = false;
    let anyCount = false;
    for (let i = 0; i < requests.length; i++) {
      const r = requests[i];
      const bad = requestStepError(r, i, where, withTokens);
      if (bad) throw new ProtocolError(bad);
      if (r.reqId === '') continue;
      rows++;
      const n = r.newTokenIds?.length ?? 0;
      tokens += n;
      if (withTokens && n > 0) {
        const lp = r.newTokenLogprobs?.length ?? 0;
        const rk = r.newTokenRanks?.length ?? 0;
        if (lp > 0) anyLogprob = true;
        if (rk > 0) anyRank = true;
      }
      if (r.draftLen > 0) anySpec = true;
      if (r.numOutputTokens > 0) anyCount = true;
    }
    if (!withTokens) tokens = 0;
    const slot = new Uint32Array(rows);
    const flags = new Uint8Array(rows);
    const tokenCount = withTokens && tokens > 0 ? new Uint32Array(rows) : EMPTY_U32;
    const tokenIds = tokens > 0 ? new Uint32Array(tokens) : EMPTY_U32;
    const tokenLogprobs = anyLogprob ? new Float32Array(tokens) : EMPTY_F32;
    const tokenRanks = anyRank ? new Uint32Array(tokens) : EMPTY_U32;
    const draftLen = anySpec ? new Uint32Array(rows) : EMPTY_U32;
    const accepted = anySpec ? new Uint32Array(rows) : EMPTY_U32;
    const numOutputTokens = anyCount ? new Uint32Array(rows) : EMPTY_U32;
    const bind: SlotBinding[] = [];
    const blocks: SlotBlocks[] = [];
    const released: number[] = [];
    let row = 0;
    let t = 0;
    for (let i = 0; i < requests.length; i++) {
      const r = requests[i];
      if (r.reqId === '') continue;
      let s = this.slots.get(r.reqId);
      if (s === undefined) {
        s = this.freeSlots.length > 0 ? this.freeSlots.pop()! : this.nextSlot++;
        this.slots.set(r.reqId, s);
        this.holder[s] = r.reqId;
        this.tables[s] = undefined;
        this.sentIn[s] = this.generation;
        const b: SlotBinding = { slot: s, reqId: r.reqId, promptLen: r.promptLen >>> 0 };
        if (r.promptTokenIds && r.promptTokenIds.length > 0) b.promptTokenIds = uint32List(r.promptTokenIds, `${where}.requests[${i}].promptTokenIds`);
        bind.push(b);
      } else if (this.sentIn[s] !== this.generation) {
        // a re-send (resend()): the id again, not the prompt
        this.sentIn[s] = this.generation;
        this.tables[s] = undefined;
        bind.push({ slot: s, reqId: r.reqId, promptLen: r.promptLen >>> 0 });
      }
      slot[row] = s;
      const ids = r.newTokenIds ?? [];
      if (tokenCount.length > 0) {
        tokenCount[row] = ids.length;
        const lps = r.newTokenLogprobs ?? [];
        const rks = r.newTokenRanks ?? [];
        for (let k = 0; k < ids.length; k++, t++) {
          tokenIds[t] = ids[k];
          if (anyLogprob) tokenLogprobs[t] = lps.length > 0 ? lps[k] : NaN;
          if (anyRank && rks.length > 0) tokenRanks[t] = rks[k];
        }
      }
      if (anySpec) {
        draftLen[row] = r.draftLen;
        accepted[row] = r.accepted;
      }
      if (anyCount) numOutputTokens[row] = r.numOutputTokens;
      flags[row] = (r.finished ? FLAG_FINISHED : 0) | (r.freed ? FLAG_FREED : 0);
      const table = r.blockIds ?? [];
      if (table.length > 0 && !sameTable(this.tables[s], table)) {
        this.tables[s] = uint32List(table, `${where}.requests[${i}].blockIds`);
        blocks.push({ slot: s, blockIds: this.tables[s] as number[] });
      }
      if (r.freed) released.push(s);
      row++;
    }
    for (const s of released) this.release(s);
    return { rows, slot, tokenCount, tokenIds, tokenLogprobs, tokenRanks, draftLen, accepted, flags, numOutputTokens, bind, blocks };
  }

  private release(s: number): void {
    const id = this.holder[s];
    if (id === undefined) return; // freed twice in one step
    this.slots.delete(id);
    this.holder[s] = undefined;
    this.tables[s] = undefined;
    this.freeSlots.push(s);
  }
}

function sameTable(a: readonly number[] | undefined, b: readonly number[]): boolean {
  if (a === undefined || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

const asBytes = (a: ArrayBufferView): Buffer => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

/** The proto TelemetryColumns object (camelCase, bytes as Buffers) for protobufjs. */
export function columnsToWire(c: TelemetryColumns): Record<string, unknown> {
  checkHost();
  return {
    rows: c.rows,
    slot: asBytes(c.slot),
    tokenCount: asBytes(c.tokenCount),
    tokenIds: asBytes(c.tokenIds),
    tokenLogprobs: asBytes(c.tokenLogprobs),
    tokenRanks: asBytes(c.tokenRanks),
    draftLen: asBytes(c.draftLen),
    accepted: asBytes(c.accepted),
    flags: asBytes(c.flags),
    numOutputTokens: asBytes(c.numOutputTokens),
    bind: c.bind,
    blocks: c.blocks,
  };
}

/** A copy of `values`, each checked to be a uint32 (these go on the wire as given). */
export function uint32List(values: readonly number[], field: string): number[] {
  const out = new Array<number>(values.length);
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new ProtocolError(`${field}[${i}] = ${String(v)} is not a 32-bit unsigned integer`);
    out[i] = v;
  }
  return out;
}

type Ctor<T> = { new (buf: ArrayBuffer, off: number, len: number): T; BYTES_PER_ELEMENT: number };

const COLUMNS: ReadonlyArray<[key: string, field: string, size: number]> = [
  ['slot', 'slot', 4],
  ['tokenCount', 'token_count', 4],
  ['tokenIds', 'token_ids', 4],
  ['tokenLogprobs', 'token_logprobs', 4],
  ['tokenRanks', 'token_ranks', 4],
  ['draftLen', 'draft_len', 4],
  ['accepted', 'accepted', 4],
  ['flags', 'flags', 1],
  ['numOutputTokens', 'num_output_tokens', 4],
];

/** The packed (bytes) fields of TelemetryColumns, by their TypeScript names. */
export const COLUMN_KEYS: readonly string[] = COLUMNS.map((c) => c[0]);

/**
 * Memory for the columns whose bytes sit misaligned in a frame, reused from message to message:
 * the coordinator consumes each step's telemetry before it decodes the next message, and a fresh
 * buffer per step (tens of KB of external memory each) would make V8 run full GCs.
 */
export class ColumnScratch {
  private buf = new ArrayBuffer(0);

  /** A buffer of at least `bytes`; what it held before is overwritten by the caller. */
  reserve(bytes: number): ArrayBuffer {
    if (this.buf.byteLength < bytes) this.buf = new ArrayBuffer(Math.max(bytes, 2 * this.buf.byteLength));
    return this.buf;
  }
}

/**
 * Typed arrays over the wire bytes: a view where the bytes sit aligned in the frame, else a
 * copy into one buffer shared by all the misaligned columns (from `scratch` when given).
 */
class ColumnReader {
  private readonly bytes: Record<string, Uint8Array> = {};
  private readonly scratch: ArrayBuffer | null;
  private at = 0;

  constructor(w: Record<string, any>, scratch?: ColumnScratch) {
    let need = 0;
    for (const [key, field, size] of COLUMNS) {
      const b = w[key];
      if (b !== undefined && b !== null && !(b instanceof Uint8Array)) throw new ProtocolError(`telemetry.columns.${field} is not bytes`);
      const buf = b ?? new Uint8Array(0);
      if (buf.byteLength % size !== 0) throw new ProtocolError(`telemetry.columns.${field}: ${buf.byteLength} bytes is not a whole number of ${size}-byte values`);
      this.bytes[key] = buf;
      if (buf.byteOffset % size !== 0) need += (buf.byteLength + 7) & ~7;
    }
    this.scratch = need === 0 ? null : scratch ? scratch.reserve(need) : new ArrayBuffer(need);
  }

  /** Column `key` as a C, whose length must be `n` or `alt`. */
  take<T>(C: Ctor<T>, key: string, field: string, n: number, alt = n): T {
    const buf = this.bytes[key];
    const size = C.BYTES_PER_ELEMENT;
    const len = buf.byteLength / size;
    if (len !== n && len !== alt) throw new ProtocolError(`telemetry.columns.${field}: ${len} values, expected ${alt === n ? n : `${alt} or ${n}`}`);
    if (buf.byteOffset % size === 0) return new C(buf.buffer as ArrayBuffer, buf.byteOffset, len);
    const at = this.at;
    new Uint8Array(this.scratch!, at, buf.byteLength).set(buf);
    this.at += (buf.byteLength + 7) & ~7;
    return new C(this.scratch!, at, len);
  }
}

/**
 * Typed columns from a decoded proto TelemetryColumns, checked for consistency (lengths, slots in
 * range, token counts adding up). Throws ProtocolError naming the field: the caller drops the
 * message as garbage. With `scratch`, the result is valid until the next call with the same one.
 */
export function columnsFromWire(w: Record<string, any>, scratch?: ColumnScratch): TelemetryColumns {
  checkHost();
  const rows = w.rows;
  if (!Number.isInteger(rows) || rows < 0 || rows > MAX_SLOTS) throw new ProtocolError(`telemetry.columns.rows ${String(rows)} is out of range`);
  const r = new ColumnReader(w, scratch);
  const slot = r.take(Uint32Array, 'slot', 'slot', rows);
  for (let i = 0; i < rows; i++) if (slot[i] >= MAX_SLOTS) throw new ProtocolError(`telemetry.columns.slot[${i}] = ${slot[i]} is out of range (< ${MAX_SLOTS})`);
  const tokenCount = r.take(Uint32Array, 'tokenCount', 'token_count', rows, 0);
  let tokens = 0;
  for (let i = 0; i < tokenCount.length; i++) tokens += tokenCount[i];
  const tokenIds = r.take(Uint32Array, 'tokenIds', 'token_ids', tokens);
  const tokenLogprobs = r.take(Float32Array, 'tokenLogprobs', 'token_logprobs', tokens, 0);
  const tokenRanks = r.take(Uint32Array, 'tokenRanks', 'token_ranks', tokens, 0);
  const draftLen = r.take(Uint32Array, 'draftLen', 'draft_len', rows, 0);
  const accepted = r.take(Uint32Array, 'accepted', 'accepted', draftLen.length);
  const flags = r.take(Uint8Array, 'flags', 'flags', rows);
  const numOutputTokens = r.take(Uint32Array, 'numOutputTokens', 'num_output_tokens', rows, 0);
  const bind: SlotBinding[] = [];
  for (const [i, b] of ((w.bind ?? []) as Record<string, any>[]).entries()) {
    if (!(b.slot < MAX_SLOTS)) throw new ProtocolError(`telemetry.columns.bind[${i}].slot ${String(b.slot)} is out of range`);
    if (typeof b.reqId !== 'string' || b.reqId === '') throw new ProtocolError(`telemetry.columns.bind[${i}].req_id is empty`);
    const ids = b.promptTokenIds ?? [];
    bind.push(ids.length > 0 ? { slot: b.slot, reqId: b.reqId, promptLen: b.promptLen ?? 0, promptTokenIds: ids } : { slot: b.slot, reqId: b.reqId, promptLen: b.promptLen ?? 0 });
  }
  const blocks: SlotBlocks[] = [];
  for (const [i, b] of ((w.blocks ?? []) as Record<string, any>[]).entries()) {
    if (!(b.slot < MAX_SLOTS)) throw new ProtocolError(`telemetry.columns.blocks[${i}].slot ${String(b.slot)} is out of range`);
    blocks.push({ slot: b.slot, blockIds: b.blockIds ?? [] });
  }
  return { rows, slot, tokenCount, tokenIds, tokenLogprobs, tokenRanks, draftLen, accepted, flags, numOutputTokens, bind, blocks };
}
