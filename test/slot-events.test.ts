// SlotEvents keeps the bindings and tables reported since the last head in arrays by row (no Map
// per step). Its sparse part, event columns and live rows must be what the Map-based bookkeeping it
// replaced gave, entry for entry and in order, through arrivals, tables, finishes, frees,
// resendAll, heads and paused sending (reset: frees take effect, everything goes again), in random
// order. The model below is that bookkeeping.
import { ConfigError } from '../src/errors';
import { bindBytes, blocksBytes } from '../src/client/head-bytes';
import { RESEND_PER_STEP, SlotEvents } from '../src/client/slot-events';
import { FLAG_FREED } from '../src/client/telemetry';

/** The head's view of a SlotEvents: what one head carries; or sending paused (TensorBatch.reset). */
class Probe extends SlotEvents {
  pause(): void {
    this.sent();
    this.resendAll();
  }

  head(): { binds: string[]; blocks: string[]; rows: number[]; flags: number[] } {
    const n = this.eventFlags(); // the head's events: the first n of evRows / evFlags
    const out = { rows: [...this.evRows.subarray(0, n)], flags: [...this.evFlags.subarray(0, n)] };
    const sp = this.sparse();
    const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
    // The lists are reused: their first nBinds / nBlocks entries are this head's.
    const r = { binds: sp.binds.slice(0, sp.nBinds).map(hex), blocks: sp.blocks.slice(0, sp.nBlocks).map(hex), ...out };
    this.sent();
    return r;
  }
}

/** The Map-based bookkeeping (the model): the same calls, the same heads. */
class Model {
  live = new Map<number, { reqId: string; promptLen: number }>();
  bindB = new Map<number, Uint8Array>();
  tables = new Map<number, { ids: number[]; bytes: Uint8Array }>();
  newBind = new Map<number, Uint8Array>();
  newBlocks = new Map<number, Uint8Array>();
  flags = new Map<number, number>();
  all = false;
  cycle: number[] = [];
  at = 0;

  arrive(row: number, reqId: string, promptLen: number, ids: number[]): void {
    const first = bindBytes(row, reqId, promptLen, ids);
    this.live.set(row, { reqId, promptLen });
    if (ids.length > 0) this.bindB.delete(row);
    else this.bindB.set(row, first);
    this.tables.delete(row);
    this.newBind.set(row, first);
  }

  blocks(row: number, ids: number[]): void {
    const t = this.tables.get(row);
    if (t && t.ids.length === ids.length && t.ids.every((v, i) => v === ids[i])) return;
    const bytes = blocksBytes(row, ids);
    this.tables.set(row, { ids, bytes });
    this.newBlocks.set(row, bytes);
  }

  flag(row: number, bit: number): void {
    this.flags.set(row, (this.flags.get(row) ?? 0) | bit);
  }

  private resendBytes(row: number): Uint8Array {
    let b = this.bindB.get(row);
    if (!b) {
      const h = this.live.get(row)!;
      b = bindBytes(row, h.reqId, h.promptLen);
      this.bindB.set(row, b);
    }
    return b;
  }

  private nextResend(): number[] {
    const out: number[] = [];
    for (let pass = 0; pass < 2 && out.length < RESEND_PER_STEP; pass++) {
      while (this.at < this.cycle.length && out.length < RESEND_PER_STEP) out.push(this.cycle[this.at++]);
      if (out.length < RESEND_PER_STEP) {
        this.cycle = [...this.live.keys()];
        this.at = 0;
      }
    }
    return out;
  }

  private applyFrees(): void {
    for (const [row, f] of this.flags) {
      if (f & FLAG_FREED) {
        this.live.delete(row);
        this.bindB.delete(row);
        this.tables.delete(row);
        // As the Python client's sent(): what the freed row got since the last head never goes.
        this.newBind.delete(row);
        this.newBlocks.delete(row);
      }
    }
    this.flags.clear();
  }

  pause(): void {
    this.applyFrees();
    this.all = true;
  }

  head(): { binds: string[]; blocks: string[]; rows: number[]; flags: number[] } {
    const rows = [...this.flags.keys()];
    const flags = [...this.flags.values()];
    const binds: Uint8Array[] = [];
    const blocks: Uint8Array[] = [];
    let tables = this.newBlocks;
    if (this.all) {
      this.all = false;
      for (const row of this.live.keys()) if (!this.newBind.has(row)) binds.push(this.resendBytes(row));
      tables = new Map([...this.tables].map(([row, t]) => [row, t.bytes]));
    } else {
      for (const row of this.nextResend()) {
        if (!this.live.has(row) || this.newBind.has(row)) continue;
        binds.push(this.resendBytes(row));
        const t = this.tables.get(row);
        if (t && !tables.has(row)) blocks.push(t.bytes);
      }
    }
    binds.push(...this.newBind.values());
    this.newBind.clear();
    blocks.push(...tables.values());
    this.newBlocks.clear();
    this.applyFrees();
    const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
    return { binds: binds.map(hex), blocks: blocks.map(hex), rows, flags };
  }
}

