// The engine's persistent batch as wavebus sees it (the tensor hot path, docs/typescript-client.md):
// each running request keeps a stable row from arrive() to free(); wavebus uses the row as the
// telemetry's slot. Arrivals, block-table changes, finishes and frees are sparse events, paid once
// each, held here until the next wave head carries them. The Python client's slot_batch.py is the
// same state machine: both send the same bindings, tables and flags for the same calls. Each
// binding and table is encoded to its wire bytes once, when reported (head-bytes.ts): a head joins
// the bytes it carries, re-sends included, and encodes no message.
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

export class SlotEvents {
  protected readonly liveRows = new Map<number, { reqId: string; promptLen: number }>();
  /** A live row's binding as re-sent (without the prompt's ids), encoded on its first re-send; by row. */
  private readonly bindB: (Uint8Array | undefined)[];
  private readonly tables = new Map<number, { ids: number[]; bytes: Uint8Array }>();
  /**
   * The bindings and tables reported since the last head, by row, and their rows in the order
   * first reported (a Map's order, without a Map: the usual step reads and clears a few entries
   * of arrays made once, no hashing, no table reallocated by a clear).
   */
  private readonly newBind: PendingByRow;
  private readonly newBlocks: PendingByRow;
  /** sparse()'s lists and answer, reused step to step. */
  private readonly outBind: Uint8Array[] = [];
  private readonly outBlocks: Uint8Array[] = [];
  private readonly out = { binds: this.outBind, blocks: this.outBlocks };
  private readonly resendOut: number[] = [];
  /**
   * This step's finish/free flags by row (0: none), and the rows flagged in the order first
   * flagged (a row flags once per step: at most maxRows). Typed arrays indexed by row, not a Map:
   * a finish costs two stores, the head reads them without hashing or allocating.
   */
  private readonly flagOf: Uint8Array;
  private flagged = 0;
  private resendEverything = false;
  private cycle: number[] = [];
  private cycleAt = 0;
  /** This step's finish/free events as the ring's columns (rows in flag order; reused). */
  protected readonly evRows: Uint32Array;
  protected readonly evFlags: Uint8Array;
  /** eventColumns()'s answer: its views are made again only when the count of events changes. */
  private readonly evOut: { rows: Uint32Array; flags: Uint8Array };

  constructor(readonly maxRows: number) {
    this.flagOf = new Uint8Array(maxRows);
    this.evRows = new Uint32Array(maxRows);
    this.evFlags = new Uint8Array(maxRows);
    this.evOut = { rows: this.evRows.subarray(0, 0), flags: this.evFlags.subarray(0, 0) };
    this.bindB = new Array<Uint8Array | undefined>(maxRows).fill(undefined);
    this.newBind = new PendingByRow(maxRows);
    this.newBlocks = new PendingByRow(maxRows);
  }

  get live(): number {
    return this.liveRows.size;
  }

  /** Request `reqId` now holds `row` (until free(row)). */
  arrive(row: number, reqId: string, opts: { promptLen?: number; promptTokenIds?: ArrayLike<number> } = {}): void {
    checkRow(row, this.maxRows, 'arrive()');
    if (typeof reqId !== 'string' || reqId === '') throw new ConfigError(`arrive(): reqId must be a non-empty string, got ${JSON.stringify(reqId)}`);
    const promptLen = opts.promptLen ?? 0;
    if (!Number.isInteger(promptLen) || promptLen < 0 || promptLen > 0xffffffff) throw new ConfigError(`arrive(): promptLen must be an integer in 0..2^32-1, got ${String(promptLen)}`);
    const held = this.liveRows.get(row);
    if (held) throw new ConfigError(`arrive(): row ${row} still holds request '${held.reqId}'; free(row) it first`);
    // Its free and this arrival would reach the coordinator in one head, the free last.
    if (this.flagOf[row] & FLAG_FREED) throw new ConfigError(`arrive(): row ${row} was freed since the last waveHead; bind it after the next waveHead`);
    const ids = opts.promptTokenIds ? u32List(opts.promptTokenIds, 'arrive(): promptTokenIds') : [];
    const first = bindBytes(row, reqId, promptLen, ids);
    this.liveRows.set(row, { reqId, promptLen });
    this.bindB[row] = ids.length > 0 ? undefined : first;
    this.tables.delete(row);
    this.newBind.set(row, first);
  }

