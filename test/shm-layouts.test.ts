// proto/layouts.json, the one description of the shared-memory layouts (docs/layouts.md): every
// side loads it (src/shm-layouts.ts; the Python client through its generated shm_layouts_data.py) and
// sees the same offsets, types and constants; both loaders refuse a bad description alike; and the
// recorder ring written by the TypeScript and the Python client is one ring the agent reads.
import * as fs from 'fs';
import * as path from 'path';
import { checkLayout, layout, layoutNames, type RawLayout } from '../src/shm-layouts';
import { RecorderRing } from '../src/agent/recorder-ring';
import { RingWriter } from '../src/client/recorder';
import { ROOT, cleanup, runPython, tmpDir } from './helpers';

afterAll(cleanup);

const PY_ENV = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python') };
// eslint-disable-next-line @typescript-eslint/no-var-requires
const { render, PYTHON: GENERATED } = require('../scripts/gen-layouts.js');

/** Each layout as a plain object: constants, and per struct its size and [at, type, bytes] per field. */
function tsView(): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const name of layoutNames()) {
    const l = layout(name);
    const structs: Record<string, unknown> = {};
    for (const [s, st] of Object.entries(l.structs)) {
      structs[s] = { bytes: st.bytes, fields: Object.fromEntries(Object.values(st.fields).map((f) => [f.name, [f.at, f.type, f.bytes]])) };
    }
    // The columns, and where they lie for two sets of capacities (every count field 3, then 1000).
    const places = [3, 1000].map((n) => {
      const counts = Object.fromEntries(l.columns.map((c) => [c.count.field, n]));
      const { places: ps, bytes } = l.placeColumns(counts);
      return { bytes, at: Object.fromEntries(ps.map((p) => [p.name, [p.at, p.capacity]])) };
    });
    const columns = { after: l.columnsAfter, items: l.columns.map((c) => [c.name, c.type, c.size, `${c.count.struct}.${c.count.field}`, c.bit]), places };
    out[name] = { constants: l.constants, structs, columns };
  }
  return out;
}

const PY_VIEW = `import json
from wavebus_client.shm_layout import layout, layout_names
out = {}
for name in layout_names():
    l = layout(name)
    places = []
    for n in (3, 1000):
        ps, nbytes = l.place_columns({c.count: n for c in l.columns})
        places.append({"bytes": nbytes, "at": {k: [at, cap] for k, (at, cap, _c) in ps.items()}})
    columns = {"after": l.columns_after, "items": [[c.name, c.type, c.size, f"{c.count_struct}.{c.count}", c.bit] for c in l.columns], "places": places}
    out[name] = {"constants": l.constants, "structs": {s: {"bytes": st.nbytes, "fields": {f.name: [f.at, f.type, f.nbytes] for f in st.fields.values()}} for s, st in l.structs.items()}, "columns": columns}
print(json.dumps(out))
`;

test('the Python package carries what proto/layouts.json says (shm_layouts_data.py is current: node scripts/gen-layouts.js)', () => {
  expect(fs.readFileSync(GENERATED, 'utf8')).toBe(render());
});

test('TypeScript and Python load the same layouts: every struct, field offset, type, length and constant', () => {
  const ts = tsView();
  expect(Object.keys(ts)).toEqual(expect.arrayContaining(['recorder', 'telemetry', 'decision']));
  expect((ts.telemetry as any).columns.items).toHaveLength(9);
  const py = JSON.parse(runPython(PY_VIEW, [], { env: PY_ENV }));
  expect(py).toEqual(ts);
  // And what the file says, read without either loader.
  const file = JSON.parse(fs.readFileSync(path.join(ROOT, 'proto', 'layouts.json'), 'utf8'));
  expect((ts.recorder as any).structs.slot.fields.commit).toEqual([file.layouts.recorder.structs.slot.fields.commit.at, 'u64', 8]);
  expect((ts.recorder as any).constants.magic).toBe(file.layouts.recorder.constants.magic.value);
});

