// .pt writer: torch.load(weights_only=True) interop for every dtype torch 1.13 has, KV dump dicts
// with metadata, the pickle opcode subset, fp8 structure, ZIP64, and reading .pt back in TS.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { DType, DTYPES, itemSize, torchStorageClass } from '../src/artifacts/dtype';
import { Tensor } from '../src/artifacts/tensor';
import { writePt } from '../src/artifacts/pt';
import { pyFloat, pyTuple, encodeLong } from '../src/artifacts/pickle';
import { listZip } from '../src/artifacts/zip-reader';
import { readPt } from '../src/artifacts/pt-reader';
import { toPlain, unpicklePt, PtTensorRef } from '../src/artifacts/unpickle';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { cleanup, pseudoRandomBytes, runPython, tmpDir } from './helpers';

afterAll(cleanup);

function dataFor(dtype: DType, numel: number, seed: number): Buffer {
  const b = pseudoRandomBytes(numel * itemSize(dtype), seed);
  if (dtype === 'bool') for (let i = 0; i < b.length; i++) b[i] &= 1;
  return b;
}
const sha = (b: Uint8Array) => crypto.createHash('sha256').update(b).digest('hex');

// Loads each file with torch.load and prints dtype, shape and a hash of the raw element bytes
// (viewed as a same-width integer type, so bf16 and NaN payloads compare bit-exactly).
const TORCH_DIGEST = `
import sys, json, hashlib, torch
INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
def digest(t):
    raw = t.contiguous() if t.is_complex() else t.contiguous().view(INT[t.element_size()]) if t.dtype != torch.bool else t.contiguous().view(torch.uint8)
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "sha": hashlib.sha256(raw.numpy().tobytes()).hexdigest()}
def plain(v):
    if isinstance(v, torch.Tensor): return digest(v)
    if isinstance(v, dict): return {"__type__": type(v).__name__, "items": [[k, plain(x)] for k, x in v.items()]}
    if isinstance(v, (list, tuple)): return [plain(x) for x in v]
    return v
out = []
for f, wo in json.loads(sys.argv[1]):
    out.append(plain(torch.load(f, weights_only=wo)))
print(json.dumps(out))
`;

// torch 1.13 loads the dtypes with a legacy typed storage; the rest need _rebuild_tensor_v3 (torch >= 2.1).
const TORCH_DTYPES = DTYPES.filter((d) => torchStorageClass(d) !== null);

describe('.pt loads in torch 1.13 with weights_only=True, bit-exact', () => {
  const dir = tmpDir('wavebus-pt-');
  const cases: { file: string; dtype: DType; shape: number[]; sha: string; crc: string; bytes: number }[] = [];

  beforeAll(async () => {
    let seed = 100;
    for (const dtype of TORCH_DTYPES) {
      for (const shape of [[], [5], [0, 3], [3, 4, 2, 8]]) {
        const numel = shape.reduce((a, b) => a * b, 1);
        const data = dataFor(dtype, numel, seed++);
        const file = path.join(dir, `${dtype}-${shape.length}d-${cases.length}.pt`);
        const r = await writePt(file, Tensor.fromBuffer(dtype, shape, data));
        cases.push({ file, dtype, shape, sha: sha(data), crc: r.checksum, bytes: r.bytes });
      }
      // Gather of non-adjacent blocks [7, 2, 5] from a pool, streamed chunk by chunk.
      const pool = dataFor(dtype, 10 * 4 * 2 * 8, seed++);
      const bb = 4 * 2 * 8 * itemSize(dtype);
      const blocks = [7, 2, 5].map((b) => pool.subarray(b * bb, (b + 1) * bb));
      async function* gen() {
        for (const b of blocks) yield b;
      }
      const file = path.join(dir, `${dtype}-gather.pt`);
      const r = await writePt(file, Tensor.fromChunks(dtype, [3, 4, 2, 8], gen(), 3 * bb));
      cases.push({ file, dtype, shape: [3, 4, 2, 8], sha: sha(Buffer.concat(blocks)), crc: r.checksum, bytes: r.bytes });
    }
  });

  test('torch.load gives the same dtype, shape and bytes', () => {
    const got = JSON.parse(runPython(TORCH_DIGEST, [JSON.stringify(cases.map((c) => [c.file, true]))]));
    expect(got).toHaveLength(cases.length);
    got.forEach((g: unknown, i: number) => {
      const c = cases[i];
      expect({ file: c.file, ...(g as object) }).toEqual({ file: c.file, dtype: c.dtype, shape: c.shape, sha: c.sha });
    });
  });

  test('records: torch order, top folder = file stem, payloads 64-byte aligned, no format_version', () => {
    const recs = listZip(cases[3].file);
    const stem = path.basename(cases[3].file, '.pt');
    expect(recs.map((r) => r.name)).toEqual([`${stem}/data.pkl`, `${stem}/byteorder`, `${stem}/data/0`, `${stem}/version`]);
    for (const r of recs) expect(r.dataOffset % 64).toBe(0);
    const buf = fs.readFileSync(cases[3].file);
    const rec = (n: string) => recs.find((r) => r.name === `${stem}/${n}`)!;
    expect(buf.toString('latin1', rec('byteorder').dataOffset, rec('byteorder').dataOffset + 6)).toBe('little');
    expect(buf.toString('latin1', rec('version').dataOffset, rec('version').dataOffset + 2)).toBe('3\n');
  });

  test('returned size and checksum match the file on disk', () => {
    for (const c of cases) {
      const buf = fs.readFileSync(c.file);
      expect(buf.length).toBe(c.bytes);
      expect(formatChecksum(crc32c(buf))).toBe(c.crc);
    }
  });

  test('readPt finds each tensor, and its bytes at the reported offset', () => {
    for (const c of cases) {
      const pt = readPt(c.file);
      expect(pt.tensors).toHaveLength(1);
      const t = pt.tensors[0];
      expect(t).toMatchObject({ dtype: c.dtype, shape: c.shape, storageOffset: 0, storageKey: '0' });
      const buf = fs.readFileSync(c.file);
      expect(sha(buf.subarray(t.dataOffset, t.dataOffset + t.nbytes))).toBe(c.sha);
    }
  });
});

