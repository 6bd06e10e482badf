// Atomic bundles: commit makes a complete folder appear at once; every failure (source error,
// EFBIG from a real file-size limit, unsafe names, races) leaves nothing under the final name.
// Also stale temp cleanup, the free-space check and dump_skipped.json.
import * as fs from 'fs';
import * as path from 'path';
import { Bundle, removeStaleTemps } from '../src/artifacts/bundle';
import { Tensor } from '../src/artifacts/tensor';
import { CaptureError } from '../src/errors';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { checkFreeSpace, writeDumpSkipped } from '../src/artifacts/freespace';
import { readNpyHeader } from '../src/artifacts/npy-reader';
import { readPt } from '../src/artifacts/pt-reader';
import { readSafetensorsHeader } from '../src/artifacts/safetensors-reader';
import { ROOT, cleanup, cleanupMounts, mountTmpfs, rootOnlyReason, runPython, spawnTracked, tmpDir, waitFor } from './helpers';

afterAll(async () => {
  cleanupMounts(); // before cleanup(): the tmpfs is mounted inside one of its temp dirs
  await cleanup();
});

const DIST_BUNDLE = path.join(ROOT, 'dist', 'src', 'artifacts', 'bundle.js');
const DIST_TENSOR = path.join(ROOT, 'dist', 'src', 'artifacts', 'tensor.js');

function leftovers(parent: string): string[] {
  return fs.existsSync(parent) ? fs.readdirSync(parent) : [];
}

