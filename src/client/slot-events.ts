// The engine's persistent batch as wavebus sees it (the tensor hot path, docs/typescript-client.md):
// each running request keeps a stable row from arrive() to free(); wavebus uses the row as the
// telemetry's slot. Arrivals, block-table changes, finishes and frees are sparse events, paid once
// each, held here until the next wave head carries them. The Python client's slot_batch.py is the
// same state machine: both send the same bindings, tables and flags for the same calls. Each
// binding and table is encoded to its wire bytes once, by the first head that carries it
// (head-bytes.ts), and kept for its re-sends: a head joins bytes and encodes no message. Encoding
// at the head, not at the report, costs nothing while sending is paused (a rank that is not its
// replica's head rank, or the bus off), when every live binding goes again anyway.
import { ConfigError } from '../errors';
import { bindBytes, blocksBytes } from './head-bytes';
import { FLAG_FINISHED, FLAG_FREED } from './telemetry';

/** Live bindings and tables re-sent per head, round-robin: a lost head heals within live / RESEND_PER_STEP steps. */
export const RESEND_PER_STEP = 4;

function checkRow(row: number, maxRows: number, where: string): number {
  if (!Number.isInteger(row) || row < 0 || row >= maxRows) throw new ConfigError(`${where}: row must be an integer in 0..${maxRows - 1}, got ${String(row)}`);
  return row;
}

function u32List(values: ArrayLike<number>, where: string): number[] {
  const out = Array.from(values);
  for (const v of out) if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new ConfigError(`${where} must be integers in 0..2^32-1, got ${String(v)}`);
  return out;
}