describe('KV dump dicts', () => {
  const dir = tmpDir('wavebus-ptdict-');
  const k = dataFor('bfloat16', 2 * 16 * 4 * 8, 7);
  const v = dataFor('bfloat16', 2 * 16 * 4 * 8, 8);
  const meta = {
    req_id: 'chatcmpl-ü-42',
    block_ids: [9, 3],
    layer: 17,
    tp_rank: 1,
    pp_rank: 0,
    cp_rank: 0,
    num_kv_heads: 4,
    wave: 123456,
    request_finished_at_dump: false,
    note: null,
    big: 2 ** 40,
    negative: -70000,
    huge: 2n ** 70n,
    nested: { a: [1, 'x', true], b: {} },
  };

  test('a dict of bf16 K/V + metadata loads with weights_only=True; metadata round-trips', async () => {
    const file = path.join(dir, '17.pt');
    const value = { ...meta, k: Tensor.fromBuffer('bfloat16', [2, 16, 4, 8], k), v: Tensor.fromBuffer('bfloat16', [2, 16, 4, 8], v) };
    await writePt(file, value);
    const [got] = JSON.parse(
      runPython(TORCH_DIGEST.replace('print(json.dumps(out))', 'out[0]["items"] = [[a, str(b) if a == "huge" else b] for a, b in out[0]["items"]]\nprint(json.dumps(out))'), [
        JSON.stringify([[file, true]]),
      ]),
    );
    expect(got.__type__).toBe('OrderedDict');
    const items = Object.fromEntries(got.items);
    expect(got.items.map((x: [string]) => x[0])).toEqual([...Object.keys(meta), 'k', 'v']); // insertion order
    expect(items.req_id).toBe(meta.req_id);
    expect(items.block_ids).toEqual([9, 3]);
    expect(items.wave).toBe(123456);
    expect(items.request_finished_at_dump).toBe(false);
    expect(items.note).toBeNull();
    expect(items.big).toBe(2 ** 40);
    expect(items.negative).toBe(-70000);
    expect(items.huge).toBe((2n ** 70n).toString());
    expect(items.nested).toEqual({ __type__: 'OrderedDict', items: [['a', [1, 'x', true]], ['b', { __type__: 'OrderedDict', items: [] }]] });
    expect(items.k).toEqual({ dtype: 'bfloat16', shape: [2, 16, 4, 8], sha: sha(k) });
    expect(items.v).toEqual({ dtype: 'bfloat16', shape: [2, 16, 4, 8], sha: sha(v) });

    const pt = readPt(file);
    const plain = toPlain(pt.value) as Record<string, unknown>;
    expect(plain.req_id).toBe(meta.req_id);
    expect(plain.huge).toBe(2n ** 70n);
    expect((plain.k as PtTensorRef).storageKey).toBe('0');
    expect((plain.v as PtTensorRef).storageKey).toBe('1');
    expect(pt.tensors.map((t) => t.dtype)).toEqual(['bfloat16', 'bfloat16']);
  });

  test('floats and tuples pickle as BINFLOAT / tuples (torch.load; 1.13 weights_only has no BINFLOAT)', async () => {
    const file = path.join(dir, 'floats.pt');
    await writePt(file, { x: 1.5, one: pyFloat(1), nan: NaN, inf: -Infinity, shape: pyTuple(1, 2, 3, 4), t: Tensor.fromBuffer('float32', [1], new Float32Array([2.5])) });
    const out = runPython(
      `import sys, torch, math; d = torch.load(sys.argv[1]); print(repr((d['x'], d['one'], math.isnan(d['nan']), d['inf'], d['shape'], d['t'].tolist())))`,
      [file],
    );
    expect(out.trim()).toBe('(1.5, 1.0, True, -inf, (1, 2, 3, 4), [2.5])');
  });

  test('data.pkl uses only opcodes the weights_only unpickler accepts', async () => {
    const file = path.join(dir, 'ops.pt');
    await writePt(file, { ...meta, x: 0.25, k: Tensor.fromBuffer('float16', [2], Buffer.alloc(4)), f8: Tensor.fromBuffer('float8_e5m2', [3], Buffer.alloc(3)) });
    const out = runPython(
      `
import sys, zipfile, pickletools, json
z = zipfile.ZipFile(sys.argv[1])
name = [n for n in z.namelist() if n.endswith('/data.pkl')][0]
print(json.dumps(sorted({op.name for op, arg, pos in pickletools.genops(z.read(name))})))
`,
      [file],
    );
    const allowed = new Set(
      'PROTO GLOBAL BINPERSID BINPUT BINGET LONG_BINPUT LONG_BINGET BININT BININT1 BININT2 LONG1 BINFLOAT BINUNICODE SHORT_BINSTRING MARK TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_TUPLE EMPTY_LIST EMPTY_DICT EMPTY_SET APPEND APPENDS SETITEM SETITEMS BUILD REDUCE NEWOBJ NONE NEWTRUE NEWFALSE STOP'.split(' '),
    );
    const used = JSON.parse(out) as string[];
    expect(used.length).toBeGreaterThan(10);
    for (const op of used) expect(allowed.has(op) ? op : `forbidden ${op}`).toBe(op);
  });
});

