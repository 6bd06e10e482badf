// .npy writer: header layout, numpy.load interop for every dtype (bit-exact), readers round trip.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { DType, DTYPES as ALL_DTYPES, itemSize, npyDescr } from '../src/artifacts/dtype';

/** The dtypes .npy can hold (complex32 has no numpy type: .npy refuses it, see snapshot-capture). */
const DTYPES = ALL_DTYPES.filter((d) => npyDescr(d) !== null);
import { Tensor } from '../src/artifacts/tensor';
import { npyHeader, npyDescrFor, writeNpy } from '../src/artifacts/npy';
import { parseNpyHeader, readNpyHeader } from '../src/artifacts/npy-reader';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { CaptureError } from '../src/errors';
import { cleanup, pseudoRandomBytes, runPython, tmpDir } from './helpers';

afterAll(cleanup);

function dataFor(dtype: DType, numel: number, seed: number): Buffer {
  const b = pseudoRandomBytes(numel * itemSize(dtype), seed);
  if (dtype === 'bool') for (let i = 0; i < b.length; i++) b[i] &= 1;
  return b;
}

const sha = (b: Uint8Array) => crypto.createHash('sha256').update(b).digest('hex');

describe('npy header', () => {
  test('dict literal, key order, 64-byte aligned data, newline before data', () => {
    for (const shape of [[], [3], [2, 3], [4, 16, 8, 128], [0, 5]]) {
      const h = npyHeader('float32', shape);
      expect(h.length % 64).toBe(0);
      expect(h.subarray(0, 8)).toEqual(Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0]));
      expect(h.readUInt16LE(8)).toBe(h.length - 10);
      expect(h[h.length - 1]).toBe(0x0a);
      const text = h.toString('latin1', 10);
      const shapeText = shape.length === 0 ? '()' : shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(', ')})`;
      expect(text.startsWith(`{'descr': '<f4', 'fortran_order': False, 'shape': ${shapeText}, }`)).toBe(true);
    }
  });

  test('bf16 and fp8 travel as raw void items', () => {
    expect(npyDescrFor('bfloat16')).toBe('|V2');
    expect(npyDescrFor('float8_e4m3fn')).toBe('|V1');
    expect(npyDescrFor('float8_e5m2')).toBe('|V1');
    expect(npyDescrFor('bool')).toBe('|b1');
  });

  test('a header over 65535 bytes switches to version 2.0 and parses back', () => {
    const shape = new Array(30000).fill(1);
    const h = npyHeader('int8', shape);
    expect(h[6]).toBe(2);
    expect(h.readUInt32LE(8)).toBe(h.length - 12);
    expect(h.length % 64).toBe(0);
    const info = parseNpyHeader(h);
    expect(info.version).toEqual([2, 0]);
    expect(info.shape).toHaveLength(30000);
    expect(info.dataOffset).toBe(h.length);
  });

  test('a dtype without a numpy representation is refused, naming it and suggesting pt', () => {
    expect(() => npyDescrFor('complex32')).toThrow(CaptureError);
    expect(() => npyDescrFor('complex32')).toThrow(/"complex32".*"pt"/);
  });

  test('garbage is rejected with a position', () => {
    expect(() => parseNpyHeader(Buffer.from('not a numpy file'))).toThrow(/bad magic at byte 0/);
    const h = npyHeader('float32', [2]);
    h.write("{'descr': 5", 10, 'latin1');
    expect(() => parseNpyHeader(h, 'x.npy')).toThrow(/x\.npy/);
  });
});

describe('npy files load in numpy, bit-exact', () => {
  const dir = tmpDir('wavebus-npy-');
  const cases: { file: string; dtype: DType; shape: number[]; sha: string; crc: string; bytes: number }[] = [];

  beforeAll(async () => {
    let seed = 1;
    for (const dtype of DTYPES) {
      // 0-d, 1-d, empty, a 4-d KV block tensor [n_blocks, block_size, heads, head_dim]
      for (const shape of [[], [5], [0, 3], [3, 4, 2, 8]]) {
        const numel = shape.reduce((a, b) => a * b, 1);
        const data = dataFor(dtype, numel, seed++);
        const file = path.join(dir, `${dtype}-${shape.length}d-${cases.length}.npy`);
        const r = await writeNpy(file, Tensor.fromBuffer(dtype, shape, data));
        cases.push({ file, dtype, shape, sha: sha(data), crc: r.checksum, bytes: r.bytes });
      }
      // A gather of non-adjacent blocks from a pool, as several chunks, streamed lazily.
      const pool = dataFor(dtype, 10 * 4 * 2 * 8, seed++);
      const blockBytes = 4 * 2 * 8 * itemSize(dtype);
      const blocks = [7, 2, 5].map((b) => pool.subarray(b * blockBytes, (b + 1) * blockBytes));
      async function* gen() {
        for (const b of blocks) yield b;
      }
      const file = path.join(dir, `${dtype}-gather.npy`);
      const r = await writeNpy(file, Tensor.fromChunks(dtype, [3, 4, 2, 8], gen(), 3 * blockBytes));
      cases.push({ file, dtype, shape: [3, 4, 2, 8], sha: sha(Buffer.concat(blocks)), crc: r.checksum, bytes: r.bytes });
    }
  });

  test('numpy.load gives the same descr, shape and bytes', () => {
    const out = runPython(
      `
import sys, json, hashlib, numpy as np
res = []
for f in json.loads(sys.argv[1]):
    a = np.load(f)
    res.append({"descr": a.dtype.str, "shape": list(a.shape), "sha": hashlib.sha256(a.tobytes()).hexdigest(), "c": bool(a.flags.c_contiguous)})
print(json.dumps(res))
`,
      [JSON.stringify(cases.map((c) => c.file))],
    );
    const got = JSON.parse(out) as { descr: string; shape: number[]; sha: string; c: boolean }[];
    expect(got).toHaveLength(cases.length);
    got.forEach((g, i) => {
      const c = cases[i];
      const want = npyDescrFor(c.dtype);
      // numpy reports '<f4' style for multi-byte and '|i1' style for single-byte types.
      expect({ file: c.file, descr: g.descr, shape: g.shape, sha: g.sha }).toEqual({ file: c.file, descr: want, shape: c.shape, sha: c.sha });
      expect(g.c).toBe(true);
    });
  });

  test('returned size and checksum match the file on disk', () => {
    for (const c of cases) {
      const buf = fs.readFileSync(c.file);
      expect(buf.length).toBe(c.bytes);
      expect(formatChecksum(crc32c(buf))).toBe(c.crc);
    }
  });

  test('readNpyHeader reads our files back', () => {
    for (const c of cases) {
      const info = readNpyHeader(c.file);
      expect(info.shape).toEqual(c.shape);
      expect(info.candidates).toContain(c.dtype);
      expect(info.dataOffset % 64).toBe(0);
      expect(sha(fs.readFileSync(c.file).subarray(info.dataOffset))).toBe(c.sha);
    }
  });

  test('readNpyHeader reads files numpy wrote', () => {
    const f = path.join(dir, 'from-numpy.npy');
    runPython(`import sys, numpy as np; np.save(sys.argv[1], np.arange(24, dtype='<i2').reshape(2, 3, 4))`, [f]);
    const info = readNpyHeader(f);
    expect(info).toMatchObject({ dtype: 'int16', shape: [2, 3, 4], fortranOrder: false });
    const data = fs.readFileSync(f).subarray(info.dataOffset);
    expect(Array.from(new Int16Array(data.buffer, data.byteOffset, 24))).toEqual([...Array(24).keys()]);
  });

  test('bf16 in .npy converts to the right float32 values via view + shift', () => {
    const f = path.join(dir, 'bf16-values.npy');
    const vals = new Uint16Array([0x3f80, 0xc000, 0x4049, 0x0000]); // 1, -2, 3.140625, 0
    return writeNpy(f, Tensor.fromBuffer('bfloat16', [4], vals)).then(() => {
      const out = runPython(
        `import sys, numpy as np; a = np.load(sys.argv[1]); print((a.view('<u2').astype('<u4') << 16).view('<f4').tolist())`,
        [f],
      );
      expect(JSON.parse(out)).toEqual([1, -2, 3.140625, 0]);
    });
  });

  test('a short lazy source fails the write and leaves no file', async () => {
    const f = path.join(dir, 'short.npy');
    async function* gen() {
      yield Buffer.alloc(8);
    }
    await expect(writeNpy(f, Tensor.fromChunks('float32', [4], gen(), 16))).rejects.toThrow(/ended after 8 of 16 bytes/);
    expect(fs.existsSync(f)).toBe(false);
  });

  test('tensor validation: bytes must equal numel × itemsize, shape integers >= 0', () => {
    expect(() => Tensor.fromBuffer('float32', [2, 3], Buffer.alloc(20))).toThrow(/20 bytes, expected 24/);
    expect(() => Tensor.fromBuffer('float32', [2, -1], Buffer.alloc(0))).toThrow(/shape\[1\]/);
    expect(() => Tensor.fromBuffer('float32', [1.5], Buffer.alloc(0))).toThrow(/shape\[0\]/);
    expect(() => Tensor.fromChunks('int8', [4], (async function* () {})(), 5)).toThrow(/announces 5 bytes, expected 4/);
  });
});