/** Random calls to a SlotEvents and the model, compared at every head; `paused` of 10 steps pause instead of sending a head. */
function randomCalls(seed: number, paused: number): number {
  let x = seed;
  const rand = (n: number): number => {
    x = (x * 1103515245 + 12345) % 2 ** 31;
    return x % n;
  };
  let heads = 0;
  for (let trial = 0; trial < 30; trial++) {
    const maxRows = [3, 8, 64][rand(3)];
    const s = new Probe(maxRows);
    const m = new Model();
    for (let step = 0; step < 120; step++) {
      for (let k = rand(9); k > 0; k--) {
        const op = rand(100);
        const row = rand(maxRows);
        try {
          if (op < 30) {
            const ids = rand(5) === 0 ? [1, 2 ** 32 - 1] : [];
            const plen = [0, 5, 300][rand(3)];
            const id = `q${trial}-${step}-${row}${rand(4) === 0 ? '-é' : ''}`; // ASCII ids and others (two encoding paths)
            s.arrive(row, id, { promptLen: plen, promptTokenIds: ids });
            m.arrive(row, id, plen, ids);
          } else if (op < 55) {
            const ids = Array.from({ length: rand(6) }, () => rand(3)); // small ids: a table often unchanged
            s.blocks(row, ids);
            m.blocks(row, ids);
          } else if (op < 64) {
            s.finish(row);
            m.flag(row, 1);
          } else if (op < 76) {
            s.free(row);
            m.flag(row, 2);
          } else if (op < 85) {
            // The step's rows in one call: flagged in order up to a refused one (a row holding no request).
            const rows = Array.from({ length: rand(4) }, () => rand(maxRows + 1)); // maxRows: out of range
            const bit = rand(2) === 0 ? 1 : 2;
            const col = rand(2) === 0 ? rows : Uint32Array.from(rows);
            try {
              if (bit === 1) s.finishRows(col);
              else s.freeRows(col);
            } finally {
              for (const r of rows) {
                if (!m.live.has(r)) break;
                m.flag(r, bit);
              }
            }
          } else {
            s.resendAll();
            m.all = true;
          }
        } catch (e) {
          if (!(e instanceof ConfigError)) throw e; // refused by the batch: the model is not told
        }
      }
      if (rand(10) < paused) {
        s.pause();
        m.pause();
      } else expect(s.head()).toEqual(m.head());
      expect(s.live).toBe(m.live.size);
      heads++;
    }
  }
  return heads;
}

test('the sparse part and event columns are the Map-based bookkeeping\'s, in order, through random calls', () => {
  expect(randomCalls(11, 1)).toBe(3600); // every step compared its live count, most a head too
});

test('finishRows / freeRows refuse what is not an array of rows, naming the call', () => {
  const s = new Probe(4);
  s.arrive(1, 'r1');
  expect(() => s.finishRows(3 as unknown as number[])).toThrow(new ConfigError('finishRows(): rows must be an array or typed array of rows, got number'));
  expect(() => s.freeRows(null as unknown as number[])).toThrow(new ConfigError('freeRows(): rows must be an array or typed array of rows, got null'));
  expect(() => s.freeRows([1, 2])).toThrow(new ConfigError('freeRows(): row 2 holds no request'));
  expect(s.head().rows).toEqual([1]); // the row before the refused one was flagged
});

test('through long pauses (many arrivals and frees with no head: the pending rows compacted) the first head after is the model\'s', () => {
  expect(randomCalls(29, 9)).toBe(3600);
});

test('a pause of many arrive/free cycles (rows of different lifetimes: holes before live rows when compacted) sends the model\'s head after', () => {
  const s = new Probe(4);
  const m = new Model();
  const live = [false, false, false, false];
  for (let cycle = 0; cycle < 60; cycle++) {
    for (let row = 0; row < 4; row++) {
      if (live[row]) continue;
      s.arrive(row, `c${cycle}-${row}`, { promptLen: cycle });
      m.arrive(row, `c${cycle}-${row}`, cycle, []);
      s.blocks(row, [cycle, row]);
      m.blocks(row, [cycle, row]);
      live[row] = true;
    }
    // Row r lives r + 1 cycles: the rows arrive and go in an order that keeps changing.
    for (let row = 3; row >= 0; row--) {
      if ((cycle + 1) % (row + 1) !== 0) continue;
      s.free(row);
      m.flag(row, 2);
      live[row] = false;
    }
    s.pause();
    m.pause();
  }
  const h = s.head();
  expect(h).toEqual(m.head());
  expect(h.binds.length).toBe(live.filter(Boolean).length);
});