  /** `row`'s whole block table, when it changed (sent with the next head). */
  blocks(row: number, blockIds: ArrayLike<number>): void {
    checkRow(row, this.maxRows, 'blocks()');
    if (!this.liveRows.has(row)) throw new ConfigError(`blocks(): row ${row} holds no request (arrive() first)`);
    const table = u32List(blockIds, `blocks(): block ids of row ${row}`);
    if (!sameTable(this.tables.get(row)?.ids, table)) {
      const bytes = blocksBytes(row, table);
      this.tables.set(row, { ids: table, bytes });
      this.newBlocks.set(row, bytes);
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

  private flag(row: number, where: string, bit: number): void {
    checkRow(row, this.maxRows, where);
    if (!this.liveRows.has(row)) throw new ConfigError(`${where}: row ${row} holds no request`);
    if (this.flagOf[row] === 0) this.evRows[this.flagged++] = row;
    this.flagOf[row] |= bit;
  }

  /** The next head carries every live binding and table (a new coordinator, a lost head). */
  resendAll(): void {
    this.resendEverything = true;
  }

  /** This step's finish/free events as columns: views valid until the next call. */
  protected eventColumns(): { rows: Uint32Array; flags: Uint8Array } {
    const n = this.flagged;
    for (let i = 0; i < n; i++) this.evFlags[i] = this.flagOf[this.evRows[i]];
    const out = this.evOut;
    if (out.rows.length !== n) {
      out.rows = this.evRows.subarray(0, n);
      out.flags = this.evFlags.subarray(0, n);
    }
    return out;
  }

  /** The head's sparse part as TelemetryColumns entries' bytes: the pending bindings and tables (new ones, a few re-sends, or all after resendAll()). Valid until the next call. */
  protected sparse(): { binds: Uint8Array[]; blocks: Uint8Array[] } {
    const binds = this.outBind;
    const blocks = this.outBlocks;
    binds.length = 0;
    blocks.length = 0;
    const everything = this.resendEverything;
    if (everything) {
      this.resendEverything = false;
      for (const row of this.liveRows.keys()) if (!this.newBind.has(row)) binds.push(this.resendBytes(row));
    } else {
      const resend = this.nextResend();
      for (let i = 0; i < resend.length; i++) {
        const row = resend[i];
        if (!this.liveRows.has(row) || this.newBind.has(row)) continue;
        binds.push(this.resendBytes(row));
        const t = this.tables.get(row);
        if (t && !this.newBlocks.has(row)) blocks.push(t.bytes);
      }
    }
    this.newBind.drainInto(binds);
    // After resendAll every live table goes (the new ones among them, in the tables' order); else the new ones.
    if (everything) {
      for (const t of this.tables.values()) blocks.push(t.bytes);
      this.newBlocks.drainInto(null);
    } else this.newBlocks.drainInto(blocks);
    return this.out;
  }

  private resendBytes(row: number): Uint8Array {
    let b = this.bindB[row];
    if (b === undefined) {
      const h = this.liveRows.get(row)!;
      b = bindBytes(row, h.reqId, h.promptLen);
      this.bindB[row] = b;
    }
    return b;
  }

  /** The head went out: frees take effect (the row is free for a later arrive). */
  protected sent(): void {
    for (let i = 0; i < this.flagged; i++) {
      const row = this.evRows[i];
      if (this.flagOf[row] & FLAG_FREED) {
        this.liveRows.delete(row);
        this.bindB[row] = undefined;
        this.tables.delete(row);
        // Sending paused (reset): a binding or table the freed row got since the last head must not
        // go with a later one (after a head, sparse() has emptied these already: no-ops).
        this.newBind.drop(row);
        this.newBlocks.drop(row);
      }
      this.flagOf[row] = 0;
    }
    this.flagged = 0;
  }

  /** Up to RESEND_PER_STEP live rows, once per cycle through them. */
  private nextResend(): number[] {
    const out = this.resendOut;
    out.length = 0;
    for (let pass = 0; pass < 2 && out.length < RESEND_PER_STEP; pass++) {
      while (this.cycleAt < this.cycle.length && out.length < RESEND_PER_STEP) out.push(this.cycle[this.cycleAt++]);
      if (out.length < RESEND_PER_STEP) {
        this.cycle = [...this.liveRows.keys()];
        this.cycleAt = 0;
      }
    }
    return out;
  }
}

/** Bytes pending by row, and their rows in the order first set (as a Map iterates; set again keeps the place). */
class PendingByRow {
  private readonly of: (Uint8Array | undefined)[];
  private readonly order: Uint32Array;
  private count = 0;

  constructor(maxRows: number) {
    this.of = new Array<Uint8Array | undefined>(maxRows).fill(undefined);
    this.order = new Uint32Array(maxRows);
  }

  has(row: number): boolean {
    return this.of[row] !== undefined;
  }

  set(row: number, bytes: Uint8Array): void {
    if (this.of[row] === undefined) this.order[this.count++] = row;
    this.of[row] = bytes;
  }

  /** Forgets `row`'s entry, keeping the others' order (rare: a row freed while sending paused). */
  drop(row: number): void {
    if (this.of[row] === undefined) return;
    this.of[row] = undefined;
    const i = this.order.subarray(0, this.count).indexOf(row);
    this.order.copyWithin(i, i + 1, this.count);
    this.count--;
  }

  /** Appends the entries in order to `out` (none when null) and empties this. */
  drainInto(out: Uint8Array[] | null): void {
    for (let i = 0; i < this.count; i++) {
      const row = this.order[i];
      if (out !== null) out.push(this.of[row]!);
      this.of[row] = undefined;
    }
    this.count = 0;
  }
}
