// Detector state for every tracked request, in a few large buffers instead of a handful of small
// objects and typed arrays per request: the guard touches the state of ~1000 requests per wave
// head, and with one contiguous record per request (all detectors' counters and rings side by
// side) that is a few cache lines each and no pointer chasing. Records are addressed by slot:
// slot → page (one ArrayBuffer of 2^k records) and an int32 word offset inside it. Each record
// is viewed both as int32 words and as float64s (at even word offsets) for sums that can pass
// 2^31. Pages are allocated on first use and never moved, so a slot's address is stable.

/** One record: word offset `base` into `i32`; a float64 at even word w is f64[w >> 1]. */
export interface StateRef {
  i32: Int32Array;
  f64: Float64Array;
  base: number;
}

interface Page {
  i32: Int32Array;
  f64: Float64Array;
}

const PAGE_BYTES = 256 * 1024;
const MAX_SLOTS_PER_PAGE = 1024;

/** Round a word count up to an even number (float64 alignment of the next record part). */
export function even(words: number): number {
  return (words + 1) & ~1;
}

/** A standalone zeroed record of `words` int32 words (single-stream use, tests). */
export class StateRecord implements StateRef {
  readonly i32: Int32Array;
  readonly f64: Float64Array;
  readonly base = 0;
  constructor(words: number) {
    const buf = new ArrayBuffer(even(Math.max(2, words)) * 4);
    this.i32 = new Int32Array(buf);
    this.f64 = new Float64Array(buf);
  }
}

export class StateSlab {
  /** int32 words per record (even). */
  readonly words: number;
  private readonly shift: number;
  private readonly mask: number;
  private readonly pages: (Page | undefined)[] = [];

  constructor(words: number) {
    this.words = even(Math.max(2, words));
    let per = 1;
    while (per * 2 <= MAX_SLOTS_PER_PAGE && per * 2 * this.words * 4 <= PAGE_BYTES) per *= 2;
    this.shift = Math.log2(per);
    this.mask = per - 1;
  }

  /** The page holding `slot` (allocated zeroed on first use). */
  page(slot: number): Page {
    return this.pages[slot >>> this.shift] ?? this.newPage(slot >>> this.shift);
  }

  /** Word offset of `slot`'s record inside its page. */
  base(slot: number): number {
    return (slot & this.mask) * this.words;
  }

  /** Zero `slot`'s record: a reused slot starts like a fresh one. */
  reset(slot: number): void {
    const p = this.pages[slot >>> this.shift];
    if (!p) return; // not allocated yet: already zero
    const b = this.base(slot);
    p.i32.fill(0, b, b + this.words);
  }

  private newPage(index: number): Page {
    const buf = new ArrayBuffer(((this.mask + 1) * this.words) * 4);
    const p: Page = { i32: new Int32Array(buf), f64: new Float64Array(buf) };
    while (this.pages.length < index) this.pages.push(undefined);
    this.pages[index] = p;
    return p;
  }
}
