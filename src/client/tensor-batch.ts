// The tensor hot path of waveHead in the TypeScript client (docs/typescript-client.md): per step
// the engine passes what it already holds as typed arrays (the rows that sampled, their token ids,
// optionally log-probs, token counts and speculative counts). They go into the telemetry ring with
// one copy per column; the head carries only the sparse events (slot-events.ts), written into the
// slot too, so a step makes no system call and sends no message. Nothing here touches an element:
// values are checked where the agent reads them (src/client/ring-columns.ts), garbage counted there.
// The agent cannot tell these heads from the Python client's (clients/python/wavebus_client/tensor_head.py).
import { BlockTableWatch } from './block-table';
import { ConfigError } from '../errors';
import type { NonFiniteRow } from '../messages';
import { messageType } from '../proto';
import { HeadBytes, nonFiniteBytes } from './head-bytes';
import { ringColumns, RowIndex } from './ring-columns';
import type { ClientFeatures } from './options';
import { SlotEvents } from './slot-events';
import { MAX_SLOTS } from './telemetry';
import { RING_COLUMN, RING_COLUMN_NAMES } from './ring-layout';
import type { RingColumns, TelemetryRingWriter } from './telemetry-ring-writer';
import { nonFiniteRow } from './wave-head';

const WaveHeadRequest = messageType('WaveHeadRequest');

/** A column as the engine holds it: a typed array (one copy into the ring), or a plain array (the small-engine convenience). */
export type Column = Uint32Array | Int32Array | Uint16Array | Int16Array | Uint8Array | Float32Array | Float64Array | readonly number[];

export interface TensorStep {
  /** The batch rows that sampled this step. */
  rows: Column;
  /** Their sampled token ids: one per row, or tokenCounts[i] for row i, row by row. */
  tokenIds?: Column;
  /** The token ids' log-probabilities (same length). */
  logprobs?: Column;
  tokenCounts?: Column;
  /** Speculative decoding, per row: tokens proposed and accepted (with the bonus); both or neither. */
  draftLen?: Column;
  accepted?: Column;
  nonFinite?: NonFiniteRow[];
}

export interface TensorBatchOptions {
  /** Sampled tokens a step holds (default maxRows). */
  maxTokens?: number;
  /** Finish/free events between two heads (default max(64, maxRows / 4)). */
  maxEvents?: number;
  /** Token ids must be below it where the agent reads them (0: not checked). */
  vocab?: number;
}

/** What the batch needs of its client: the gate every head passes, the ring, the queue for messages. */
export interface TensorHost {
  /** The agent's features when this rank sends now; null when not (sending paused); a promise while a hello is due. */
  gate(wave: number): ClientFeatures | null | Promise<ClientFeatures | null>;
  ring(): TelemetryRingWriter | null;
  /** Queue a head (one-way; sent when the engine yields). */
  send(body: Record<string, unknown>): void;
  epoch(): number;
}

const TRUE = Promise.resolve(true);
// The columns' indexes in the step's RingColumns (the layout's order).
const C_ROW = RING_COLUMN.row;
const C_TOKEN_COUNT = RING_COLUMN.token_count;
const C_TOKEN_IDS = RING_COLUMN.token_ids;
const C_LOGPROBS = RING_COLUMN.token_logprobs;
const C_DRAFT = RING_COLUMN.draft_len;
const C_ACCEPTED = RING_COLUMN.accepted;
const C_EVENT_ROW = RING_COLUMN.event_row;
const C_EVENT_FLAGS = RING_COLUMN.event_flags;
const NO_ROWS: unknown[] = [];
const NO_BYTES = new Uint8Array(0);
const FALSE = Promise.resolve(false);

function isColumn(x: unknown): x is Column {
  return Array.isArray(x) || (ArrayBuffer.isView(x) && !(x instanceof DataView) && !(x instanceof BigInt64Array) && !(x instanceof BigUint64Array));
}

