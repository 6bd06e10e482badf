// The flight recorder's writer in the TypeScript client (docs/recorder.md): each forward's inputs
// and context copied into the ring of the last K forwards that the agent created and reads back
// after a crash. Per forward: the entry encoded, one memcpy per input into the mapped file, no
// message, no system call. The layout is proto/layouts.json's "recorder" (src/shm-layouts.ts); the
// agent's reader is src/agent/recorder-ring.ts, the Python writer wavebus_client/recorder.py.
import { ConfigError, WavebusError } from '../errors';
import { parseDType, itemSize } from '../artifacts/dtype';
import { layout, readField, writeField, type LayoutField } from '../shm-layouts';
import { ShmSegment } from '../memory';
import { native, nativeCall } from '../native';
import { encodeTrusted, RecorderEntry } from '../proto';
import type { ClientRegion } from './region';

const L = layout('recorder');
const HEAD = L.structs.header;
const SLOT = L.structs.slot;
const F = HEAD.fields;
const S = SLOT.fields;
const MAGIC = L.constant('magic');
const VERSION = L.constant('version');
const TOO_LARGE = L.constant('flag_too_large');

/** The per-forward writes use plain offsets: the field types they assume are checked once, here. */
function expectType(f: LayoutField, type: LayoutField['type']): number {
  if (f.type !== type) throw new WavebusError('ERR_LAYOUT', `proto/layouts.json: recorder.${f.name} is ${f.type}; src/client/recorder.ts writes it as ${type}`);
  return f.at;
}
const COMMIT_AT = expectType(S.commit, 'u64');
const FORWARDS_AT = expectType(F.forwards, 'u64');
const ENTRY_LEN_AT = expectType(S.entry_len, 'u32');
const FLAGS_AT = expectType(S.flags, 'u32');
const DATA_LEN_AT = expectType(S.data_len, 'u64');

const align8 = (n: number): number => Math.ceil(n / 8) * 8;

/** One input as the engine passes it to beforeForward. */
export interface RecordedInput {
  region: string;
  offset?: number;
  dtype: string;
  shape: number[];
}

/** The client's side of one ring file (the path the agent's hello named), mapped once. */
export class RingWriter {
  /** Forwards begun in this ring (a client that comes back to it goes on numbering). */
  forwards: number;
  tooLarge = 0;
  private readonly words: BigUint64Array;

  private constructor(readonly path: string, private readonly mem: Buffer, readonly slots: number, readonly stride: number) {
    // The commit word and the forward count are stored with Atomics: never torn, never reordered
    // after the bytes they commit (the agent may read the ring at any moment, the engine may die).
    this.words = new BigUint64Array(mem.buffer, mem.byteOffset, Math.floor(mem.length / 8));
    this.forwards = Number(readField(mem, 0, F.forwards));
    writeField(mem, 0, F.pid, process.pid);
  }

  static open(path: string): RingWriter {
    const where = `flight recorder ring ${path}`;
    let mem: Buffer;
    try {
      mem = nativeCall(() => native.mapFile(path));
    } catch (e) {
      throw new WavebusError((e as WavebusError).code ?? 'ERR_RECORDER', `${where}: ${(e as Error).message}`);
    }
    if (mem.length < HEAD.bytes) throw new ConfigError(`${where}: ${mem.length} bytes, shorter than its header (${HEAD.bytes})`, 'ERR_RECORDER');
    const magic = Number(readField(mem, 0, F.magic));
    const version = Number(readField(mem, 0, F.version));
    if (magic !== MAGIC || version !== VERSION) throw new ConfigError(`${where}: not a version ${VERSION} ring (magic 0x${magic.toString(16)}, version ${version})`, 'ERR_RECORDER');
    const slots = Number(readField(mem, 0, F.slots));
    const stride = Number(readField(mem, 0, F.stride));
    if (slots < 1 || stride <= SLOT.bytes || stride % 8 !== 0 || HEAD.bytes + slots * stride > mem.length) {
      throw new ConfigError(`${where}: ${slots} slots of ${stride} bytes do not fit its ${mem.length} bytes`, 'ERR_RECORDER');
    }
    return new RingWriter(path, mem, slots, stride);
  }

