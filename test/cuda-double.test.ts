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
import { setupAgent } from '../src/commands/agent';
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
    const file = path.join(waveDir, 'dp0_tp0_pp0_cp0', `layers.${l}.pt`);
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

test('Python client: an input snapshot from a cuda region (int32 [32] at offset 64) is captured byte for byte, beside a KV dump', () => {
  const dir = fs.mkdtempSync(path.join(work, 'py-snap-'));
  const blocks = [4, 4, 1];
  const { out, report } = runJob(
    {
      reqId: 'req-py-cuda-snap',
      blocks,
      snapshot: { region: 'input0' },
      python: [PYTHON, path.join(DIR, 'py_engine.py'), lib, dir, 'req-py-cuda-snap', blocks.join(','), 'snapshot'],
    },
    { WAVEBUS_CUDA_DOUBLE_SLOW_COPY_US: '200' },
  );
  expect(out.python.regions).toEqual(['layers.0.k', 'layers.0.v', 'layers.1.k', 'layers.1.v', 'input0']);
  expect(out.python.captured).toBe(true);
  expect(out.manifest).toMatchObject({ complete: true, completed_ranks: [0] });
  const pools = out.python.regions.slice(0, 4).map((n: string) => fs.readFileSync(path.join(dir, `${n}.bin`)));
  expectDumped(out.waveDir, pools, 2, blocks);
  return loadCallDir(out.python.call_dir).then((call) => {
    expect(call.tensors).toHaveLength(1);
    expect(call.tensors[0].data.equals(fs.readFileSync(path.join(dir, 'input0.bin')).subarray(64, 192))).toBe(true);
    expectClean(report);
  });
});

