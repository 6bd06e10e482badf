// Real POSIX shared memory, real child processes (node and Debian's python3).
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import { NativeError } from '../src/errors';
import { cudaAvailable, DeviceRegion, ShmSegment, Staging } from '../src/memory';
import { addonPath, native } from '../src/native';
import { cleanup, runPython, spawnTracked } from './helpers';

const created: string[] = [];
let counter = 0;
function shmName(tag: string): string {
  const n = `/wavebus-test-${process.pid}-${tag}-${counter++}`;
  created.push(n);
  return n;
}

function pattern(n: number, seed = 1): Buffer {
  const b = Buffer.alloc(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + seed * 7 + (i >> 8)) & 0xff;
  return b;
}

function createFilled(tag: string, n: number): { name: string; seg: ShmSegment; data: Buffer } {
  const name = shmName(tag);
  const seg = ShmSegment.create(name, n);
  const data = pattern(n, counter);
  seg.buffer().set(data);
  return { name, seg, data };
}

async function expectCode(p: Promise<unknown> | (() => unknown), code: string, msg?: RegExp): Promise<NativeError> {
  let err: unknown;
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(NativeError);
  expect((err as NativeError).code).toBe(code);
  if (msg) expect((err as NativeError).message).toMatch(msg);
  return err as NativeError;
}

afterAll(async () => {
  for (const n of created) {
    try {
      fs.rmSync(`/dev/shm${n}`, { force: true });
    } catch {
      /* already gone */
    }
  }
  await cleanup();
});

describe('ShmSegment', () => {
  test('create, fill through the buffer, copy ranges back; name normalization', async () => {
    const { name, seg, data } = createFilled('basic', 10000);
    expect(seg.name).toBe(name);
    expect(seg.size).toBe(10000);
    expect(seg.readonly).toBe(false);
    const dst = Buffer.alloc(600, 0xee);
    await seg.copyTo(dst, 100, 4321, 500);
    expect(dst.subarray(100, 600).equals(data.subarray(4321, 4821))).toBe(true);
    expect(dst.subarray(0, 100).every((b) => b === 0xee)).toBe(true);
    // Opening without the leading slash finds the same segment.
    const ro = ShmSegment.open(name.slice(1));
    expect(ro.readonly).toBe(true);
    expect(ro.size).toBe(10000);
    await expectCode(() => ro.buffer(), 'ERR_READONLY');
    ro.close();
    seg.close();
  });

  test('create refuses an existing name; open of a missing name says why', async () => {
    const { name, seg } = createFilled('excl', 64);
    await expectCode(() => ShmSegment.create(name, 64), 'ERR_SHM_OPEN', /File exists/);
    await expectCode(() => ShmSegment.open(`/wavebus-test-missing-${process.pid}`), 'ERR_SHM_OPEN', /No such file/);
    await expectCode(() => ShmSegment.create('bad/name', 64), 'ERR_INVALID_ARG', /name must match/);
    await expectCode(() => ShmSegment.create(shmName('zero'), 0), 'ERR_INVALID_ARG', /nbytes must be positive/);
    seg.close();
  });

  test('after close: ERR_CLOSED, never a crash; the Buffer handed out earlier stays valid', async () => {
    const { seg, data } = createFilled('closed', 4096);
    const buf = seg.buffer();
    expect(seg.buffer()).toBe(buf); // one Buffer per mapping
    seg.close();
    seg.close(); // idempotent
    expect(seg.closed).toBe(true);
    await expectCode(seg.copyTo(Buffer.alloc(10), 0, 0, 10), 'ERR_CLOSED', /is closed/);
    await expectCode(() => seg.buffer(), 'ERR_CLOSED');
    await expectCode(() => seg.stat(), 'ERR_CLOSED');
    // The mapping lives on until the Buffer is collected.
    expect(buf.equals(data)).toBe(true);
    buf[0] ^= 0xff;
    expect(buf[0]).toBe(data[0] ^ 0xff);
  });

  test('close while a copy is in flight: the copy completes with the right bytes', async () => {
    const { seg, data } = createFilled('inflight', 1 << 20);
    const dst = Buffer.alloc(1 << 20);
    const p = seg.copyTo(dst, 0, 0, 1 << 20);
    seg.close();
    await p;
    expect(dst.equals(data)).toBe(true);
  });

  test('a node child process opens our segment read-only and sees the same bytes', async () => {
    const { name, seg, data } = createFilled('child', 8192);
    const script = `
      const n = require(${JSON.stringify(addonPath())});
      const s = n.ShmSegment.open(${JSON.stringify(name)}, true);
      const dst = Buffer.alloc(1000);
      s.copyTo(dst, 0, 3000, 1000).then(() => {
        let err = 'none';
        try { s.buffer(); } catch (e) { err = e.code; }
        process.stdout.write(JSON.stringify({ size: s.size, readonly: s.readonly, hex: dst.toString('hex'), err }));
        s.close();
      });`;
    const child = spawnTracked(process.execPath, ['-e', script]);
    const { code } = await child.exited;
    expect(child.stderr()).toBe('');
    expect(code).toBe(0);
    const out = JSON.parse(child.stdout());
    expect(out).toEqual({ size: 8192, readonly: true, hex: data.subarray(3000, 4000).toString('hex'), err: 'ERR_READONLY' });
    seg.close();
  });
});

