// `wavebus compare`: decoders checked against numpy/torch, real bundles written with Bundle,
// the CLI's exit codes, TP assembly against torch.cat, and the heatmap PNG decoded by Python.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { loadAssembled } from '../src/tools/assemble';
import { Bundle } from '../src/artifacts/bundle';
import { bf16ToFloat, compareCaptures, compareTensors, fp8e4m3fnToFloat, fp8e5m2ToFloat, halfToFloat, unravel, type CompareResult } from '../src/tools/compare';
import type { DType } from '../src/artifacts/dtype';
import { encodePng, heatmapGrid, heatmapPng } from '../src/tools/heatmap';
import { Tensor } from '../src/artifacts/tensor';
import { cleanup, pseudoRandomBytes, runPython, runWavebus, tmpDir } from './helpers';

afterAll(cleanup);

/** Random finite bf16 values in about [-4, 4]. */
function bf16Data(numel: number, seed: number): Buffer {
  const r = pseudoRandomBytes(numel * 2, seed);
  const out = Buffer.alloc(numel * 2);
  for (let i = 0; i < numel; i++) {
    const mant = r[2 * i] & 0x7f;
    const exp = 124 + (r[2 * i + 1] & 3); // 2^-3 .. 2^0
    const sign = r[2 * i + 1] & 0x80;
    out.writeUInt16LE((sign << 8) | (exp << 7) | mant, i * 2);
  }
  return out;
}

/** float64 values of a file (a small file's Buffer sits inside Node's shared pool: copy its own bytes). */
function readF64(file: string): Float64Array {
  const b = fs.readFileSync(file);
  return new Float64Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
}

function sameFloat(a: number, b: number): boolean {
  return (Number.isNaN(a) && Number.isNaN(b)) || a === b;
}

describe('element decoding matches numpy / torch', () => {
  test('float16 (all 65536 patterns) vs numpy, bfloat16 (all patterns) vs torch, e5m2 vs numpy float16', () => {
    const dir = tmpDir();
    runPython(
      `import sys, numpy as np, torch
bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
bits.view(np.float16).astype(np.float64).tofile(sys.argv[1] + '/f16')
torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16).to(torch.float64).numpy().tofile(sys.argv[1] + '/bf16')
b8 = np.arange(256, dtype=np.uint16)
(b8 << 8).astype(np.uint16).view(np.float16).astype(np.float64).tofile(sys.argv[1] + '/e5m2')`,
      [dir],
    );
    const f16 = readF64(path.join(dir, 'f16'));
    const bf16 = readF64(path.join(dir, 'bf16'));
    const e5m2 = readF64(path.join(dir, 'e5m2'));
    let bad = 0;
    for (let i = 0; i < 65536; i++) {
      if (!sameFloat(halfToFloat(i), f16[i])) bad++;
      if (!sameFloat(bf16ToFloat(i), bf16[i])) bad++;
    }
    expect([f16.length, bf16.length, e5m2.length]).toEqual([65536, 65536, 256]);
    for (let i = 0; i < 256; i++) if (!sameFloat(fp8e5m2ToFloat(i), e5m2[i])) bad++;
    expect(bad).toBe(0);
    expect(halfToFloat(0x3c00)).toBe(1);
    expect(halfToFloat(0x7c00)).toBe(Infinity);
    expect(bf16ToFloat(0x3f80)).toBe(1);
  });

  test('float8_e4m3fn (all 256 patterns) vs a Python reference of the OCP spec (numpy 1.24 and torch 1.13 have no fp8)', () => {
    const out = runPython(`import math
vals = []
for b in range(256):
    s = -1.0 if b & 0x80 else 1.0
    e = (b >> 3) & 0xF
    m = b & 0x7
    if e == 0xF and m == 0x7:
        vals.append('nan')
    elif e == 0:
        vals.append(repr(s * math.ldexp(m / 8.0, -6)))
    else:
        vals.append(repr(s * math.ldexp(1.0 + m / 8.0, e - 7)))
print(' '.join(vals))`).trim();
    const ref = out.split(' ').map((v) => (v === 'nan' ? NaN : Number(v)));
    expect(ref).toHaveLength(256);
    for (let i = 0; i < 256; i++) expect(sameFloat(fp8e4m3fnToFloat(i), ref[i])).toBe(true);
    expect(fp8e4m3fnToFloat(0x7e)).toBe(448); // the largest finite value
    expect(fp8e4m3fnToFloat(0x38)).toBe(1);
    expect(fp8e4m3fnToFloat(0x01)).toBe(2 ** -9); // the smallest subnormal
    expect(Number.isNaN(fp8e4m3fnToFloat(0xff))).toBe(true);
    expect(fp8e5m2ToFloat(0x7c)).toBe(Infinity);
  });
});

