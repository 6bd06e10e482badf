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

/** The engine client's side: map once, then read without system calls. */
export class MailboxReader {
  private constructor(readonly path: string, private readonly r: NativeMailboxReader) {}

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

  /**
   * The vector of `wave` if slot wave % 8 holds it; `{ wave, 0, 0, implied: true }` when the wave is
   * below the floor and no slot holds it (nothing due); else undefined (not yet published,
   * overwritten by a later wave, or mid-update).
   */
  read(wave: number): WaveVector | undefined {
    const w = checkWave(wave);
    const got = nativeCall(() => this.r.read(w));
    return got === undefined ? undefined : toVector(got);
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
    return nativeCall(() => this.r.features());
  }

  epoch(): number {
    return nativeCall(() => this.r.epoch());
  }

  /** Waves below this need no vector (0: none yet). */
  floor(): number {
    return nativeCall(() => this.r.floor());
  }

  close(): void {
    this.r.close();
  }
}
