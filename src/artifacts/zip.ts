// A stored-only (no compression) zip writer, shaped the way torch.save lays out a .pt archive:
// every payload starts on a 64-byte boundary (local-header extra field "FB" holds the filler),
// real CRC32s, central directory, ZIP64 when any size or offset reaches 4 GiB.
//
// Two record kinds, both strictly sequential (see sink.ts for why nothing is patched afterwards):
// - addBuffer: small in-memory records (data.pkl, byteorder, version): CRC32 computed first, then
//   a complete local header, exactly as torch writes them.
// - addStream: tensor payloads. Their CRC32 is computed while the bytes go to disk, so the local
//   header carries flag bit 3 (CRC in a data descriptor after the data); the central directory has
//   the real CRC. Readers (miniz in torch, Python's zipfile) take CRC and sizes from the central
//   directory. This saves a full extra pass over the tensor bytes before writing: the sink computes
//   the record's CRC32 and the file's crc32c in the same pass as the write (FileSink.writeZip).
import * as zlib from 'zlib';
import { CaptureError } from '../errors';
import { FileSink } from './sink';

const LOCAL_SIG = 0x04034b50;
const CENTRAL_SIG = 0x02014b50;
const DESCRIPTOR_SIG = 0x08074b50;
const EOCD_SIG = 0x06054b50;
const EOCD64_SIG = 0x06064b50;
const LOCATOR64_SIG = 0x07064b50;
const FLAG_DESCRIPTOR = 1 << 3;
const FLAG_UTF8 = 1 << 11;
const ALIGN = 64;
// Fixed timestamp (1980-01-01 00:00) so identical inputs give identical archives.
const DOS_TIME = 0;
const DOS_DATE = (0 << 9) | (1 << 5) | 1;
const U32_MAX = 0xffffffff;

export interface ZipOptions {
  /**
   * Sizes/offsets at or above this use ZIP64 fields. Default 0xFFFFFFFF (the format's limit);
   * tests lower it to exercise ZIP64 without writing 4 GiB.
   */
  zip64Threshold?: number;
  /**
   * Offsets at or above this use ZIP64 fields; default zip64Threshold. Separate because miniz
   * (torch's reader) sanity-checks `32-bit offset field + size <= archive size`, which only a
   * really large archive passes once an offset field holds 0xFFFFFFFF.
   */
  zip64OffsetThreshold?: number;
}

interface CentralEntry {
  name: Buffer;
  flags: number;
  crc: number;
  size: number;
  offset: number;
}

function u64(n: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt(n));
  return b;
}

export class ZipWriter {
  private readonly entries: CentralEntry[] = [];
  private readonly names = new Set<string>();
  private readonly threshold: number;
  private readonly offsetThreshold: number;
  private finished = false;

  constructor(private readonly sink: FileSink, opts: ZipOptions = {}) {
    this.threshold = opts.zip64Threshold ?? U32_MAX;
    this.offsetThreshold = opts.zip64OffsetThreshold ?? this.threshold;
    for (const v of [this.threshold, this.offsetThreshold]) {
      if (!(Number.isInteger(v) && v > 0 && v <= U32_MAX)) throw new RangeError(`zip64 thresholds must be integers in 1..${U32_MAX}, got ${v}`);
    }
  }

  private checkName(name: string): Buffer {
    if (this.finished) throw new CaptureError(`zip ${this.sink.path}: record ${name} added after finish()`, 'ERR_ZIP');
    if (this.names.has(name)) throw new CaptureError(`zip ${this.sink.path}: duplicate record ${name}`, 'ERR_ZIP');
    const b = Buffer.from(name, 'utf8');
    if (b.length === 0 || b.length > 0xffff) throw new CaptureError(`zip ${this.sink.path}: bad record name length ${b.length}`, 'ERR_ZIP');
    this.names.add(name);
    return b;
  }

