// Region.block_stride (proto/wavebus.proto): a KV pool whose blocks are not back to back (an
// interleaved pool such as transformers' paged cache, docs/transformers.md). The TypeScript
// client's wire form, through the real protobuf encoding, into the agent's region table over real
// shared memory: what the agent accepts, what it refuses (naming region and field), and that its
// gather reads each block's page at the stride.
import { RegionTable } from '../src/agent/regions';
import { regionMessage, validateRegion, type ClientRegion } from '../src/client/region';
import { ShmSegment } from '../src/memory';
import { decode, encode, messageType } from '../src/proto';

const name = `/wavebus-test-${process.pid}-stride`;
let seg: ShmSegment;

beforeAll(() => {
  // 5 blocks of 4 float32 pages of [2 tokens, 1 head, 2 dims] (16 bytes): L0.k, L0.v, L1.k, L1.v.
  seg = ShmSegment.create(name, 5 * 64);
  const b = seg.buffer();
  for (let i = 0; i < b.length; i++) b[i] = i & 0xff;
});
afterAll(() => {
  seg.close();
  ShmSegment.unlink(name);
});

/** What the agent receives: the client's region, encoded and decoded as on the wire. */
function wire(r: ClientRegion) {
  validateRegion(r);
  return decode<any>(messageType('Region'), encode(messageType('Region'), regionMessage(r)));
}

const layer1V: ClientRegion = { name: 'l1.v', shmName: name, offset: 48, nbytes: 4 * 64 + 16, dtype: 'float32', shape: [5, 2, 1, 2], role: 'kv_pool', layer: 'l1', kv: 'v', blockStride: 64 };

test('a strided KV region is accepted and its blocks are read at the stride', async () => {
  const table = new RegionTable();
  const r = table.register(wire(layer1V))!;
  expect(r.blockStride).toBe(64);
  const dst = Buffer.alloc(2 * 16);
  await r.region.gatherTo(dst, 0, [3, 0], 16, 0, r.blockStride);
  const b = seg.buffer();
  expect(dst.equals(Buffer.concat([b.subarray(3 * 64 + 48, 3 * 64 + 64), b.subarray(48, 64)]))).toBe(true);
  // The same description again (a client that says hello again) is the same region; another stride is not.
  expect(table.register(wire(layer1V))).toBe(r);
  expect(() => table.register(wire({ ...layer1V, blockStride: 80, nbytes: 4 * 80 + 16 }))).toThrow(/region\.name 'l1\.v' is already registered with a different description/);
  table.closeAll();
});

test('the agent refuses a stride below one block, a region too short for its strides, and a stride on an input', () => {
  const table = new RegionTable();
  expect(() => table.register(wire({ ...layer1V, blockStride: 8 }))).toThrow(/region 'l1\.v'\.block_stride 8 is below one block \(16 bytes\)/);
  expect(() => table.register(wire({ ...layer1V, nbytes: 4 * 64 }))).toThrow(/region 'l1\.v': shape \[5, 2, 1, 2\] of float32 needs 272 bytes but region\.nbytes is 256/);
  const input = wire({ name: 'x', shmName: name, nbytes: 16, dtype: 'float32', shape: [4], role: 'input' });
  expect(() => table.register({ ...input, blockStride: 32 })).toThrow(/region 'x'\.block_stride is only for kv_pool regions/);
  // The TypeScript client refuses it before sending.
  expect(() => validateRegion({ name: 'x', shmName: name, nbytes: 16, dtype: 'float32', shape: [4], role: 'input', blockStride: 32 })).toThrow(/region 'x'\.blockStride must be a non-negative integer, and only on a kv_pool region/);
  table.closeAll();
});