function column(x: unknown, name: string): Column {
  if (!isColumn(x)) throw new ConfigError(`waveHead(): ${name} must be a typed array (Uint32Array, Int32Array, Float32Array, ...) or an array of numbers`);
  return x;
}

export function ringSizes(maxRows: number, o: TensorBatchOptions): { rows: number; tokens: number; events: number; vocab: number } {
  const tokens = o.maxTokens ?? maxRows;
  const events = o.maxEvents ?? Math.max(64, Math.floor(maxRows / 4));
  const vocab = o.vocab ?? 0;
  for (const [name, v] of [['maxRows', maxRows], ['maxTokens', tokens], ['maxEvents', events], ['vocab', vocab]] as const) {
    if (!Number.isInteger(v) || v < 0) throw new ConfigError(`tensorBatch(): ${name} must be a non-negative integer, got ${String(v)}`);
  }
  if (maxRows < 1 || maxRows > MAX_SLOTS) throw new ConfigError(`tensorBatch(): maxRows must be in 1..${MAX_SLOTS}, got ${maxRows}`);
  if (tokens > 16 * MAX_SLOTS || events > MAX_SLOTS || vocab > 0xffffffff) throw new ConfigError('tensorBatch(): maxTokens, maxEvents or vocab is too large');
  return { rows: maxRows, tokens, events, vocab };
}

export class TensorBatch extends SlotEvents {
  readonly maxTokens: number;
  readonly maxEvents: number;
  readonly vocab: number;
  readonly stats = { ringHeads: 0, inlineHeads: 0 };
  private epoch = -1;
  private watch: BlockTableWatch | undefined;
  /**
   * Order across the two ways a head travels: the agent relays whole heads from its poll of the
   * ring and message heads as it reads its socket, so a whole head written while a message head is
   * still on its way could overtake it. After a message head, heads go as messages naming their
   * slot until the agent took the last such slot (the ring's consumed word): by then it has read
   * every message before it. Infinity: a message went and no slot was named since; 0: none pending.
   */
  private fence = 0;
  private fenceRing: TelemetryRingWriter | null = null;
  private readonly index = new RowIndex();
  private readonly headBytes = new HeadBytes();
  /** The step's columns for the ring, by layout index: one array, refilled per step. */
  private readonly cols: RingColumns = RING_COLUMN_NAMES.map(() => undefined);
  /** Per column index, the last array that passed column()'s kind check: the engine hands the same arrays step after step, checked once. */
  private readonly checked: unknown[] = RING_COLUMN_NAMES.map(() => undefined);

  constructor(private readonly host: TensorHost, maxRows: number, opts: TensorBatchOptions = {}) {
    const s = ringSizes(maxRows, opts);
    super(s.rows);
    this.maxTokens = s.tokens;
    this.maxEvents = s.events;
    this.vocab = s.vocab;
  }

  /** The hello's fields asking the agent for a ring of this batch's sizes. */
  ringRequest(): Record<string, number> {
    return { ringRows: this.maxRows, ringTokens: this.maxTokens, ringEvents: this.maxEvents, ringVocab: this.vocab };
  }

  /**
   * Marks the head of `wave` with the telemetry of wave - 1, in columns. Like WavebusClient.waveHead:
   * one-way, never waits for the agent; resolves true if the head went (into the ring or queued).
   * With the features known (the usual step) everything happens before this returns.
   */
  waveHead(wave: number, step: TensorStep): Promise<boolean> {
    let r: boolean | Promise<boolean>;
    try {
      r = this.waveHeadNow(wave, step);
    } catch (e) {
      return Promise.reject(e);
    }
    return r === true ? TRUE : r === false ? FALSE : r;
  }

  /**
   * waveHead without a promise when the features are known (the usual step): whether the head
   * went, else the promise waveHead would return (a hello is due). Bad columns throw here.
   */
  waveHeadNow(wave: number, step: TensorStep): boolean | Promise<boolean> {
    const gate = this.host.gate(wave);
    if (gate === null) {
      this.reset();
      return false;
    }
    if (gate instanceof Promise) return this.afterHello(gate, wave, step);
    return this.head(gate, wave, step);
  }