function f64(values: number[], shape = [values.length]) {
  const data = Buffer.alloc(values.length * 8);
  values.forEach((v, i) => data.writeDoubleLE(v, i * 8));
  return { key: 't', file: 'mem', dtype: 'float64' as DType, shape, data };
}

describe('tolerance semantics (numpy.isclose)', () => {
  test('atol / rtol edges, NaN and infinities', () => {
    const b = f64([1, 2, 3, 4]);
    const a = f64([1 + 2 ** -10, 2, 3, 4]);
    expect(compareTensors(a, b, 0, 0)).toMatchObject({ status: 'differs', mismatched: 1, first_diff_index: [0], max_abs_diff: 2 ** -10 });
    expect(compareTensors(a, b, 2 ** -10, 0).status).toBe('within_tolerance'); // |a-b| == atol passes
    expect(compareTensors(a, b, 2 ** -11, 0).status).toBe('differs');
    expect(compareTensors(a, b, 0, 2 ** -10).status).toBe('within_tolerance'); // rtol * |b| with b = 1
    expect(compareTensors(a, b, 0, 2 ** -11).status).toBe('differs');
    expect(compareTensors(b, b, 0, 0).status).toBe('equal');
    // NaN vs NaN equal; NaN vs a number is a difference, whatever the tolerance.
    expect(compareTensors(f64([NaN, 1]), f64([NaN, 1]), 0, 0).status).toBe('equal');
    expect(compareTensors(f64([NaN, 1]), f64([0, 1]), 1e9, 1e9)).toMatchObject({ status: 'differs', mismatched: 1, nan_mismatched: 1, first_diff_index: [0] });
    // Infinities: equal only to the same infinity.
    expect(compareTensors(f64([Infinity, -Infinity]), f64([Infinity, -Infinity]), 0, 0).status).toBe('equal');
    expect(compareTensors(f64([Infinity]), f64([-Infinity]), 1e9, 1e9)).toMatchObject({ status: 'differs', max_abs_diff: Infinity });
    expect(compareTensors(f64([Infinity]), f64([5]), 1e9, 1e9).status).toBe('differs');
    // Multi-index of the first difference.
    expect(compareTensors(f64([0, 0, 0, 0, 0, 7], [2, 3]), f64([0, 0, 0, 0, 0, 0], [2, 3]), 0, 0).first_diff_index).toEqual([1, 2]);
    expect(unravel(23, [2, 3, 4])).toEqual([1, 2, 3]);
  });

  test('integers compare exactly, tolerances do not apply', () => {
    const i32 = (v: number[]) => ({ key: 'i', file: 'mem', dtype: 'int32' as DType, shape: [v.length], data: Buffer.from(new Int32Array(v).buffer) });
    expect(compareTensors(i32([1, 2, 3]), i32([1, 2, 3]), 0, 0).status).toBe('equal');
    expect(compareTensors(i32([1, 2, 4]), i32([1, 2, 3]), 100, 100)).toMatchObject({ status: 'differs', mismatched: 1, first_diff_index: [2], max_abs_diff: 1 });
  });
});

/** A snapshot-like call dir: tensor0 float32 (npy), tensor1 bf16 (npy, dtype from meta.json), tensor2 int64 (pt). */
async function writeCall(dir: string, f32: Float32Array, bf16: Buffer, ints: BigInt64Array): Promise<void> {
  const b = Bundle.begin(dir);
  const files = [
    await b.writeTensor('tensor0.npy', 'npy', Tensor.fromBuffer('float32', [4, f32.length / 4], f32)),
    await b.writeTensor('tensor1.npy', 'npy', Tensor.fromBuffer('bfloat16', [bf16.length / 2], bf16)),
    await b.writeTensor('tensor2.pt', 'pt', Tensor.fromBuffer('int64', [ints.length], ints)),
  ];
  await b.commit({
    name: 'meta.json',
    value: {
      schema: 1,
      global_rank: 0,
      call_index: 3,
      format: 'npy',
      inputs: [
        { index: 0, dtype: 'float32', shape: [4, f32.length / 4] },
        { index: 1, dtype: 'bfloat16', shape: [bf16.length / 2] },
        { index: 2, dtype: 'int64', shape: [ints.length] },
      ],
      files: files.map((f) => ({ name: f.path, bytes: f.bytes, checksum: f.checksum })),
    },
  });
}

