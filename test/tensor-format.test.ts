// artifacts/tensor-format.ts: the format names and the proto TensorFormat enum they travel as.
import * as path from 'path';
import { enumValues } from '../src/proto';
import { isTensorFormat, TENSOR_FORMATS, tensorFormatFromProto, tensorFormatToProto } from '../src/artifacts/tensor-format';
import { SNAPSHOT_FORMATS } from '../src/snapshot/config';
import { configFromRaw } from '../src/guard/config';
import { runPython } from './helpers';

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