  // The slow paths' closures live in their own methods: a closure in a hot function makes V8 allocate its context on every call.
  private afterHello(gate: Promise<ClientFeatures | null>, wave: number, step: TensorStep): Promise<boolean> {
    return gate.then((f) => (f ? this.head(f, wave, step) : (this.reset(), false)));
  }

  private diffTable(watch: BlockTableWatch): void {
    watch.diff((r) => this.isLive(r), (r, ids) => this.blocks(r, ids));
  }

  /** Sending paused (bus off, agent gone, not the head rank): the events are dropped, frees take effect, and the next head re-sends every binding. */
  reset(): void {
    this.sent();
    this.resendAll();
  }

  /**
   * Register the engine's block table once (`table`: rows x `width` block ids, row-major, written
   * in place; `numBlocks`: the blocks in use per row): each head that is sent passes on the live
   * rows whose blocks changed, or that a request took since, and blocks() is needed no more.
   */
  blockTable(table: Int32Array | Uint32Array, width: number, numBlocks: Int32Array | Uint32Array): void {
    this.watch = new BlockTableWatch(table, width, numBlocks, this.maxRows);
  }

  /** blockTable()'s counts: the tables sent, and the rows skipped as garbage. */
  get blockStats(): { blockRowsSent: number; badBlockRows: number } {
    return this.watch ? { ...this.watch.stats } : { blockRowsSent: 0, badBlockRows: 0 };
  }

  override arrive(row: number, reqId: string, opts: { promptLen?: number; promptTokenIds?: ArrayLike<number> } = {}): void {
    super.arrive(row, reqId, opts);
    this.watch?.invalidate(row);
  }

  /** `x` as column `c` (its kind checked, once per array the engine hands). */
  private col(x: unknown, c: number, name: string): Column {
    if (x !== this.checked[c] || x === undefined) this.checked[c] = column(x, name);
    return x as Column;
  }

  private perRow(x: unknown, c: number, name: string, n: number): Column {
    const a = this.col(x, c, name);
    if (a.length !== n) throw new ConfigError(`waveHead(): ${name} has ${a.length} entries for ${n} rows`);
    return a;
  }

