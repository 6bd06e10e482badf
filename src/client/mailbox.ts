// The wave-vector mailbox: a small shared file (under /dev/shm) with a seqlock ring of the last
// 8 wave vectors and a floor. The agent publishes each wave's [wave, config_due, dump_due] one wave
// ahead (docs/architecture.md, "Waves") and raises the floor: a wave below it whose slot does not
// hold it has nothing due. The engine client checks "is anything due for wave N?" with plain
// memory loads, no system call.
// Byte layout: docs/native.md (a Python client reads it with mmap + struct).
import * as fs from 'fs';
import { setTimeout as sleep } from 'timers/promises';
import { NativeError, ProtocolError, type WavebusError } from '../errors';
import { native, nativeAsync, nativeCall, type MailboxVector, NativeMailboxReader, NativeMailboxWriter } from '../native';

// What a slot read found (the addon's SlotRead).
const FOUND = 0;
const OTHER = 1;
const BUSY = 2;
const IMPLIED = 3;
const LATER = 4;

/** Feature bits in the header, set by the agent so an all-off client can skip everything. */
export const MailboxFeature = {
  BUS_ACTIVE: 1,
  HOT_RELOAD: 2,
  DETECTORS: 4,
  SNAPSHOTS: 8,
  /** A capture armed on the running job is in force here: a forward whose vector is late is waited for (docs/control.md). */
  LIVE_CAPTURES: 16,
  /** The flight recorder is on: the engine copies each forward's inputs into its ring (docs/recorder.md). */
  RECORDER: 32,
  /**
   * Wake on demand (docs/control.md, "An idle job"): this rank heads its replica and something is
   * armed on a job whose bus sleeps: send wave heads (the vector is not read until BUS_ACTIVE).
   */
  HEADS: 64,
  /** rank_divergence is on: the engine writes its decision ring each wave (docs/runtime-guard.md). */
  RANK_DIGEST: 128,
} as const;

/** Layout constants (from the addon, the single source of truth). */
export const MAILBOX_LAYOUT = native.mailboxLayout;

export interface WaveVector {
  wave: number;
  /** Non-zero when a new config is due in this wave. */
  configDue: number;
  /** Non-zero when dump jobs are due at the end of this wave (the number of jobs). */
  dumpDue: number;
  /** Reserved, always 0 for now. */
  snapshotDue?: number;
  /** True when no slot held the wave and the floor said nothing is due (the wave is below it). */
  implied?: boolean;
}

function checkPath(p: unknown, field: string): string {
  if (typeof p !== 'string' || p === '' || p.includes('\0')) throw new NativeError(`${field} must be a non-empty path, got ${JSON.stringify(p)}`, 'ERR_INVALID_ARG');
  return p;
}

function checkU32(v: unknown, field: string): number {
  const n = typeof v === 'boolean' ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > 0xffffffff) {
    throw new NativeError(`${field} must be an unsigned 32-bit integer (or boolean), got ${String(v)}`, 'ERR_INVALID_ARG');
  }
  return n;
}

function checkWave(v: unknown, field = 'wave'): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) {
    throw new NativeError(`${field} must be a non-negative safe integer, got ${String(v)}`, 'ERR_INVALID_ARG');
  }
  return v;
}

function toVector(got: MailboxVector): WaveVector {
  const v: WaveVector = { wave: got[0], configDue: got[1], dumpDue: got[2], snapshotDue: got[3] };
  if (got[4] === 1) v.implied = true;
  return v;
}

function exists(p: string): boolean {
  try {
    return fs.lstatSync(p, { throwIfNoEntry: false }) !== undefined;
  } catch {
    return true; // not ours to say why (EACCES, ENOTDIR): the open names it
  }
}

/** Codes of an open that may succeed once the agent has created the file and written its header. */
const MAILBOX_NOT_READY = new Set(['ERR_MAILBOX_OPEN', 'ERR_MAILBOX_FORMAT']);

/** The agent's side. One writer per mailbox file. */
export class MailboxWriter {
  private constructor(readonly path: string, private readonly w: NativeMailboxWriter) {}

  /**
   * Create the file (or take over one a previous agent left at the same path; its slots are
   * emptied). `ownerRank`: the global rank of the agent creating it, stored in the header so the
   * host receiver writes only its own replica's mailboxes (host-receiver.ts).
   */
  static create(path: string, ownerRank?: number): MailboxWriter {
    const p = checkPath(path, 'path');
    const owner = ownerRank === undefined ? undefined : checkU32(ownerRank, 'ownerRank') + 1;
    return new MailboxWriter(p, nativeCall(() => native.MailboxWriter.create(p, owner)));
  }

