// The telemetry ring's writer in the TypeScript client (the tensor hot path, docs/typescript-client.md):
// per step one copy per column (TypedArray.set into a view made once) into a slot of the file the
// agent created and reads (src/agent/telemetry-ring.ts). No per-element JS, no protobuf for the
// columns, no system call. The layout comes from src/client/ring-layout.ts (one description for
// both clients); clients/python/wavebus_client/ring.py is the Python writer of the same bytes.
//
// Seqlock: the slot's seq word goes odd, the columns and counts are stored, then seq goes even
// (2k for write k). The seq and written words are stored with Atomics (never torn, never reordered
// before the bytes they commit); the agent drops a slot whose seq changed while it read it.
import { ConfigError, WavebusError } from '../errors';
import { native, nativeCall } from '../native';
import { WHOLE_COPY_MAX } from './head-bytes';
import { columnPlaces, RING_COLUMN, RING_HEADER, RING_LAYOUT, RING_SLOT, type ColumnPlace } from './ring-layout';

type View = Uint8Array | Uint32Array | Float32Array;

/**
 * A step's columns as the batch hands them over, by their index in the layout (RING_COLUMN; the
 * extra column goes separately): each already checked to fit its view and holding at least its
 * count's entries (rows, tokens or events), of which write() copies that many. One array the batch
 * reuses step to step: no object built per step, no lookup by name.
 */
export type RingColumns = (ArrayLike<number> | undefined)[];

const EXTRA = RING_COLUMN.extra;

export class TelemetryRingWriter {
  readonly slots: number;
  readonly maxRows: number;
  readonly maxTokens: number;
  readonly maxEvents: number;
  readonly maxExtra: number;
  private readonly words: BigUint64Array;
  /** The same memory as u32s: the consumed word read in halves, no BigInt per step. */
  private readonly halves: Uint32Array;
  private readonly dv: DataView;
  private readonly base: number[];
  /** Per slot, per column (by index): a typed view over its place, made once (a step only assigns into them). */
  private readonly views: View[][];
  /** Per column: its bit in the slot's present word, and which count says its entries (0 rows, 1 tokens, 2 events). */
  private readonly bit: number[];
  private readonly countOf: number[];
  private readonly extraAt: number;
  private seq: number;
  /** An Int32Array column's u32 view, by column: made when the engine hands a new array, reused while it hands the same. */
  private readonly asU32: ([Int32Array, Uint32Array] | undefined)[];
  private readonly counts = [0, 0, 0];

  private constructor(readonly path: string, private readonly mem: Buffer) {
    const where = `telemetry ring ${path}`;
    if (mem.length < RING_LAYOUT.header_bytes) throw new ConfigError(`${where}: ${mem.length} bytes, shorter than its header`);
    this.dv = new DataView(mem.buffer, mem.byteOffset, mem.length);
    const u32 = (name: string): number => this.dv.getUint32(RING_HEADER[name], true);
    if (mem.subarray(0, 8).toString('latin1') !== RING_LAYOUT.magic || u32('version') !== RING_LAYOUT.version) {
      throw new ConfigError(`${where}: not a version ${RING_LAYOUT.version} telemetry ring`);
    }
    this.slots = u32('slots');
    this.maxRows = u32('max_rows');
    this.maxTokens = u32('max_tokens');
    this.maxEvents = u32('max_events');
    this.maxExtra = u32('max_extra');
    const stride = Number(this.dv.getBigUint64(RING_HEADER.slot_bytes, true));
    const { places, slotBytes } = columnPlaces({ maxRows: this.maxRows, maxTokens: this.maxTokens, maxEvents: this.maxEvents, maxExtra: this.maxExtra });
    if (this.slots < 1 || stride !== slotBytes || RING_LAYOUT.header_bytes + this.slots * stride > mem.length) {
      throw new ConfigError(`${where}: ${this.slots} slots of ${stride} bytes do not fit its ${mem.length} bytes`);
    }
    this.words = new BigUint64Array(mem.buffer, mem.byteOffset, Math.floor(mem.length / 8));
    this.halves = new Uint32Array(mem.buffer, mem.byteOffset, 2 * this.words.length);
    this.dv.setUint32(RING_HEADER.pid, process.pid, true);
    this.base = Array.from({ length: this.slots }, (_, i) => RING_LAYOUT.header_bytes + i * stride);
    this.views = this.base.map((b) => places.map((p) => view(mem, b, p)));
    this.bit = places.map((p) => 1 << p.bit);
    const countName = (p: ColumnPlace): string => p.count.replace(/^header\./, '');
    this.countOf = places.map((p) => ['max_rows', 'max_tokens', 'max_events'].indexOf(countName(p)));
    this.asU32 = places.map(() => undefined);
    this.extraAt = places.find((p) => p.name === 'extra')!.at;
    // A client that comes back to the ring goes on numbering after the last write.
    this.seq = Number(this.words[RING_HEADER.written / 8]) / 2;
  }