test.each([
  ['enqueue', '999', 'unknown error'],
  ['sync', '700', 'an illegal memory access was encountered'],
])('a copy failing mid-dump (reported at %s, code %s) commits no bundle; the error names rank, region and CUDA error', async (at, code, text) => {
  const pools = [0, 1, 2, 3].map((i) => pseudoRandomBytes(POOL, 21 + i));
  const owner = await startOwner(pools);
  // Staging of 200 bytes: every region's gather is several copies, and the 5th of the process fails.
  const { out, report } = runJob(
    { reqId: 'req-fail-1', blocks: [1, 2, 3], regions: kvRegions(owner.handles, 2), cudaStagingBytes: 200 },
    { WAVEBUS_CUDA_DOUBLE_FAIL_COPY: '5', WAVEBUS_CUDA_DOUBLE_FAIL_AT: at, WAVEBUS_CUDA_DOUBLE_FAIL_ERROR: code, WAVEBUS_CUDA_DOUBLE_SLOW_COPY_US: '500' },
  );
  expect(out.manifest.complete).toBe(false);
  const fn = at === 'enqueue' ? 'cudaMemcpyAsync' : 'cudaStreamSynchronize';
  expect(out.manifest.failed_ranks[0]).toMatch(new RegExp(`^rank 0: copy of region 'layers\\.[01]\\.[kv]' \\(cuda device 0 \\[0, 1024\\)\\) failed: ${fn}: ${text} \\(code ${code}\\)`));
  expect(fs.existsSync(path.join(out.waveDir, 'dp0_tp0_pp0_cp0', 'dump.json'))).toBe(false);
  expect(fs.readdirSync(path.join(out.waveDir, 'dp0_tp0_pp0_cp0')).filter((n) => n.endsWith('.pt'))).toEqual([]);
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
  // dump.json's copy figure (what scripts/gpu-check.sh times): every gathered byte, and at least
  // the double's injected delay of 100 µs per copy (each region's 5120 bytes are 6+ copies in a row).
  const { copy } = JSON.parse(fs.readFileSync(path.join(out.waveDir, 'dp0_tp0_pp0_cp0', 'dump.json'), 'utf8'));
  expect(copy.bytes).toBe(8 * 40 * BLOCK);
  expect(copy.seconds).toBeGreaterThanOrEqual(6 * 100e-6);
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

// ---------------------------------------------------------------- the double itself, and each fault

test('the double exports exactly the functions the backend resolves with dlsym, plus the four the test "engine" uses', () => {
  const backend = fs.readFileSync(path.join(ROOT, 'native', 'cuda_backend.cc'), 'utf8');
  const resolved = [...backend.matchAll(/Resolve\(lib, "(\w+)"/g)].map((m) => m[1]);
  expect(resolved).toHaveLength(11);
  const nm = spawnSync('nm', ['-D', '--defined-only', lib], { encoding: 'utf8' });
  expect(nm.status).toBe(0);
  const exported = nm.stdout.split('\n').filter((l) => / T /.test(l)).map((l) => l.split(' ').pop());
  expect(exported.sort()).toEqual([...resolved, 'cudaMalloc', 'cudaFree', 'cudaMemcpy', 'cudaIpcGetMemHandle'].sort());
});

/** Open (then close) a cuda region on `handle` in a child process with the double and `faults`. */
function openRegion(handle: string, nbytes: number, faults: Record<string, string>): { result: { code?: string; message?: string; opened?: boolean }; report: Report } {
  const reports = fs.mkdtempSync(path.join(work, 'rep-'));
  const script = `
const { DeviceRegion } = require(${JSON.stringify(path.join(ROOT, 'dist', 'src', 'memory'))});
try {
  const r = DeviceRegion.open({ kind: 'cuda', cudaIpcHandle: Buffer.from(process.argv[1], 'hex'), offset: 0, nbytes: ${nbytes} });
  r.close();
  console.log(JSON.stringify({ opened: true }));
} catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }`;
  const r = spawnSync(process.execPath, ['-e', script, handle], { env: { ...process.env, WAVEBUS_CUDART: lib, WAVEBUS_CUDA_DOUBLE_REPORT: reports, ...faults }, encoding: 'utf8' });
  expect(r.stderr).toBe('');
  return { result: JSON.parse(r.stdout), report: JSON.parse(fs.readFileSync(path.join(reports, `${r.pid}.json`), 'utf8')) };
}

test('faults by environment: an invalid handle, and an owner the runtime treats as exited, are refused with CUDA\'s error', async () => {
  const owner = await startOwner([pseudoRandomBytes(4096, 71)]);
  const ok = openRegion(owner.handles[0], 4096, {});
  expect(ok.result).toEqual({ opened: true });
  expect({ leaks: ok.report.leaks, violations: ok.report.violations }).toEqual({ leaks: [], violations: 0 });
  const refused = { code: 'ERR_CUDA_IPC', message: expect.stringMatching(/cudaIpcOpenMemHandle: invalid resource handle \(code 400\)$/) };
  expect(openRegion(owner.handles[0], 4096, { WAVEBUS_CUDA_DOUBLE_INVALID_HANDLE: '1' }).result).toEqual(refused);
  // The invalid-handle fault leaves the owner's memory alone; an exited owner's memory is freed.
  expect(fs.readdirSync('/dev/shm').filter((n) => n.startsWith(`wbcd-${owner.pid}-`))).toHaveLength(1);
  expect(openRegion(owner.handles[0], 4096, { WAVEBUS_CUDA_DOUBLE_OWNER_EXITED: '1' }).result).toEqual(refused);
  expect(fs.readdirSync('/dev/shm').filter((n) => n.startsWith(`wbcd-${owner.pid}-`))).toEqual([]);
});

test('the double sees what it must: a destination read before synchronising is poison, and what is left at exit is reported', () => {
  // A careless "engine" written against the double directly (ctypes): it reads pinned memory before
  // synchronising, then leaves a copy unsynchronised, its pinned memory, its stream and its device
  // allocation behind. The report must name every one; expectClean() relies on that.
  const reports = fs.mkdtempSync(path.join(work, 'rep-'));
  const script = `
import ctypes, json, sys
from device import DoubleDevice
d = DoubleDevice(sys.argv[1]); L = d.lib
L.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
L.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
L.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
data = bytes(range(256)) * 16
src = d.upload(data)
pinned, stream = ctypes.c_void_p(), ctypes.c_void_p()
d.check(L.cudaHostAlloc(ctypes.byref(pinned), 4096, 0), "cudaHostAlloc")
d.check(L.cudaStreamCreateWithFlags(ctypes.byref(stream), 1), "cudaStreamCreateWithFlags")
d.check(L.cudaMemcpyAsync(pinned, src, 4096, 2, stream), "cudaMemcpyAsync")
early = ctypes.string_at(pinned.value, 4096)
d.check(L.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
late = ctypes.string_at(pinned.value, 4096)
d.check(L.cudaMemcpyAsync(pinned, src, 4096, 2, stream), "cudaMemcpyAsync")
print(json.dumps({"early_is_poison": early == b"\\xdb" * 4096, "late_is_data": late == data}))
`;
  const r = spawnSync(PYTHON, ['-c', script, lib], {
    env: { ...process.env, PYTHONPATH: DIR, PYTHONDONTWRITEBYTECODE: '1', WAVEBUS_CUDA_DOUBLE_REPORT: reports, WAVEBUS_CUDA_DOUBLE_SLOW_COPY_US: '200000' },
    encoding: 'utf8',
  });
  expect(r.stderr).toBe('');
  expect(JSON.parse(r.stdout)).toEqual({ early_is_poison: true, late_is_data: true });
  const report = JSON.parse(fs.readFileSync(path.join(reports, `${r.pid}.json`), 'utf8')) as Report;
  expect(report.violations).toBe(1);
  expect(report.events).toEqual(['violation: 1 copies were never synchronised when the process exited']);
  expect(report.leaks.sort()).toEqual(['device allocation of 4096 bytes /wbcd-' + r.pid + '-1', 'pinned host memory of 4096 bytes', 'stream never destroyed'].sort());
});

test('wavebus agent --cuda-staging-mb sets each CUDA region\'s pinned chunk, validated like every integer flag', () => {
  const argv = (v?: string) => ({ 'heartbeat-ms': '500', 'end-of-wave-timeout-ms': '50', 'staging-mb': '1024', ...(v === undefined ? {} : { 'cuda-staging-mb': v }) });
  const env = { RANK: '0', WORLD_SIZE: '1', LOCAL_RANK: '0', LOCAL_WORLD_SIZE: '1' };
  expect(setupAgent(argv(), env).cudaStagingBytes).toBe(8 << 20);
  expect(setupAgent(argv('64'), env).cudaStagingBytes).toBe(64 << 20);
  for (const bad of ['0', '1025', '1.5', '-3', 'lots']) {
    expect(() => setupAgent(argv(bad), env)).toThrow(`--cuda-staging-mb: expected an integer in 1..1024, got ${JSON.stringify(bad)}`);
  }
});
