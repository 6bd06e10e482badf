// Mutations of valid encodings for the fuzz bench (bench/fuzz.ts): bit flips, truncation,
// extension, wrong wire types, huge length prefixes and varints, repeated and swapped fields,
// unknown fields, noise, empty frames, and multi-part messages with the wrong number of parts.
import { prng } from '../../src/prng';

/** The varint encoding of a non-negative integer below 2^53. */
export function varint(n: number): Buffer {
  const out: number[] = [];
  let v = n;
  while (v >= 0x80) {
    out.push((v % 0x80) | 0x80);
    v = Math.floor(v / 0x80);
  }
  out.push(v);
  return Buffer.from(out);
}

/** The top-level fields of a protobuf encoding as [start, end) spans, or undefined when it does not parse. */
export function fieldSpans(b: Buffer): Array<[number, number]> | undefined {
  const spans: Array<[number, number]> = [];
  let i = 0;
  const readVarint = (): number | undefined => {
    let v = 0;
    for (let shift = 0; shift < 64; shift += 7) {
      if (i >= b.length) return undefined;
      const c = b[i++];
      v += (c & 0x7f) * 2 ** shift;
      if (c < 0x80) return v;
    }
    return undefined;
  };
  while (i < b.length) {
    const start = i;
    const tag = readVarint();
    if (tag === undefined) return undefined;
    const wt = tag % 8;
    if (wt === 0) {
      if (readVarint() === undefined) return undefined;
    } else if (wt === 1) i += 8;
    else if (wt === 5) i += 4;
    else if (wt === 2) {
      const n = readVarint();
      if (n === undefined) return undefined;
      i += n;
    } else return undefined;
    if (i > b.length) return undefined;
    spans.push([start, i]);
  }
  return spans;
}

export class Mutator {
  readonly rand: () => number;
  constructor(seed: number) {
    this.rand = prng(seed);
  }
  int(n: number): number {
    return Math.floor(this.rand() * n);
  }
  pick<T>(xs: readonly T[]): T {
    return xs[this.int(xs.length)];
  }
  bytes(n: number): Buffer {
    const b = Buffer.allocUnsafe(n);
    for (let i = 0; i < n; i++) b[i] = this.int(256);
    return b;
  }

  /** One mutation of `valid` (or pure noise). */
  mutate(valid: Buffer): Buffer {
    const b = Buffer.from(valid);
    switch (this.int(12)) {
      case 0: {
        // bit flips
        for (let k = 1 + this.int(8); k > 0 && b.length > 0; k--) b[this.int(b.length)] ^= 1 << this.int(8);
        return b;
      }
      case 1:
        return b.subarray(0, this.int(Math.max(1, b.length))); // truncation
      case 2:
        return Buffer.concat([b, this.bytes(1 + this.int(64))]); // extension
      case 3: {
        // wrong field type: change the wire type of a tag byte
        if (b.length > 0) {
          const i = this.int(b.length);
          b[i] = (b[i] & ~7) | this.int(8);
        }
        return b;
      }
      case 4: {
        // a huge length prefix on a length-delimited field
        const field = 1 + this.int(15);
        const huge = [0xff, 0xff, 0xff, 0xff, 0x0f];
        const at = this.int(b.length + 1);
        return Buffer.concat([b.subarray(0, at), Buffer.from([(field << 3) | 2, ...huge]), b.subarray(at)]);
      }
      case 5:
        return this.bytes(this.int(200)); // noise
      case 6:
        return this.rand() < 0.5 ? Buffer.alloc(0) : b; // empty, or the valid frame itself
      case 7: {
        // duplicated / spliced bytes
        const cut = this.int(b.length + 1);
        return Buffer.concat([b.subarray(0, cut), b, b.subarray(cut)]);
      }
      case 8: {
        // a huge varint: a known field number with 2^32..2^64-1, or a 10+ byte overlong varint
        const field = 1 + this.int(15);
        const big = this.pick([varint(2 ** 32), varint(2 ** 53 - 1), Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]), Buffer.from([0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01])]);
        return Buffer.concat([b, varint(field << 3), big]);
      }
      case 9: {
        // a repeated field: one top-level field of the message again (a oneof or a scalar given twice)
        const spans = fieldSpans(b);
        if (!spans || spans.length === 0) return Buffer.concat([b, b]);
        const [s, e] = this.pick(spans);
        const copies = 1 + this.int(3);
        return Buffer.concat([b, ...Array.from({ length: copies }, () => b.subarray(s, e))]);
      }
      case 10: {
        // two top-level fields swapped (a field's bytes under another field's place)
        const spans = fieldSpans(b);
        if (!spans || spans.length < 2) return this.bytes(this.int(32));
        const i = this.int(spans.length);
        let j = this.int(spans.length - 1);
        if (j >= i) j++;
        const [a, c] = i < j ? [spans[i], spans[j]] : [spans[j], spans[i]];
        return Buffer.concat([b.subarray(0, a[0]), b.subarray(c[0], c[1]), b.subarray(a[1], c[0]), b.subarray(a[0], a[1]), b.subarray(c[1])]);
      }
      default: {
        // an unknown field number with a random wire type
        const tag = ((20 + this.int(1000)) << 3) | this.int(8);
        return Buffer.concat([b, varint(tag), this.bytes(this.int(16))]);
      }
    }
  }

  /** A message of 1..4 parts: the right count most of the time, a wrong one otherwise. */
  parts(make: () => Buffer, right: number): Buffer[] {
    const n = this.rand() < 0.9 ? right : this.pick([1, 2, 3, 4].filter((x) => x !== right));
    return Array.from({ length: n }, () => make());
  }
}