describe('Bundle', () => {
  test('commit: every file complete and synced, meta.json last with sorted keys, temp dir gone', async () => {
    const parent = tmpDir('wavebus-bundle-');
    const final = path.join(parent, 'wave_3', 'rank5');
    const b = Bundle.begin(final);
    expect(path.dirname(b.tempDir)).toBe(path.dirname(final));
    expect(path.basename(b.tempDir)).toMatch(new RegExp(`^\\.rank5\\.tmp-${process.pid}-[0-9a-f]{8}@`));
    const k = Tensor.fromBuffer('float16', [2, 4, 1, 2], Buffer.alloc(32, 1));
    const e1 = await b.writeTensor('0', 'pt', { req_id: 'r', layer: 0, k });
    const e2 = await b.writeTensor('0.k.npy', 'npy', k);
    const e3 = await b.writeTensor('sub/0.k', 'safetensors', { k });
    const e4 = b.writeJson('extra.json', { b: 1, a: [2, { d: 1, c: 2 }] }, { sortKeys: true });
    expect(fs.existsSync(final)).toBe(false); // nothing visible before commit
    const files = await b.commit({ name: 'meta.json', value: { z: 1, a: 2, nested: { y: 1, x: 2 } } });
    expect(files.map((f) => f.path)).toEqual(['0.pt', '0.k.npy', 'sub/0.k.safetensors', 'extra.json', 'meta.json']);
    expect([e1.path, e2.path, e3.path, e4.path]).toEqual(files.slice(0, 4).map((f) => f.path));
    for (const f of files) {
      const buf = fs.readFileSync(path.join(final, f.path));
      expect({ p: f.path, bytes: buf.length, checksum: formatChecksum(crc32c(buf)) }).toEqual({ p: f.path, bytes: f.bytes, checksum: f.checksum });
    }
    expect(fs.readFileSync(path.join(final, 'meta.json'), 'utf8')).toBe('{\n  "a": 2,\n  "nested": {\n    "x": 2,\n    "y": 1\n  },\n  "z": 1\n}\n');
    expect(fs.readFileSync(path.join(final, 'extra.json'), 'utf8')).toContain('"a": [\n    2,\n    {\n      "c": 2,\n      "d": 1');
    expect(leftovers(path.dirname(final))).toEqual(['rank5']);
    expect(readPt(path.join(final, '0.pt')).archiveName).toBe('0');
    expect(readNpyHeader(path.join(final, '0.k.npy')).shape).toEqual([2, 4, 1, 2]);
    expect(readSafetensorsHeader(path.join(final, 'sub', '0.k.safetensors')).tensors[0].shape).toEqual([2, 4, 1, 2]);
    await expect(b.writeTensor('x', 'npy', k)).rejects.toThrow(/already committed/);
  });

  test('more tensor files than fsyncs allowed in flight: each is fsynced behind the next, all complete at commit', async () => {
    const parent = tmpDir('wavebus-bundle-');
    const final = path.join(parent, 'rank4');
    const b = Bundle.begin(final);
    const want = new Map<string, Buffer>();
    for (let i = 0; i < 13; i++) {
      const data = Buffer.alloc(64 * 1024 + i, i + 1);
      const fmt = (['npy', 'pt', 'safetensors'] as const)[i % 3];
      const t = Tensor.fromBuffer('uint8', [data.length], data);
      const e = await b.writeTensor(`layer${i}`, fmt, fmt === 'npy' ? t : { k: t });
      want.set(e.path, data);
    }
    const files = await b.commit({ name: 'dump.json', value: { n: 13 } });
    expect(files).toHaveLength(14);
    for (const f of files) {
      const buf = fs.readFileSync(path.join(final, f.path));
      expect({ p: f.path, bytes: buf.length, checksum: formatChecksum(crc32c(buf)) }).toEqual({ p: f.path, bytes: f.bytes, checksum: f.checksum });
      const data = want.get(f.path);
      if (data) expect(buf.includes(data)).toBe(true);
    }
    expect(leftovers(parent)).toEqual(['rank4']);
  });

  (rootOnlyReason() ? test.skip : test)('ENOSPC on a later file while earlier ones are still being fsynced: nothing left, errno named', async () => {
    const mnt = path.join(tmpDir('wavebus-bundle-'), 'small');
    mountTmpfs(mnt, '1m');
    const b = Bundle.begin(path.join(mnt, 'rank0'));
    let err: unknown;
    try {
      for (let i = 0; i < 8; i++) await b.writeTensor(`l${i}`, 'npy', Tensor.fromBuffer('uint8', [200 * 1024], Buffer.alloc(200 * 1024, i)));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(CaptureError);
    expect((err as CaptureError).code).toBe('ERR_ENOSPC');
    expect((err as CaptureError).message).toMatch(/rank0: write .*l\d\.npy failed: ENOSPC.*nothing was written under the final name/);
    expect(leftovers(mnt)).toEqual([]);
    await expect(b.commit()).rejects.toThrow(/aborted/);
    expect(leftovers(mnt)).toEqual([]);
  });

  test('begin refuses an existing final dir, naming it', () => {
    const parent = tmpDir('wavebus-bundle-');
    const final = path.join(parent, 'rank0');
    fs.mkdirSync(final);
    expect(() => Bundle.begin(final)).toThrow(new RegExp(`${final} already exists`));
    expect(leftovers(parent)).toEqual(['rank0']);
  });

  test('begin under a file fails with the path and errno code', () => {
    const parent = tmpDir('wavebus-bundle-');
    fs.writeFileSync(path.join(parent, 'f'), 'x');
    expect(() => Bundle.begin(path.join(parent, 'f', 'rank0'))).toThrow(/mkdir .*f failed: E(EXIST|NOTDIR)/);
  });

  test('a source failure mid-write aborts the bundle: temp dir removed, nothing under the final name', async () => {
    const parent = tmpDir('wavebus-bundle-');
    const final = path.join(parent, 'rank1');
    const b = Bundle.begin(final);
    await b.writeTensor('ok', 'npy', Tensor.fromBuffer('int8', [4], Buffer.alloc(4)));
    async function* failing() {
      yield Buffer.alloc(1024);
      throw new Error('device region gone');
    }
    const err = await b.writeTensor('bad', 'pt', { k: Tensor.fromChunks('float32', [1024], failing(), 4096) }).catch((e) => e);
    expect(err).toBeInstanceOf(CaptureError);
    expect(err.message).toMatch(/rank1.*bad\.pt.*device region gone.*nothing was written under the final name/);
    expect(leftovers(parent)).toEqual([]);
    await expect(b.commit()).rejects.toThrow(/aborted: .*device region gone/);
    expect(leftovers(parent)).toEqual([]);
  });

  test('unsafe file names are refused and abort the bundle', async () => {
    const parent = tmpDir('wavebus-bundle-');
    for (const bad of ['../escape', '/abs', 'a//b', '.hidden', '']) {
      const b = Bundle.begin(path.join(parent, 'r'));
      await expect(b.writeTensor(bad, 'npy', Tensor.fromBuffer('int8', [1], Buffer.alloc(1)))).rejects.toThrow(CaptureError);
      expect(leftovers(parent)).toEqual([]);
    }
    const b = Bundle.begin(path.join(parent, 'r'));
    expect(() => b.writeJson('../x.json', {})).toThrow(/unsafe file name/);
    expect(leftovers(parent)).toEqual([]);
    expect(fs.existsSync(path.join(path.dirname(parent), 'x.json'))).toBe(false);
  });

  test('a final dir that appears during the write is not replaced', async () => {
    const parent = tmpDir('wavebus-bundle-');
    const final = path.join(parent, 'rank2');
    const b = Bundle.begin(final);
    await b.writeTensor('a', 'npy', Tensor.fromBuffer('int8', [1], Buffer.alloc(1)));
    fs.mkdirSync(final);
    fs.writeFileSync(path.join(final, 'theirs'), 'x');
    await expect(b.commit()).rejects.toThrow(/appeared while writing/);
    expect(leftovers(parent)).toEqual(['rank2']);
    expect(fs.readdirSync(final)).toEqual(['theirs']);
  });

  test('a real write error (EFBIG under a file-size limit) names path and errno, leaves nothing', async () => {
    expect(fs.existsSync(DIST_BUNDLE)).toBe(true); // built by `npx tsc -p tsconfig.json`
    const parent = tmpDir('wavebus-bundle-');
    const final = path.join(parent, 'rank3');
    const script = `
const { Bundle } = require(${JSON.stringify(DIST_BUNDLE)});
const { Tensor } = require(${JSON.stringify(DIST_TENSOR)});
(async () => {
  const b = Bundle.begin(${JSON.stringify(final)});
  try {
    await b.writeTensor('big', 'npy', Tensor.fromBuffer('uint8', [4 << 20], Buffer.alloc(4 << 20, 7)));
    await b.commit();
    console.log('UNEXPECTED success');
  } catch (e) { console.log(e.constructor.name + ' ' + e.code + ' ' + e.message); }
})();`;
    // ulimit -f is in 1 KiB blocks; SIGXFSZ ignored so write() fails with EFBIG instead of killing.
    const p = spawnTracked('bash', ['-c', `trap '' XFSZ; ulimit -f 1024; exec "${process.execPath}" -e "$0"`, script]);
    const ex = await p.exited;
    expect(ex.code).toBe(0);
    expect(p.stdout()).toMatch(/^CaptureError ERR_EFBIG bundle .*rank3: write .*big\.npy failed: EFBIG/);
    expect(leftovers(parent)).toEqual([]);
  });

  test('removeStaleTemps removes temp dirs of dead processes only', async () => {
    expect(fs.existsSync(DIST_BUNDLE)).toBe(true);
    const parent = tmpDir('wavebus-bundle-');
    const script = `
const { Bundle } = require(${JSON.stringify(DIST_BUNDLE)});
const b = Bundle.begin(${JSON.stringify(path.join(parent, 'rank7'))});
require('fs').writeFileSync(b.tempDir + '/partial.pt', 'half');
console.log(b.tempDir);
setInterval(() => {}, 1000);`;
    const child = spawnTracked(process.execPath, ['-e', script]);
    const deadTemp = (await waitFor(() => child.stdout().trim(), 'child bundle temp dir')).trim();
    child.child.kill('SIGKILL');
    await child.exited;
    const mine = Bundle.begin(path.join(parent, 'rank8')); // live (this process)
    const otherHost = path.join(parent, '.rank9.tmp-1-deadbeef@some-other-host');
    fs.mkdirSync(otherHost);
    fs.mkdirSync(path.join(parent, 'rank6'));
    expect(removeStaleTemps(parent)).toEqual([deadTemp]);
    expect(leftovers(parent).sort()).toEqual([path.basename(otherHost), path.basename(mine.tempDir), 'rank6'].sort());
    await mine.abort();
    expect(removeStaleTemps(path.join(parent, 'missing'))).toEqual([]);
  });
});

describe('free space and dump_skipped.json', () => {
  test('checkFreeSpace compares statfs free bytes with estimate × tp_size + headroom, for not-yet-created dirs too', () => {
    const dir = tmpDir('wavebus-free-');
    const free = Number(runPython(`import os, sys; s = os.statvfs(sys.argv[1]); print(s.f_bavail * s.f_frsize)`, [dir]).trim());
    const r = checkFreeSpace(path.join(dir, 'not', 'yet'), { estimatePerRankBytes: 1000, tpSize: 4, headroomBytes: 5 });
    expect(r.ok).toBe(true);
    expect(r.neededBytes).toBe(4005);
    expect(Math.abs(r.freeBytes - free)).toBeLessThan(64 * 1024 * 1024); // other processes write meanwhile
    const big = checkFreeSpace(dir, { estimatePerRankBytes: r.freeBytes * 2, tpSize: 1, headroomBytes: 0 });
    expect(big.ok).toBe(false);
    expect(() => checkFreeSpace(dir, { estimatePerRankBytes: -1, tpSize: 1, headroomBytes: 0 })).toThrow(/estimatePerRankBytes/);
    expect(() => checkFreeSpace(dir, { estimatePerRankBytes: 1, tpSize: 0, headroomBytes: 0 })).toThrow(/tpSize must be a positive integer, got 0/);
  });

  (rootOnlyReason() ? test.skip : test)('"skip when free < estimate_per_rank × tp_size + free_headroom_bytes" on a real 8 MiB tmpfs', () => {
    const mnt = path.join(tmpDir('wavebus-free-'), 'small');
    mountTmpfs(mnt, '8m');
    const MiB = 1024 * 1024;
    const free = checkFreeSpace(mnt, { estimatePerRankBytes: 0, tpSize: 1, headroomBytes: 0 }).freeBytes;
    expect(free).toBe(8 * MiB);
    // one rank's 2 MiB fits with 1 MiB headroom; four ranks' shards (8 MiB) + 1 MiB do not
    expect(checkFreeSpace(path.join(mnt, 'kv', 'rank0'), { estimatePerRankBytes: 2 * MiB, tpSize: 1, headroomBytes: MiB })).toEqual({ ok: true, freeBytes: free, neededBytes: 3 * MiB });
    expect(checkFreeSpace(path.join(mnt, 'kv', 'rank0'), { estimatePerRankBytes: 2 * MiB, tpSize: 4, headroomBytes: MiB })).toEqual({ ok: false, freeBytes: free, neededBytes: 9 * MiB });
    // exactly enough is enough
    expect(checkFreeSpace(mnt, { estimatePerRankBytes: 2 * MiB, tpSize: 3, headroomBytes: 2 * MiB }).ok).toBe(true);
    // what is written counts: after 3 MiB, 2 MiB × 2 + 2 MiB no longer fits, 2 MiB × 1 + 2 MiB does
    fs.writeFileSync(path.join(mnt, 'taken'), Buffer.alloc(3 * MiB));
    expect(checkFreeSpace(mnt, { estimatePerRankBytes: 2 * MiB, tpSize: 2, headroomBytes: 2 * MiB })).toMatchObject({ ok: false, freeBytes: 5 * MiB });
    expect(checkFreeSpace(mnt, { estimatePerRankBytes: 2 * MiB, tpSize: 1, headroomBytes: 2 * MiB })).toMatchObject({ ok: true, freeBytes: 5 * MiB });
  });

  test('writeDumpSkipped writes the reason record atomically', () => {
    const dir = path.join(tmpDir('wavebus-skip-'), 'kv_cache', 'token_repeat', 'r1', 'wave_9', 'dp0_tp0_pp0_cp0');
    const p = writeDumpSkipped(dir, { reason: 'insufficient_free_space', req_id: 'r1', incident_type: 'token_repeat', stage: 'arm', rank: 0, wave: 9, ts: 1700000000.5 });
    expect(p).toBe(path.join(dir, 'dump_skipped.json'));
    expect(JSON.parse(fs.readFileSync(p, 'utf8'))).toEqual({
      reason: 'insufficient_free_space',
      req_id: 'r1',
      incident_type: 'token_repeat',
      stage: 'arm',
      rank: 0,
      wave: 9,
      ts: 1700000000.5,
    });
    expect(fs.readdirSync(dir)).toEqual(['dump_skipped.json']);
    expect(() => writeDumpSkipped(dir, { reason: 'bored' as never, req_id: 'r1', incident_type: 't', stage: 'arm', rank: 0, wave: 1 })).toThrow(/reason must be one of/);
    expect(() => writeDumpSkipped(dir, { reason: 'd2h_failed', req_id: 'r1', incident_type: 't', stage: 'later' as never, rank: 0, wave: 1 })).toThrow(/stage/);
  });
});