describe('compare captures (CLI)', () => {
  test('identical captures exit 0; one flipped element exits 1 with its index and magnitude; usage errors exit 2', async () => {
    const root = tmpDir();
    const f32 = new Float32Array(Array.from({ length: 32 }, (_, i) => i * 0.5 - 3));
    const bf = bf16Data(64, 9);
    const ints = new BigInt64Array(Array.from({ length: 5 }, (_, i) => BigInt(i) * 10n ** 15n));
    await writeCall(path.join(root, 'runA', 'call3'), f32, bf, ints);
    await writeCall(path.join(root, 'runB', 'call3'), f32, bf, ints);
    const same = runWavebus(['compare', path.join(root, 'runA'), path.join(root, 'runB'), '--json']);
    expect(same.code).toBe(0);
    const sj = JSON.parse(same.stdout) as CompareResult;
    expect(sj.summary.equal).toBe(3);
    expect(sj.tensors.map((t) => t.key).sort()).toEqual(['call3/tensor0', 'call3/tensor1', 'call3/tensor2']);
    expect(sj.tensors.find((t) => t.key === 'call3/tensor1')!.dtype_a).toBe('bfloat16'); // from meta.json, not |V2

    // Flip one float32 element: [2, 5] of a [4, 8] tensor, by +0.25.
    const g = new Float32Array(f32);
    g[2 * 8 + 5] += 0.25;
    await writeCall(path.join(root, 'runC', 'call3'), g, bf, ints);
    const diff = runWavebus(['compare', path.join(root, 'runA'), path.join(root, 'runC'), '--json']);
    expect(diff.code).toBe(1);
    const t0 = (JSON.parse(diff.stdout) as CompareResult).tensors.find((t) => t.key === 'call3/tensor0')!;
    expect(t0).toMatchObject({ status: 'differs', mismatched: 1, first_diff_index: [2, 5], max_abs_diff: 0.25 });
    expect(t0.first_diff_values).toEqual([f32[21], g[21]]);
    const text = runWavebus(['compare', path.join(root, 'runA'), path.join(root, 'runC')]);
    expect(text.code).toBe(1);
    expect(text.stdout).toMatch(/DIFFERS\s+call3\/tensor0 .*max_abs=0\.2500 .*first \[2, 5\]/);
    // Within tolerance: exit 0.
    expect(runWavebus(['compare', path.join(root, 'runA'), path.join(root, 'runC'), '--atol', '0.25']).code).toBe(0);
    expect(runWavebus(['compare', path.join(root, 'runA'), path.join(root, 'runC'), '--atol', '0.2']).code).toBe(1);
    // Two single files pair by themselves.
    expect(runWavebus(['compare', path.join(root, 'runA', 'call3', 'tensor2.pt'), path.join(root, 'runC', 'call3', 'tensor2.pt')]).code).toBe(0);

    // A bf16 element flipped (sign bit) and an int64 off by one at 10^15 scale.
    const bf2 = Buffer.from(bf);
    bf2[2 * 10 + 1] ^= 0x80;
    const ints2 = new BigInt64Array(ints);
    ints2[4] += 1n;
    await writeCall(path.join(root, 'runD', 'call3'), f32, bf2, ints2);
    const d2 = JSON.parse(runWavebus(['compare', path.join(root, 'runA'), path.join(root, 'runD'), '--json', '--rtol', '1']).stdout) as CompareResult;
    const t1 = d2.tensors.find((t) => t.key === 'call3/tensor1')!;
    expect(t1.first_diff_index).toEqual([10]);
    expect(t1.max_abs_diff).toBe(2 * Math.abs(bf16ToFloat(bf.readUInt16LE(20))));
    expect(d2.tensors.find((t) => t.key === 'call3/tensor2')).toMatchObject({ status: 'differs', first_diff_index: [4] });

    // Missing tensors and usage errors.
    fs.rmSync(path.join(root, 'runD', 'call3', 'tensor2.pt'));
    const miss = JSON.parse(runWavebus(['compare', path.join(root, 'runA'), path.join(root, 'runD'), '--json']).stdout) as CompareResult;
    expect(miss.summary.only_in_a).toBe(1);
    expect(runWavebus(['compare', path.join(root, 'runA'), path.join(root, 'nope')]).code).toBe(2);
    const badTol = runWavebus(['compare', path.join(root, 'runA'), path.join(root, 'runB'), '--atol', '-1']);
    expect(badTol.code).toBe(2);
    expect(badTol.stderr).toMatch(/--atol/);
    expect(runWavebus(['compare', path.join(root, 'runA'), path.join(root, 'runB'), '--heatmap', 'x.jpg']).code).toBe(2);
    fs.writeFileSync(path.join(root, 'garbage.npy'), 'not an npy');
    const garbage = runWavebus(['compare', path.join(root, 'garbage.npy'), path.join(root, 'garbage.npy')]);
    expect(garbage.code).toBe(2);
    expect(garbage.stderr).toMatch(/garbage\.npy/);
  });
});

