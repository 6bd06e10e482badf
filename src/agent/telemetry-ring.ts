// The telemetry ring on the agent's side (proto/layouts.json's "telemetry"): the agent creates the file
// (0600, beside the mailbox) that its engine client maps and fills, one copy per column, and reads
// a slot when the wave head naming its seq arrives. Reads are pread on the agent's own descriptor:
// every count read is checked against the ring's capacities, so nothing the engine writes can make
// the agent read outside the slot or allocate more than a slot's bytes.
import * as fs from 'fs';
import { ConfigError } from '../errors';
import { columnPlaces, RING_HEADER, RING_LAYOUT, RING_SLOT, type ColumnPlace, type RingAsk, type RingSlotRead } from '../client/ring-layout';

/** The sizes a client asked for at hello: at most these (a slot of 4096 rows is ~100 KiB). */
export const RING_MAX_ROWS = 1 << 20;
export const RING_MAX_TOKENS = 1 << 22;
export const RING_MAX_EVENTS = 1 << 20;

/** Present columns at most this many bytes apart in a slot are read with one pread (telemetry-ring.ts readColumns). */
export const COALESCE_GAP = 16 << 10;

/** Why a slot was not taken: torn (seq changed or not the one named), counts past the capacity. */
export type RingMiss = { garbage: 'torn' | 'bad_seq' | 'bad_counts'; detail: string };

export function checkRingAsk(a: { ringRows?: number; ringTokens?: number; ringEvents?: number; ringVocab?: number }): RingAsk {
  const rows = Number(a.ringRows ?? 0);
  const tokens = Number(a.ringTokens ?? 0);
  const events = Number(a.ringEvents ?? 0);
  if (!(rows >= 1 && rows <= RING_MAX_ROWS)) throw new ConfigError(`hello.ring_rows ${rows} is out of range (1..${RING_MAX_ROWS})`);
  if (!(tokens >= 0 && tokens <= RING_MAX_TOKENS)) throw new ConfigError(`hello.ring_tokens ${tokens} is out of range (0..${RING_MAX_TOKENS})`);
  if (!(events >= 0 && events <= RING_MAX_EVENTS)) throw new ConfigError(`hello.ring_events ${events} is out of range (0..${RING_MAX_EVENTS})`);
  // The head's sparse part: a few bindings and tables a step; a larger one goes as a message.
  const maxExtra = Math.min(16 << 20, Math.max(64 << 10, 64 * rows));
  return { maxRows: rows, maxTokens: tokens, maxEvents: events, maxExtra, vocab: Number(a.ringVocab ?? 0) };
}

export class TelemetryRingReader {
  private readonly places: ColumnPlace[];
  readonly slotBytes: number;
  private readonly head = Buffer.alloc(RING_LAYOUT.slot_header_bytes);
  private readonly word = Buffer.alloc(8);

  private constructor(
    readonly path: string,
    private fd: number,
    readonly ask: RingAsk,
  ) {
    const { places, slotBytes } = columnPlaces(ask);
    this.places = places;
    this.slotBytes = slotBytes;
  }

  /** A fresh ring at `file` (a previous one is replaced: an engine still mapping it keeps its copy). */
  static create(file: string, ask: RingAsk): TelemetryRingReader {
    const { slotBytes } = columnPlaces(ask);
    const size = RING_LAYOUT.header_bytes + RING_LAYOUT.slots * slotBytes;
    fs.rmSync(file, { force: true });
    const fd = fs.openSync(file, fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o600);
    try {
      fs.ftruncateSync(fd, size);
      const h = Buffer.alloc(RING_LAYOUT.header_bytes);
      h.write(RING_LAYOUT.magic, RING_HEADER.magic, 'latin1'); // and magic_hi: the 8 bytes WBTRING1
      h.writeUInt32LE(RING_LAYOUT.version, RING_HEADER.version);
      h.writeUInt32LE(RING_LAYOUT.slots, RING_HEADER.slots);
      h.writeUInt32LE(ask.maxRows, RING_HEADER.max_rows);
      h.writeUInt32LE(ask.maxTokens, RING_HEADER.max_tokens);
      h.writeUInt32LE(ask.maxEvents, RING_HEADER.max_events);
      h.writeUInt32LE(ask.vocab >>> 0, RING_HEADER.vocab);
      h.writeBigUInt64LE(BigInt(slotBytes), RING_HEADER.slot_bytes);
      h.writeUInt32LE(ask.maxExtra, RING_HEADER.max_extra);
      fs.writeSync(fd, h, 0, h.length, 0);
    } catch (e) {
      fs.closeSync(fd);
      fs.rmSync(file, { force: true });
      throw e;
    }
    return new TelemetryRingReader(file, fd, ask);
  }

  get closed(): boolean {
    return this.fd < 0;
  }

