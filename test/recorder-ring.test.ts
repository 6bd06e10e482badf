// The flight recorder's ring between its two real ends: the agent's file (src/agent/recorder-ring.ts)
// and the Python client's writer (wavebus_client/recorder.py) in another process. A writer killed in
// the middle of a copy leaves its slot out (named); a forward larger than a slot is "too large",
// never half; a ring whose lengths lie is read without a crash; the variables are checked.
import * as fs from 'fs';
import * as path from 'path';
import { RecorderRing, RECORDER } from '../src/agent/recorder-ring';
import { flushRing } from '../src/agent/recorder-flush';
import { recorderSettingsFromEnv } from '../src/agent/flight-recorder';
import { resolveIdentity } from '../src/launch/identity';
import { ROOT, cleanup, runPython, tmpDir } from './helpers';

afterAll(cleanup);

const PY_ENV = { PYTHONPATH: path.join(ROOT, 'clients', 'python') };

/** Records forwards 1..n of a [rows] int64 tensor filled with the forward number; `die` kills the process inside forward `die`'s copy. */
const WRITER = `import os, sys, ctypes, numpy as np
from wavebus_client.recorder import Recorder
from wavebus_client import wavebus_pb2 as pb
path, n, rows, die = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rec = Recorder(path)
bufs = [np.full(rows, i + 1, dtype=np.int64) for i in range(n)]
real = ctypes.memmove
for i in range(n):
    if i + 1 == die:
        def dying(dst, src, nb):
            real(dst, src, nb // 2)
            os._exit(9)  # half the bytes copied: the engine dies mid-copy
        ctypes.memmove = dying
    ctx = pb.ForwardContext(compilation_hash="g", global_step=100 + i, req_ids=["r"], positions=[0] * rows)
    tin = pb.TensorInput(region="ids", offset=0, dtype="int64", shape=[rows])
    rec.record(ctx, [tin], [(bufs[i].ctypes.data, bufs[i].nbytes)], 7 + i)
rec.note("uncaught RuntimeError: boom")
print(rec.forwards, rec.too_large)
`;

function ring(forwards: number, maxBytes: number) {
  const dir = tmpDir('wavebus-ring-');
  const file = path.join(dir, 'recorder-local0');
  return { dir, file, ring: RecorderRing.create(file, { forwards, maxBytes }) };
}

test('the client writes the last K forwards whole; a slot whose writer died mid-copy is named, never read', () => {
  const { dir, file, ring: r } = ring(3, 3 * 4096);
  try {
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    // Forwards 1..5 through 3 slots; the writer dies inside forward 5's copy.
    expect(() => runPython(WRITER, [file, '5', '64', '5'], { env: PY_ENV })).toThrow();
    const read = r.read();
    expect(read.forwards).toBe(5);
    expect(read.entries.map((e) => e.forward)).toEqual([3, 4]);
    expect(read.torn).toEqual([{ slot: 1, forward: 5, why: 'being written (the commit word is odd)' }]);
    for (const e of read.entries) {
      expect(e.entry.wave).toBe(7 + e.forward - 1);
      expect(Number(e.entry.context.globalStep)).toBe(100 + e.forward - 1);
      const got = new BigInt64Array(e.data[0].buffer.slice(e.data[0].byteOffset, e.data[0].byteOffset + e.data[0].length));
      expect([...got].every((v) => v === BigInt(e.forward))).toBe(true);
    }
  } finally {
    r.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a forward larger than its slot is recorded as too large (no data); the flush writes the others as bundles and names it', async () => {
  const { dir, file, ring: r } = ring(2, 2 * 1024);
  try {
    // 1 KiB a slot (plus room for the entry): 64 rows fit, 20000 rows do not.
    expect(runPython(WRITER, [file, '1', '64', '0'], { env: PY_ENV }).trim()).toBe('1 0');
    expect(runPython(WRITER, [file, '1', '20000', '0'], { env: PY_ENV }).trim()).toBe('2 1');
    const read = r.read();
    expect(read.note).toBe('uncaught RuntimeError: boom');
    expect(read.entries.map((e) => [e.forward, e.tooLarge, e.data.length])).toEqual([[1, false, 1], [2, true, 0]]);
    const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
    const res = await flushRing(read, path.join(dir, 'root'), 'flush-capture-1', 'user', identity);
    expect(res.forwards.map((f) => [f.forward, f.tooLarge ?? false, f.callDir !== ''])).toEqual([[1, false, true], [2, true, false]]);
    const meta = JSON.parse(fs.readFileSync(path.join(res.forwards[0].callDir, 'meta.json'), 'utf8'));
    expect(meta).toMatchObject({ selected_by: ['recorder'], call_index: 1, global_step: 100, recorder: { forward: 1, slot: 0, wave: 7, reason: 'user' } });
    expect(fs.readdirSync(path.dirname(res.forwards[0].callDir))).toEqual(['call1']); // nothing partial beside it
  } finally {
    r.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('garbage in a slot (lengths past it, an entry that does not decode) is left out with the reason, nothing crashes', () => {
  const { dir, file, ring: r } = ring(2, 2 * 1024);
  try {
    runPython(WRITER, [file, '2', '8', '0'], { env: PY_ENV });
    const fd = fs.openSync(file, 'r+');
    const H = RECORDER.structs.header.bytes;
    // Slot 0: an entry length far past the slot. Slot 1: its entry bytes overwritten with 0xff.
    const big = Buffer.alloc(4);
    big.writeUInt32LE(0xffffffff);
    fs.writeSync(fd, big, 0, 4, H + RECORDER.field('slot', 'entry_len').at);
    fs.writeSync(fd, Buffer.alloc(16, 0xff), 0, 16, H + r.stride + RECORDER.structs.slot.bytes);
    fs.closeSync(fd);
    const read = r.read();
    expect(read.entries).toEqual([]);
    expect(read.torn.map((t) => t.slot)).toEqual([0, 1]);
    expect(read.torn[0].why).toMatch(/lengths past the slot/);
    expect(read.torn[1].why).toMatch(/does not decode|do not add up/);
  } finally {
    r.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('WAVEBUS_RECORD_FORWARDS / WAVEBUS_RECORD_MAX_BYTES: off by default, bad values named', () => {
  expect(recorderSettingsFromEnv({})).toBeUndefined();
  expect(recorderSettingsFromEnv({ WAVEBUS_RECORD_FORWARDS: '0' })).toBeUndefined();
  expect(recorderSettingsFromEnv({ WAVEBUS_RECORD_FORWARDS: '8' })).toEqual({ forwards: 8, maxBytes: 256 * 2 ** 20 });
  expect(() => recorderSettingsFromEnv({ WAVEBUS_RECORD_FORWARDS: 'lots' })).toThrow(/WAVEBUS_RECORD_FORWARDS must be an integer in 0\.\.4096, got "lots"/);
  expect(() => recorderSettingsFromEnv({ WAVEBUS_RECORD_FORWARDS: '2', WAVEBUS_RECORD_MAX_BYTES: '0' })).toThrow(/WAVEBUS_RECORD_MAX_BYTES/);
});