describe('fp8 .pt structure (torch 1.13 lacks fp8)', () => {
  test('_rebuild_tensor_v3 with UntypedStorage (numel = bytes) and the torch dtype as 7th argument', async () => {
    const dir = tmpDir('wavebus-fp8-');
    const file = path.join(dir, 'fp8.pt');
    const data = pseudoRandomBytes(2 * 3 * 4, 5);
    await writePt(file, { e4: Tensor.fromBuffer('float8_e4m3fn', [2, 3, 4], data), e5: Tensor.fromBuffer('float8_e5m2', [4], data.subarray(0, 4)) });
    const out = runPython(
      `
import sys, zipfile, pickle, io, json, collections, hashlib
z = zipfile.ZipFile(sys.argv[1])
root = z.namelist()[0].split('/')[0]
class G:
    def __init__(s, mod, name): s.path = mod + '.' + name
    def __call__(s, *args): return {"call": s.path, "args": list(args)}
class U(pickle.Unpickler):
    def find_class(s, mod, name):
        return collections.OrderedDict if (mod, name) == ('collections', 'OrderedDict') else G(mod, name)
    def persistent_load(s, pid):
        return {"pid": [p.path if isinstance(p, G) else p for p in pid]}
v = U(io.BytesIO(z.read(root + '/data.pkl'))).load()
def enc(o):
    if isinstance(o, G): return {"global": o.path}
    if isinstance(o, tuple): return {"tuple": [enc(x) for x in o]}
    if isinstance(o, list): return [enc(x) for x in o]
    if isinstance(o, collections.OrderedDict): return {"odict": [[k, enc(x)] for k, x in o.items()]}
    if isinstance(o, dict): return {k: enc(x) for k, x in o.items()}
    return o
res = enc(v)
res["sha0"] = hashlib.sha256(z.read(root + '/data/0')).hexdigest()
print(json.dumps(res))
`,
      [file],
    );
    const res = JSON.parse(out);
    const [e4, e5] = res.odict;
    expect(e4[0]).toBe('e4');
    expect(e4[1].call).toBe('torch._utils._rebuild_tensor_v3');
    expect(e4[1].args).toEqual([
      { pid: ['storage', 'torch.storage.UntypedStorage', '0', 'cpu', 24] },
      0,
      { tuple: [2, 3, 4] },
      { tuple: [12, 4, 1] },
      false,
      { odict: [] },
      { global: 'torch.float8_e4m3fn' },
    ]);
    expect(e5[1].args[0]).toEqual({ pid: ['storage', 'torch.storage.UntypedStorage', '1', 'cpu', 4] });
    expect(e5[1].args[6]).toEqual({ global: 'torch.float8_e5m2' });
    expect(res.sha0).toBe(sha(data));
    // And our own reader understands it.
    const pt = readPt(file);
    expect(pt.tensors.map((t) => [t.dtype, t.shape, t.nbytes])).toEqual([
      ['float8_e4m3fn', [2, 3, 4], 24],
      ['float8_e5m2', [4], 4],
    ]);
  });
});