  private head(f: ClientFeatures, wave: number, step: TensorStep): boolean {
    const cols = this.cols;
    for (let c = 0; c < cols.length; c++) cols[c] = undefined;
    const rows = this.col(step.rows, C_ROW, 'rows');
    const n = rows.length;
    cols[C_ROW] = rows;
    let tokens = 0;
    if (f.detectors.length > 0 && step.tokenIds !== undefined) {
      const ids = this.col(step.tokenIds, C_TOKEN_IDS, 'tokenIds');
      tokens = ids.length;
      if (step.tokenCounts !== undefined) cols[C_TOKEN_COUNT] = this.perRow(step.tokenCounts, C_TOKEN_COUNT, 'tokenCounts', n);
      else if (tokens !== n) throw new ConfigError(`waveHead(): ${tokens} tokenIds for ${n} rows; pass tokenCounts when a row sampled more than one`);
      cols[C_TOKEN_IDS] = ids;
      if (step.logprobs !== undefined) {
        const lp = this.col(step.logprobs, C_LOGPROBS, 'logprobs');
        if (lp.length !== tokens) throw new ConfigError(`waveHead(): ${lp.length} logprobs for ${tokens} tokenIds`);
        cols[C_LOGPROBS] = lp;
      }
    }
    if (step.draftLen !== undefined || step.accepted !== undefined) {
      if (step.draftLen === undefined || step.accepted === undefined) throw new ConfigError('waveHead(): draftLen and accepted go together');
      cols[C_DRAFT] = this.perRow(step.draftLen, C_DRAFT, 'draftLen', n);
      cols[C_ACCEPTED] = this.perRow(step.accepted, C_ACCEPTED, 'accepted', n);
    }
    if (this.watch !== undefined) this.diffTable(this.watch);
    // The events: the reused arrays, their first `events` entries (write() copies that many).
    const events = this.eventFlags();
    if (events > 0) {
      cols[C_EVENT_ROW] = this.evRows;
      cols[C_EVENT_FLAGS] = this.evFlags;
    }
    const nonFinite = f.detectors.length > 0 && step.nonFinite && step.nonFinite.length > 0 ? step.nonFinite.map(nonFiniteRow) : NO_ROWS;
    const epoch = this.host.epoch();
    if (epoch !== this.epoch) {
      this.epoch = epoch; // a new coordinator knows no bindings
      this.resendAll();
    }
    // The head's sparse part, joined from the bytes each event was encoded to once (head-bytes.ts).
    const sp = this.sparse();
    const hb = this.headBytes;
    const extraLen = hb.build(wave, wave > 0 ? wave - 1 : 0, sp.binds, sp.nBinds, sp.blocks, sp.nBlocks, nonFinite === NO_ROWS ? NO_BYTES : nonFiniteBytes(nonFinite));
    const ring = this.host.ring();
    if (ring !== this.fenceRing) {
      this.fenceRing = ring; // a fresh ring (a new hello): nothing of the old one is pending in it
      if (this.fence !== Infinity) this.fence = 0;
    }
    if (this.fence > 0 && this.fence !== Infinity && ring && ring.consumed() >= this.fence) this.fence = 0;
    let body: Record<string, any>;
    if (ring && ring.fits(n, tokens, events) && ring.free()) {
      this.stats.ringHeads++;
      if (this.fence === 0 && extraLen <= ring.maxExtra) {
        // The whole head in the ring: no message, no system call; the agent polls for it.
        ring.write(wave, cols, n, tokens, events, hb.buf, extraLen);
        this.sent();
        return true;
      }
      // The sparse part is large, or a message head is pending: a message names the slot.
      body = messageBody(hb.bytes());
      body.ringSeq = this.fence = ring.write(wave, cols, n, tokens, events);
    } else {
      body = messageBody(hb.bytes());
      Object.assign(body.telemetry.columns, this.inline(cols, n, tokens, events));
      this.stats.inlineHeads++;
      this.fence = Infinity;
    }
    this.host.send(body);
    this.sent();
    return true;
  }

  /** No ring (or a step larger than it, or the agent behind): the columns go in the head, built as the agent builds them from a slot. */
  private inline(cols: RingColumns, rows: number, tokens: number, events: number): Record<string, unknown> {
    const bytes = new Map<string, Uint8Array>();
    for (let c = 0; c < cols.length; c++) {
      const a = cols[c];
      if (a === undefined) continue;
      const name = RING_COLUMN_NAMES[c];
      const T = name === 'token_logprobs' ? Float32Array : name === 'event_flags' ? Uint8Array : Uint32Array;
      const n = c === C_EVENT_ROW || c === C_EVENT_FLAGS ? events : a.length; // the event arrays are reused: their first `events`
      const copy = new T(n);
      if (a.length === n) copy.set(a);
      else for (let j = 0; j < n; j++) copy[j] = a[j];
      bytes.set(name, new Uint8Array(copy.buffer));
    }
    const ask = { maxRows: this.maxRows, maxTokens: this.maxTokens, maxEvents: this.maxEvents, maxExtra: 0, vocab: this.vocab };
    // Garbage (a row past maxRows, counts not adding up) leaves the step without columns, as from the ring.
    return ringColumns({ wave: 0, rows, tokens, events, extraLen: 0, columns: bytes }, ask, this.index).columns ?? { rows: 0 };
  }
}

/** A head that goes as a message (rare: no ring, or behind a pending one): its sparse part as the plain object the queue encodes. */
function messageBody(extra: Uint8Array): Record<string, any> {
  // No defaults filled in: the fields the head left out stay out, as when it was built as an object.
  const body = WaveHeadRequest.toObject(WaveHeadRequest.decode(extra), { longs: Number, bytes: Buffer }) as Record<string, any>;
  body.telemetry.columns ??= {};
  return body;
}
