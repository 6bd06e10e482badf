import * as fs from 'fs';
import * as path from 'path';
import type { DType } from '../src/artifacts/dtype';
import { CaptureError } from '../src/errors';
import type { ForwardContext } from '../src/messages';
import { CaptureBudget } from '../src/snapshot/budget';
import { CaptureInput, SnapshotCapturer } from '../src/snapshot/capture';
import { resolveSnapshotConfig, SnapshotFormat } from '../src/snapshot/config';
import { loadCallDir } from '../src/snapshot/loader';
import { cleanup, runPython, tmpDir } from './helpers';

afterAll(cleanup);

const ctx: ForwardContext = {
  compilationHash: 'g',
  globalStep: 3,
  isPrompt: true,
  reqIds: ['r-1'],
  positions: [0, 1],
  rowRequest: [0, 0],
  numSpeculativeTokens: 0,
  warmup: false,
};

/** Deterministic, non-trivial bytes for any dtype (bool: 0/1 only). */
function bytesFor(dtype: DType, numel: number, item: number, seed: number): Buffer {
  const b = Buffer.alloc(numel * item);
  for (let i = 0; i < b.length; i++) b[i] = (i * 31 + seed * 17 + 7) & 0xff;
  if (dtype === 'bool') for (let i = 0; i < b.length; i++) b[i] &= 1;
  return b;
}

const CASES: { dtype: DType; shape: number[]; item: number }[] = [
  { dtype: 'float32', shape: [2, 3], item: 4 },
  { dtype: 'bfloat16', shape: [4, 1, 2], item: 2 },
  { dtype: 'float16', shape: [5], item: 2 },
  { dtype: 'int64', shape: [2, 2], item: 8 },
  { dtype: 'int32', shape: [], item: 4 },
  { dtype: 'uint8', shape: [7], item: 1 },
  { dtype: 'bool', shape: [3, 1], item: 1 },
  { dtype: 'int8', shape: [0, 4], item: 1 },
  { dtype: 'float8_e4m3fn', shape: [6], item: 1 },
  { dtype: 'float8_e5m2', shape: [2, 3], item: 1 },
];

async function captureAll(format: SnapshotFormat, cases = CASES): Promise<{ dir: string; data: Buffer[] }> {
  const root = tmpDir('wb-load-');
  const config = resolveSnapshotConfig({ WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_CACHE_ROOT: root, WAVEBUS_SNAPSHOT_FORMAT: format }, {}, () => undefined);
  const c = new SnapshotCapturer(config, { globalRank: 0, tpRank: 0, ppRank: 0, dpRank: 0, cpRank: 0 }, {
    budget: new CaptureBudget(1),
    log: { info: () => undefined, warn: () => undefined },
  });
  const data = cases.map((k, i) => bytesFor(k.dtype, k.shape.reduce((a, b) => a * b, 1), k.item, i));
  const inputs: CaptureInput[] = cases.map((k, i) => ({ dtype: k.dtype, shape: k.shape, read: async () => data[i] }));
  const r = await c.capture(ctx, inputs);
  expect(r.captured).toBe(true);
  return { dir: r.callDir!, data };
}

describe.each<SnapshotFormat>(['npy', 'pt', 'safetensors'])('round trip (%s)', (format) => {
  test('every dtype comes back with its dtype, shape and bytes', async () => {
    const { dir, data } = await captureAll(format);
    const { meta, tensors } = await loadCallDir(dir);
    expect(meta.format).toBe(format);
    expect(meta.call_index).toBe(0);
    expect(tensors.map((t) => t.index)).toEqual(CASES.map((_, i) => i));
    tensors.forEach((t, i) => {
      expect(t.dtype).toBe(CASES[i].dtype);
      expect(t.shape).toEqual(CASES[i].shape);
      expect(t.data.equals(data[i])).toBe(true);
    });
  });
});

async function expectLoadError(dir: string, file: string, re: RegExp): Promise<void> {
  const err = await loadCallDir(dir).catch((e) => e);
  expect(err).toBeInstanceOf(CaptureError);
  expect(err.message).toContain(file);
  expect(err.message).toMatch(re);
}

function editMeta(dir: string, edit: (m: Record<string, any>) => void): void {
  const p = path.join(dir, 'meta.json');
  const m = JSON.parse(fs.readFileSync(p, 'utf8'));
  edit(m);
  fs.writeFileSync(p, JSON.stringify(m, null, 2));
}

