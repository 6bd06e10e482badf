// The telemetry ring's one layout description (proto/layouts.json's "telemetry"; test/shm-layouts.test.ts
// checks both loaders read it alike): the Python writer's column offsets and docs/native.md's table
// agree with it; and the agent's reader takes
// whatever an engine leaves in the file (torn slots, counts past the capacity, a garbage written
// word, random bytes) without crashing or reading outside a slot, counting each as garbage.
import * as fs from 'fs';
import * as path from 'path';
import { columnPlaces, RING_HEADER, RING_LAYOUT, RING_SLOT } from '../src/client/ring-layout';
import { layout } from '../src/shm-layouts';
import { GAPS_KEPT, MAX_QUIET_MS, POLL_MS, PollSchedule, QUIET_FRACTION, RingHeads, newRingStats } from '../src/agent/ring-heads';
import { checkRingAsk } from '../src/agent/telemetry-ring';
import { createLogger } from '../src/log';
import { ROOT, cleanup, runPython, tmpDir } from './helpers';

afterAll(cleanup);
jest.setTimeout(60000);

const ENV = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1' };

test('Python and TypeScript place every column at the same offset for the same sizes', () => {
  const sizes = [
    [1, 1, 64, 65536],
    [1024, 1024, 256, 65536],
    [4096, 8192, 1024, 262144],
    [7, 13, 3, 100],
  ];
  const py = JSON.parse(
    runPython(
      `import json, sys
from wavebus_client.ring import column_offsets
out = []
for r, t, e, x in json.loads(sys.argv[1]):
    cols, total = column_offsets(r, t, e, x)
    out.append({"cols": {k: [v[0], v[1]] for k, v in cols.items()}, "total": total})
print(json.dumps(out))`,
      [JSON.stringify(sizes)],
      { env: ENV },
    ),
  );
  sizes.forEach(([maxRows, maxTokens, maxEvents, maxExtra], i) => {
    const { places, slotBytes } = columnPlaces({ maxRows, maxTokens, maxEvents, maxExtra });
    expect(py[i].total).toBe(slotBytes);
    expect(py[i].cols).toEqual(Object.fromEntries(places.map((p) => [p.name, [p.at, p.capacity]])));
  });
});

test('docs/native.md shows every header, slot-header field and column of the layout', () => {
  const doc = fs.readFileSync(path.join(ROOT, 'docs', 'native.md'), 'utf8');
  const l = layout('telemetry');
  const fields = [...Object.values(l.structs.header.fields), ...Object.values(l.structs.slot.fields)];
  expect(fields.length).toBeGreaterThan(15);
  for (const f of fields) expect([f.name, doc.includes(`| \`${f.name}\` | ${f.at} | ${f.type} |`)]).toEqual([f.name, true]);
  expect(l.columns.length).toBe(9);
  for (const c of l.columns) expect([c.name, doc.includes(`| \`${c.name}\` | ${c.type} | ${c.count.field} |`)]).toEqual([c.name, true]);
  expect(RING_LAYOUT.magic).toBe('WBTRING1');
  expect(doc).toContain(`\`${RING_LAYOUT.magic}\``);
});