  /** Maps the ring the agent's hello named (opened without following a link). */
  static open(path: string): TelemetryRingWriter {
    let mem: Buffer;
    try {
      mem = nativeCall(() => native.mapFile(path));
    } catch (e) {
      throw new WavebusError((e as WavebusError).code ?? 'ERR_MAP_FILE', `telemetry ring ${path}: ${(e as Error).message}`);
    }
    return new TelemetryRingWriter(path, mem);
  }

  fits(rows: number, tokens: number, events: number): boolean {
    return rows <= this.maxRows && tokens <= this.maxTokens && events <= this.maxEvents;
  }

  /**
   * Whether the next write's slot was taken by the agent: a head it has not read is never
   * overwritten (the caller sends that head inline instead; nothing is lost when the agent lags).
   */
  free(): boolean {
    const k = this.seq + 1;
    return k <= this.slots || this.consumed() >= 2 * (k - this.slots);
  }

  /** The seq of the last slot the agent took (the header's consumed word). */
  consumed(): number {
    // The high half on both sides of the low one: a value crossing 2^32 while read is read again
    // (a bounded number of times: a word that never holds still is garbage, read as it last was).
    const at = RING_HEADER.consumed / 4;
    let hi = 0;
    let lo = 0;
    for (let attempt = 0; attempt < 64; attempt++) {
      hi = Atomics.load(this.halves, at + 1);
      lo = Atomics.load(this.halves, at);
      if (Atomics.load(this.halves, at + 1) === hi) break;
    }
    return hi * 0x100000000 + lo;
  }