const G = { layers: 2, blocks: 3, blockSize: 4, heads: 8, headDim: 16 };

/**
 * Write a KV dump wave dir of the full [blocks, bs, 8, hd] tensors split over `tp` ranks (global
 * ranks from `firstRank`, the last PP stage: pp_rank = firstRank / tp), in the seed's
 * dp<d>_tp<t>_pp<p>_cp<c> dirs, or (`legacy`) the rank<g> dirs of wavebus before them.
 */
async function writeTpDump(wave: string, tp: number, full: Buffer[][], firstRank: number, order: number[], legacy = false): Promise<void> {
  const per = G.heads / tp;
  const ppRank = firstRank / tp;
  for (const tpRank of order) {
    const g = firstRank + tpRank;
    const b = Bundle.begin(path.join(wave, legacy ? `rank${g}` : `dp0_tp${tpRank}_pp${ppRank}_cp0`));
    const files = [];
    for (let l = 0; l < G.layers; l++) {
      const shard = (kv: number) => {
        const out = Buffer.alloc(G.blocks * G.blockSize * per * G.headDim * 2);
        let o = 0;
        for (let r = 0; r < G.blocks * G.blockSize; r++) {
          const start = (r * G.heads + tpRank * per) * G.headDim * 2;
          full[l][kv].copy(out, o, start, start + per * G.headDim * 2);
          o += per * G.headDim * 2;
        }
        return Tensor.fromBuffer('bfloat16', [G.blocks, G.blockSize, per, G.headDim], out);
      };
      files.push(await b.writeTensor(`model.layers.${l}.self_attn.pt`, 'pt', { layer: `model.layers.${l}.self_attn`, tp_rank: tpRank, k: shard(0), v: shard(1) }));
    }
    await b.commit({
      name: 'dump.json',
      value: {
        schema: 1,
        format: 'pt',
        identity: { global_rank: g, tp_rank: tpRank, pp_rank: ppRank, dp_rank: 0, cp_rank: 0, tp_size: tp },
        layers: Array.from({ length: G.layers }, (_, l) => ({ layer: `model.layers.${l}.self_attn`, dtype: 'bfloat16', shape: [G.blocks, G.blockSize, per, G.headDim] })),
        files,
      },
    });
  }
}