describe('DeviceRegion (shm)', () => {
  test('Python creates a segment (multiprocessing.shared_memory); we open a region of it and copy ranges', async () => {
    const name = shmName('py');
    // The resource tracker would unlink the segment when python exits; unregister so it outlives it.
    const out = runPython(
      `
import sys
from multiprocessing import shared_memory, resource_tracker
shm = shared_memory.SharedMemory(name=sys.argv[1].lstrip('/'), create=True, size=65536)
for i in range(65536):
    shm.buf[i] = (i * 7 + 3) % 251
resource_tracker.unregister(shm._name, 'shared_memory')
shm.close()
print(shm._name)
`,
      [name],
    );
    expect(out.trim()).toBe(name);
    const expected = Buffer.from(Array.from({ length: 65536 }, (_, i) => (i * 7 + 3) % 251));
    const region = DeviceRegion.open({ kind: 'shm', shmName: name, offset: 4096, nbytes: 32768 });
    expect(region.nbytes).toBe(32768);
    const dst = Buffer.alloc(32768);
    await region.copyTo(dst); // whole region
    expect(dst.equals(expected.subarray(4096, 4096 + 32768))).toBe(true);
    const part = Buffer.alloc(100);
    await region.copyTo(part, 10, 1000, 90); // region-relative source offset
    expect(part.subarray(10).equals(expected.subarray(4096 + 1000, 4096 + 1090))).toBe(true);
    region.close();
  });

  test('gatherTo copies non-adjacent blocks in the given order, contiguously', async () => {
    const blockBytes = 256;
    const nblocks = 16;
    const base = 128;
    const name = shmName('gather');
    const seg = ShmSegment.create(name, base + blockBytes * nblocks + 64);
    const buf = seg.buffer();
    buf.fill(0xaa);
    for (let b = 0; b < nblocks; b++) {
      for (let i = 0; i < blockBytes; i++) buf[base + b * blockBytes + i] = (b * 16 + (i % 16)) & 0xff;
    }
    // Region starts 64 bytes in; the pool starts at region offset 64 (segment offset 128).
    const region = DeviceRegion.open({ kind: 'shm', shmName: name, offset: 64, nbytes: 64 + blockBytes * nblocks });
    const ids = [9, 2, 15, 2, 0, 7];
    const dst = Buffer.alloc(8 + ids.length * blockBytes, 0x55);
    await region.gatherTo(dst, 8, ids, blockBytes, 64);
    expect(dst.subarray(0, 8).every((b) => b === 0x55)).toBe(true);
    ids.forEach((b, k) => {
      const got = dst.subarray(8 + k * blockBytes, 8 + (k + 1) * blockBytes);
      expect(got.equals(buf.subarray(base + b * blockBytes, base + (b + 1) * blockBytes))).toBe(true);
    });
    // The same gather straight from the segment (segment-relative base).
    const dst2 = Buffer.alloc(ids.length * blockBytes);
    await seg.gatherTo(dst2, 0, ids, blockBytes, base);
    expect(dst2.equals(dst.subarray(8))).toBe(true);
    await expectCode(seg.gatherTo(dst2, 0, [16], blockBytes, base), 'ERR_OUT_OF_RANGE', /blockIds\[0\] = 16 is out of range/);
    // Empty gather is a no-op.
    await region.gatherTo(dst, 0, [], blockBytes, 64);
    region.close();
    seg.close();
  });

  test('gatherTo with a block stride reads one page of each interleaved block (a layer of an interleaved pool)', async () => {
    // 6 blocks of 4 pages (L0.k, L0.v, L1.k, L1.v) of 32 bytes: layer 1's V is page 3 of each block.
    const page = 32;
    const stride = 4 * page;
    const { name, seg, data } = createFilled('stride', 6 * stride);
    // The region ends with the last block's page: (6 - 1) strides and one page after its offset.
    const region = DeviceRegion.open({ kind: 'shm', shmName: name, offset: 3 * page, nbytes: 5 * stride + page });
    const ids = [4, 1, 5];
    const dst = Buffer.alloc(ids.length * page);
    await region.gatherTo(dst, 0, ids, page, 0, stride);
    ids.forEach((b, k) => expect(dst.subarray(k * page, (k + 1) * page).equals(data.subarray(b * stride + 3 * page, b * stride + 4 * page))).toBe(true));
    await expectCode(region.gatherTo(dst, 0, [6], page, 0, stride), 'ERR_OUT_OF_RANGE', /the region holds 6 blocks of 32 bytes \(stride 128\)/);
    await expectCode(region.gatherTo(dst, 0, [1], page, 0, page - 1), 'ERR_INVALID_ARG', /blockStride \(31\) must be at least blockBytes \(32\)/);
    // The native layer checks the stride too, for callers that bypass the wrapper.
    expect(() => seg.handle.gatherTo(dst, 0, new Uint32Array([1]), page, 0, page - 1)).toThrow(/blockStride \(31\) is below blockBytes \(32\)/);
    region.close();
    seg.close();
  });

  test('bounds and spec errors name the field', async () => {
    const { name, seg } = createFilled('bounds', 4096);
    await expectCode(
      () => DeviceRegion.open({ kind: 'shm', shmName: name, offset: 4000, nbytes: 200 }),
      'ERR_OUT_OF_RANGE',
      new RegExp(`region\\.offset \\+ region\\.nbytes \\(4000 \\+ 200 = 4200\\) exceeds segment size \\(4096\\) of ${name}`),
    );
    await expectCode(() => DeviceRegion.open({ kind: 'shm', shmName: name, offset: -1, nbytes: 1 }), 'ERR_INVALID_ARG', /region\.offset must be a non-negative safe integer, got -1/);
    await expectCode(() => DeviceRegion.open({ kind: 'shm', shmName: name, offset: 0, nbytes: 1.5 }), 'ERR_INVALID_ARG', /region\.nbytes/);
    await expectCode(() => DeviceRegion.open({ kind: 'shm', shmName: '../etc/passwd', offset: 0, nbytes: 1 }), 'ERR_INVALID_ARG', /region\.shmName must match/);
    await expectCode(() => DeviceRegion.open({ kind: 'shm', offset: 0, nbytes: 1 }), 'ERR_INVALID_ARG', /region\.shmName/);
    await expectCode(() => DeviceRegion.open({ kind: 'shm', shmName: name, offset: 0, nbytes: 1 }, { field: 'regions[3]' }).copyTo(Buffer.alloc(1), 0, 0, 2), 'ERR_OUT_OF_RANGE', /srcOffset \+ nbytes \(0 \+ 2 = 2\) exceeds region\.nbytes \(1\)/);
    await expectCode(() => DeviceRegion.open({ kind: 'disk' as 'shm', offset: 0, nbytes: 1 }, { field: 'regions[3]' }), 'ERR_INVALID_ARG', /regions\[3\]\.kind must be "shm" or "cuda"/);

    const region = DeviceRegion.open({ kind: 'shm', shmName: name, offset: 1024, nbytes: 1024 });
    await expectCode(region.copyTo(Buffer.alloc(10), 0, 0, 11), 'ERR_OUT_OF_RANGE', /dst holds 10 bytes; dstOffset \+ nbytes \(0 \+ 11 = 11\)/);
    await expectCode(region.copyTo(Buffer.alloc(10), 0, 1020, 5), 'ERR_OUT_OF_RANGE', /exceeds region\.nbytes \(1024\)/);
    await expectCode(region.gatherTo(Buffer.alloc(1000), 0, [1, 4], 256), 'ERR_OUT_OF_RANGE', /blockIds\[1\] = 4 is out of range: the region holds 4 blocks of 256 bytes/);
    await expectCode(region.gatherTo(Buffer.alloc(1000), 0, [1, 2.5], 256), 'ERR_OUT_OF_RANGE', /blockIds\[1\] = 2.5/);
    await expectCode(region.gatherTo(Buffer.alloc(300), 0, [1, 2], 256), 'ERR_OUT_OF_RANGE', /dst holds 300 bytes/);
    await expectCode(region.gatherTo(Buffer.alloc(300), 0, [1], 0), 'ERR_INVALID_ARG', /blockBytes must be positive/);
    await expectCode(region.copyTo('x' as unknown as Buffer, 0, 0, 1), 'ERR_INVALID_ARG', /dst must be a Buffer/);
    // The native layer checks too, for callers that bypass the wrapper.
    const raw = ShmSegment.open(name).handle;
    await expectCode(async () => {
      try {
        await raw.copyTo(Buffer.alloc(10), 0, 4090, 10);
      } catch (e) {
        const { toNativeError } = await import('../src/native');
        throw toNativeError(e);
      }
    }, 'ERR_OUT_OF_RANGE', /outside shm segment/);
    raw.close();
    region.close();
    seg.close();
  });

  test('unlinked or truncated segment: copies fail with ERR_REGION_GONE, not SIGBUS', async () => {
    const a = createFilled('unlink', 8192);
    const ra = DeviceRegion.open({ kind: 'shm', shmName: a.name, offset: 0, nbytes: 8192 });
    await ra.copyTo(Buffer.alloc(8192));
    ShmSegment.unlink(a.name);
    await expectCode(ra.copyTo(Buffer.alloc(8192)), 'ERR_REGION_GONE', /was unlinked/);
    await expectCode(ra.gatherTo(Buffer.alloc(8192), 0, [1], 4096), 'ERR_REGION_GONE');
    await expectCode(() => ShmSegment.unlink(a.name), 'ERR_SHM_UNLINK', /No such file/);
    ra.close();
    a.seg.close();

    // Truncated under us (another process shrinks the object): reading past its end would be SIGBUS.
    const b = createFilled('trunc', 1 << 16);
    const rb = DeviceRegion.open({ kind: 'shm', shmName: b.name, offset: 0, nbytes: 1 << 16 });
    fs.truncateSync(`/dev/shm${b.name}`, 4096);
    await expectCode(rb.copyTo(Buffer.alloc(1 << 16)), 'ERR_REGION_GONE', /shrank to 4096 bytes/);
    const head = Buffer.alloc(4096);
    await rb.copyTo(head, 0, 0, 4096); // what is still there can be read
    expect(head.equals(b.data.subarray(0, 4096))).toBe(true);
    rb.close();
    await expectCode(rb.copyTo(Buffer.alloc(1)), 'ERR_CLOSED', /is closed/);
    await expectCode(rb.gatherTo(Buffer.alloc(1), 0, [0], 1), 'ERR_CLOSED');
    b.seg.close();
  });
});