  /**
   * Copies one step's columns (each at most its capacity; the caller checked fits()) into the next
   * slot; returns its seq. With `extra` (the head's sparse part: its first `extraLen` bytes, at
   * most maxExtra) the slot is the whole head: `written` says so and the agent's poll takes it;
   * without, a message names the seq.
   */
  write(wave: number, columns: RingColumns, rows: number, tokens: number, events: number, extra?: Uint8Array, extraLen = extra ? extra.length : 0): number {
    const k = this.seq + 1;
    const i = (k - 1) % this.slots;
    const base = this.base[i];
    const views = this.views[i];
    const seqWord = (base + RING_SLOT.seq) / 8;
    this.store(seqWord, 2 * k - 1); // odd: being written
    const counts = this.counts;
    counts[0] = rows;
    counts[1] = tokens;
    counts[2] = events;
    let present = 0;
    for (let c = 0; c < columns.length; c++) {
      let a = columns[c];
      if (a === undefined || c === EXTRA) continue;
      const v = views[c];
      const n = counts[this.countOf[c]];
      // An Int32Array into a u32 column: the same bits, copied as they are (a negative value reads
      // as >= 2^31 and is garbage where the agent checks it); other types are converted in the copy.
      if (a instanceof Int32Array && v instanceof Uint32Array) a = this.u32View(c, a);
      if (a.length === n) v.set(a); // one copy
      else for (let j = 0; j < n; j++) v[j] = a[j]; // a reused array longer than this step's count (the events: a few)
      present |= this.bit[c];
    }
    if (extraLen > 0) {
      // A small reused buffer whole when the slot's room takes it (bytes past extraLen are never
      // read): no view made per step; a large one (rare) by a view of its extraLen bytes.
      const e = extra!;
      this.mem.set(e.length <= this.maxExtra && e.length <= WHOLE_COPY_MAX ? e : e.subarray(0, extraLen), base + this.extraAt);
      present |= this.bit[EXTRA];
    }
    const dv = this.dv;
    dv.setUint32(base + RING_SLOT.wave, wave % 0x100000000, true); // the u64 as two halves: no BigInt per step
    dv.setUint32(base + RING_SLOT.wave + 4, high32(wave), true);
    dv.setUint32(base + RING_SLOT.rows, rows, true);
    dv.setUint32(base + RING_SLOT.tokens, tokens, true);
    dv.setUint32(base + RING_SLOT.events, events, true);
    dv.setUint32(base + RING_SLOT.present, present, true);
    dv.setUint32(base + RING_SLOT.extra_len, extraLen, true);
    this.store(seqWord, 2 * k); // whole
    if (extraLen > 0) this.store(RING_HEADER.written / 8, 2 * k); // after the slot: the agent's poll takes it
    this.seq = k;
    return 2 * k;
  }

  /**
   * Stores u64 word `w` (a Number below 2^53) atomically. While its high half stays what it was
   * (below 2^32 always: 2^31 writes) the low half's u32 Atomics store makes the same 64-bit value,
   * and no BigInt is made per step; a high half that changes goes as one BigInt store.
   */
  private store(w: number, value: number): void {
    const hi = high32(value);
    if (Atomics.load(this.halves, 2 * w + 1) === hi) Atomics.store(this.halves, 2 * w, hi === 0 ? value : value % 0x100000000);
    else Atomics.store(this.words, w, BigInt(value));
  }

  private u32View(c: number, a: Int32Array): Uint32Array {
    const got = this.asU32[c];
    if (got !== undefined && got[0] === a) return got[1];
    const v = new Uint32Array(a.buffer, a.byteOffset, a.length);
    this.asU32[c] = [a, v];
    return v;
  }
}

/** A u64's high half (0 below 2^32 without a division: a fraction would be a heap number, an allocation, in V8's baseline code). */
function high32(v: number): number {
  return v > 0xffffffff ? Math.floor(v / 0x100000000) : 0;
}

function view(mem: Buffer, slotBase: number, p: ColumnPlace): View {
  const at = mem.byteOffset + slotBase + p.at;
  if (p.size === 1) return new Uint8Array(mem.buffer, at, p.capacity);
  // The layout's 4-byte columns: u32 but for token_logprobs (f32); read from the one description.
  return p.type === 'f32' ? new Float32Array(mem.buffer, at, p.capacity) : new Uint32Array(mem.buffer, at, p.capacity);
}

/** The ring the last hello named, mapped once per hello (each hello that asks makes a fresh file). */
export class RingAtHello {
  private ring: TelemetryRingWriter | null = null;
  private at = -1;

  constructor(
    private readonly hello: { readonly hellos: number; readonly ringPath: string },
    /** A ring that cannot be mapped: the heads go inline, the reason is the client's last error. */
    private readonly failed: (message: string) => void,
  ) {}

  get(): TelemetryRingWriter | null {
    if (this.at !== this.hello.hellos) {
      this.at = this.hello.hellos;
      this.ring = null; // the old mapping goes with its Buffer
      if (this.hello.ringPath) {
        try {
          this.ring = TelemetryRingWriter.open(this.hello.ringPath);
        } catch (e) {
          this.failed(`telemetry ring unusable, sending columns inline: ${(e as Error).message}`);
        }
      }
    }
    return this.ring;
  }
}