  /** Local header + extra fields (ZIP64 sizes when needed, then the FB alignment filler). */
  private localHeader(name: Buffer, flags: number, crc: number, size: number): Buffer {
    const offset = this.sink.offset;
    const zip64 = size >= this.threshold;
    const z64Len = zip64 ? 20 : 0;
    const start = offset + 30 + name.length + z64Len + 4;
    const pad = (ALIGN - (start % ALIGN)) % ALIGN;
    const h = Buffer.alloc(30 + name.length + z64Len + 4 + pad, 0x5a); // filler 'Z' like torch
    h.writeUInt32LE(LOCAL_SIG, 0);
    h.writeUInt16LE(zip64 ? 45 : 20, 4);
    h.writeUInt16LE(flags, 6);
    h.writeUInt16LE(0, 8); // stored
    h.writeUInt16LE(DOS_TIME, 10);
    h.writeUInt16LE(DOS_DATE, 12);
    h.writeUInt32LE(crc >>> 0, 14);
    h.writeUInt32LE(zip64 ? U32_MAX : size, 18);
    h.writeUInt32LE(zip64 ? U32_MAX : size, 22);
    h.writeUInt16LE(name.length, 26);
    h.writeUInt16LE(z64Len + 4 + pad, 28);
    name.copy(h, 30);
    let p = 30 + name.length;
    if (zip64) {
      h.writeUInt16LE(0x0001, p);
      h.writeUInt16LE(16, p + 2);
      h.writeBigUInt64LE(BigInt(size), p + 4);
      h.writeBigUInt64LE(BigInt(size), p + 12);
      p += 20;
    }
    h.write('FB', p, 'latin1');
    h.writeUInt16LE(pad, p + 2);
    return h;
  }

  private flagsFor(name: string, extra: number): number {
    // eslint-disable-next-line no-control-regex
    return (/^[\x00-\x7f]*$/.test(name) ? 0 : FLAG_UTF8) | extra;
  }

  /** A record whose bytes are in memory. */
  async addBuffer(name: string, data: Uint8Array): Promise<void> {
    const nb = this.checkName(name);
    const crc = zlib.crc32(data);
    const flags = this.flagsFor(name, 0);
    const offset = this.sink.offset;
    await this.sink.write(this.localHeader(nb, flags, crc, data.length));
    await this.sink.write(data);
    this.entries.push({ name: nb, flags, crc, size: data.length, offset });
  }

  /** A record streamed from `chunks`, which must total exactly `size` bytes. */
  async addStream(name: string, size: number, chunks: AsyncIterable<Uint8Array>): Promise<void> {
    const nb = this.checkName(name);
    const flags = this.flagsFor(name, FLAG_DESCRIPTOR);
    const offset = this.sink.offset;
    await this.sink.write(this.localHeader(nb, flags, 0, size));
    let crc = 0;
    let seen = 0;
    for await (const c of chunks) {
      seen += c.length;
      if (seen > size) throw new CaptureError(`zip ${this.sink.path}: record ${name} got more than ${size} bytes`, 'ERR_SOURCE');
      crc = await this.sink.writeZip(c, crc);
    }
    if (seen !== size) throw new CaptureError(`zip ${this.sink.path}: record ${name} got ${seen} of ${size} bytes`, 'ERR_SOURCE');
    const zip64 = size >= this.threshold;
    const d = Buffer.alloc(zip64 ? 24 : 16);
    d.writeUInt32LE(DESCRIPTOR_SIG, 0);
    d.writeUInt32LE(crc >>> 0, 4);
    if (zip64) {
      d.writeBigUInt64LE(BigInt(size), 8);
      d.writeBigUInt64LE(BigInt(size), 16);
    } else {
      d.writeUInt32LE(size, 8);
      d.writeUInt32LE(size, 12);
    }
    await this.sink.write(d);
    this.entries.push({ name: nb, flags, crc: crc >>> 0, size, offset });
  }