describe('the loader checks every file against meta.json', () => {
  const two = CASES.slice(0, 2);

  test('a flipped byte fails the checksum', async () => {
    const { dir } = await captureAll('npy', two);
    const f = path.join(dir, 'tensor1.npy');
    const b = fs.readFileSync(f);
    b[b.length - 1] ^= 0xff;
    fs.writeFileSync(f, b);
    await expectLoadError(dir, 'tensor1.npy', /checksum crc32c:[0-9a-f]{8} does not match/);
  });

  test('a truncated or grown file fails the size check', async () => {
    const { dir } = await captureAll('pt', two);
    fs.appendFileSync(path.join(dir, 'tensor0.pt'), 'x');
    await expectLoadError(dir, 'tensor0.pt', /has \d+ bytes, meta.json says \d+/);
  });

  test('a missing tensor file', async () => {
    const { dir } = await captureAll('safetensors', two);
    fs.unlinkSync(path.join(dir, 'tensor1.safetensors'));
    await expectLoadError(dir, 'tensor1.safetensors', /missing/);
  });

  test('an extra file', async () => {
    const { dir } = await captureAll('npy', two);
    fs.writeFileSync(path.join(dir, 'tensor2.npy'), 'stray');
    await expectLoadError(dir, 'tensor2.npy', /not listed in meta.json/);
  });

  test('a dtype disagreeing with the file', async () => {
    const { dir } = await captureAll('npy', two);
    editMeta(dir, (m) => (m.inputs[0].dtype = 'int32')); // same item size, different type
    await expectLoadError(dir, 'tensor0.npy', /holds float32, meta.json says int32/);
  });

  test('a shape disagreeing with the file', async () => {
    const { dir } = await captureAll('pt', two);
    editMeta(dir, (m) => (m.inputs[0].shape = [3, 2]));
    await expectLoadError(dir, 'tensor0.pt', /has shape \[2, 3\], meta.json says \[3, 2\]/);
  });

  test('|V1 in npy accepts either fp8 named by meta.json, not bf16', async () => {
    const { dir } = await captureAll('npy', [CASES[8]]);
    editMeta(dir, (m) => (m.inputs[0].dtype = 'float8_e5m2'));
    expect((await loadCallDir(dir)).tensors[0].dtype).toBe('float8_e5m2');
    editMeta(dir, (m) => (m.inputs[0].dtype = 'bfloat16'));
    await expectLoadError(dir, 'tensor0.npy', /bytes|holds/);
  });

  test('files and inputs disagreeing in count', async () => {
    const { dir } = await captureAll('npy', two);
    editMeta(dir, (m) => m.files.pop());
    await expectLoadError(dir, 'meta.json', /files lists \[tensor0.npy\] but inputs need \[tensor0.npy, tensor1.npy\]/);
  });

  test('no meta.json, bad JSON, unknown schema, missing field', async () => {
    const { dir } = await captureAll('npy', two);
    const p = path.join(dir, 'meta.json');
    const good = fs.readFileSync(p, 'utf8');
    editMeta(dir, (m) => (m.schema = 2));
    await expectLoadError(dir, 'meta.json', /schema 2 is not supported/);
    fs.writeFileSync(p, good);
    editMeta(dir, (m) => delete m.inputs);
    await expectLoadError(dir, 'meta.json', /missing field "inputs"/);
    fs.writeFileSync(p, good);
    expect((await loadCallDir(dir)).tensors).toHaveLength(2);
    fs.writeFileSync(p, good.slice(0, 20));
    await expectLoadError(dir, 'meta.json', /not valid JSON/);
    fs.unlinkSync(p);
    await expectLoadError(dir, 'meta.json', /missing/);
  });
});

describe("the loader reads the seed's layout: meta.json without files", () => {
  // A call dir as the seed's writer leaves it: tensor<i>.<format> from numpy / torch and a meta.json
  // with the seed's fields only (no files, no pp/cp rank, no row_request).
  function seedCallDir(format: 'npy' | 'pt'): string {
    const dir = tmpDir('wb-seed-');
    runPython(
      `
import json, sys, numpy as np, torch
d, fmt = sys.argv[1], sys.argv[2]
a = np.arange(6, dtype=np.float32).reshape(2, 3)
b = np.array([7, -8, 9], dtype=np.int64)
bf = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
if fmt == "npy":
    np.save(f"{d}/tensor0.npy", a); np.save(f"{d}/tensor1.npy", b)
    np.save(f"{d}/tensor2.npy", bf.view(torch.int16).numpy().view("V2"))
else:
    torch.save(torch.from_numpy(a), f"{d}/tensor0.pt"); torch.save(torch.from_numpy(b), f"{d}/tensor1.pt"); torch.save(bf, f"{d}/tensor2.pt")
meta = {"schema": 1, "hash": "seedhash", "format": fmt, "global_rank": 0, "tp_rank": 0, "dp_rank": 0, "call_index": 2,
        "selected_by": ["token"], "inputs": [{"index": 0, "dtype": "float32", "shape": [2, 3]}, {"index": 1, "dtype": "int64", "shape": [3]},
        {"index": 2, "dtype": "bfloat16", "shape": [2]}], "global_step": 40, "is_prompt": False,
        "matches": [{"batch_index": 0, "request_id": "abc-1", "position": 104, "reason": "token"}], "req_ids": ["abc-1"], "positions": [103]}
json.dump(meta, open(f"{d}/meta.json", "w"), indent=2, sort_keys=True)
`,
      [dir, format],
    );
    return dir;
  }
  test.each<'npy' | 'pt'>(['npy', 'pt'])('%s', async (format) => {
    const dir = seedCallDir(format);
    const { meta, tensors } = await loadCallDir(dir);
    expect(meta.files).toBeUndefined();
    expect(meta.call_index).toBe(2);
    expect(tensors.map((t) => [t.dtype, t.shape])).toEqual([
      ['float32', [2, 3]],
      ['int64', [3]],
      ['bfloat16', [2]],
    ]);
    expect(Array.from(new Float32Array(tensors[0].data.buffer.slice(tensors[0].data.byteOffset, tensors[0].data.byteOffset + 24)))).toEqual([0, 1, 2, 3, 4, 5]);
    expect(tensors[2].data.readUInt16LE(0)).toBe(0x3fc0); // bf16 1.5
    // Without a files list the dtype/shape checks still hold, and an extra file is still refused.
    fs.writeFileSync(path.join(dir, 'stray.bin'), 'x');
    await expectLoadError(dir, 'stray.bin', /not listed in meta.json/);
  });
});

describe('paths', () => {
  test('load_call_dir("~/...") works: a leading ~ is the home directory', async () => {
    const { dir } = await captureAll('npy', CASES.slice(0, 2));
    const home = tmpDir('wb-home-');
    fs.renameSync(dir, path.join(home, 'call0'));
    const saved = process.env.HOME;
    process.env.HOME = home; // os.homedir() reads HOME
    try {
      expect((await loadCallDir('~/call0')).tensors).toHaveLength(2);
    } finally {
      process.env.HOME = saved;
    }
  });
});
