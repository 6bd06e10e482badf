// What every artifact reader shares: the format error (naming the file and the byte position)
// and reading an exact byte range of a file.
import * as fs from 'fs';
import { ArtifactFormatError } from '../errors';

export function readRange(path: string, offset: number, length: number): Buffer {
  const fd = fs.openSync(path, 'r');
  try {
    const b = Buffer.alloc(length);
    let done = 0;
    while (done < length) {
      const n = fs.readSync(fd, b, done, length - done, offset + done);
      if (n === 0) throw new ArtifactFormatError(`${path}: unexpected end of file at byte ${offset + done} (wanted ${length} bytes from ${offset})`);
      done += n;
    }
    return b;
  } finally {
    fs.closeSync(fd);
  }
}

/** Bytes [offset, offset + length) of a file. */
export function readBytes(path: string, offset: number, length: number): Buffer {
  return readRange(path, offset, length);
}
