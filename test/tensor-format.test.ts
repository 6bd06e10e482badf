// artifacts/tensor-format.ts: the format names and the proto TensorFormat enum they travel as;
// artifacts/tensor-files.ts: the one registry every writer and reader of tensor files goes through.
import * as fs from 'fs';
import * as path from 'path';
import { enumValues } from '../src/proto';
import { isTensorFormat, TENSOR_FORMATS, tensorFileExtension, tensorFormatFromProto, tensorFormatOfFile, tensorFormatToProto } from '../src/artifacts/tensor-format';
import { kvDumpFileName, resolveDtype, tensorFile, tensorFileOf } from '../src/artifacts/tensor-files';
import { Bundle } from '../src/artifacts/bundle';
import { Tensor } from '../src/artifacts/tensor';
import { SNAPSHOT_FORMATS } from '../src/snapshot/config';
import { configFromRaw } from '../src/guard/config';
import { cleanup, runPython, tmpDir } from './helpers';

afterAll(cleanup);

describe('TensorFormat', () => {
  test('every name maps to its own proto value and back; unspecified gives the default', () => {
    const wire = enumValues('TensorFormat');
    expect(TENSOR_FORMATS.map(tensorFormatToProto)).toEqual([wire.TENSOR_FORMAT_PT, wire.TENSOR_FORMAT_NPY, wire.TENSOR_FORMAT_SAFETENSORS]);
    for (const f of TENSOR_FORMATS) expect(tensorFormatFromProto(tensorFormatToProto(f), 'f')).toBe(f);
    expect(tensorFormatFromProto(wire.TENSOR_FORMAT_UNSPECIFIED, 'f')).toBe('pt');
    expect(tensorFormatFromProto(wire.TENSOR_FORMAT_UNSPECIFIED, 'f', 'npy')).toBe('npy');
    expect(Object.keys(wire).length).toBe(TENSOR_FORMATS.length + 1);
  });

  test('a number from a newer peer is refused, naming the field', () => {
    expect(() => tensorFormatFromProto(99, 'dump.format')).toThrow('dump.format: unknown TensorFormat 99 (this side knows pt, npy, safetensors)');
    expect(isTensorFormat('h5')).toBe(false);
  });

  test('snapshots and the runtime config take exactly these formats', () => {
    expect(SNAPSHOT_FORMATS).toEqual(TENSOR_FORMATS);
    expect(configFromRaw({ dump: { format: 'safetensors' } }, 'c').dump.format).toBe('safetensors');
    expect(() => configFromRaw({ dump: { format: 'h5' } }, 'c')).toThrow(/dump\.format/);
  });

  test('the Python client sees the same numbers', () => {
    const py = JSON.parse(
      runPython(
        'import sys, json; sys.path.insert(0, sys.argv[1]); from wavebus_client import wavebus_pb2 as pb; ' +
          'print(json.dumps({n: pb.TensorFormat.Value(n) for n in pb.TensorFormat.keys()}))',
        [path.resolve(__dirname, '..', 'clients/python')],
      ),
    );
    expect(py).toEqual(enumValues('TensorFormat'));
  });
});

describe('the tensor file registry', () => {
  const bytes = Buffer.from(Array.from({ length: 24 }, (_, i) => i * 7));
  const tensor = () => Tensor.fromBuffer('float32', [2, 3], bytes);

  test('every format has an entry named for it, found again by its file extension', () => {
    for (const f of TENSOR_FORMATS) {
      const entry = tensorFile(f);
      expect(entry.name).toBe(f);
      expect(entry.extension).toBe(tensorFileExtension(f));
      expect(tensorFormatOfFile(`a/b/layer.0${entry.extension}`)).toBe(f);
      expect(tensorFileOf(`x${entry.extension}`)).toBe(entry);
    }
    expect(tensorFileOf('x.h5')).toBeUndefined();
    expect(tensorFileOf('dump.json')).toBeUndefined();
  });

  test.each([...TENSOR_FORMATS])('%s: a lone Tensor written through a bundle reads back whole, with its bytes where the reader says', async (f) => {
    const dir = path.join(tmpDir(), 'bundle');
    const b = Bundle.begin(dir);
    const entry = await b.writeTensor('t', f, tensor());
    await b.commit();
    expect(entry.path).toBe(`t${tensorFileExtension(f)}`);
    const file = path.join(dir, entry.path);
    const got = tensorFileOf(file)!.read(file);
    expect(got.lone).toBe(true);
    expect(got.tensors).toHaveLength(1);
    const t = got.tensors[0];
    expect({ dtype: t.dtype, shape: t.shape, nbytes: t.nbytes, notContiguous: t.notContiguous }).toEqual({ dtype: 'float32', shape: [2, 3], nbytes: 24, notContiguous: undefined });
    expect(fs.readFileSync(file).subarray(t.offset, t.offset + t.nbytes)).toEqual(bytes);
  });

  test('a KV layer: pt keeps k, v and the metadata in one file, the others one file each; the reader names k and v', async () => {
    expect(TENSOR_FORMATS.map((f) => [kvDumpFileName('model.layers.0.attn', f, 'v'), tensorFile(f).kvInOneFile])).toEqual([
      ['model.layers.0.attn.pt', true],
      ['model.layers.0.attn.v.npy', false],
      ['model.layers.0.attn.v.safetensors', false],
    ]);
    const dir = path.join(tmpDir(), 'kv');
    const b = Bundle.begin(dir);
    const k = Tensor.fromBuffer('int8', [4], Buffer.from([1, 2, 3, 4]));
    const v = Tensor.fromBuffer('int8', [4], Buffer.from([5, 6, 7, 8]));
    const e = await b.writeTensor(kvDumpFileName('l0', 'pt', 'k'), 'pt', { layer: 'l0', k, v });
    await b.commit();
    const file = path.join(dir, e.path);
    const got = tensorFile('pt').read(file);
    expect(got.lone).toBe(false);
    const v2 = got.tensors.find((t) => t.name === 'v')!;
    expect(fs.readFileSync(file).subarray(v2.offset, v2.offset + v2.nbytes)).toEqual(Buffer.from([5, 6, 7, 8]));
  });

  test('npy refuses a dict, naming the file; an extension that disagrees with the format is refused', async () => {
    const b = Bundle.begin(path.join(tmpDir(), 'refused'));
    await expect(b.writeTensor('kv', 'npy', { k: tensor() })).rejects.toThrow(/kv\.npy: format npy holds exactly one Tensor/);
    const b2 = Bundle.begin(path.join(tmpDir(), 'refused2'));
    await expect(b2.writeTensor('x.pt', 'npy', tensor())).rejects.toThrow('file "x.pt" has extension .pt but format is npy');
  });

  test('a .npy of one fp8 kind says only |V1; the JSON beside it picks among the header\'s candidates, nothing else', async () => {
    const dir = path.join(tmpDir(), 'fp8');
    const b = Bundle.begin(dir);
    await b.writeTensor('t', 'npy', Tensor.fromBuffer('float8_e5m2', [2], Buffer.from([1, 2])));
    await b.commit();
    const [t] = tensorFile('npy').read(path.join(dir, 't.npy')).tensors;
    expect(t.dtype).toBeNull();
    expect(t.code).toBe('|V1');
    expect(resolveDtype(t, 'float8_e5m2')).toBe('float8_e5m2');
    expect(resolveDtype(t, 'float32')).toBeNull();
  });
});