  /** Copy one forward: `entry` is its RecorderEntry less `forward`, `data[i]` input i's bytes. */
  record(entry: Record<string, unknown>, data: Uint8Array[]): void {
    const n = this.forwards;
    const off = HEAD.bytes + (n % this.slots) * this.stride;
    const mem = this.mem;
    // Encoded first: an entry that does not encode leaves the ring as it was.
    let body = encodeTrusted(RecorderEntry, { ...entry, forward: n + 1 });
    // Odd: forward n is being written; a reader (or a death now) leaves this slot out.
    Atomics.store(this.words, (off + COMMIT_AT) / 8, BigInt(2 * n + 1));
    this.forwards = n + 1;
    Atomics.store(this.words, FORWARDS_AT / 8, BigInt(n + 1));
    let total = 0;
    for (const d of data) total += d.length;
    const dataAt = off + SLOT.bytes + align8(body.length);
    let flags = 0;
    if (dataAt + total > off + this.stride) {
      // Never half a forward: the entry alone (if it fits) says what did not.
      flags = TOO_LARGE;
      total = 0;
      this.tooLarge++;
      if (SLOT.bytes + body.length > this.stride) body = Buffer.alloc(0);
    } else {
      let pos = dataAt;
      for (const d of data) {
        mem.set(d, pos);
        pos += d.length;
      }
    }
    mem.writeUInt32LE(body.length, off + ENTRY_LEN_AT);
    mem.writeUInt32LE(flags, off + FLAGS_AT);
    mem.writeBigUInt64LE(BigInt(total), off + DATA_LEN_AT);
    mem.set(body, off + SLOT.bytes);
    Atomics.store(this.words, (off + COMMIT_AT) / 8, BigInt(2 * n + 2)); // whole
  }

  /** Why the engine is about to die (an uncaught exception), for the agent's crash-rank<g>.json. */
  note(text: string): void {
    let b = Buffer.from(text, 'utf8');
    if (b.length > F.note.bytes) b = b.subarray(0, F.note.bytes);
    this.mem.set(b, F.note.at);
    writeField(this.mem, 0, F.note_len, b.length);
  }
}

/**
 * The engine's registered regions as the recorder reads them: a shm region's segment is mapped
 * once (the engine's own memory, so the copy is a memcpy); a CUDA region is not readable here.
 */
export class RegionBytes {
  private readonly segments = new Map<string, Buffer>();

  /** Input `inp`'s bytes (checked against its region), or the reason it cannot be recorded. */
  bytesOf(inp: RecordedInput, region: ClientRegion, where: string): Uint8Array | string {
    const dtype = parseDType(inp.dtype, `${where}.dtype`);
    if (!Array.isArray(inp.shape) || inp.shape.some((d) => !Number.isSafeInteger(d) || d < 0)) {
      throw new ConfigError(`${where}.shape must be a list of non-negative integers, got ${JSON.stringify(inp.shape)}`);
    }
    const offset = inp.offset ?? 0;
    const nbytes = inp.shape.reduce((a, b) => a * b, 1) * itemSize(dtype);
    if (!Number.isSafeInteger(offset) || offset < 0 || offset + nbytes > region.nbytes) {
      throw new ConfigError(`${where}: bytes ${offset}..${offset + nbytes} lie outside region '${region.name}' (${region.nbytes} bytes)`);
    }
    if (region.kind === 'cuda') return `region '${region.name}' is CUDA memory, which the TypeScript client cannot copy into the ring`;
    let seg = this.segments.get(region.shmName as string);
    if (!seg) {
      try {
        seg = ShmSegment.open(region.shmName as string, { readonly: false }).buffer();
      } catch (e) {
        return `region '${region.name}': its segment ${region.shmName} cannot be mapped (${(e as Error).message})`;
      }
      this.segments.set(region.shmName as string, seg);
    }
    const at = (region.offset ?? 0) + offset;
    if (at + nbytes > seg.length) throw new ConfigError(`${where}: region '${region.name}' ends past its segment ${region.shmName} (${seg.length} bytes)`);
    return seg.subarray(at, at + nbytes);
  }

  close(): void {
    this.segments.clear();
  }
}

let noted: RingWriter | undefined;
let hooked = false;

/**
 * An uncaught exception (or unhandled rejection) writes its type and message into the ring before
 * the process dies. A monitor only: Node's own handling (print, exit) is left as it was.
 */
export function noteUncaught(ring: RingWriter): void {
  noted = ring;
  if (hooked) return;
  hooked = true;
  process.on('uncaughtExceptionMonitor', (err) => {
    try {
      const name = err instanceof Error ? err.constructor.name || err.name : typeof err;
      noted?.note(`uncaught ${name}: ${err instanceof Error ? err.message : String(err)}`);
    } catch {
      /* the engine is dying: never hide its own error */
    }
  });
}
