// TensorBatch.blockTable(): the engine's block table (rows x width integers, written in place, with
// a block count per row) registered once. Each head that is sent compares it with what the previous
// head saw and hands the rows that changed to blocks() (the Python client's block_table() is the
// same, with numpy). The comparison reads each row's blocks in use, no more: the batch's blocks.
import { ConfigError } from '../errors';

type Ints = Int32Array | Uint32Array | BigInt64Array | Int16Array | Uint16Array;

export class BlockTableWatch {
  private readonly seen: Float64Array;
  private readonly seenN: Float64Array;
  readonly stats = { blockRowsSent: 0, badBlockRows: 0 };

  constructor(
    private readonly table: ArrayLike<number>,
    private readonly width: number,
    private readonly counts: ArrayLike<number>,
    private readonly rows: number,
  ) {
    if (!Number.isInteger(width) || width < 1) throw new ConfigError(`blockTable(): width must be a positive integer, got ${String(width)}`);
    if (!isInts(table) || !isInts(counts)) throw new ConfigError('blockTable(): table and numBlocks must be integer typed arrays (Int32Array, Uint32Array, ...)');
    if (table.length < rows * width || counts.length < rows) {
      throw new ConfigError(`blockTable(): table holds ${table.length} ids and numBlocks ${counts.length} counts; the batch needs ${rows} x ${width} and ${rows}`);
    }
    this.seen = new Float64Array(rows * width).fill(-1);
    this.seenN = new Float64Array(rows).fill(-1);
  }

  /** A request took `row`: its table goes with the next head, whatever the last head saw. */
  invalidate(row: number): void {
    this.seenN[row] = -1;
  }

  /** Hand each live row whose blocks changed since the last call to `blocks`. */
  diff(live: (row: number) => boolean, blocks: (row: number, ids: ArrayLike<number>) => void): void {
    const { table, width, counts, seen, seenN } = this;
    for (let r = 0; r < this.rows; r++) {
      const k = Number(counts[r]);
      const base = r * width;
      const used = Math.min(Math.max(k, seenN[r], 0), width);
      let changed = k !== seenN[r];
      for (let i = 0; i < used; i++) {
        const v = Number(table[base + i]);
        if (v !== seen[base + i]) {
          seen[base + i] = v;
          changed = true;
        }
      }
      seenN[r] = k;
      if (!changed || !live(r)) continue;
      try {
        if (!Number.isInteger(k) || k < 0 || k > width) throw new ConfigError(`numBlocks[${r}] = ${k} is not in 0..${width}`);
        blocks(r, Array.from({ length: k }, (_, i) => Number(table[base + i])));
        this.stats.blockRowsSent++;
      } catch (e) {
        // Garbage in the engine's table costs that row's update, never the step.
        if (!(e instanceof ConfigError)) throw e;
        this.stats.badBlockRows++;
      }
    }
  }
}

function isInts(x: unknown): x is Ints {
  return x instanceof Int32Array || x instanceof Uint32Array || x instanceof Int16Array || x instanceof Uint16Array || x instanceof BigInt64Array;
}