test('whatever the engine leaves in the ring, the agent counts it as garbage and relays nothing of it', () => {
  const dir = tmpDir('wavebus-ring-');
  const relayed: Uint8Array[] = [];
  const stats = newRingStats();
  const heads = new RingHeads(path.join(dir, 'telemetry-ring-local0'), stats, createLogger('ring-test', 'silent'), (h) => relayed.push(h));
  const file = heads.open(checkRingAsk({ ringRows: 8, ringTokens: 8, ringEvents: 4 }));
  try {
    const ask = checkRingAsk({ ringRows: 8, ringTokens: 8, ringEvents: 4 });
    const { slotBytes } = columnPlaces(ask);
    const fd = fs.openSync(file, 'r+');
    const put = (buf: Buffer, at: number) => fs.writeSync(fd, buf, 0, buf.length, at);
    const u64 = (v: number) => {
      const b = Buffer.alloc(8);
      b.writeBigUInt64LE(BigInt(v));
      return b;
    };
    const slot0 = RING_LAYOUT.header_bytes;
    // 1: written names seq 2, its slot says seq 3 (being written): torn.
    put(u64(3), slot0 + RING_SLOT.seq);
    put(u64(2), RING_HEADER.written);
    heads.poll();
    // 2: seq 4 whole, but rows past the capacity.
    const h = Buffer.alloc(RING_LAYOUT.slot_header_bytes);
    h.writeBigUInt64LE(4n, RING_SLOT.seq);
    h.writeUInt32LE(1000, RING_SLOT.rows);
    h.writeUInt32LE(1, RING_SLOT.present);
    h.writeUInt32LE(4, RING_SLOT.extra_len);
    put(h, slot0 + slotBytes);
    put(u64(4), RING_HEADER.written);
    heads.poll();
    // 3: a huge odd written word: one miss for the slots it skips, and no loop over them.
    put(u64(2 ** 52 + 1), RING_HEADER.written);
    heads.poll();
    // 4: random bytes over the whole file, then polls: nothing throws.
    let seed = 7;
    const rnd = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff);
    const size = fs.fstatSync(fd).size;
    for (let round = 0; round < 50; round++) {
      const junk = Buffer.alloc(size - 64);
      for (let i = 0; i < junk.length; i++) junk[i] = rnd() & 0xff;
      put(junk, 64);
      put(u64(2 * (round + 1) + 2 ** 52), RING_HEADER.written);
      expect(() => heads.poll()).not.toThrow();
    }
    fs.closeSync(fd);
    expect(relayed.length).toBe(0);
    expect(stats.ringGarbageByKind.torn).toBeGreaterThanOrEqual(2);
    expect(stats.ringGarbageByKind.bad_counts).toBeGreaterThanOrEqual(1);
    expect(stats.ringGarbage).toBeGreaterThanOrEqual(4);
  } finally {
    heads.close();
  }
  expect(fs.existsSync(file)).toBe(false);
});

test("the ring poll sleeps most of a step after each head and looks every POLL_MS once the next one is due", () => {
  const s = new PollSchedule();
  // Before any head: every POLL_MS.
  expect(s.next(0, 0)).toBe(POLL_MS);
  expect(s.next(1, 1)).toBe(POLL_MS); // the first head: no step length known yet
  // Heads every 6 ms: after each, the poll sleeps QUIET_FRACTION of the step.
  let t = 1;
  for (let k = 0; k < 10; k++) expect(s.next((t += 6), 1)).toBeGreaterThanOrEqual(POLL_MS);
  expect(s.next(t, 0)).toBeCloseTo(QUIET_FRACTION * 6, 5);
  // Once the quiet time is over and no head came: every POLL_MS, however long the engine pauses.
  expect(s.next(t + 0.8 * 6, 0)).toBe(POLL_MS);
  expect(s.next(t + 500, 0)).toBe(POLL_MS);
  // A long pause is not taken for a step: the next head's quiet is still about the 6 ms step's.
  expect(s.next(t + 501, 1)).toBeCloseTo(QUIET_FRACTION * 6, 5);
  // One short step among long ones: the quiet follows the shortest of the last GAPS_KEPT steps.
  const mixed = new PollSchedule();
  let v = 0;
  for (let k = 0; k < 5; k++) mixed.next((v += 40), 1);
  mixed.next((v += 4), 1);
  for (let k = 0; k < GAPS_KEPT - 1; k++) mixed.next((v += 40), 1);
  expect(mixed.next(v, 0)).toBeCloseTo(QUIET_FRACTION * 4, 5);
  mixed.next((v += 40), 1); // the short step is now GAPS_KEPT heads back: forgotten
  expect(mixed.next(v, 0)).toBeCloseTo(QUIET_FRACTION * 40, 5);
  // Gaps of MAX_QUIET_MS or more are pauses, not steps: the poll never sleeps past it.
  const slow = new PollSchedule();
  let u = 0;
  for (let k = 0; k < 10; k++) slow.next((u += 2 * MAX_QUIET_MS), 1);
  expect(slow.next(u, 0)).toBe(POLL_MS);
});

