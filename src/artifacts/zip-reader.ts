// Listing a stored zip archive (a .pt file) from its central directory, ZIP64 aware: each
// record's name, CRC32, size and where its bytes start.
import * as fs from 'fs';
import { ArtifactFormatError } from '../errors';
import { readRange } from './read-range';

export interface ZipRecord {
  name: string;
  crc32: number;
  size: number;
  method: number;
  localHeaderOffset: number;
  /** File offset of the record's first byte. */
  dataOffset: number;
}

/** List a stored zip's records from its central directory (ZIP64 aware). */
export function listZip(path: string): ZipRecord[] {
  const size = fs.statSync(path).size;
  const tailLen = Math.min(size, 22 + 0xffff);
  const tail = readRange(path, size - tailLen, tailLen);
  let eocd = -1;
  for (let i = tail.length - 22; i >= 0; i--) {
    if (tail.readUInt32LE(i) === 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw new ArtifactFormatError(`${path}: not a zip archive (no end-of-central-directory record)`);
  const eocdAbs = size - tailLen + eocd;
  let count = tail.readUInt16LE(eocd + 10);
  let cdSize = tail.readUInt32LE(eocd + 12);
  let cdOffset = tail.readUInt32LE(eocd + 16);
  if (eocdAbs >= 20) {
    const loc = readRange(path, eocdAbs - 20, 20);
    if (loc.readUInt32LE(0) === 0x07064b50) {
      const off64 = Number(loc.readBigUInt64LE(8));
      const r = readRange(path, off64, 56);
      if (r.readUInt32LE(0) !== 0x06064b50) throw new ArtifactFormatError(`${path}: bad ZIP64 end record at byte ${off64}`);
      count = Number(r.readBigUInt64LE(32));
      cdSize = Number(r.readBigUInt64LE(40));
      cdOffset = Number(r.readBigUInt64LE(48));
    }
  }
  if (cdOffset + cdSize > size) throw new ArtifactFormatError(`${path}: central directory [${cdOffset}, +${cdSize}) runs past the end (${size})`);
  const cd = readRange(path, cdOffset, cdSize);
  const out: ZipRecord[] = [];
  let p = 0;
  for (let i = 0; i < count; i++) {
    if (p + 46 > cd.length || cd.readUInt32LE(p) !== 0x02014b50) throw new ArtifactFormatError(`${path}: bad central directory entry ${i} at byte ${cdOffset + p}`);
    const method = cd.readUInt16LE(p + 10);
    const crc32 = cd.readUInt32LE(p + 16);
    let csize = cd.readUInt32LE(p + 20);
    let usize = cd.readUInt32LE(p + 24);
    const nameLen = cd.readUInt16LE(p + 28);
    const extraLen = cd.readUInt16LE(p + 30);
    const commentLen = cd.readUInt16LE(p + 32);
    let lho = cd.readUInt32LE(p + 42);
    const name = cd.toString('utf8', p + 46, p + 46 + nameLen);
    let x = p + 46 + nameLen;
    const xend = x + extraLen;
    while (x + 4 <= xend) {
      const id = cd.readUInt16LE(x);
      const len = cd.readUInt16LE(x + 2);
      if (id === 0x0001) {
        let q = x + 4;
        if (usize === 0xffffffff) (usize = Number(cd.readBigUInt64LE(q))), (q += 8);
        if (csize === 0xffffffff) (csize = Number(cd.readBigUInt64LE(q))), (q += 8);
        if (lho === 0xffffffff) (lho = Number(cd.readBigUInt64LE(q))), (q += 8);
      }
      x += 4 + len;
    }
    const lh = readRange(path, lho, 30);
    if (lh.readUInt32LE(0) !== 0x04034b50) throw new ArtifactFormatError(`${path}: bad local header for ${name} at byte ${lho}`);
    const dataOffset = lho + 30 + lh.readUInt16LE(26) + lh.readUInt16LE(28);
    if (method !== 0 && csize !== usize) throw new ArtifactFormatError(`${path}: record ${name} is compressed (method ${method}); only stored records are supported`);
    out.push({ name, crc32, size: usize, method, localHeaderOffset: lho, dataOffset });
    p = xend + commentLen;
  }
  return out;
}
