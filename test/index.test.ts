// The package entry (`require('wavebus')`, package.json "main"): it resolves to the built public
// API, names the same things as src/index.ts, and a TypeScript engine can work from it alone.
import * as fs from 'fs';
import * as path from 'path';
import * as api from '../src/index';
import { ROOT, cleanup, runPython, tmpDir } from './helpers';

afterAll(cleanup);

// What the built package is: the file package.json names, not src/ through ts-jest.
function loadPackage(): typeof api {
  const main = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')).main as string;
  expect(fs.existsSync(path.join(ROOT, main))).toBe(true);
  return require(ROOT) as typeof api;
}

test('package.json main resolves to the public API of src/index.ts, built from the current sources', () => {
  const pkg = loadPackage();
  expect(Object.keys(pkg).sort()).toEqual(Object.keys(api).sort());
  for (const name of ['WavebusClient', 'MailboxFeature', 'ShmSegment', 'Coordinator', 'Agent', 'launch', 'aggregate', 'inspectTree', 'compareCaptures', 'loadCallDir', 'writeNpy', 'writePt', 'writeSafetensors']) {
    expect(pkg).toHaveProperty(name);
  }
  const err = new pkg.ConfigError('bad --tp');
  expect(err).toBeInstanceOf(pkg.WavebusError);
  expect(err.code).toBe('ERR_CONFIG');
  expect(err.message).toBe('bad --tp');
});

test('from the package alone: a shared-memory region, written as .npy, read back by numpy and by wavebus', async () => {
  const pkg = loadPackage();
  const name = `/wavebus-index-${process.pid}`;
  const seg = pkg.ShmSegment.create(name, 16 * 4);
  try {
    const values = new Float32Array(seg.buffer().buffer, seg.buffer().byteOffset, 16);
    values.forEach((_, i) => (values[i] = i * 0.5 - 3));
    const file = path.join(tmpDir(), 'region.npy');
    await pkg.writeNpy(file, pkg.Tensor.fromBuffer('float32', [4, 4], seg.buffer()));
    expect(pkg.readNpyHeader(file)).toMatchObject({ dtype: 'float32', shape: [4, 4] });
    const out = JSON.parse(runPython('import sys, json, numpy; a = numpy.load(sys.argv[1]); print(json.dumps([str(a.dtype), a.shape, a.ravel().tolist()]))', [file]));
    expect(out).toEqual(['float32', [4, 4], Array.from(values)]);
  } finally {
    seg.close();
    pkg.ShmSegment.unlink(name);
  }
});