describe('Staging', () => {
  test('chunks() plans ranges of at most capacity', () => {
    const s = new Staging(1000);
    expect(s.pinned).toBe(false);
    expect(s.chunks(2500, 10)).toEqual([
      { kind: 'range', srcOffset: 10, nbytes: 1000 },
      { kind: 'range', srcOffset: 1010, nbytes: 1000 },
      { kind: 'range', srcOffset: 2010, nbytes: 500 },
    ]);
    expect(s.chunks(0)).toEqual([]);
    expect(() => new Staging(0)).toThrow(/capacityBytes must be positive/);
  });

  test('stream() moves a region larger than the staging area through it, chunk by chunk', async () => {
    const { name, seg, data } = createFilled('stream', 4500);
    const region = DeviceRegion.open({ kind: 'shm', shmName: name, offset: 100, nbytes: 4400 });
    const s = new Staging(1000);
    const parts: Buffer[] = [];
    for await (const chunk of s.stream(region)) {
      expect(chunk.buffer).toBe(s.buffer.buffer); // a view of the staging memory, no new allocation
      parts.push(Buffer.from(chunk)); // the consumer copies (or writes) before asking for more
    }
    expect(parts.map((p) => p.length)).toEqual([1000, 1000, 1000, 1000, 400]);
    expect(Buffer.concat(parts).equals(data.subarray(100, 4500))).toBe(true);
    region.close();
    seg.close();
  });

  test('gatherChunks() + stream() gathers blocks in order through a small staging area', async () => {
    const blockBytes = 300;
    const { name, seg, data } = createFilled('sgather', blockBytes * 10);
    const region = DeviceRegion.open({ kind: 'shm', shmName: name, offset: 0, nbytes: blockBytes * 10 });
    const ids = [7, 1, 9, 3, 3, 0, 5];
    const expected = Buffer.concat(ids.map((b) => data.subarray(b * blockBytes, (b + 1) * blockBytes)));

    const s = new Staging(1000); // 3 blocks per chunk
    const plan = s.gatherChunks(ids, blockBytes);
    expect(plan.map((c) => c.nbytes)).toEqual([900, 900, 300]);
    const parts: Buffer[] = [];
    for await (const chunk of s.stream(region, plan)) parts.push(Buffer.from(chunk));
    expect(Buffer.concat(parts).equals(expected)).toBe(true);

    // Blocks bigger than the staging area become ranges.
    const tiny = new Staging(128);
    const plan2 = tiny.gatherChunks(ids, blockBytes);
    expect(plan2.every((c) => c.kind === 'range' && c.nbytes <= 128)).toBe(true);
    const parts2: Buffer[] = [];
    for await (const chunk of tiny.stream(region, plan2)) parts2.push(Buffer.from(chunk));
    expect(Buffer.concat(parts2).equals(expected)).toBe(true);

    await expect(async () => {
      for await (const _ of tiny.stream(region, s.chunks(1000))) void _;
    }).rejects.toThrow(/plan\[0\]\.nbytes \(1000\) exceeds staging capacity \(128\)/);
    region.close();
    seg.close();
  });

  test('pinned requested without CUDA falls back to plain memory', () => {
    const s = new Staging(4096, { pinned: true });
    expect(s.buffer.length).toBe(4096);
    expect(s.pinned).toBe(cudaAvailable().available);
  });
});

