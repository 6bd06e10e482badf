// Reading a runtime config file with a size cap: the startup read and every hot-reload poll use
// it, so a huge file is refused from its size, never read whole or parsed.
import * as fs from 'fs';
import { ConfigError } from '../errors';

export const MAX_CONFIG_BYTES = 1024 * 1024;


/**
 * The file's bytes, read through one descriptor: its size checked by fstat before reading, and
 * at most MAX_CONFIG_BYTES + 1 bytes read (a file growing meanwhile is caught too).
 */
export function readCapped(file: string): { bytes: Buffer; st: fs.Stats } | { tooBig: number; st: fs.Stats } {
  const fd = fs.openSync(file, 'r');
  try {
    const st = fs.fstatSync(fd);
    if (st.size > MAX_CONFIG_BYTES) return { tooBig: st.size, st };
    const buf = Buffer.allocUnsafe(MAX_CONFIG_BYTES + 1);
    let n = 0;
    while (n < buf.length) {
      const got = fs.readSync(fd, buf, n, buf.length - n, n);
      if (got === 0) break;
      n += got;
    }
    if (n > MAX_CONFIG_BYTES) return { tooBig: n, st };
    return { bytes: Buffer.from(buf.subarray(0, n)), st };
  } finally {
    fs.closeSync(fd);
  }
}

export function configTooBigError(file: string, bytes: number): ConfigError {
  return new ConfigError(
    `${file}: ${bytes > MAX_CONFIG_BYTES ? `${bytes} bytes` : 'the file'} is over the runtime config size cap of ${MAX_CONFIG_BYTES} bytes (MAX_CONFIG_BYTES); not read`,
    'ERR_CONFIG_TOO_BIG',
  );
}
