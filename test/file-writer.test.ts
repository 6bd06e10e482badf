// The native one-pass checksums (crc_pair.cc) and FileWriter (file_writer.cc), and FileSink on top:
// bytes on disk, both CRCs against independent implementations (zlib.crc32, the crc32c table
// path), errno errors from real failures (EEXIST, ENOSPC on a 1 MiB tmpfs), misuse codes; the
// writer's own thread (it writes while the libuv pool is blocked), close(fsync), early writeback.
import { spawnSync } from 'child_process';
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import * as zlib from 'zlib';
import { native } from '../src/native';
import { crc32c } from '../src/artifacts/checksum';
import { FileSink, withSink } from '../src/artifacts/sink';
import { CaptureError } from '../src/errors';
import { cleanup, cleanupMounts, mountTmpfs, rootOnlyReason, tmpDir } from './helpers';

afterAll(async () => {
  cleanupMounts();
  await cleanup();
});

/** Random bytes starting at an odd address offset, so unaligned loads are exercised. */
function unaligned(len: number, skew: number): Buffer {
  return crypto.randomBytes(len + skew).subarray(skew);
}

describe('crc32 / crcPair', () => {
  // Not 0: Node's zlib.crc32(empty, prev) returns 0 (zlib's crc32(crc, NULL, 0) idiom), not prev.
  const lengths = [1, 3, 4, 15, 16, 63, 64, 65, 127, 128, 255, 256, 257, 319, 320, 511, 512, 1000, 4096, 65537, (1 << 20) + 77];

  test('crc32 and crc32Software equal zlib.crc32, with and without prev', () => {
    for (const len of lengths) {
      for (const skew of [0, 1, 7]) {
        const b = unaligned(len, skew);
        const prev = crypto.randomBytes(4).readUInt32LE();
        expect(native.crc32(b)).toBe(zlib.crc32(b));
        expect(native.crc32(b, prev)).toBe(zlib.crc32(b, prev));
        expect(native.crc32Software(b, prev)).toBe(zlib.crc32(b, prev));
      }
    }
    expect(native.crc32(Buffer.from('123456789'))).toBe(0xcbf43926);
    expect(native.crc32(Buffer.alloc(0), 0x12345678)).toBe(0x12345678); // chaining over nothing keeps prev
    expect(native.crcPair(Buffer.alloc(0), 7, 9)).toEqual([7, 9]);
  });

  test('crcPair gives crc32c and zip crc32 of the same bytes, chaining across calls', () => {
    for (const len of lengths) {
      const b = unaligned(len, len % 5);
      const pc = crypto.randomBytes(4).readUInt32LE();
      const pz = crypto.randomBytes(4).readUInt32LE();
      expect(native.crcPair(b, pc, pz)).toEqual([native.crc32cSoftware(b, pc), zlib.crc32(b, pz)]);
    }
    const whole = crypto.randomBytes(300_000);
    let c = 0;
    let z = 0;
    for (let off = 0; off < whole.length; off += 77_777) [c, z] = native.crcPair(whole.subarray(off, off + 77_777), c, z);
    expect([c, z]).toEqual([crc32c(whole), zlib.crc32(whole)]);
  });

  test('rejects bad arguments with ERR_INVALID_ARG', () => {
    expect(() => native.crc32('abc' as unknown as Uint8Array)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG' }));
    expect(() => native.crc32(Buffer.alloc(1), 2 ** 32)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG' }));
    expect(() => native.crcPair(Buffer.alloc(1), -1, 0)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG' }));
  });
});

describe('native FileWriter', () => {
  const dir = tmpDir('wavebus-file-writer-');

  test('writes every byte in order; crc32c, offset and zip crc32 match the file', async () => {
    const file = path.join(dir, 'a.bin');
    // Small blocks exercise the checksum-then-write loop across block boundaries.
    const w = new native.FileWriter(file, 0o600, 4096);
    const parts = [unaligned(10, 1), unaligned(3 * 1024 * 1024 + 17, 3), unaligned(5000, 0)];
    expect(await w.write(parts[0])).toBeUndefined();
    const z = await w.write(parts[1], 0);
    expect(z).toBe(zlib.crc32(parts[1]));
    expect(await w.write(parts[2], z)).toBe(zlib.crc32(Buffer.concat([parts[1], parts[2]])));
    await w.sync();
    await w.close();
    const onDisk = fs.readFileSync(file);
    expect(onDisk.equals(Buffer.concat(parts))).toBe(true);
    expect(w.offset).toBe(onDisk.length);
    expect(w.crc32c).toBe(crc32c(onDisk));
    expect(w.closed).toBe(true);
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
  });

  test('refuses an existing file (O_EXCL) with EEXIST and syscall open', () => {
    const file = path.join(dir, 'exists.bin');
    fs.writeFileSync(file, 'x');
    expect(() => new native.FileWriter(file, 0o644, 65536)).toThrow(expect.objectContaining({ code: 'EEXIST', syscall: 'open' }));
    expect(() => new native.FileWriter(path.join(dir, 'no', 'such', 'dir'), 0o644, 65536)).toThrow(
      expect.objectContaining({ code: 'ENOENT', syscall: 'open' }),
    );
  });

  test('one operation at a time, nothing after close, bad arguments named', async () => {
    const w = new native.FileWriter(path.join(dir, 'busy.bin'), 0o644, 65536);
    const first = w.write(Buffer.alloc(1 << 20, 1));
    expect(w.busy).toBe(true);
    expect(() => w.write(Buffer.alloc(10))).toThrow(expect.objectContaining({ code: 'ERR_BUSY' }));
    expect(() => w.abandon()).toThrow(expect.objectContaining({ code: 'ERR_BUSY' }));
    await first;
    expect(w.busy).toBe(false);
    expect(() => w.write('text' as unknown as Uint8Array)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG', message: expect.stringContaining('data') }));
    expect(() => w.write(Buffer.alloc(1), 2 ** 32)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG', message: expect.stringContaining('zipPrev') }));
    await w.close();
    expect(() => w.write(Buffer.alloc(10))).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }));
    expect(() => w.sync()).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }));
    w.abandon(); // idempotent after close
    expect(() => new native.FileWriter(path.join(dir, 'c.bin'), 0o644, 100)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG', message: expect.stringContaining('blockBytes') }));
    expect(() => new native.FileWriter(path.join(dir, 'd.bin'), 0o10000, 65536)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG', message: expect.stringContaining('mode') }));
  });

  test('early writeback (sync_file_range every writebackBytes) and close(fsync) keep every byte and the checksum', async () => {
    const file = path.join(dir, 'wb.bin');
    // 64 KiB writeback steps over 4 KiB blocks: many hints, across write() calls.
    const w = new native.FileWriter(file, 0o644, 4096, 65536);
    const parts = [unaligned(300 * 1024 + 5, 1), unaligned(7, 2), unaligned(1024 * 1024 + 3, 3)];
    for (const p of parts) await w.write(p);
    await w.close(true);
    expect(w.closed).toBe(true);
    const onDisk = fs.readFileSync(file);
    expect(onDisk.equals(Buffer.concat(parts))).toBe(true);
    expect(w.crc32c).toBe(crc32c(onDisk));
    expect(() => w.close(true)).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }));
    expect(() => new native.FileWriter(path.join(dir, 'wb2.bin'), 0o644, 4096, 4096)).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG', message: expect.stringContaining('writebackBytes') }),
    );
    const off = new native.FileWriter(path.join(dir, 'wb3.bin'), 0o644, 4096, 0); // 0: no early writeback
    await off.write(parts[0]);
    expect(() => off.close('yes' as unknown as boolean)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG', message: expect.stringContaining('fsync') }));
    await off.close(false);
    expect(fs.readFileSync(path.join(dir, 'wb3.bin')).equals(parts[0])).toBe(true);
  });

  test('writes on its own thread: they complete while every libuv pool thread is blocked', async () => {
    // Each pool thread blocks in open(2) of a FIFO with no writer until we open its other end;
    // a writer on the pool (as staging copies and other fs work are) would wait behind them.
    const poolSize = Number(process.env.UV_THREADPOOL_SIZE ?? 4);
    const fifos = Array.from({ length: poolSize }, (_, i) => path.join(dir, `pool-${i}.fifo`));
    for (const f of fifos) expect(spawnSync('mkfifo', [f]).status).toBe(0);
    const blocked = fifos.map((f) => fs.promises.readFile(f));
    let poolRan = false;
    const probe = fs.promises.access(dir).then(() => (poolRan = true)); // queued behind the blocked ones
    try {
      const file = path.join(dir, 'own-thread.bin');
      const w = new native.FileWriter(file, 0o644, 65536, 1 << 20);
      const data = unaligned(3 << 20, 1);
      await w.write(data);
      await w.close(true);
      expect(poolRan).toBe(false); // the pool really was blocked all along
      expect(fs.readFileSync(file).equals(data)).toBe(true);
    } finally {
      for (const f of fifos) fs.writeFileSync(f, 'x'); // opens the write end: unblocks the reader (sync: the pool is busy)
      await Promise.all([...blocked, probe]);
    }
  });

  const noRoot = rootOnlyReason();
  (noRoot ? test.skip : test)('a full disk rejects the write with ENOSPC and syscall write', async () => {
    const mnt = path.join(dir, 'small');
    mountTmpfs(mnt, '1m');
    const w = new native.FileWriter(path.join(mnt, 'full.bin'), 0o644, 65536);
    await expect(w.write(Buffer.alloc(2 << 20, 7))).rejects.toMatchObject({ code: 'ENOSPC', syscall: 'write' });
    w.abandon();
    expect(w.closed).toBe(true);
    // Through FileSink/withSink: a CaptureError naming the path and errno, and no partial file left.
    const file = path.join(mnt, 'sink.bin');
    const err = await withSink(file, (s) => s.write(Buffer.alloc(2 << 20, 7))).catch((e) => e);
    expect(err).toBeInstanceOf(CaptureError);
    expect(err.code).toBe('ERR_ENOSPC');
    expect(err.message).toContain(`write ${file} failed: ENOSPC`);
    expect(fs.existsSync(file)).toBe(false);
  });
});

