// .safetensors writer: layout rules, a numpy-based reader in Python (no safetensors package),
// every dtype bit-exact, metadata, and the TS header reader.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { DType, DTYPES as ALL_DTYPES, dtypeInfo, itemSize } from '../src/artifacts/dtype';

/** The dtypes safetensors has codes for. */
const DTYPES = ALL_DTYPES.filter((d) => dtypeInfo(d).safetensors !== null);
import { Tensor } from '../src/artifacts/tensor';
import { writeSafetensors, safetensorsLayout } from '../src/artifacts/safetensors';
import { parseSafetensorsHeader, readSafetensorsHeader } from '../src/artifacts/safetensors-reader';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { cleanup, pseudoRandomBytes, runPython, tmpDir } from './helpers';

afterAll(cleanup);

const sha = (b: Uint8Array) => crypto.createHash('sha256').update(b).digest('hex');

// A strict reader written from the format description: u64 length, JSON, contiguous offsets.
const PY_READER = `
import sys, json, struct, hashlib, numpy as np
SIZES = {"BOOL":1,"U8":1,"I8":1,"F8_E5M2":1,"F8_E4M3":1,"I16":2,"U16":2,"F16":2,"BF16":2,"I32":4,"U32":4,"F32":4,"F64":8,"I64":8,"U64":8}
out = []
for f in json.loads(sys.argv[1]):
    raw = open(f, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, "header not padded to 8"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    pos, res = 0, {}
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        assert b == pos, "gap before " + name
        numel = int(np.prod(e["shape"])) if e["shape"] else 1
        assert end - b == numel * SIZES[e["dtype"]], "size mismatch " + name
        arr = np.frombuffer(data[b:end], dtype=np.uint8)
        res[name] = {"dtype": e["dtype"], "shape": e["shape"], "sha": hashlib.sha256(arr.tobytes()).hexdigest()}
        pos = end
    assert pos == len(data), "data buffer does not end at end of file"
    out.append({"tensors": res, "meta": meta, "order": list(header.keys())})
print(json.dumps(out))
`;

describe('.safetensors', () => {
  const dir = tmpDir('wavebus-st-');

  test('every dtype and shape, several tensors per file, bit-exact through a Python reader', async () => {
    const files: string[] = [];
    const want: Record<string, { dtype: string; shape: number[]; sha: string }>[] = [];
    let seed = 3;
    for (const dtype of DTYPES) {
      const tensors: Record<string, Tensor> = {};
      const w: Record<string, { dtype: string; shape: number[]; sha: string }> = {};
      for (const [name, shape] of [['scalar', []], ['vec', [5]], ['empty', [0, 3]], ['kv', [3, 4, 2, 8]]] as [string, number[]][]) {
        const numel = shape.reduce((a, b) => a * b, 1);
        const data = pseudoRandomBytes(numel * itemSize(dtype as DType), seed++);
        if (dtype === 'bool') for (let i = 0; i < data.length; i++) data[i] &= 1;
        tensors[name] = Tensor.fromBuffer(dtype, shape, data);
        w[name] = { dtype: safetensorsLayout(tensors[name]).header.toString('utf8', 8).match(/"dtype":"([A-Z0-9_]+)"/)![1], shape, sha: sha(data) };
      }
      const f = path.join(dir, `${dtype}.safetensors`);
      const r = await writeSafetensors(f, tensors);
      const buf = fs.readFileSync(f);
      expect(r).toEqual({ bytes: buf.length, checksum: formatChecksum(crc32c(buf)) });
      files.push(f);
      want.push(w);
    }
    const got = JSON.parse(runPython(PY_READER, [JSON.stringify(files)]));
    got.forEach((g: { tensors: unknown; meta: unknown; order: string[] }, i: number) => {
      expect({ file: files[i], ...(g.tensors as object) }).toEqual({ file: files[i], ...want[i] });
      expect(g.meta).toBeNull();
      expect(g.order).toEqual(['scalar', 'vec', 'empty', 'kv']);
    });
    expect(want.map((w) => w.kv.dtype)).toEqual(['F64', 'F32', 'F16', 'BF16', 'I64', 'I32', 'I16', 'I8', 'U8', 'BOOL', 'F8_E4M3', 'F8_E5M2', 'U16', 'U32', 'U64']);
  });

  test('non-tensor dict values become __metadata__ strings; lazy tensors stream', async () => {
    const f = path.join(dir, 'kv.safetensors');
    const k = pseudoRandomBytes(2 * 16 * 2 * 8 * 2, 11);
    async function* gen() {
      yield k.subarray(0, 100);
      yield k.subarray(100);
    }
    await writeSafetensors(f, { req_id: 'r-1', layer: 3, block_ids: [4, 1], k: Tensor.fromChunks('bfloat16', [2, 16, 2, 8], gen(), k.length) }, { format: 'pt' });
    const [got] = JSON.parse(runPython(PY_READER, [JSON.stringify([f])]));
    expect(got.meta).toEqual({ req_id: 'r-1', layer: '3', block_ids: '[4,1]', format: 'pt' });
    expect(got.tensors.k).toEqual({ dtype: 'BF16', shape: [2, 16, 2, 8], sha: sha(k) });
    const info = readSafetensorsHeader(f);
    expect(info.metadata.req_id).toBe('r-1');
    expect(info.tensors).toEqual([{ name: 'k', code: 'BF16', dtype: 'bfloat16', shape: [2, 16, 2, 8], begin: 0, end: k.length }]);
    expect(info.dataOffset % 8).toBe(0);
    expect(sha(fs.readFileSync(f).subarray(info.dataOffset))).toBe(sha(k));
  });

  test('a lone tensor is named "tensor"; "__metadata__" cannot name a tensor', async () => {
    const lay = safetensorsLayout(Tensor.fromBuffer('int32', [2], new Int32Array([1, 2])));
    expect(lay.tensors.map((t) => t[0])).toEqual(['tensor']);
    expect(() => safetensorsLayout({ __metadata__: Tensor.fromBuffer('int8', [1], Buffer.alloc(1)) })).toThrow(/reserved/);
  });

  test('the header reader rejects gaps, bad sizes and garbage, naming the file', () => {
    const mk = (obj: unknown, dataLen: number) => {
      const j = Buffer.from(JSON.stringify(obj));
      const b = Buffer.alloc(8 + j.length + dataLen);
      b.writeBigUInt64LE(BigInt(j.length));
      j.copy(b, 8);
      return b;
    };
    expect(() => parseSafetensorsHeader(mk({ a: { dtype: 'F32', shape: [2], data_offsets: [4, 12] } }, 12), 'f.st')).toThrow(/f\.st.*not contiguous/);
    expect(() => parseSafetensorsHeader(mk({ a: { dtype: 'F32', shape: [3], data_offsets: [0, 8] } }, 8), 'f.st')).toThrow(/needs 12/);
    expect(() => parseSafetensorsHeader(Buffer.from('\x05\0\0\0\0\0\0\0{oops'), 'f.st')).toThrow(/does not parse/);
    const ok = mk({ a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] } }, 8);
    expect(() => parseSafetensorsHeader(ok, 'f.st', ok.length + 1)).toThrow(/data buffer ends/);
    expect(parseSafetensorsHeader(ok, 'f.st', ok.length).tensors[0].dtype).toBe('float32');
  });
});
