// Detector state for every tracked request in one buffer instead of a handful of small objects
// and typed arrays per request: the guard touches the state of ~1000 requests per wave head, and
// with one contiguous record per request (all detectors' counters and rings side by side) that is
// a few cache lines each and no pointer chasing, and the native detector pass
// (native/detector_pass.cc) gets the whole state as one array. Records are addressed by slot:
// the record of slot s starts at int32 word s × words. Each record is viewed both as int32 words
// and as float64s (at even word offsets) for sums that can pass 2^31. The buffer grows by
// doubling (records are copied; nothing keeps an address across steps).

/** One record: word offset `base` into `i32`; a float64 at even word w is f64[w >> 1]. */
export interface StateRef {
  i32: Int32Array;
  f64: Float64Array;
  base: number;
}

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
  i32: Int32Array;
  f64: Float64Array;
  private capacity: number;

  constructor(words: number, initialRecords = 64) {
    this.words = even(Math.max(2, words));
    this.capacity = Math.max(1, initialRecords);
    const buf = new ArrayBuffer(this.capacity * this.words * 4);
    this.i32 = new Int32Array(buf);
    this.f64 = new Float64Array(buf);
  }

  /** Records the buffer holds now. */
  get records(): number {
    return this.capacity;
  }

  /** Word offset of `slot`'s record. */
  base(slot: number): number {
    return slot * this.words;
  }

  /** Make room for `slot` (new records are zero). */
  ensure(slot: number): void {
    if (slot < this.capacity) return;
    let cap = this.capacity;
    while (cap <= slot) cap *= 2;
    const buf = new ArrayBuffer(cap * this.words * 4);
    const i32 = new Int32Array(buf);
    i32.set(this.i32);
    this.i32 = i32;
    this.f64 = new Float64Array(buf);
    this.capacity = cap;
  }

  /** Zero `slot`'s record: a reused slot starts like a fresh one. */
  reset(slot: number): void {
    this.ensure(slot);
    const b = this.base(slot);
    this.i32.fill(0, b, b + this.words);
  }
}