describe('FileSink on FileWriter', () => {
  const dir = tmpDir('wavebus-sink-');

  test('gathered small writes and large ones land in order; writeZip covers exactly its bytes', async () => {
    const file = path.join(dir, 's.bin');
    const sink = await FileSink.create(file);
    const head = Buffer.from('header');
    const small = unaligned(1000, 1);
    const big = unaligned(2 * 1024 * 1024 + 3, 2);
    await sink.write(head);
    let z = await sink.writeZip(small, 0); // gathered: crc from zlib here
    z = await sink.writeZip(big, z); // large: crc from the native pass
    await sink.write(Buffer.from('tail'));
    expect(z).toBe(zlib.crc32(Buffer.concat([small, big])));
    expect(sink.offset).toBe(head.length + small.length + big.length + 4);
    expect(() => sink.result()).toThrow(expect.objectContaining({ code: 'ERR_SINK_STATE' }));
    const r = await sink.close();
    const onDisk = fs.readFileSync(file);
    expect(onDisk.equals(Buffer.concat([head, small, big, Buffer.from('tail')]))).toBe(true);
    expect(r).toEqual({ bytes: onDisk.length, checksum: `crc32c:${crc32c(onDisk).toString(16).padStart(8, '0')}` });
    await expect(sink.write(Buffer.alloc(1))).rejects.toMatchObject({ code: 'ERR_CLOSED' });
  });

  test('finishInBackground: size and checksum at once, fsync + close behind; close({ fsync }) in one call', async () => {
    const file = path.join(dir, 'bg.bin');
    const sink = await FileSink.create(file);
    const head = Buffer.from('head');
    const big = unaligned(9 * 1024 * 1024 + 11, 1); // more than one early-writeback step
    await sink.write(head);
    await sink.write(big);
    const { result, durable } = await sink.finishInBackground();
    await expect(sink.write(Buffer.alloc(1))).rejects.toMatchObject({ code: 'ERR_CLOSED' });
    await durable;
    const onDisk = fs.readFileSync(file);
    expect(onDisk.equals(Buffer.concat([head, big]))).toBe(true);
    expect(result).toEqual({ bytes: onDisk.length, checksum: `crc32c:${crc32c(onDisk).toString(16).padStart(8, '0')}` });

    const file2 = path.join(dir, 'synced.bin');
    const r2 = await withSink(file2, (s) => s.write(big), { fsync: true });
    expect(r2.bytes).toBe(big.length);
    expect(fs.readFileSync(file2).equals(big)).toBe(true);
  });

  test('create refuses an existing file as a CaptureError naming it', async () => {
    const file = path.join(dir, 'dup.bin');
    fs.writeFileSync(file, '');
    await expect(FileSink.create(file)).rejects.toMatchObject({ code: 'ERR_EEXIST', message: expect.stringContaining(`create ${file} failed: EEXIST`) });
  });

  test('a failing source discards the partial file', async () => {
    const file = path.join(dir, 'partial.bin');
    const err = await withSink(file, async (s) => {
      await s.write(Buffer.alloc(1 << 20, 1));
      throw new Error('source broke');
    }).catch((e) => e);
    expect(err).toMatchObject({ code: 'ERR_SOURCE' });
    expect(fs.existsSync(file)).toBe(false);
  });
});
