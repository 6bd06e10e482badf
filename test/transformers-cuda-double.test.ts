// transformers' paged KV cache on the GPU path, against the CUDA runtime TEST DOUBLE
// (test/cuda-double/: device memory is POSIX shm, IPC handles name segments). A real
// PagedAttentionCache (torch 2.x venv, transformers' own manager) is exported as ONE cuda region and
// its per-layer K and V regions cut from it with block_stride (integrations/transformers_cache.py,
// what share_cache() does with a CUDA cache); the agent dumps a request through the double's CUDA
// IPC path and the dump must equal the pages transformers' own page views hold, byte for byte.
// It proves the mapping and the agent's strided CUDA gather against the runtime's contract, nothing
// about a GPU (this torch has no CUDA: the cache bytes are uploaded into the double).
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { readBytes } from '../src/artifacts/read-range';
import { readPt } from '../src/artifacts/pt-reader';
import { ROOT } from './helpers';
import { torch2 } from './torch2';

const DIR = path.join(ROOT, 'test', 'cuda-double');
let work: string;
let lib: string;

beforeAll(() => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-hf-cudadbl-'));
  lib = path.join(work, 'libcudart_double.so');
  const cc = spawnSync('cc', ['-shared', '-fPIC', '-O1', '-Wall', '-Werror', '-o', lib, path.join(DIR, 'cudart_double.c'), '-lrt', '-lpthread'], { encoding: 'utf8' });
  expect([cc.status, cc.stderr]).toEqual([0, '']);
});

afterAll(() => {
  fs.rmSync(work, { recursive: true, force: true });
  expect(fs.readdirSync('/dev/shm').filter((n) => n.startsWith('wbcd-') && !fs.existsSync(`/proc/${n.split('-')[1]}`))).toEqual([]);
});

test('a transformers cache exported as cuda regions (block_stride over one IPC allocation) is dumped byte for byte, no ordering violation, no leak', () => {
  const venv = torch2();
  const root = fs.mkdtempSync(path.join(work, 'job-'));
  const reports = path.join(root, 'reports');
  fs.mkdirSync(reports);
  const blocks = [5, 0, 3];
  const spec = path.join(root, 'spec.json');
  fs.writeFileSync(spec, JSON.stringify({ root, reqId: 'req-hf-cuda', blocks, python: [venv.python, path.join(DIR, 'hf_engine.py'), lib, root, 'req-hf-cuda', blocks.join(',')] }));
  const env = { ...process.env, WAVEBUS_CUDART: lib, WAVEBUS_CUDA_DOUBLE_REPORT: reports, WAVEBUS_CUDA_DOUBLE_SLOW_COPY_US: '200', PYTHONPATH: `${path.join(ROOT, 'clients', 'python')}:${DIR}`, PYTHONDONTWRITEBYTECODE: '1' };
  const r = spawnSync(process.execPath, [path.join(DIR, 'job.js'), spec], { env, encoding: 'utf8', timeout: 180000 });
  if (r.status !== 0) throw new Error(`job.js exited ${r.status}: ${r.stderr.slice(-3000)}`);
  const lines = r.stdout.trim().split('\n');
  const out = JSON.parse(lines[lines.length - 1]);
  // One allocation: every region is the same IPC handle at its own offset; K/V regions stride over the blocks.
  const regions: [string, string, number, number][] = out.python.regions;
  expect(regions.map(([n, k]) => [n, k])).toEqual([
    ['model.layers.0.self_attn.k', 'cuda'], ['model.layers.0.self_attn.v', 'cuda'], ['model.layers.1.self_attn.k', 'cuda'], ['model.layers.1.self_attn.v', 'cuda'], ['kv_cache', 'cuda']]);
  const stride = regions[0][3];
  expect(regions.slice(0, 4).map(([, , off, s]) => [off, s])).toEqual([0, 1, 2, 3].map((i) => [i * stride / 4, stride]));
  expect(out.manifest).toMatchObject({ complete: true, completed_ranks: [0] });
  for (const layer of [0, 1]) {
    const file = path.join(out.waveDir, 'dp0_tp0_pp0_cp0', `model.layers.${layer}.self_attn.pt`);
    const pt = readPt(file);
    for (const [i, kv] of ['k', 'v'].entries()) {
      const want = fs.readFileSync(path.join(root, `model.layers.${layer}.self_attn.${kv}.bin`));
      const t = pt.tensors[i];
      expect(want.length).toBeGreaterThan(0);
      expect(readBytes(file, t.dataOffset, t.nbytes).equals(want)).toBe(true);
    }
  }
  const report = JSON.parse(fs.readFileSync(path.join(reports, `${r.pid}.json`), 'utf8'));
  expect({ violations: report.violations, events: report.events, leaks: report.leaks }).toEqual({ violations: 0, events: [], leaks: [] });
  expect(report.async_copies).toBeGreaterThan(0); // the copies really went through the double
}, 240000);