describe('ZIP64', () => {
  const dir = tmpDir('wavebus-zip64-');
  const data = pseudoRandomBytes(4096, 9);

  test('forced for every size and offset: Python zipfile reads every record with the right CRC', async () => {
    const file = path.join(dir, 'all64.pt');
    await writePt(file, { a: Tensor.fromBuffer('float32', [1024], data), b: Tensor.fromBuffer('uint8', [100], data.subarray(0, 100)) }, { zip64Threshold: 1 });
    const out = runPython(
      `
import sys, zipfile, json, hashlib
z = zipfile.ZipFile(sys.argv[1])
assert z.testzip() is None
print(json.dumps({i.filename: [i.file_size, i.header_offset, hashlib.sha256(z.read(i.filename)).hexdigest()] for i in z.infolist()}))
`,
      [file],
    );
    const got = JSON.parse(out);
    const recs = listZip(file);
    expect(Object.keys(got)).toEqual(recs.map((r) => r.name));
    expect(got['all64/data/0'][0]).toBe(4096);
    expect(got['all64/data/0'][2]).toBe(sha(data));
    expect(got['all64/data/1'][2]).toBe(sha(data.subarray(0, 100)));
    for (const r of recs) expect(got[r.name][1]).toBe(r.localHeaderOffset);
    const buf = fs.readFileSync(file);
    expect(buf.indexOf(Buffer.from([0x50, 0x4b, 0x06, 0x06]))).toBeGreaterThan(0); // zip64 end record
    expect(buf.indexOf(Buffer.from([0x50, 0x4b, 0x06, 0x07]))).toBeGreaterThan(0); // zip64 locator
  });

  test('forced for sizes: torch.load(weights_only=True) reads it', async () => {
    const file = path.join(dir, 'size64.pt');
    await writePt(file, { a: Tensor.fromBuffer('float32', [1024], data) }, { zip64Threshold: 1, zip64OffsetThreshold: 0xffffffff });
    const [got] = JSON.parse(runPython(TORCH_DIGEST, [JSON.stringify([[file, true]])]));
    expect(got.items[0]).toEqual(['a', { dtype: 'float32', shape: [1024], sha: sha(data) }]);
    expect(readPt(file).tensors[0].nbytes).toBe(4096);
  });
});

describe('reading .pt files', () => {
  test('readPt understands what torch.save writes', () => {
    const dir = tmpDir('wavebus-ptread-');
    const file = path.join(dir, 'saved.pt');
    runPython(
      `import sys, torch; torch.save({"x": torch.arange(12, dtype=torch.int32).reshape(3, 4), "y": torch.ones(2, dtype=torch.bfloat16), "n": 5, "s": "hi"}, sys.argv[1])`,
      [file],
    );
    const pt = readPt(file);
    const plain = toPlain(pt.value) as Record<string, unknown>;
    expect(plain.n).toBe(5);
    expect(plain.s).toBe('hi');
    expect(pt.tensors.map((t) => [t.dtype, t.shape])).toEqual([
      ['int32', [3, 4]],
      ['bfloat16', [2]],
    ]);
    const buf = fs.readFileSync(file);
    const x = pt.tensors[0];
    const ints = new Int32Array(buf.buffer.slice(buf.byteOffset + x.dataOffset, buf.byteOffset + x.dataOffset + x.nbytes));
    expect(Array.from(ints)).toEqual([...Array(12).keys()]);
  });

  test('garbage pickles fail with a position, not a crash', () => {
    expect(() => unpicklePt(Buffer.from([0x80, 0x02, 0x74]), 'x')).toThrow(/x: MARK missing at byte 3/);
    expect(() => unpicklePt(Buffer.from([0x80, 0x02, 0x63, 0x6f, 0x73, 0x0a, 0x73, 0x79, 0x73, 0x74, 0x65, 0x6d, 0x0a, 0x29, 0x52]), 'x')).toThrow(
      /unsupported global os\.system/,
    );
    expect(() => unpicklePt(Buffer.from([0x80, 0x02, 0x4a, 0x01]), 'x')).toThrow(/truncated/);
  });

  test('LONG1 encoding matches Python', () => {
    const vals = [2n ** 31n, -(2n ** 31n) - 1n, 2n ** 63n, -(2n ** 64n), 255n, -1n, 2n ** 70n];
    const out = runPython(`import sys, pickle, json; print(json.dumps([pickle.encode_long(int(x)).hex() for x in json.loads(sys.argv[1])]))`, [
      JSON.stringify(vals.map(String)),
    ]);
    expect(JSON.parse(out)).toEqual(vals.map((v) => encodeLong(v).toString('hex')));
  });
});