describe('--assemble-tp and heatmaps', () => {
  test('TP=4 shards join along dim 2 exactly as torch.cat does; a TP=4 dump equals a TP=2 dump of the same request', async () => {
    const root = tmpDir();
    const numel = G.blocks * G.blockSize * G.heads * G.headDim;
    const full = Array.from({ length: G.layers }, (_, l) => [bf16Data(numel, 100 + l), bf16Data(numel, 200 + l)]);
    const tp4 = path.join(root, 'tp4', 'token_repeat', 'req-1', 'wave_7');
    const tp2 = path.join(root, 'tp2', 'token_repeat', 'req-1', 'wave_7');
    await writeTpDump(tp4, 4, full, 4, [2, 0, 3, 1]); // global ranks 4..7, written out of order
    await writeTpDump(tp2, 2, full, 0, [1, 0]);

    const assembled = loadAssembled(tp4);
    const k1 = assembled.find((t) => t.key === 'model.layers.1.self_attn.k')!;
    expect(k1.shape).toEqual([G.blocks, G.blockSize, G.heads, G.headDim]);
    expect(k1.tpRanks).toEqual([0, 1, 2, 3]);
    expect(k1.data.equals(full[1][0])).toBe(true);
    const torchHash = runPython(
      `import sys, torch, hashlib
parts = [torch.load(sys.argv[1] + '/dp0_tp%d_pp1_cp0/model.layers.1.self_attn.pt' % t, weights_only=True) for t in range(4)]
parts.sort(key=lambda d: d['tp_rank'])
cat = torch.cat([p['k'] for p in parts], dim=2)
print(tuple(cat.shape), hashlib.sha256(cat.contiguous().view(torch.int16).numpy().tobytes()).hexdigest())`,
      [tp4],
    ).trim();
    expect(torchHash).toBe(`(3, 4, 8, 16) ${crypto.createHash('sha256').update(k1.data).digest('hex')}`);

    const ok = runWavebus(['compare', tp4, tp2, '--assemble-tp', '--json']);
    expect(ok.code).toBe(0);
    const okJ = JSON.parse(ok.stdout) as CompareResult;
    expect(okJ.summary.equal).toBe(4);
    // Without assembly, the rank dirs do not pair up.
    expect(runWavebus(['compare', tp4, tp2]).code).toBe(1);

    // Flip one element in TP=2 rank 1 (heads 4..7): layer 0, v, block 2, slot 1, local head 3, dim 5.
    const f = path.join(tp2, 'dp0_tp1_pp0_cp0', 'model.layers.0.self_attn.pt');
    const { readPt } = await import('../src/artifacts/pt-reader');
    const v = readPt(f).tensors[1];
    const bytes = fs.readFileSync(f);
    const per = G.heads / 2;
    const flat = ((2 * G.blockSize + 1) * per + 3) * G.headDim + 5;
    const before = bf16ToFloat(bytes.readUInt16LE(v.dataOffset + flat * 2));
    bytes.writeUInt16LE(0x4200, v.dataOffset + flat * 2); // 32.0
    fs.writeFileSync(f, bytes);
    const heat = path.join(root, 'heat.png');
    const html = path.join(root, 'heat.html');
    const bad = runWavebus(['compare', tp4, tp2, '--assemble-tp', '--json', '--heatmap', heat]);
    expect(bad.code).toBe(1);
    const t = (JSON.parse(bad.stdout) as CompareResult).tensors.find((x) => x.key === 'model.layers.0.self_attn.v')!;
    expect(t).toMatchObject({ status: 'differs', mismatched: 1, first_diff_index: [2, 1, 7, 5], max_abs_diff: Math.abs(32 - before) });
    expect(t.per_head_max_abs).toEqual([0, 0, 0, 0, 0, 0, 0, Math.abs(32 - before)]);
    expect(runWavebus(['compare', tp4, tp2, '--assemble-tp', '--heatmap', html]).code).toBe(1);
    const page = fs.readFileSync(html, 'utf8');
    expect(page).toMatch(/<table>/);
    expect(page).toContain('model.layers.0.self_attn.v');
    expect((page.match(/<tr>/g) ?? []).length).toBe(5); // header + 4 tensors

    // The PNG decodes: signature, chunk CRCs, IHDR, IDAT inflating to height * (1 + 3 * width).
    const check = runPython(
      `import sys, struct, zlib
d = open(sys.argv[1], 'rb').read()
assert d[:8] == b'\\x89PNG\\r\\n\\x1a\\n', 'signature'
i = 8; chunks = []
while i < len(d):
    n, = struct.unpack('>I', d[i:i+4]); typ = d[i+4:i+8]; body = d[i+8:i+8+n]
    crc, = struct.unpack('>I', d[i+8+n:i+12+n])
    assert zlib.crc32(typ + body) & 0xffffffff == crc, typ
    chunks.append((typ, body)); i += 12 + n
assert [c[0] for c in chunks] == [b'IHDR', b'IDAT', b'IEND']
w, h, depth, ctype, comp, filt, inter = struct.unpack('>IIBBBBB', chunks[0][1])
raw = zlib.decompress(chunks[1][1])
assert len(raw) == h * (1 + 3 * w), (len(raw), w, h)
# the differing cell (row of layer0.v, head 7) is darker than an equal one
c = (w - 1) // 8
row = [t for t in range(4)]
def px(x, y): o = y * (1 + 3 * w) + 1 + 3 * x; return tuple(raw[o:o+3])
print(w, h, depth, ctype, px(7 * c + c // 2, 1 * c + c // 2), px(0 * c + c // 2, 1 * c + c // 2))`,
      [heat],
    ).trim();
    const [w, h, depth, ctype, ...rest] = check.split(' ');
    expect(Number(depth)).toBe(8);
    expect(Number(ctype)).toBe(2);
    expect(Number(w)).toBeGreaterThan(8);
    expect(Number(h)).toBeGreaterThan(4);
    expect(rest.join(' ')).toBe('(128, 0, 38) (247, 247, 247)'); // max diff dark red; an equal head near-white
  });

  test('dumps of wavebus before the seed names (rank<g>/) compare with new ones, with and without --assemble-tp', async () => {
    const root = tmpDir();
    const numel = G.blocks * G.blockSize * G.heads * G.headDim;
    const full = Array.from({ length: G.layers }, (_, l) => [bf16Data(numel, 300 + l), bf16Data(numel, 400 + l)]);
    const oldW = path.join(root, 'old', 'wave_3');
    const newW = path.join(root, 'new', 'wave_3');
    await writeTpDump(oldW, 2, full, 0, [0, 1], true);
    await writeTpDump(newW, 2, full, 0, [1, 0]);
    expect(fs.readdirSync(oldW).sort()).toEqual(['rank0', 'rank1']);
    expect(fs.readdirSync(newW).sort()).toEqual(['dp0_tp0_pp0_cp0', 'dp0_tp1_pp0_cp0']);
    // Shard by shard: an old rank<g>/ is keyed by the seed's name from its dump.json, so they pair.
    const plain = compareCaptures(oldW, newW, { atol: 0, rtol: 0, assembleTp: false });
    expect(plain.tensors.map((t) => `${t.key}:${t.status}`).sort()).toEqual(
      ['dp0_tp0_pp0_cp0', 'dp0_tp1_pp0_cp0'].flatMap((d) => [0, 1].flatMap((l) => ['k', 'v'].map((kv) => `${d}/model.layers.${l}.self_attn.${kv}:equal`))).sort(),
    );
    const assembled = runWavebus(['compare', oldW, newW, '--assemble-tp', '--json']);
    expect(assembled.code).toBe(0);
    expect((JSON.parse(assembled.stdout) as CompareResult).summary.equal).toBe(4);
    expect(loadAssembled(oldW).find((t) => t.key === 'model.layers.0.self_attn.k')!.data.equals(full[0][0])).toBe(true);
  });

  test('--assemble-tp refuses a shard whose directory name is not a rank dir or disagrees with its dump.json', async () => {
    const root = tmpDir();
    const numel = G.blocks * G.blockSize * G.heads * G.headDim;
    const full = Array.from({ length: G.layers }, (_, l) => [bf16Data(numel, 500 + l), bf16Data(numel, 600 + l)]);
    const w = path.join(root, 'wave_1');
    await writeTpDump(w, 2, full, 0, [0, 1]);
    fs.renameSync(path.join(w, 'dp0_tp1_pp0_cp0'), path.join(w, 'dp0_tp2_pp0_cp0'));
    expect(() => loadAssembled(w)).toThrow(`${w}: KV dump directory "dp0_tp2_pp0_cp0" disagrees with its dump.json (global rank 1, dp0_tp1_pp0_cp0)`);
    fs.renameSync(path.join(w, 'dp0_tp2_pp0_cp0'), path.join(w, 'shard1'));
    let err: unknown;
    try {
      loadAssembled(w);
    } catch (e) {
      err = e;
    }
    expect(err).toMatchObject({ code: 'ERR_KV_DIR_NAME', message: `${w}: KV dump directory "shard1" is not dp<d>_tp<t>_pp<p>_cp<c> (decimal, no leading zeros) (nor rank<g> of an older wavebus)` });
    const cli = runWavebus(['compare', w, w, '--assemble-tp']);
    expect(cli.code).toBe(2);
    expect(cli.stderr).toContain('"shard1" is not dp<d>_tp<t>_pp<p>_cp<c>');
  });

  test('heatmap grid and the PNG encoder on their own', () => {
    const r: CompareResult = {
      a: 'a',
      b: 'b',
      atol: 0,
      rtol: 0,
      assemble_tp: false,
      ok: false,
      summary: { equal: 0, within_tolerance: 0, differs: 1, shape_mismatch: 1, only_in_a: 0, only_in_b: 0 },
      tensors: [
        { key: 'x', status: 'differs', per_head_max_abs: [0, 2], nan_mismatched: 0 },
        { key: 'y', status: 'shape_mismatch' },
      ],
    };
    const g = heatmapGrid(r);
    expect(g).toEqual({ rows: ['x', 'y'], cols: 2, cells: [[0, 2], [-1, null]], max: 2 });
    const png = heatmapPng(g, 10);
    expect(png.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]))).toBe(true);
    expect(png.readUInt32BE(16)).toBe(21);
    expect(png.readUInt32BE(20)).toBe(21);
    expect(() => encodePng(2, 2, Buffer.alloc(5))).toThrow(/2x2/);
    expect(compareCaptures.length).toBeGreaterThan(0);
  });
});