  /**
   * Write the vectors of a mailbox another local agent created (the host receiver: docs/bus.md,
   * "One receiver per host"): nothing in it is reset, and it must already have its header.
   */
  static attach(path: string): MailboxWriter {
    const p = checkPath(path, 'path');
    return new MailboxWriter(p, nativeCall(() => native.MailboxWriter.attach(p)));
  }

  /**
   * Take the exclusive lock on `path` (flock): its fd when taken (held until fs.closeSync(fd) or
   * this process ends), -1 when another open of the file holds it. The kernel drops it when its
   * holder dies.
   */
  static holdLock(path: string): number {
    const p = checkPath(path, 'path');
    return nativeCall(() => native.MailboxWriter.holdLock(p));
  }

  /**
   * Write one wave's vector; with `floor`, raise (or move) the floor after it: every wave below
   * `floor` is decided (its vector, if anything was due, is in its slot). With `wake` false the
   * sleepers are not woken: announce() does it (the host receiver stores every rank's slot first).
   */
  publish(v: WaveVector | { wave: number; configDue: number | boolean; dumpDue: number | boolean; snapshotDue?: number | boolean }, floor?: number, wake = true): void {
    if (v === null || typeof v !== 'object') throw new NativeError('wave vector must be an object', 'ERR_INVALID_ARG');
    const wave = checkWave(v.wave, 'wave vector.wave');
    const c = checkU32(v.configDue, 'wave vector.configDue');
    const d = checkU32(v.dumpDue, 'wave vector.dumpDue');
    const s = checkU32(v.snapshotDue ?? 0, 'wave vector.snapshotDue');
    const f = floor === undefined ? undefined : checkWave(floor, 'floor');
    nativeCall(() => this.w.publish(wave, c, d, s, f, wake));
  }

  /** Wake whoever sleeps on this mailbox (after publishes made with wake false). */
  announce(): void {
    nativeCall(() => this.w.announce());
  }

  /** The floor alone (after a snapshot): waves below it need no vector. */
  setFloor(floor: number): void {
    const f = checkWave(floor, 'floor');
    nativeCall(() => this.w.setFloor(f));
  }

  /** Replace the feature bits (MailboxFeature.*). */
  setFeatures(bits: number): void {
    if (!Number.isSafeInteger(bits) || bits < 0) throw new NativeError(`features must be a non-negative integer bit set, got ${bits}`, 'ERR_INVALID_ARG');
    nativeCall(() => this.w.setFeatures(bits));
  }

  /** The coordinator epoch the vectors belong to. */
  setEpoch(epoch: number): void {
    nativeCall(() => this.w.setEpoch(checkWave(epoch, 'epoch')));
  }

  /** The global rank of the agent that created the file; undefined when it did not say. */
  get ownerRank(): number | undefined {
    const o = nativeCall(() => this.w.owner());
    return o === 0 ? undefined : o - 1;
  }

  /**
   * The ticket of the before_forward the engine client waits on (0: none), loaded after a
   * capture's copy: any other ticket means the engine may have changed the inputs meanwhile.
   */
  captureWaiting(): number {
    return nativeCall(() => this.w.captureWaiting());
  }

  /** Unmap; with { unlink: true } also remove the file (readers that have it mapped keep their mapping). */
  close(opts: { unlink?: boolean } = {}): void {
    this.w.close();
    if (opts.unlink) fs.rmSync(this.path, { force: true });
  }
}

/** What dueBits() says of a wave: bits of what is due, or NOT_KNOWN (no vector yet: not published, overwritten, mid-update). */
export const DUE_CONFIG = 1;
export const DUE_DUMP = 2;
export const DUE_SNAPSHOT = 4;
export const NOT_KNOWN = -1;

// Word indexes into the mapping (docs/native.md; the addon's constants are the source of the byte offsets).
const H_FEATURES = 16 / 8;
const H_EPOCH = 24 / 8;
const H_FLOOR = 40 / 8;
const S_SEQ = 0;
const S_WAVE_LO = 8 / 4;
const S_WAVE_HI = 12 / 4;
const S_CONFIG = 16 / 4;
const S_DUMP = 20 / 4;
const S_SNAPSHOT = 24 / 4;
const SPINS = 4096;

