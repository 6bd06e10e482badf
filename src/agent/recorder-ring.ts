// The flight recorder's ring on the agent's side (docs/recorder.md): the agent creates the file
// (0600, beside the mailbox) that its engine client maps and copies each forward's inputs into,
// and reads it back when it is flushed. The layout is proto/layouts.json's "recorder" (src/shm-layouts.ts);
// the writers are clients/python/wavebus_client/recorder.py and src/client/recorder.ts. The agent reads with pread on its own
// descriptor: the same page cache as the engine's mapping, and nothing the engine can point
// elsewhere (every length read is checked against the slot it lies in).
import * as fs from 'fs';
import { ConfigError } from '../errors';
import { layout, readField, writeField } from '../shm-layouts';
import { RecorderEntry, toPlain } from '../proto';

/** The ring's layout (proto/layouts.json "recorder"). */
export const RECORDER = layout('recorder');
const HEAD = RECORDER.structs.header;
const SLOT = RECORDER.structs.slot;
const H = HEAD.bytes;
const SH = SLOT.bytes;
const F = HEAD.fields;
const S = SLOT.fields;

export interface RecorderSettings {
  /** K: forwards kept. */
  forwards: number;
  /** The ring's data bytes in all (each slot holds maxBytes / K). */
  maxBytes: number;
}

/** One whole forward read out of the ring. */
export interface RingEntry {
  slot: number;
  /** 1, 2, ...: the client's count. */
  forward: number;
  entry: Record<string, any>;
  tooLarge: boolean;
  /** Input i's bytes (empty when too large). */
  data: Buffer[];
}

/** A slot left out: being written (the engine died mid-copy, or it is being overwritten now) or unreadable. */
export interface TornSlot {
  slot: number;
  forward: number;
  why: string;
}

export interface RingRead {
  entries: RingEntry[];
  torn: TornSlot[];
  /** Forwards the client began recording in all. */
  forwards: number;
  /** The engine's last words (an uncaught exception), if its client wrote any. */
  note: string;
  pid: number;
}

function align8(n: number): number {
  return Math.ceil(n / 8) * 8;
}

/** Slot stride for these settings: its header, a share of maxBytes, and room for the entry. */
export function slotStride(s: RecorderSettings): number {
  return align8(SH + Math.floor(s.maxBytes / s.forwards) + 64 * 1024);
}

export class RecorderRing {
  private constructor(
    readonly path: string,
    private fd: number,
    readonly slots: number,
    readonly stride: number,
  ) {}

  /** A fresh ring at `file` (a previous agent's is replaced: an engine still mapping it keeps its copy). */
  static create(file: string, s: RecorderSettings): RecorderRing {
    const stride = slotStride(s);
    const size = H + s.forwards * stride;
    fs.rmSync(file, { force: true });
    const fd = fs.openSync(file, fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o600);
    try {
      fs.ftruncateSync(fd, size);
      const head = Buffer.alloc(H);
      writeField(head, 0, F.magic, RECORDER.constant('magic'));
      writeField(head, 0, F.version, RECORDER.constant('version'));
      writeField(head, 0, F.slots, s.forwards);
      writeField(head, 0, F.stride, stride);
      fs.writeSync(fd, head, 0, H, 0);
    } catch (e) {
      fs.closeSync(fd);
      throw new ConfigError(`flight recorder ring ${file}: ${(e as Error).message} (WAVEBUS_RECORD_MAX_BYTES too large for this file system?)`, 'ERR_RECORDER');
    }
    return new RecorderRing(file, fd, s.forwards, stride);
  }

  /** The newest wave of a whole forward in the ring (0: none), reading only the entries. */
  newestWave(): number {
    let w = 0;
    for (let slot = 0; slot < this.slots; slot++) {
      const r = this.readSlot(slot, false);
      if (r && !('why' in r)) w = Math.max(w, Number(r.entry.wave ?? 0));
    }
    return w;
  }

  /** Whatever the ring holds now, oldest forward first; slots being written are named, not read. */
  read(): RingRead {
    const head = Buffer.alloc(H);
    fs.readSync(this.fd, head, 0, H, 0);
    const forwards = Number(readField(head, 0, F.forwards));
    const noteLen = Math.min(Number(readField(head, 0, F.note_len)), F.note.bytes);
    const note = head.subarray(F.note.at, F.note.at + noteLen).toString('utf8');
    const pid = Number(readField(head, 0, F.pid));
    const entries: RingEntry[] = [];
    const torn: TornSlot[] = [];
    for (let slot = 0; slot < this.slots; slot++) {
      const r = this.readSlot(slot);
      if (r === null) continue;
      if ('why' in r) torn.push(r);
      else entries.push(r);
    }
    entries.sort((a, b) => a.forward - b.forward);
    return { entries, torn, forwards, note, pid };
  }

  private readSlot(slot: number, withData = true): RingEntry | TornSlot | null {
    const off = H + slot * this.stride;
    const sh = Buffer.alloc(SH);
    fs.readSync(this.fd, sh, 0, SH, off);
    const c1 = readField(sh, 0, S.commit) as bigint;
    if (c1 === 0n) return null;
    if (c1 % 2n === 1n) return { slot, forward: Number((c1 - 1n) / 2n) + 1, why: 'being written (the commit word is odd)' };
    const forward = Number(c1 / 2n);
    const entryLen = Number(readField(sh, 0, S.entry_len));
    const flags = Number(readField(sh, 0, S.flags));
    const dataLen = Number(readField(sh, 0, S.data_len));
    const dataAt = SH + align8(entryLen);
    if (SH + entryLen > this.stride || dataAt + dataLen > this.stride) return { slot, forward, why: `lengths past the slot (entry ${entryLen}, data ${dataLen}, slot ${this.stride})` };
    const body = Buffer.alloc((withData ? dataAt + dataLen : SH + entryLen) - SH);
    fs.readSync(this.fd, body, 0, body.length, off + SH);
    // The same whole forward before and after: else it was overwritten while read.
    fs.readSync(this.fd, sh, S.commit.at, S.commit.bytes, off + S.commit.at);
    if (readField(sh, 0, S.commit) !== c1) return { slot, forward, why: 'overwritten while read' };
    let entry: Record<string, any>;
    try {
      entry = toPlain<Record<string, any>>(RecorderEntry, RecorderEntry.decode(body.subarray(0, entryLen)));
    } catch (e) {
      return { slot, forward, why: `entry does not decode: ${(e as Error).message}` };
    }
    const tooLarge = (flags & RECORDER.constant('flag_too_large')) !== 0;
    const data: Buffer[] = [];
    if (!tooLarge && withData) {
      const sizes = (entry.inputBytes ?? []).map(Number);
      if (sizes.length !== (entry.inputs ?? []).length || sizes.reduce((a: number, b: number) => a + b, 0) !== dataLen) {
        return { slot, forward, why: `input sizes ${JSON.stringify(sizes)} do not add up to the slot's ${dataLen} bytes` };
      }
      let at = dataAt - SH;
      for (const n of sizes) {
        data.push(body.subarray(at, at + n));
        at += n;
      }
    }
    return { slot, forward, entry, tooLarge, data };
  }

  close(opts: { unlink?: boolean } = {}): void {
    if (this.fd < 0) return;
    fs.closeSync(this.fd);
    this.fd = -1;
    if (opts.unlink) fs.rmSync(this.path, { force: true });
  }
}