describe('CUDA backend', () => {
  test('unavailable CUDA: opening a cuda region throws ERR_CUDA_UNAVAILABLE with the dlerror text', async () => {
    // Forced to a library that cannot exist, so this holds on machines with CUDA too.
    const script = `
      const n = require(${JSON.stringify(addonPath())});
      const avail = n.cudaAvailable();
      let err = null;
      try { n.CudaRegion.open(Buffer.alloc(64), 0, 1024, 4096); } catch (e) { err = { code: e.code, message: e.message }; }
      process.stdout.write(JSON.stringify({ avail, err }));`;
    const child = spawnTracked(process.execPath, ['-e', script], {
      env: { ...process.env, WAVEBUS_CUDART: '/nonexistent/libcudart.so.12' },
    });
    const { code } = await child.exited;
    expect(code).toBe(0);
    const out = JSON.parse(child.stdout());
    expect(out.avail.available).toBe(false);
    expect(out.avail.reason).toMatch(/\/nonexistent\/libcudart\.so\.12: cannot open shared object file/);
    expect(out.err.code).toBe('ERR_CUDA_UNAVAILABLE');
    expect(out.err.message).toBe(`CUDA backend unavailable: ${out.avail.reason}`);
  });

  test('in this process: cudaAvailable() reports, and a cuda region spec is validated first', async () => {
    const a = cudaAvailable();
    expect(typeof a.available).toBe('boolean');
    expect(a.reason.length).toBeGreaterThan(0);
    await expectCode(
      () => DeviceRegion.open({ kind: 'cuda', offset: 0, nbytes: 16, cudaIpcHandle: Buffer.alloc(63) }),
      'ERR_INVALID_ARG',
      /region\.cudaIpcHandle must be exactly 64 bytes, got 63 bytes/,
    );
    await expectCode(() => DeviceRegion.open({ kind: 'cuda', offset: 0, nbytes: 16, cudaIpcHandle: Buffer.alloc(64), device: -1 }), 'ERR_INVALID_ARG', /region\.device/);
    if (!a.available) {
      await expectCode(
        () => DeviceRegion.open({ kind: 'cuda', offset: 0, nbytes: 16, cudaIpcHandle: Buffer.alloc(64) }),
        'ERR_CUDA_UNAVAILABLE',
        /^CUDA backend unavailable: .+/,
      );
    }
    expect(native.abiVersion).toBe(1);
  });
});