test('a ring ask past the limits is refused naming the hello field', () => {
  expect(() => checkRingAsk({ ringRows: 0 })).toThrow(/hello\.ring_rows 0/);
  expect(() => checkRingAsk({ ringRows: 8, ringTokens: 2 ** 30 })).toThrow(/hello\.ring_tokens/);
  expect(() => checkRingAsk({ ringRows: 8, ringEvents: -1 })).toThrow(/hello\.ring_events/);
});

test('a head that comes inline (the ring was full) never overtakes a whole head still in the ring: the agent polls before relaying it', () => {
  const { TelemetryRingWriter } = require('../src/client/telemetry-ring-writer') as typeof import('../src/client/telemetry-ring-writer');
  const { RING_COLUMN } = require('../src/client/ring-layout') as typeof import('../src/client/ring-layout');
  const { encodeTrusted, messageType, decode } = require('../src/proto') as typeof import('../src/proto');
  const WaveHeadRequest = messageType('WaveHeadRequest');
  const dir = tmpDir('wavebus-ring-');
  const relayed: number[] = [];
  const heads = new RingHeads(path.join(dir, 'telemetry-ring-local0'), newRingStats(), createLogger('ring-test', 'silent'), (h) => relayed.push(Number((decode(WaveHeadRequest, Buffer.from(h)) as any).wave)));
  const file = heads.open(checkRingAsk({ ringRows: 8, ringTokens: 8, ringEvents: 4 }));
  const writer = TelemetryRingWriter.open(file);
  try {
    const body = (wave: number) => ({ wave, telemetry: { wave: wave - 1, columns: {} } });
    // Wave 8 whole in the ring; before the agent's poll timer runs, wave 9 arrives on the socket inline.
    const cols: (ArrayLike<number> | undefined)[] = [];
    cols[RING_COLUMN.row] = Uint32Array.of(0);
    writer.write(8, cols, 1, 0, 0, encodeTrusted(WaveHeadRequest, body(8)));
    const nine = heads.fill(encodeTrusted(WaveHeadRequest, body(9)));
    relayed.push(Number((decode(WaveHeadRequest, Buffer.from(nine)) as any).wave)); // what the agent relays next
    expect(relayed).toEqual([8, 9]);
  } finally {
    heads.close();
  }
});

test("the client's seq and written words cross 2^32 whole: the u32 half store while the high half holds, one u64 store when it moves", () => {
  const { TelemetryRingWriter } = require('../src/client/telemetry-ring-writer') as typeof import('../src/client/telemetry-ring-writer');
  const { RING_COLUMN } = require('../src/client/ring-layout') as typeof import('../src/client/ring-layout');
  const { TelemetryRingReader } = require('../src/agent/telemetry-ring') as typeof import('../src/agent/telemetry-ring');
  const file = path.join(tmpDir('wavebus-ring-seq-'), 'telemetry-ring-local0');
  const reader = TelemetryRingReader.create(file, checkRingAsk({ ringRows: 4, ringTokens: 4, ringEvents: 4 }));
  try {
    // A client that comes back to the ring numbers on after the last write: here write 2^31 - 1.
    const w = Buffer.alloc(8);
    w.writeBigUInt64LE(BigInt(2 ** 32 - 2));
    const fd = fs.openSync(file, 'r+');
    fs.writeSync(fd, w, 0, 8, RING_HEADER.written);
    fs.closeSync(fd);
    const writer = TelemetryRingWriter.open(file);
    const cols: (ArrayLike<number> | undefined)[] = [];
    cols[RING_COLUMN.row] = Uint32Array.of(3);
    for (const [wave, seq] of [[7, 2 ** 32], [8, 2 ** 32 + 2], [9, 2 ** 32 + 4]]) {
      expect(writer.write(wave, cols, 1, 0, 0, Uint8Array.of(8, wave))).toBe(seq);
      expect(reader.written()).toBe(seq);
      const got = reader.read(seq);
      expect('garbage' in got ? got : { wave: got.wave, rows: got.rows, extraLen: got.extraLen }).toEqual({ wave, rows: 1, extraLen: 2 });
    }
  } finally {
    reader.close();
  }
});
