import { crc32c, Crc32c, formatChecksum, parseChecksum, crc32cHardware } from '../src/artifacts/checksum';
import { native } from '../src/native';
import { cleanup, pseudoRandomBytes } from './helpers';

afterAll(cleanup);

// Bit-at-a-time reference, independent of the addon's tables and instructions.
function referenceCrc32c(data: Uint8Array, prev = 0): number {
  let crc = ~prev >>> 0;
  for (const byte of data) {
    crc ^= byte;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0x82f63b78 : crc >>> 1;
  }
  return ~crc >>> 0;
}

describe('crc32c', () => {
  test('standard check value for "123456789"', () => {
    expect(crc32c(Buffer.from('123456789'))).toBe(0xe3069283);
    expect(native.crc32cSoftware(Buffer.from('123456789'))).toBe(0xe3069283);
    expect(referenceCrc32c(Buffer.from('123456789'))).toBe(0xe3069283);
  });

  test('known vectors (RFC 3720 B.4)', () => {
    expect(crc32c(Buffer.alloc(32, 0))).toBe(0x8a9136aa);
    expect(crc32c(Buffer.alloc(32, 0xff))).toBe(0x62a8ab43);
    const inc = Buffer.from(Array.from({ length: 32 }, (_, i) => i));
    expect(crc32c(inc)).toBe(0x46dd794e);
    expect(crc32c(Buffer.alloc(0))).toBe(0);
  });

  test('incremental: crc32c(b, crc32c(a)) equals crc32c(a + b) at every split', () => {
    const data = pseudoRandomBytes(1000, 7);
    const whole = crc32c(data);
    for (const split of [0, 1, 3, 7, 8, 9, 63, 500, 999, 1000]) {
      expect(crc32c(data.subarray(split), crc32c(data.subarray(0, split)))).toBe(whole);
    }
  });

  test('large and odd-sized buffers match the pure-JS reference; hardware and table paths agree', () => {
    for (const [n, seed] of [[1, 1], [13, 2], [4096 + 5, 3], [1 << 20, 4], [3 * (1 << 20) + 7, 5]]) {
      const data = pseudoRandomBytes(n, seed);
      const ref = referenceCrc32c(data);
      expect(crc32c(data)).toBe(ref);
      expect(native.crc32cSoftware(data)).toBe(ref);
      // Unaligned views into a larger buffer.
      const view = data.subarray(1, n);
      expect(crc32c(view)).toBe(referenceCrc32c(view));
    }
    expect(typeof crc32cHardware()).toBe('boolean');
  });

  test('Crc32c class streams chunks', () => {
    const data = pseudoRandomBytes(70000, 9);
    const h = new Crc32c();
    for (let off = 0; off < data.length; off += 4093) h.update(data.subarray(off, off + 4093));
    expect(h.digest()).toBe(crc32c(data));
    expect(h.length).toBe(data.length);
    expect(h.toString()).toBe(formatChecksum(crc32c(data)));
    expect(new Crc32c().update(Buffer.from('1234')).update(Buffer.from('56789')).digest()).toBe(0xe3069283);
  });

  test('formatChecksum / parseChecksum', () => {
    expect(formatChecksum(0xe3069283)).toBe('crc32c:e3069283');
    expect(formatChecksum(0x1f)).toBe('crc32c:0000001f');
    expect(parseChecksum('crc32c:0000001f')).toBe(0x1f);
    expect(() => parseChecksum('crc32:0000001f')).toThrow(/checksum must look like/);
    expect(() => formatChecksum(-1)).toThrow(/crc must be an unsigned 32-bit integer/);
    expect(() => formatChecksum(2 ** 32)).toThrow(/crc/);
  });

  test('bad input names the argument', () => {
    expect(() => crc32c('abc' as unknown as Uint8Array)).toThrow(/data must be a Buffer or Uint8Array/);
    expect(() => crc32c(Buffer.from('a'), 1.5)).toThrow(/prev must be an unsigned 32-bit integer/);
    expect(() => new Crc32c().update(null as unknown as Uint8Array)).toThrow(/buf must be a Buffer/);
  });
});