  /** The header's written word: the seq of the last whole write that carries its head (extra). */
  written(): number {
    if (this.fd < 0) return 0;
    fs.readSync(this.fd, this.word, 0, 8, RING_HEADER.written);
    return Number(this.word.readBigUInt64LE(0));
  }

  /** Tells the client the slots up to `seq` were taken: it may write over them. */
  markConsumed(seq: number): void {
    if (this.fd < 0) return;
    this.word.writeBigUInt64LE(BigInt(seq), 0);
    fs.writeSync(this.fd, this.word, 0, 8, RING_HEADER.consumed);
  }

  /** The present columns of one read, in slot order (reused). */
  private readonly want: { place: ColumnPlace; bytes: number }[] = [];
  private scratch = new Uint8Array(0);

  /**
   * Each present column as its own copy (a Uint8Array on its own buffer, as the readers expect).
   * Columns lie in slot order with their capacity between them; those at most COALESCE_GAP apart
   * are read with one pread into the scratch and copied out: at 1024 rows a head's ~8 columns cost
   * one or two system calls instead of one each.
   */
  private readColumns(base: number, want: { place: ColumnPlace; bytes: number }[]): Map<string, Uint8Array> {
    const columns = new Map<string, Uint8Array>();
    let i = 0;
    while (i < want.length) {
      if (want[i].bytes === 0) {
        columns.set(want[i].place.name, new Uint8Array(0));
        i++;
        continue;
      }
      const lo = want[i].place.at;
      let hi = lo + want[i].bytes;
      let j = i + 1;
      for (; j < want.length; j++) {
        const w = want[j];
        if (w.bytes === 0) continue;
        if (w.place.at - hi > COALESCE_GAP) break;
        hi = w.place.at + w.bytes;
      }
      const span = hi - lo;
      if (this.scratch.length < span) this.scratch = new Uint8Array(Math.max(span, 2 * this.scratch.length));
      const got = fs.readSync(this.fd, this.scratch, 0, span, base + lo);
      // A short read (the file cut under us) reads as zeros, as a fresh buffer did: never a previous slot's bytes.
      if (got < span) this.scratch.fill(0, Math.max(0, got), span);
      for (let k = i; k < j; k++) {
        const w = want[k];
        const from = w.place.at - lo;
        columns.set(w.place.name, w.bytes === 0 ? new Uint8Array(0) : this.scratch.slice(from, from + w.bytes));
      }
      i = j;
    }
    return columns;
  }

  private seqAt(base: number): number {
    fs.readSync(this.fd, this.head, 0, this.head.length, base);
    return Number(this.head.readBigUInt64LE(RING_SLOT.seq));
  }

  /** The slot written as `seq` (2k for write k), whole, or why not. */
  read(seq: number): RingSlotRead | RingMiss {
    if (this.fd < 0) return { garbage: 'bad_seq', detail: 'the ring is closed' };
    if (!Number.isSafeInteger(seq) || seq < 2 || seq % 2 !== 0) return { garbage: 'bad_seq', detail: `ring_seq ${seq} is not a whole write's seq` };
    const base = RING_LAYOUT.header_bytes + ((seq / 2 - 1) % RING_LAYOUT.slots) * this.slotBytes;
    const before = this.seqAt(base);
    if (before !== seq) return { garbage: 'torn', detail: `slot holds seq ${before}, the head named ${seq}` };
    const h = this.head;
    const wave = Number(h.readBigUInt64LE(RING_SLOT.wave));
    const rows = h.readUInt32LE(RING_SLOT.rows);
    const tokens = h.readUInt32LE(RING_SLOT.tokens);
    const events = h.readUInt32LE(RING_SLOT.events);
    const present = h.readUInt32LE(RING_SLOT.present);
    const extraLen = h.readUInt32LE(RING_SLOT.extra_len);
    const count: Record<string, number> = { max_rows: rows, max_tokens: tokens, max_events: events, max_extra: extraLen };
    const want = this.want;
    want.length = 0;
    for (const p of this.places) {
      if (!(present & (1 << p.bit))) continue;
      const n = count[p.count];
      if (n > p.capacity) return { garbage: 'bad_counts', detail: `${p.name}: ${n} values, the ring holds ${p.capacity}` };
      want.push({ place: p, bytes: n * p.size });
    }
    const columns = this.readColumns(base, want);
    const after = this.seqAt(base);
    if (after !== seq) return { garbage: 'torn', detail: `slot rewritten while read (seq ${seq} -> ${after})` };
    return { wave, rows, tokens, events, extraLen, columns };
  }

  close(): void {
    if (this.fd < 0) return;
    fs.closeSync(this.fd);
    this.fd = -1;
    fs.rmSync(this.path, { force: true });
  }
}