  /** Central directory, ZIP64 end record + locator when needed, end record. */
  async finish(): Promise<void> {
    if (this.finished) return;
    this.finished = true;
    const t = this.threshold;
    const ot = this.offsetThreshold;
    const cdStart = this.sink.offset;
    const parts: Buffer[] = [];
    let anyZip64 = false;
    for (const e of this.entries) {
      const bigSize = e.size >= t;
      const bigOffset = e.offset >= ot;
      const extra: Buffer[] = [];
      if (bigSize) extra.push(u64(e.size), u64(e.size));
      if (bigOffset) extra.push(u64(e.offset));
      const extraLen = extra.length ? 4 + 8 * extra.length : 0;
      const zip64 = extra.length > 0;
      anyZip64 ||= zip64;
      const h = Buffer.alloc(46 + e.name.length + extraLen);
      h.writeUInt32LE(CENTRAL_SIG, 0);
      h.writeUInt16LE(zip64 ? 45 : 20, 4); // made by (MS-DOS host)
      h.writeUInt16LE(zip64 ? 45 : 20, 6); // needed
      h.writeUInt16LE(e.flags, 8);
      h.writeUInt16LE(0, 10);
      h.writeUInt16LE(DOS_TIME, 12);
      h.writeUInt16LE(DOS_DATE, 14);
      h.writeUInt32LE(e.crc, 16);
      h.writeUInt32LE(bigSize ? U32_MAX : e.size, 20);
      h.writeUInt32LE(bigSize ? U32_MAX : e.size, 24);
      h.writeUInt16LE(e.name.length, 28);
      h.writeUInt16LE(extraLen, 30);
      // comment len, disk start, internal attrs, external attrs: 0
      h.writeUInt32LE(bigOffset ? U32_MAX : e.offset, 42);
      e.name.copy(h, 46);
      if (zip64) {
        h.writeUInt16LE(0x0001, 46 + e.name.length);
        h.writeUInt16LE(8 * extra.length, 48 + e.name.length);
        Buffer.concat(extra).copy(h, 50 + e.name.length);
      }
      parts.push(h);
    }
    const cd = Buffer.concat(parts);
    const cdSize = cd.length;
    const n = this.entries.length;
    const need64 = anyZip64 || n >= 0xffff || cdStart >= ot || cdSize >= t;
    const tail: Buffer[] = [cd];
    if (need64) {
      const eocd64Offset = cdStart + cdSize;
      const r = Buffer.alloc(56);
      r.writeUInt32LE(EOCD64_SIG, 0);
      r.writeBigUInt64LE(44n, 4);
      r.writeUInt16LE(45, 12);
      r.writeUInt16LE(45, 14);
      r.writeUInt32LE(0, 16);
      r.writeUInt32LE(0, 20);
      r.writeBigUInt64LE(BigInt(n), 24);
      r.writeBigUInt64LE(BigInt(n), 32);
      r.writeBigUInt64LE(BigInt(cdSize), 40);
      r.writeBigUInt64LE(BigInt(cdStart), 48);
      const loc = Buffer.alloc(20);
      loc.writeUInt32LE(LOCATOR64_SIG, 0);
      loc.writeUInt32LE(0, 4);
      loc.writeBigUInt64LE(BigInt(eocd64Offset), 8);
      loc.writeUInt32LE(1, 16);
      tail.push(r, loc);
    }
    const e = Buffer.alloc(22);
    e.writeUInt32LE(EOCD_SIG, 0);
    e.writeUInt16LE(need64 && n >= 0xffff ? 0xffff : n, 8);
    e.writeUInt16LE(need64 && n >= 0xffff ? 0xffff : n, 10);
    e.writeUInt32LE(need64 && cdSize >= t ? U32_MAX : cdSize, 12);
    e.writeUInt32LE(need64 && cdStart >= ot ? U32_MAX : cdStart, 16);
    tail.push(e);
    await this.sink.write(Buffer.concat(tail));
  }
}