const BAD: Array<[string, RawLayout, RegExp]> = [
  ['misaligned', { structs: { s: { bytes: 8, fields: { a: { at: 4, type: 'u64' } } } } }, /s\.fields\.a: a u64 at 4 is not 8-aligned/],
  ['past the end', { structs: { s: { bytes: 8, fields: { a: { at: 8, type: 'u32' } } } } }, /s\.fields\.a: bytes 8\.\.12 lie outside the struct's 8/],
  ['overlap', { structs: { s: { bytes: 16, fields: { a: { at: 0, type: 'bytes', bytes: 6 }, b: { at: 4, type: 'u32' } } } } }, /s\.fields\.b: bytes 4\.\.8 overlap field a \(0\.\.6\)/],
  ['unknown type', { structs: { s: { bytes: 8, fields: { a: { at: 0, type: 'u128' } } } } }, /s\.fields\.a: unknown type "u128"/],
  ['bad constant', { constants: { k: { value: -1 } } }, /constants\.k\.value: expected a non-negative integer/],
  ['column counted by a missing field', { structs: { h: { bytes: 8, fields: { n: { at: 0, type: 'u32' } } } }, columns: { after: 'h', items: [{ name: 'c', type: 'u32', count: 'h.m' }] } }, /columns\.items\[0\]\.count: names no u32 field/],
  ['column of an unknown type', { structs: { h: { bytes: 8, fields: { n: { at: 0, type: 'u32' } } } }, columns: { after: 'h', items: [{ name: 'c', type: 'f16', count: 'h.n' }] } }, /columns\.items\[0\]\.type: unknown type "f16"/],
  ['column after a struct of unaligned size', { structs: { h: { bytes: 4, fields: { n: { at: 0, type: 'u32' } } } }, columns: { after: 'h', items: [] } }, /columns\.after: struct h's 4 bytes are not 8-aligned/],
];

test.each(BAD)('both loaders refuse a description with a field %s, naming it (ERR_LAYOUT)', (_what, raw, message) => {
  let ts: any;
  try {
    checkLayout('bad', raw);
  } catch (e) {
    ts = e;
  }
  expect(ts?.code).toBe('ERR_LAYOUT');
  expect(ts.message).toMatch(message);
  const py = runPython(
    `import json, sys
from wavebus_client.shm_layout import Layout
from wavebus_client.errors import WavebusError
try:
    Layout("bad", json.loads(sys.argv[1]))
    print("accepted")
except WavebusError as e:
    print(e.code, str(e))`,
    [JSON.stringify(raw)],
    { env: PY_ENV },
  ).trim();
  expect(py.startsWith('ERR_LAYOUT ')).toBe(true);
  expect(py).toMatch(message);
});

test('one ring, three sides: forwards written by the TypeScript client, then by a Python client that maps the same ring, read back whole by the agent', () => {
  const dir = tmpDir('wavebus-layouts-');
  const file = path.join(dir, 'recorder-local0');
  const ring = RecorderRing.create(file, { forwards: 4, maxBytes: 4 * 4096 });
  try {
    const ts = RingWriter.open(file);
    for (let n = 1; n <= 2; n++) {
      const ids = Buffer.from(new Int32Array([n, n, n]).buffer);
      ts.record({ context: { compilationHash: 'h', globalStep: 10 + n, positions: [0, 1, 2] }, inputs: [{ region: 'input_ids', offset: 0, dtype: 'int32', shape: [3] }], inputBytes: [12], wave: 20 + n, unixMs: Date.now() }, [ids]);
    }
    ts.note('uncaught Error: from TypeScript');
    const out = runPython(
      `import sys, numpy as np
from wavebus_client.recorder import Recorder
from wavebus_client import wavebus_pb2 as pb
rec = Recorder(sys.argv[1])
a = np.full(3, 3, dtype=np.int32)
rec.record(pb.ForwardContext(compilation_hash="h", global_step=13, positions=[0, 1, 2]), [pb.TensorInput(region="input_ids", dtype="int32", shape=[3])], [(a.ctypes.data, a.nbytes)], 23)
print(rec.forwards)`,
      [file],
      { env: PY_ENV },
    ).trim();
    expect(out).toBe('3'); // the Python client went on numbering where the TypeScript one stopped
    const read = ring.read();
    expect(read.torn).toEqual([]);
    expect(read.forwards).toBe(3);
    expect(read.note).toBe('uncaught Error: from TypeScript');
    expect(read.entries.map((e) => [e.forward, Number(e.entry.wave), Number(e.entry.context.globalStep), [...new Int32Array(new Uint8Array(e.data[0]).buffer)]])).toEqual([
      [1, 21, 11, [1, 1, 1]],
      [2, 22, 12, [2, 2, 2]],
      [3, 23, 13, [3, 3, 3]],
    ]);
  } finally {
    ring.close();
  }
});

test('the TypeScript writer: a forward larger than its slot is recorded too large (entry, no data); a file that is not a ring is refused naming it', () => {
  const dir = tmpDir('wavebus-layouts-');
  const file = path.join(dir, 'recorder-local0');
  const ring = RecorderRing.create(file, { forwards: 2, maxBytes: 2 * 1024 });
  try {
    const ts = RingWriter.open(file);
    const big = Buffer.alloc(ring.stride + 8, 7);
    ts.record({ context: { compilationHash: 'h', globalStep: 1 }, inputs: [{ region: 'x', offset: 0, dtype: 'uint8', shape: [big.length] }], inputBytes: [big.length], wave: 1, unixMs: 0 }, [big]);
    expect(ts.tooLarge).toBe(1);
    const read = ring.read();
    expect(read.entries.map((e) => [e.forward, e.tooLarge, e.data.length])).toEqual([[1, true, 0]]);
  } finally {
    ring.close();
  }
  const notRing = path.join(dir, 'not-a-ring');
  fs.writeFileSync(notRing, Buffer.alloc(4096));
  expect(() => RingWriter.open(notRing)).toThrow(/flight recorder ring .*not-a-ring: not a version 1 ring \(magic 0x0, version 0\)/);
  fs.symlinkSync(file, path.join(dir, 'link'));
  expect(() => RingWriter.open(path.join(dir, 'link'))).toThrow(expect.objectContaining({ code: 'ERR_PATH_LINK' }));
});