describe('malloc tuning', () => {
  test('glibc keeps freed memory for reuse when asked; out-of-range thresholds are refused; WAVEBUS_MALLOC_TUNING=0 leaves the defaults', () => {
    // in a separate process: the setting is process-wide
    const script = `console.log(JSON.stringify(require(${JSON.stringify(require.resolve('../dist/src/malloc-tuning'))}).keepFreedMemory()))`;
    const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', env: { ...process.env, WAVEBUS_MALLOC_TUNING: '1' } });
    expect(r.status).toBe(0);
    const glibc = (process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined)?.header?.glibcVersionRuntime !== undefined;
    expect(JSON.parse(r.stdout.trim())).toBe(glibc);
    const { keepFreedMemory } = require('../src/malloc-tuning');
    expect(keepFreedMemory({ WAVEBUS_MALLOC_TUNING: '0' })).toBe(false);
    expect(() => native.tuneMalloc(64 << 20, 0)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG' }));
  });
});

test('a worker thread terminated while it is inside a native call that throws ends cleanly, not with an abort', () => {
  // node-addon-api without NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS aborts the whole process here
  const script = `
const { Worker } = require('worker_threads');
const w = new Worker(\`
  const { native } = require(${JSON.stringify(require.resolve('../dist/src/native'))});
  require('worker_threads').parentPort.postMessage('go');
  for (;;) { try { native.crc32c('not bytes'); } catch (e) {} }
\`, { eval: true });
w.on('message', () => setTimeout(() => w.terminate().then(() => { console.log('terminated'); process.exit(0); }), 50));`;
  for (let i = 0; i < 3; i++) {
    const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 60000 });
    expect({ status: r.status, signal: r.signal, out: r.stdout.trim() }).toEqual({ status: 0, signal: null, out: 'terminated' });
  }
});
