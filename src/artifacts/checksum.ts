// CRC-32C (Castagnoli) for artifact checksums in dump acks and bundle manifests.
// The native addon does the work (SSE4.2 crc32 instruction when the CPU has it, else a
// slicing-by-8 table); this module validates and gives it a small API.
import * as fs from 'fs';
import { native, nativeCall } from '../native';

function checkBytes(data: unknown, what: string): Uint8Array {
  if (!(data instanceof Uint8Array)) {
    throw new TypeError(`${what} must be a Buffer or Uint8Array, got ${data === null ? 'null' : typeof data}`);
  }
  return data;
}

function checkCrc(v: unknown, what: string): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > 0xffffffff) {
    throw new RangeError(`${what} must be an unsigned 32-bit integer, got ${String(v)}`);
  }
  return v;
}

/**
 * CRC-32C of `data`. Pass the previous result as `prev` to continue a running checksum:
 * crc32c(b, crc32c(a)) === crc32c(concat(a, b)). crc32c("123456789") === 0xe3069283.
 */
export function crc32c(data: Uint8Array, prev = 0): number {
  checkBytes(data, 'data');
  checkCrc(prev, 'prev');
  return nativeCall(() => native.crc32c(data, prev));
}

/** "crc32c:%08x", the form checksums take in acks, manifests and request_info.json. */
export function formatChecksum(crc: number): string {
  checkCrc(crc, 'crc');
  return `crc32c:${crc.toString(16).padStart(8, '0')}`;
}

/** Parse "crc32c:%08x" back to a number; throws naming the value when it is malformed. */
export function parseChecksum(text: string): number {
  const m = /^crc32c:([0-9a-f]{8})$/.exec(text);
  if (!m) throw new RangeError(`checksum must look like "crc32c:0123abcd", got ${JSON.stringify(text)}`);
  return parseInt(m[1], 16);
}

/** Whether the SSE4.2 instruction is in use (for bench output and logs). */
export function crc32cHardware(): boolean {
  return native.crc32cHardware();
}

/** A running CRC-32C over data that arrives in pieces (e.g. a file written in chunks). */
export class Crc32c {
  private crc = 0;
  private bytes = 0;

  update(buf: Uint8Array): this {
    checkBytes(buf, 'buf');
    this.crc = native.crc32c(buf, this.crc);
    this.bytes += buf.byteLength;
    return this;
  }

  /** The checksum of everything passed to update() so far (update may continue after). */
  digest(): number {
    return this.crc;
  }

  /** Bytes passed to update() so far. */
  get length(): number {
    return this.bytes;
  }

  /** formatChecksum(digest()). */
  toString(): string {
    return formatChecksum(this.crc);
  }
}

/**
 * A file's CRC-32C, read in 4 MiB pieces; only its first `limit` bytes when given.
 * `.toString()` is the "crc32c:%08x" form, `.digest()` the number, `.length` the bytes read.
 */
export function crc32cOfFile(file: string, limit = Infinity): Crc32c {
  const fd = fs.openSync(file, 'r');
  try {
    return crc32cOfFd(fd, limit);
  } finally {
    fs.closeSync(fd);
  }
}

/** crc32cOfFile for a descriptor already open (read from offset 0; the caller closes it). */
export function crc32cOfFd(fd: number, limit = Infinity): Crc32c {
  const h = new Crc32c();
  const buf = Buffer.allocUnsafe(4 << 20);
  while (h.length < limit) {
    const n = fs.readSync(fd, buf, 0, Math.min(buf.length, limit - h.length), h.length);
    if (n === 0) break;
    h.update(buf.subarray(0, n));
  }
  return h;
}

/** CRC-32C's reflected polynomial. */
const POLY = 0x82f63b78;

/** a(x) · b(x) mod p(x), reflected (zlib's multmodp). */
function multModP(a: number, b: number): number {
  let m = 0x80000000;
  let p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) === 0) break;
    }
    m >>>= 1;
    b = b & 1 ? (b >>> 1) ^ POLY : b >>> 1;
  }
  return p >>> 0;
}

/** X2N[k] = x^(2^k) mod p(x). */
const X2N: number[] = (() => {
  const t = [0x40000000]; // x^1
  for (let k = 1; k < 32; k++) t.push(multModP(t[k - 1], t[k - 1]));
  return t;
})();

/** x^(len·8) mod p(x): the operator that shifts a crc past `len` zero bytes. */
const shiftCache = new Map<number, number>();
function shiftFor(len: number): number {
  let op = shiftCache.get(len);
  if (op !== undefined) return op;
  op = 0x80000000; // x^0
  for (let n = len, k = 3; n > 0; n = Math.floor(n / 2), k++) if (n % 2) op = multModP(X2N[k & 31], op);
  if (shiftCache.size < 64) shiftCache.set(len, op);
  return op;
}

/**
 * crc32c(concat(a, b)) from crc32c(a), crc32c(b) and b's length, without reading any bytes
 * (zlib's crc32_combine for the Castagnoli polynomial): a chunk's checksum, checked once, also
 * continues the whole-file checksum.
 */
export function crc32cCombine(crcA: number, crcB: number, lenB: number): number {
  if (lenB === 0) return crcA >>> 0;
  return (multModP(shiftFor(lenB), crcA >>> 0) ^ crcB) >>> 0;
}