/**
 * The engine client's side: map once, then read without system calls. The header's words and the
 * slots' seqlock are read with Atomics loads on the addon's mapping (view()), in JS: a read is a few
 * memory loads, no addon call (the per-step calls make several). The byte layout: docs/native.md.
 */
export class MailboxReader {
  private readonly u32: Uint32Array;
  private closed = false;
  /** The last read's vector fields (readSlot's out parameters: no allocation per read). */
  private got = { config: 0, dump: 0, snapshot: 0 };

  private constructor(readonly path: string, private readonly r: NativeMailboxReader) {
    const mem = nativeCall(() => r.view());
    if (mem.length < MAILBOX_LAYOUT.fileBytes || mem.byteOffset % 8 !== 0) throw new NativeError(`mailbox ${path}: its mapping is not ${MAILBOX_LAYOUT.fileBytes} aligned bytes`, 'ERR_MAILBOX_FORMAT');
    this.u32 = new Uint32Array(mem.buffer, mem.byteOffset, MAILBOX_LAYOUT.fileBytes / 4);
  }

  static open(path: string): MailboxReader {
    const p = checkPath(path, 'path');
    return new MailboxReader(p, nativeCall(() => native.MailboxReader.open(p)));
  }

  /**
   * Open, retrying every 20 ms while the file is missing or its header not yet written (the agent
   * is starting: it writes the magic last), for at most `timeoutMs` (0: one try). Then a
   * ProtocolError: ERR_MAILBOX_MISSING when the file never appeared, else the last open's code
   * (ERR_MAILBOX_FORMAT: header never written). The Python client's Mailbox.wait_open does the same.
   */
  static async waitOpen(path: string, timeoutMs: number): Promise<MailboxReader> {
    const p = checkPath(path, 'path');
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      let failed: WavebusError;
      if (!exists(p)) {
        failed = new ProtocolError(`mailbox ${p} does not exist (is the wavebus agent of this rank running?)`, 'ERR_MAILBOX_MISSING');
      } else {
        try {
          return MailboxReader.open(p);
        } catch (e) {
          failed = e as WavebusError;
          if (!MAILBOX_NOT_READY.has(failed.code)) throw e;
        }
      }
      if (performance.now() >= deadline) throw new ProtocolError(`${failed.message} (waited ${timeoutMs} ms)`, failed.code);
      await sleep(Math.max(1, Math.min(20, deadline - performance.now())));
    }
  }

  private live(): void {
    if (this.closed) throw new NativeError(`mailbox reader ${this.path} is closed`, 'ERR_CLOSED');
  }

  /**
   * The vector of `wave` if slot wave % 8 holds it; `{ wave, 0, 0, implied: true }` when the wave is
   * below the floor and no slot holds it (nothing due); else undefined (not yet published,
   * overwritten by a later wave, or mid-update).
   */
  read(wave: number): WaveVector | undefined {
    const w = checkWave(wave);
    this.live();
    const r = this.lookup(w);
    if (r === FOUND) return { wave: w, configDue: this.got.config, dumpDue: this.got.dump, snapshotDue: this.got.snapshot };
    if (r === IMPLIED) return { wave: w, configDue: 0, dumpDue: 0, snapshotDue: 0, implied: true };
    return undefined;
  }

  /**
   * read() for the per-step calls, allocating nothing: DUE_CONFIG | DUE_DUMP | DUE_SNAPSHOT of
   * what `wave`'s vector says is due (0: nothing, implied by the floor included), or NOT_KNOWN
   * when read() would say undefined. `wave` must be a non-negative safe integer (the caller checked).
   */
  dueBits(wave: number): number {
    this.live();
    const r = this.lookup(wave);
    if (r === IMPLIED) return 0;
    if (r !== FOUND) return NOT_KNOWN;
    const g = this.got;
    return (g.config !== 0 ? DUE_CONFIG : 0) | (g.dump !== 0 ? DUE_DUMP : 0) | (g.snapshot !== 0 ? DUE_SNAPSHOT : 0);
  }

  /**
   * A header word (u64) as a Number, from two u32 Atomics loads: no BigInt allocated per read (the
   * per-step calls read several). The high half is read on both sides of the low one and the read
   * retried if it moved, so a value crossing 2^32 while read is never torn. Bounded: a word that
   * never holds still (garbage in the file) is read as it last was, never waited on.
   */
  private word(index: number): number {
    const u32 = this.u32;
    let hi = 0;
    let lo = 0;
    for (let attempt = 0; attempt < SPINS; attempt++) {
      hi = Atomics.load(u32, 2 * index + 1);
      lo = Atomics.load(u32, 2 * index);
      if (Atomics.load(u32, 2 * index + 1) === hi) break;
    }
    return hi * 0x100000000 + lo;
  }

  /** The addon's Lookup, in JS (native/mailbox_reader.cc): the floor first, then the slot's seqlock. */
  private lookup(wave: number): number {
    const floor = this.word(H_FLOOR);
    const r = this.readSlot(wave);
    return r === OTHER && wave < floor ? IMPLIED : r;
  }

  /**
   * Seqlock read of the slot for `wave` (the addon's ReadSlot): the seq word, the fields, the seq
   * again; odd or changed is a writer mid-update (busy after the spin: treated as not arrived).
   * Atomics loads are sequentially consistent, so the fields are read between the two seq loads.
   * The seq word is compared by its low half (u32 loads, no BigInt per read): it moves by one per
   * store, so the half changes whenever the word does within any read's few loads; the high half
   * is read only to tell a never-written slot (seq 0) from one whose low half wrapped.
   */
  private readSlot(wave: number): number {
    const u32 = this.u32;
    const slot = MAILBOX_LAYOUT.headerBytes + MAILBOX_LAYOUT.slotBytes * (wave % MAILBOX_LAYOUT.slots);
    const at = slot >> 2;
    const seqLo = at + 2 * S_SEQ; // little-endian: the low half comes first
    for (let attempt = 0; attempt < SPINS; attempt++) {
      const s1 = Atomics.load(u32, seqLo);
      if ((s1 & 1) !== 0) continue;
      const lo = Atomics.load(u32, at + S_WAVE_LO);
      const hi = Atomics.load(u32, at + S_WAVE_HI);
      const config = Atomics.load(u32, at + S_CONFIG);
      const dump = Atomics.load(u32, at + S_DUMP);
      const snapshot = Atomics.load(u32, at + S_SNAPSHOT);
      if (Atomics.load(u32, seqLo) !== s1) continue;
      const unwritten = s1 === 0 && Atomics.load(u32, seqLo + 1) === 0;
      // An empty slot's wave is 2^64-1 (hi and lo all ones): never a safe integer, never later.
      const w = hi * 0x100000000 + lo;
      if (unwritten || w !== wave) return !unwritten && !(hi === 0xffffffff && lo === 0xffffffff) && w > wave ? LATER : OTHER;
      this.got.config = config;
      this.got.dump = dump;
      this.got.snapshot = snapshot;
      return FOUND;
    }
    return BUSY;
  }

  /**
   * Wait for `wave`'s vector without a system call per check: the reader sleeps on the header's
   * publish counter, which the writer bumps and wakes after every slot or floor write. Resolves with
   * the vector (implied when the floor rose past `wave`), 'timeout' when `timeoutMs` ran out, or 'overwritten' when the slot already holds a
   * later wave. The JS thread stays free meanwhile.
   */
  async waitFor(wave: number, timeoutMs: number): Promise<WaveVector | 'timeout' | 'overwritten'> {
    const w = checkWave(wave);
    if (!Number.isSafeInteger(timeoutMs) || timeoutMs < 0) throw new NativeError(`timeoutMs must be a non-negative integer, got ${timeoutMs}`, 'ERR_INVALID_ARG');
    const got = await nativeAsync(() => this.r.waitFor(w, timeoutMs));
    if (got === false) return 'timeout';
    if (got === undefined) return 'overwritten';
    return toVector(got);
  }

  /**
   * Says which before_forward this client waits on (a ticket > 0), or that it waits on none (0):
   * stored before the request and cleared before the engine may touch the inputs again, so the
   * agent keeps only a copy made while the engine still waited (docs/snapshots.md).
   */
  setCaptureWaiting(ticket: number): void {
    nativeCall(() => this.r.setCaptureWaiting(checkWave(ticket, 'ticket')));
  }

  features(): number {
    this.live();
    return this.word(H_FEATURES);
  }

  epoch(): number {
    this.live();
    return this.word(H_EPOCH);
  }

  /** Waves below this need no vector (0: none yet). */
  floor(): number {
    this.live();
    return this.word(H_FLOOR);
  }

  close(): void {
    this.closed = true;
    this.r.close(); // the view's Buffer keeps the mapping until it is collected
  }
}
