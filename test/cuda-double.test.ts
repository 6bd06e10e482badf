// wavebus's CUDA path, end to end, against a TEST DOUBLE of the CUDA runtime (test/cuda-double/):
// device memory is POSIX shm, IPC handles name segments, async copies land on a thread of their
// own. It proves the agent's logic against the runtime's contract (ordering, errors, handle and
// pinned-memory lifetimes), nothing about GPUs. The agent runs in a child process whose
// WAVEBUS_CUDART names the double (the backend loads libcudart once per process).
import { spawn, spawnSync, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { readBytes } from '../src/artifacts/read-range';
import { readPt } from '../src/artifacts/pt-reader';
import { loadCallDir } from '../src/snapshot/loader';
import { PYTHON, ROOT, pseudoRandomBytes } from './helpers';

const DIR = path.join(ROOT, 'test', 'cuda-double');
let work: string;
let lib: string;
const owners: ChildProcess[] = [];

beforeAll(() => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-cudadbl-'));
  lib = path.join(work, 'libcudart_double.so');
  const cc = spawnSync('cc', ['-shared', '-fPIC', '-O1', '-Wall', '-Werror', '-o', lib, path.join(DIR, 'cudart_double.c'), '-lrt', '-lpthread'], { encoding: 'utf8' });
  expect(cc.stderr).toBe('');
  expect(cc.status).toBe(0);
});