function sameTable(a: readonly number[] | undefined, b: readonly number[]): boolean {
  if (a === undefined || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** A row's live request: what its binding re-sends; the prompt's ids until its first binding is encoded (re-sends leave them out). */
interface Held {
  reqId: string;
  promptLen: number;
  ids: number[] | undefined;
}

export class SlotEvents {
  /** The live rows' requests by row, and the rows in the order they arrived (a Map's order, without a Map: no hashing in a step). */
  private readonly held: (Held | undefined)[];
  private readonly liveOrder: RowOrder;
  /** A live row's binding as re-sent (without the prompt's ids), encoded when first carried; by row. */
  private readonly bindB: (Uint8Array | undefined)[];
  /** The live rows' last reported tables by row (bytes encoded when first carried), and their rows in the order first reported since the row's arrival. */
  private readonly tableIds: (number[] | undefined)[];
  private readonly tableB: (Uint8Array | undefined)[];
  private readonly tableOrder: RowOrder;
  /**
   * The rows whose binding or table was reported since the last head, in the order first reported
   * (a Map's order, without a Map: the usual step reads and clears a few entries of arrays made
   * once, no hashing, no table reallocated by a clear).
   */
  private readonly newBind: PendingRows;
  private readonly newBlocks: PendingRows;
  /** sparse()'s lists and answer, reused step to step: the first nBinds / nBlocks entries are this head's (no array length set per step). */
  private readonly out = { binds: [] as Uint8Array[], nBinds: 0, blocks: [] as Uint8Array[], nBlocks: 0 };
  private readonly resendOut = new Uint32Array(RESEND_PER_STEP);
  /**
   * This step's finish/free flags by row (0: none), and the rows flagged in the order first
   * flagged (a row flags once per step: at most maxRows). Typed arrays indexed by row, not a Map:
   * a finish costs two stores, the head reads them without hashing or allocating.
   */
  private readonly flagOf: Uint8Array;
  private flagged = 0;
  private resendEverything = false;
  /** The round-robin of re-sends: the live rows as a cycle began (cycleLen of them), and the next to go. */
  private readonly cycle: Uint32Array;
  private cycleLen = 0;
  private cycleAt = 0;
  /** This step's finish/free events as the ring's columns: the first `flagged` entries, rows in flag order (reused). */
  protected readonly evRows: Uint32Array;
  protected readonly evFlags: Uint8Array;

  constructor(readonly maxRows: number) {
    this.flagOf = new Uint8Array(maxRows);
    this.evRows = new Uint32Array(maxRows);
    this.evFlags = new Uint8Array(maxRows);
    this.cycle = new Uint32Array(maxRows);
    this.held = new Array<Held | undefined>(maxRows).fill(undefined);
    this.bindB = new Array<Uint8Array | undefined>(maxRows).fill(undefined);
    this.tableIds = new Array<number[] | undefined>(maxRows).fill(undefined);
    this.tableB = new Array<Uint8Array | undefined>(maxRows).fill(undefined);
    this.liveOrder = new RowOrder(maxRows);
    this.tableOrder = new RowOrder(maxRows);
    this.newBind = new PendingRows(maxRows);
    this.newBlocks = new PendingRows(maxRows);
  }

  get live(): number {
    return this.liveOrder.size;
  }

  /** Whether `row` holds a request (arrive() and not yet freed by a head). */
  protected isLive(row: number): boolean {
    return this.held[row] !== undefined;
  }

  /** Request `reqId` now holds `row` (until free(row)). */
  arrive(row: number, reqId: string, opts: { promptLen?: number; promptTokenIds?: ArrayLike<number> } = {}): void {
    checkRow(row, this.maxRows, 'arrive()');
    if (typeof reqId !== 'string' || reqId === '') throw new ConfigError(`arrive(): reqId must be a non-empty string, got ${JSON.stringify(reqId)}`);
    const promptLen = opts.promptLen ?? 0;
    if (!Number.isInteger(promptLen) || promptLen < 0 || promptLen > 0xffffffff) throw new ConfigError(`arrive(): promptLen must be an integer in 0..2^32-1, got ${String(promptLen)}`);
    const held = this.held[row];
    if (held) throw new ConfigError(`arrive(): row ${row} still holds request '${held.reqId}'; free(row) it first`);
    // Its free and this arrival would reach the coordinator in one head, the free last.
    if (this.flagOf[row] & FLAG_FREED) throw new ConfigError(`arrive(): row ${row} was freed since the last waveHead; bind it after the next waveHead`);
    const ids = opts.promptTokenIds ? u32List(opts.promptTokenIds, 'arrive(): promptTokenIds') : undefined;
    this.held[row] = { reqId, promptLen, ids: ids !== undefined && ids.length > 0 ? ids : undefined };
    this.liveOrder.add(row);
    this.bindB[row] = undefined;
    this.dropTable(row);
    this.newBind.add(row);
  }

  /** `row`'s whole block table, when it changed (sent with the next head). */
  blocks(row: number, blockIds: ArrayLike<number>): void {
    checkRow(row, this.maxRows, 'blocks()');
    if (this.held[row] === undefined) throw new ConfigError(`blocks(): row ${row} holds no request (arrive() first)`);
    const table = u32List(blockIds, `blocks(): block ids of row ${row}`);
    if (!sameTable(this.tableIds[row], table)) {
      if (this.tableIds[row] === undefined) this.tableOrder.add(row);
      this.tableIds[row] = table;
      this.tableB[row] = undefined;
      this.newBlocks.add(row);
    }
  }

  /** `row`'s request finished in the step the next head reports. */
  finish(row: number): void {
    this.flag(row, 'finish()', FLAG_FINISHED);
  }

  /** `row`'s blocks were given back (ask pendingDump first): its binding ends with the next head. */
  free(row: number): void {
    this.flag(row, 'free()', FLAG_FREED);
  }

  /** finish() of each of `rows`, in order: the step's finished requests in one call (a refused row throws as finish() does, the rows before it flagged). */
  finishRows(rows: ArrayLike<number>): void {
    this.flagRows(rows, 'finishRows()', FLAG_FINISHED);
  }

  /** free() of each of `rows`, in order (as finishRows). */
  freeRows(rows: ArrayLike<number>): void {
    this.flagRows(rows, 'freeRows()', FLAG_FREED);
  }

  private flagRows(rows: ArrayLike<number>, where: string, bit: number): void {
    if (rows === null || typeof rows !== 'object' || typeof rows.length !== 'number') {
      throw new ConfigError(`${where}: rows must be an array or typed array of rows, got ${rows === null ? 'null' : typeof rows}`);
    }
    for (let i = 0; i < rows.length; i++) this.flag(rows[i], where, bit);
  }

  private flag(row: number, where: string, bit: number): void {
    // A live row is an integer in range: the usual call is one array load (a row past the array reads undefined).
    if (this.held[row] === undefined || !Number.isInteger(row)) {
      checkRow(row, this.maxRows, where);
      throw new ConfigError(`${where}: row ${row} holds no request`);
    }
    if (this.flagOf[row] === 0) this.evRows[this.flagged++] = row;
    this.flagOf[row] |= bit;
  }

  /** The next head carries every live binding and table (a new coordinator, a lost head). */
  resendAll(): void {
    this.resendEverything = true;
  }

  /** This step's finish/free events: fills evFlags for the first n entries of evRows; n. */
  protected eventFlags(): number {
    const n = this.flagged;
    for (let i = 0; i < n; i++) this.evFlags[i] = this.flagOf[this.evRows[i]];
    return n;
  }

  /**
   * The head's sparse part as TelemetryColumns entries' bytes: the pending bindings and tables (new
   * ones, a few re-sends, or all after resendAll()). The first nBinds / nBlocks entries of the
   * lists are this head's; valid until the next call.
   */
  protected sparse(): { binds: Uint8Array[]; nBinds: number; blocks: Uint8Array[]; nBlocks: number } {
    const out = this.out;
    const binds = out.binds;
    const blocks = out.blocks;
    let nb = 0;
    let nt = 0;
    const everything = this.resendEverything;
    if (everything) {
      this.resendEverything = false;
      for (let row = this.liveOrder.first(); row >= 0; row = this.liveOrder.next(row)) if (!this.newBind.has(row)) binds[nb++] = this.resendBytes(row);
    } else {
      const resend = this.resendOut;
      const k = this.nextResend();
      for (let i = 0; i < k; i++) {
        const row = resend[i];
        if (this.held[row] === undefined || this.newBind.has(row)) continue;
        binds[nb++] = this.resendBytes(row);
        if (this.tableIds[row] !== undefined && !this.newBlocks.has(row)) blocks[nt++] = this.tableBytes(row);
      }
    }
    const nb0 = this.newBind.count;
    for (let i = 0; i < nb0; i++) {
      const row = this.newBind.at(i);
      if (row >= 0) binds[nb++] = this.firstBytes(row);
    }
    this.newBind.clear();
    // After resendAll every live table goes (the new ones among them, in the tables' order); else the new ones.
    if (everything) {
      for (let row = this.tableOrder.first(); row >= 0; row = this.tableOrder.next(row)) blocks[nt++] = this.tableBytes(row);
    } else {
      const nt0 = this.newBlocks.count;
      for (let i = 0; i < nt0; i++) {
        const row = this.newBlocks.at(i);
        if (row >= 0) blocks[nt++] = this.tableBytes(row);
      }
    }
    this.newBlocks.clear();
    out.nBinds = nb;
    out.nBlocks = nt;
    return out;
  }

  /** `row`'s first binding since its arrival: with the prompt's ids when given (then re-sends encode their own), else the re-send's bytes. */
  private firstBytes(row: number): Uint8Array {
    const h = this.held[row]!;
    if (h.ids === undefined) return this.resendBytes(row);
    const b = bindBytes(row, h.reqId, h.promptLen, h.ids);
    h.ids = undefined;
    return b;
  }

  private tableBytes(row: number): Uint8Array {
    let b = this.tableB[row];
    if (b === undefined) {
      b = blocksBytes(row, this.tableIds[row]!);
      this.tableB[row] = b;
    }
    return b;
  }

  private resendBytes(row: number): Uint8Array {
    let b = this.bindB[row];
    if (b === undefined) {
      const h = this.held[row]!;
      b = bindBytes(row, h.reqId, h.promptLen);
      this.bindB[row] = b;
    }
    return b;
  }

  private dropTable(row: number): void {
    if (this.tableIds[row] === undefined) return;
    this.tableIds[row] = undefined;
    this.tableB[row] = undefined;
    this.tableOrder.remove(row);
  }

  /** The head went out: frees take effect (the row is free for a later arrive). */
  protected sent(): void {
    for (let i = 0; i < this.flagged; i++) {
      const row = this.evRows[i];
      if (this.flagOf[row] & FLAG_FREED) {
        this.held[row] = undefined;
        this.liveOrder.remove(row);
        this.bindB[row] = undefined;
        this.dropTable(row);
        // Sending paused (reset): a binding or table the freed row got since the last head must not
        // go with a later one (after a head, sparse() has emptied these already: no-ops).
        this.newBind.drop(row);
        this.newBlocks.drop(row);
      }
      this.flagOf[row] = 0;
    }
    this.flagged = 0;
  }

  /** Up to RESEND_PER_STEP live rows into resendOut, once per cycle through them; how many. */
  private nextResend(): number {
    const out = this.resendOut;
    let n = 0;
    for (let pass = 0; pass < 2 && n < RESEND_PER_STEP; pass++) {
      while (this.cycleAt < this.cycleLen && n < RESEND_PER_STEP) out[n++] = this.cycle[this.cycleAt++];
      if (n < RESEND_PER_STEP) {
        // A new cycle: the live rows now, in their order.
        let len = 0;
        for (let row = this.liveOrder.first(); row >= 0; row = this.liveOrder.next(row)) this.cycle[len++] = row;
        this.cycleLen = len;
        this.cycleAt = 0;
      }
    }
    return n;
  }
}

/** Rows in the order added (as a Map's keys: added again after a remove goes last), as a linked list over arrays: add, remove and walk without hashing or allocating. */
class RowOrder {
  private readonly prev: Int32Array;
  private readonly nextOf: Int32Array;
  private head = -1;
  private tail = -1;
  size = 0;

  constructor(maxRows: number) {
    this.prev = new Int32Array(maxRows);
    this.nextOf = new Int32Array(maxRows);
  }

  /** Appends `row` (the caller knows it is not in the list). */
  add(row: number): void {
    this.prev[row] = this.tail;
    this.nextOf[row] = -1;
    if (this.tail >= 0) this.nextOf[this.tail] = row;
    else this.head = row;
    this.tail = row;
    this.size++;
  }

  /** Unlinks `row` (the caller knows it is in the list). */
  remove(row: number): void {
    const p = this.prev[row];
    const n = this.nextOf[row];
    if (p >= 0) this.nextOf[p] = n;
    else this.head = n;
    if (n >= 0) this.prev[n] = p;
    else this.tail = p;
    this.size--;
  }

  /** The first row, -1 when empty. */
  first(): number {
    return this.head;
  }

  /** The row after `row`, -1 at the end. */
  next(row: number): number {
    return this.nextOf[row];
  }
}

/**
 * Rows pending for the next head, in the order first added (as a Map's keys: added again after a
 * drop goes last). add, has and drop are O(1): a drop leaves a hole (-1) that the head skips, and a
 * full order list is compacted, so a long pause (no head drains it) with arrivals and frees stays
 * within its arrays.
 */
class PendingRows {
  private readonly pos: Int32Array;
  private readonly order: Int32Array;
  count = 0;

  constructor(maxRows: number) {
    this.pos = new Int32Array(maxRows).fill(-1);
    this.order = new Int32Array(2 * maxRows);
  }

  has(row: number): boolean {
    return this.pos[row] >= 0;
  }

  add(row: number): void {
    if (this.pos[row] >= 0) return;
    if (this.count === this.order.length) this.compact();
    this.pos[row] = this.count;
    this.order[this.count++] = row;
  }

  /** Forgets `row` (a row freed while sending paused): its place becomes a hole. */
  drop(row: number): void {
    const i = this.pos[row];
    if (i < 0) return;
    this.order[i] = -1;
    this.pos[row] = -1;
  }

  /** The i-th entry in order: a row, or -1 for a hole. */
  at(i: number): number {
    return this.order[i];
  }

  clear(): void {
    for (let i = 0; i < this.count; i++) {
      const row = this.order[i];
      if (row >= 0) this.pos[row] = -1;
    }
    this.count = 0;
  }

  /** Squeezes the holes out (each row is pending once, at most maxRows: at least half the list is free after). */
  private compact(): void {
    let k = 0;
    for (let i = 0; i < this.count; i++) {
      const row = this.order[i];
      if (row < 0) continue;
      this.pos[row] = k;
      this.order[k++] = row;
    }
    this.count = k;
  }
}