afterEach(async () => {
  // Owners free their device memory when stdin closes (the double unlinks the segments).
  for (const o of owners.splice(0)) {
    if (o.exitCode !== null || o.signalCode !== null) continue;
    const exited = new Promise((r) => o.once('exit', r));
    o.stdin!.end();
    const t = setTimeout(() => o.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(t);
  }
});

afterAll(() => {
  fs.rmSync(work, { recursive: true, force: true });
  // Every segment the double made belongs to a process of this test that has exited.
  expect(fs.readdirSync('/dev/shm').filter((n) => n.startsWith('wbcd-') && !fs.existsSync(`/proc/${n.split('-')[1]}`))).toEqual([]);
});

/** An owner process holding `datas` in the double's device memory; its IPC handles. */
async function startOwner(datas: Buffer[]): Promise<{ proc: ChildProcess; pid: number; handles: string[] }> {
  const files = datas.map((d, i) => {
    const f = path.join(work, `owner-${process.hrtime.bigint()}-${i}.bin`);
    fs.writeFileSync(f, d);
    return f;
  });
  const proc = spawn(PYTHON, [path.join(DIR, 'device.py'), lib, ...files], { stdio: ['pipe', 'pipe', 'inherit'] });
  owners.push(proc);
  const line = await new Promise<string>((resolve, reject) => {
    let out = '';
    proc.stdout!.on('data', (d) => {
      out += d;
      if (out.includes('\n')) resolve(out.split('\n')[0]);
    });
    proc.on('exit', (code) => reject(new Error(`owner exited ${code}`)));
  });
  const j = JSON.parse(line);
  return { proc, pid: j.pid, handles: j.handles };
}

interface Report {
  pid: number;
  async_copies: number;
  violations: number;
  events: string[];
  leaks: string[];
}

/** Run one rank's job (test/cuda-double/job.js) with the double; its output and the double's report. */
function runJob(spec: Record<string, unknown>, faults: Record<string, string> = {}): { out: any; report: Report } {
  const root = fs.mkdtempSync(path.join(work, 'job-'));
  const reports = path.join(root, 'reports');
  fs.mkdirSync(reports);
  const specFile = path.join(root, 'spec.json');
  fs.writeFileSync(specFile, JSON.stringify({ root, ...spec }));
  const env = { ...process.env, WAVEBUS_CUDART: lib, WAVEBUS_CUDA_DOUBLE_REPORT: reports, PYTHONPATH: `${path.join(ROOT, 'clients', 'python')}:${DIR}`, PYTHONDONTWRITEBYTECODE: '1', ...faults };
  const r = spawnSync(process.execPath, [path.join(DIR, 'job.js'), specFile], { env, encoding: 'utf8', timeout: 60000 });
  if (r.status !== 0) throw new Error(`job.js exited ${r.status}: ${r.stderr.slice(-3000)}`);
  const lines = r.stdout.trim().split('\n');
  const report = JSON.parse(fs.readFileSync(path.join(reports, `${r.pid}.json`), 'utf8')) as Report;
  return { out: JSON.parse(lines[lines.length - 1]), report };
}

const SHAPE = [8, 4, 2, 8]; // blocks, block_size, kv heads, head_dim (bf16): 128-byte blocks
const POOL = 8 * 4 * 2 * 8 * 2;
const BLOCK = POOL / 8;

function kvRegions(handles: string[], layers: number, shape = SHAPE, nbytes = POOL) {
  const out = [];
  for (let l = 0; l < layers; l++) {
    for (const [i, kv] of ['k', 'v'].entries()) {
      out.push({ name: `layers.${l}.${kv}`, handle: handles[2 * l + i], nbytes, dtype: 'bfloat16', shape, role: 'kv_pool', layer: `layers.${l}`, kv });
    }
  }
  return out;
}

function expectDumped(waveDir: string, pools: Buffer[], layers: number, blocks: number[], blockBytes = BLOCK) {
  for (let l = 0; l < layers; l++) {
    const file = path.join(waveDir, 'rank0', `layers.${l}.pt`);
    const pt = readPt(file);
    for (const i of [0, 1]) {
      const t = pt.tensors[i];
      const want = Buffer.concat(blocks.map((b) => pools[2 * l + i].subarray(b * blockBytes, (b + 1) * blockBytes)));
      expect(readBytes(file, t.dataOffset, t.nbytes).equals(want)).toBe(true);
    }
  }
}

function expectClean(report: Report) {
  expect({ violations: report.violations, events: report.events, leaks: report.leaks }).toEqual({ violations: 0, events: [], leaks: [] });
  expect(report.async_copies).toBeGreaterThan(0); // the copies really went through the double
}

test('the double is a CUDA runtime as far as the backend can tell, and a device count of 0 is reported as CUDA\'s error', () => {
  const probe = `const n = require(${JSON.stringify(path.join(ROOT, 'dist', 'src', 'native'))}).native; console.log(JSON.stringify(n.cudaAvailable()))`;
  const run = (extra: Record<string, string>) => JSON.parse(spawnSync(process.execPath, ['-e', probe], { env: { ...process.env, WAVEBUS_CUDART: lib, ...extra }, encoding: 'utf8' }).stdout);
  expect(run({})).toEqual({ available: true, reason: 'libcudart loaded; 1 device(s)' });
  expect(run({ WAVEBUS_CUDA_DOUBLE_DEVICE_COUNT: '0' })).toEqual({ available: false, reason: 'cudaGetDeviceCount: no CUDA-capable device is detected (code 100)' });
});

test('TS client: a KV dump and an input snapshot from cuda regions, bytes exact, no ordering violation, no leak', async () => {
  const pools = [0, 1, 2, 3].map((i) => pseudoRandomBytes(POOL, 11 + i));
  const input = pseudoRandomBytes(256, 99);
  const owner = await startOwner([...pools, input]);
  const blocks = [3, 1, 6];
  const { out, report } = runJob(
    {
      reqId: 'req-cuda-1',
      blocks,
      regions: [...kvRegions(owner.handles, 2), { name: 'input0', handle: owner.handles[4], nbytes: 256, dtype: 'int32', shape: [64], role: 'input' }],
      snapshot: { region: 'input0', dtype: 'int32', shape: [64] },
    },
    { WAVEBUS_CUDA_DOUBLE_SLOW_COPY_US: '200' },
  );
  expect(out.manifest).toMatchObject({ complete: true, completed_ranks: [0], failed_ranks: {} });
  expectDumped(out.waveDir, pools, 2, blocks);
  const call = await loadCallDir(out.snapshotCallDir);
  expect(call.tensors[0].data.equals(input)).toBe(true);
  expectClean(report);
});

test('Python client: a KV pool allocated in the double and registered with cuda regions is dumped byte for byte', () => {
  const blocks = [7, 0, 2];
  const { out, report } = runJob({
    reqId: 'req-py-cuda-1',
    blocks,
    python: [PYTHON, path.join(DIR, 'py_engine.py'), lib, work, 'req-py-cuda-1', blocks.join(',')],
  });
  expect(out.python.regions).toEqual(['layers.0.k', 'layers.0.v', 'layers.1.k', 'layers.1.v']);
  expect(out.manifest).toMatchObject({ complete: true, completed_ranks: [0] });
  const pools = out.python.regions.map((n: string) => fs.readFileSync(path.join(work, `${n}.bin`)));
  expectDumped(out.waveDir, pools, 2, blocks);
  expectClean(report);
});

test.each(['enqueue', 'sync'])('a copy failing mid-dump (reported at %s) commits no bundle; the error names rank, region and CUDA error', async (at) => {
  const pools = [0, 1, 2, 3].map((i) => pseudoRandomBytes(POOL, 21 + i));
  const owner = await startOwner(pools);
  // Staging of 200 bytes: every region's gather is several copies, and the 5th of the process fails.
  const { out, report } = runJob(
    { reqId: 'req-fail-1', blocks: [1, 2, 3], regions: kvRegions(owner.handles, 2), cudaStagingBytes: 200 },
    { WAVEBUS_CUDA_DOUBLE_FAIL_COPY: '5', WAVEBUS_CUDA_DOUBLE_FAIL_AT: at, WAVEBUS_CUDA_DOUBLE_SLOW_COPY_US: '500' },
  );
  expect(out.manifest.complete).toBe(false);
  expect(out.manifest.failed_ranks[0]).toMatch(/^rank 0: copy of region 'layers\.[01]\.[kv]' \(cuda device 0 \[0, 1024\)\) failed: cuda(MemcpyAsync|StreamSynchronize): unknown error \(code 999\)/);
  expect(fs.existsSync(path.join(out.waveDir, 'rank0', 'dump.json'))).toBe(false);
  expect(fs.readdirSync(path.join(out.waveDir, 'rank0')).filter((n) => n.endsWith('.pt'))).toEqual([]);
  expectClean(report);
});

test('a handle whose owner has exited is refused clearly; the agent survives and the dump works', async () => {
  const pools = [0, 1].map((i) => pseudoRandomBytes(POOL, 31 + i));
  const owner = await startOwner(pools);
  const dead = await startOwner([pseudoRandomBytes(POOL, 40)]);
  dead.proc.kill('SIGKILL');
  await new Promise((r) => dead.proc.once('exit', r));
  const blocks = [5, 4];
  const { out, report } = runJob({
    reqId: 'req-after-dead-1',
    blocks,
    regions: kvRegions(owner.handles, 1),
    deadRegions: [{ name: 'input.dead', handle: dead.handles[0], nbytes: POOL, dtype: 'uint8', shape: [POOL], role: 'input' }],
  });
  expect(out.registerErrors['input.dead'].code).toBe('ERR_CUDA_IPC');
  expect(out.registerErrors['input.dead'].message).toMatch(/register\('input\.dead'\): cudaIpcOpenMemHandle: invalid resource handle \(code 400\)/);
  expect(out.manifest).toMatchObject({ complete: true, completed_ranks: [0] });
  expectDumped(out.waveDir, pools, 1, blocks);
  // The segment the killed owner left behind was removed by the double, as CUDA frees it.
  expect(fs.readdirSync('/dev/shm').filter((n) => n.startsWith(`wbcd-${dead.pid}-`))).toEqual([]);
  expectClean(report);
});

test('concurrent dumps of many regions through pinned staging smaller than each region\'s copy', async () => {
  const shape = [64, 4, 2, 8];
  const nbytes = 64 * BLOCK;
  const pools = Array.from({ length: 8 }, (_, i) => pseudoRandomBytes(nbytes, 51 + i));
  const owner = await startOwner(pools);
  const blocks = Array.from({ length: 40 }, (_, i) => (i * 37) % 64);
  // 40 blocks × 128 bytes = 5120 bytes per region through a 1000-byte pinned chunk, 8 regions at once.
  const { out, report } = runJob(
    { reqId: 'req-staged-1', blocks, regions: kvRegions(owner.handles, 4, shape, nbytes), cudaStagingBytes: 1000 },
    { WAVEBUS_CUDA_DOUBLE_SLOW_COPY_US: '100' },
  );
  expect(out.manifest).toMatchObject({ complete: true, completed_ranks: [0] });
  expectDumped(out.waveDir, pools, 4, blocks);
  expectClean(report);
});

test('a failed copy into pinned memory waits for the copies already queued before it reports (found by the double)', async () => {
  // Two regions on one allocation, one pinned buffer: region A's gather fails at its 3rd copy, then
  // region B copies into the same buffer at once. Had A returned with copies 1-2 still queued on
  // its stream, B's copy would race them (the double records it) and the bytes would be A's.
  const pool = pseudoRandomBytes(POOL, 61);
  const owner = await startOwner([pool]);
  const reports = fs.mkdtempSync(path.join(work, 'rep-'));
  const script = `
const { DeviceRegion, Staging } = require(${JSON.stringify(path.join(ROOT, 'dist', 'src', 'memory'))});
(async () => {
  const spec = { kind: 'cuda', cudaIpcHandle: Buffer.from(process.argv[1], 'hex'), offset: 0, nbytes: ${POOL} };
  const a = DeviceRegion.open(spec), b = DeviceRegion.open(spec);
  const st = new Staging(${POOL}, { pinned: true });
  let err = '';
  await a.gatherTo(st.buffer, 0, [0, 1, 2, 3], ${BLOCK}).catch((e) => (err = e.code + ' ' + e.message));
  await b.copyTo(st.buffer, 0, 0, ${POOL});
  const same = Buffer.from(st.buffer).equals(Buffer.from(process.argv[2], 'hex'));
  a.close(); b.close();
  console.log(JSON.stringify({ pinned: st.pinned, err, same }));
})();`;
  const r = spawnSync(process.execPath, ['-e', script, owner.handles[0], pool.toString('hex')], {
    env: { ...process.env, WAVEBUS_CUDART: lib, WAVEBUS_CUDA_DOUBLE_REPORT: reports, WAVEBUS_CUDA_DOUBLE_FAIL_COPY: '3', WAVEBUS_CUDA_DOUBLE_FAIL_AT: 'enqueue', WAVEBUS_CUDA_DOUBLE_SLOW_COPY_US: '20000' },
    encoding: 'utf8',
  });
  expect(r.stderr).toBe('');
  expect(JSON.parse(r.stdout)).toEqual({ pinned: true, err: 'ERR_SHORT_COPY cudaMemcpyAsync: unknown error (code 999)', same: true });
  const report = JSON.parse(fs.readFileSync(path.join(reports, `${r.pid}.json`), 'utf8')) as Report;
  // The pinned staging buffer is freed by its finalizer, which need not run before exit.
  expect({ violations: report.violations, events: report.events }).toEqual({ violations: 0, events: [] });
});
