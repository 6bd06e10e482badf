import * as fs from 'fs';
import * as path from 'path';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { CaptureError } from '../src/errors';
import type { ForwardContext } from '../src/messages';
import { CaptureBudget } from '../src/snapshot/budget';
import { CaptureInput, regionInput, SnapshotCapturer, snapshotRankDir } from '../src/snapshot/capture';
import { loadCallDir } from '../src/snapshot/loader';
import { DeviceRegion, ShmSegment } from '../src/memory';
import { resolveSnapshotConfig, SnapshotFormat } from '../src/snapshot/config';
import { Agent } from '../src/agent/agent';
import { WavebusClient } from '../src/client/client';
import { resolveIdentity } from '../src/launch/identity';
import { cudaAvailable } from '../src/memory';
import pino from 'pino';
import { Writable } from 'stream';
import { cleanup, runPython, tmpDir } from './helpers';

afterAll(cleanup);

const RANK0 = { globalRank: 5, tpRank: 1, ppRank: 1, dpRank: 0, cpRank: 0 };

interface Made {
  capturer: SnapshotCapturer;
  root: string;
  logs: string[];
  budget: CaptureBudget;
}

function make(env: Record<string, string>, opts: { rank?: typeof RANK0; root?: string; budget?: CaptureBudget; noopReason?: string } = {}): Made {
  const root = opts.root ?? tmpDir('wb-snap-');
  const logs: string[] = [];
  const config = resolveSnapshotConfig({ WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_CACHE_ROOT: root, ...env }, {}, (m) => logs.push(m));
  const budget = opts.budget ?? new CaptureBudget(config.maxCaptures, (m) => logs.push(m));
  const capturer = new SnapshotCapturer(config, opts.rank ?? RANK0, {
    budget,
    noopReason: opts.noopReason,
    log: { info: (m) => logs.push(m), warn: (m) => logs.push(m) },
  });
  return { capturer, root, logs, budget };
}

function ctx(over: Partial<ForwardContext> = {}): ForwardContext {
  return {
    compilationHash: 'graphA',
    globalStep: 12,
    isPrompt: false,
    reqIds: ['abc-9a8546d5', 'zz-1'],
    positions: [9, 4, -1],
    rowRequest: [0, 1, -1],
    numSpeculativeTokens: 0,
    warmup: false,
    ...over,
  };
}

function f32(values: number[]): Buffer {
  return Buffer.from(new Float32Array(values).buffer);
}
function i64(values: number[]): Buffer {
  return Buffer.from(new BigInt64Array(values.map(BigInt)).buffer);
}
/** bf16 bits of exactly representable floats: the top half of their f32 bits. */
function bf16(values: number[]): Buffer {
  const u32 = new Uint32Array(new Float32Array(values).buffer);
  return Buffer.from(new Uint16Array(Array.from(u32, (x) => x >>> 16)).buffer);
}

const F = [1.5, -2, 0.25, 3, 100, -0.5];
function inputs(): CaptureInput[] {
  return [
    { dtype: 'float32', shape: [2, 3], read: async () => f32(F) },
    { dtype: 'int64', shape: [3], read: async () => [i64([7]), i64([-8, 9])] }, // chunks, in order
    { dtype: 'bfloat16', shape: [3, 2], read: async () => bf16(F) },
    { dtype: 'uint8', shape: [], read: async () => Buffer.from([200]) },
  ];
}

function listTree(dir: string): string[] {
  if (!fs.existsSync(dir)) return [];
  const out: string[] = [];
  const walk = (d: string, rel: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) walk(path.join(d, e.name), r);
      else out.push(r);
    }
  };
  walk(dir, '');
  return out.sort();
}

describe('a selected forward becomes a call directory', () => {
  test('layout, meta.json fields, files', async () => {
    const { capturer, root } = make({ WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '10', WAVEBUS_SNAPSHOT_FORMAT: 'npy' });
    const r = await capturer.capture(ctx(), inputs());
    const dir = path.join(root, 'snapshots', 'graphA', 'rank5', 'call0');
    expect(r).toMatchObject({ captured: true, callDir: dir });
    expect(listTree(path.join(root, 'snapshots'))).toEqual([
      'graphA/rank5/call0/meta.json',
      'graphA/rank5/call0/tensor0.npy',
      'graphA/rank5/call0/tensor1.npy',
      'graphA/rank5/call0/tensor2.npy',
      'graphA/rank5/call0/tensor3.npy',
    ]);
    const text = fs.readFileSync(path.join(dir, 'meta.json'), 'utf8');
    const meta = JSON.parse(text);
    // Sorted keys, indent 2.
    expect(text).toBe(JSON.stringify(meta, null, 2) + '\n');
    const keysSorted = (v: unknown): boolean =>
      Array.isArray(v)
        ? v.every(keysSorted)
        : v !== null && typeof v === 'object'
          ? Object.keys(v).join() === Object.keys(v).sort().join() && Object.values(v).every(keysSorted)
          : true;
    expect(keysSorted(meta)).toBe(true);
    expect(text.indexOf('"batch_index"')).toBeLessThan(text.indexOf('"request_id"'));
    expect(meta).toEqual({
      schema: 1,
      hash: 'graphA',
      format: 'npy',
      global_rank: 5,
      tp_rank: 1,
      pp_rank: 1,
      dp_rank: 0,
      cp_rank: 0,
      call_index: 0,
      selected_by: ['token'],
      inputs: [
        { index: 0, dtype: 'float32', shape: [2, 3] },
        { index: 1, dtype: 'int64', shape: [3] },
        { index: 2, dtype: 'bfloat16', shape: [3, 2] },
        { index: 3, dtype: 'uint8', shape: [] },
      ],
      global_step: 12,
      is_prompt: false,
      req_ids: ['abc-9a8546d5', 'zz-1'],
      positions: [9, 4, -1],
      row_request: [0, 1, -1],
      num_speculative_tokens: 0,
      matches: [{ batch_index: 0, position: 10, reason: 'token', request_id: 'abc-9a8546d5' }],
      files: meta.files,
    });
    expect(meta.files.map((f: { name: string }) => f.name)).toEqual(['tensor0.npy', 'tensor1.npy', 'tensor2.npy', 'tensor3.npy']);
    for (const f of meta.files as { name: string; bytes: number; checksum: string }[]) {
      const bytes = fs.readFileSync(path.join(dir, f.name));
      expect(f.bytes).toBe(bytes.length);
      expect(f.checksum).toBe(formatChecksum(crc32c(bytes)));
    }
    expect(capturer.stats()).toMatchObject({ forwards: 1, selected: 1, captured: 1 });
  });

  test('call<N> is the graph call index whichever rule fired; unselected forwards leave nothing', async () => {
    const { capturer, root } = make({ WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'zz' });
    const miss = await capturer.capture(ctx({ reqIds: ['q-1'], positions: [3], rowRequest: [0] }), inputs());
    expect(miss).toMatchObject({ captured: false, reason: 'not_selected' });
    const warm = await capturer.capture(ctx({ warmup: true }), inputs());
    expect(warm).toMatchObject({ captured: false, reason: 'warmup' });
    const hit = await capturer.capture(ctx(), inputs());
    expect(hit.callDir).toBe(path.join(root, 'snapshots', 'graphA', 'rank5', 'call1'));
    expect(listTree(path.join(root, 'snapshots')).filter((f) => f.endsWith('meta.json'))).toEqual(['graphA/rank5/call1/meta.json']);
    const meta = JSON.parse(fs.readFileSync(path.join(hit.callDir!, 'meta.json'), 'utf8'));
    expect(meta.selected_by).toEqual(['request']);
    expect(meta.matches).toEqual([{ batch_index: 1, request_id: 'zz-1', position: 4, reason: 'request' }]);
    expect(meta.format).toBe('pt');
  });

  test('the compilation hash is sanitised for the path and kept verbatim in meta.json', async () => {
    const { capturer, root } = make({});
    const r = await capturer.capture(ctx({ compilationHash: '../evil/hash' }), inputs());
    expect(r.captured).toBe(true);
    const rel = path.relative(path.join(root, 'snapshots'), r.callDir!);
    expect(rel.startsWith('..')).toBe(false);
    expect(rel.split(path.sep)).toHaveLength(3);
    expect(JSON.parse(fs.readFileSync(path.join(r.callDir!, 'meta.json'), 'utf8')).hash).toBe('../evil/hash');
  });

  test('disabled capture does nothing', async () => {
    const root = tmpDir('wb-snap-');
    const config = resolveSnapshotConfig({ WAVEBUS_CACHE_ROOT: root }, {}, () => undefined);
    const c = new SnapshotCapturer(config, RANK0, { budget: new CaptureBudget(1) });
    expect(await c.capture(ctx(), inputs())).toEqual({ captured: false, reason: 'disabled' });
    expect(fs.readdirSync(root)).toEqual([]);
  });
});

describe('inputs read from shared memory (DeviceRegion)', () => {
  test('regionInput copies each input out of an engine buffer', async () => {
    const name = `/wavebus-snaptest-${process.pid}`;
    const seg = ShmSegment.create(name, 4096);
    let region: DeviceRegion | undefined;
    try {
      const buf = seg.buffer();
      f32(F).copy(buf, 0);
      bf16(F).copy(buf, 1024);
      region = DeviceRegion.open({ kind: 'shm', shmName: name, offset: 0, nbytes: 4096 });
      const { capturer } = make({ WAVEBUS_SNAPSHOT_FORMAT: 'safetensors' });
      const r = await capturer.capture(ctx(), [regionInput(region, 'float32', [6]), regionInput(region, 'bfloat16', [2, 3], 1024)]);
      const { tensors } = await loadCallDir(r.callDir!);
      expect(tensors.map((t) => [t.dtype, t.shape])).toEqual([
        ['float32', [6]],
        ['bfloat16', [2, 3]],
      ]);
      expect(tensors[0].data.equals(f32(F))).toBe(true);
      expect(tensors[1].data.equals(bf16(F))).toBe(true);
    } finally {
      region?.close();
      seg.close();
      ShmSegment.unlink(name);
    }
  });
});

describe('ranks and budget', () => {
  test('rank narrowing by tp rank; excluded ranks spend no budget', async () => {
    const budget = new CaptureBudget(4);
    const root = tmpDir('wb-snap-');
    const excluded = make({ WAVEBUS_SNAPSHOT_RANKS: '0' }, { root, budget, rank: { ...RANK0, globalRank: 1, tpRank: 1 } });
    const included = make({ WAVEBUS_SNAPSHOT_RANKS: '0' }, { root, budget, rank: { ...RANK0, globalRank: 0, tpRank: 0 } });
    expect(await excluded.capturer.capture(ctx(), inputs())).toMatchObject({ captured: false, reason: 'rank_not_selected' });
    expect(budget.consumed).toBe(0);
    expect(await included.capturer.capture(ctx(), inputs())).toMatchObject({ captured: true });
    expect(budget.consumed).toBe(1);
    expect(fs.readdirSync(path.join(root, 'snapshots', 'graphA'))).toEqual(['rank0']);
    expect(excluded.capturer.stats()).toMatchObject({ selected: 1, skippedRank: 1, captured: 0 });
  });

  test('budget: consumed only when selected; exhausted → no capture, logged once; shared by capturers', async () => {
    const logs: string[] = [];
    const budget = new CaptureBudget(2, (m) => logs.push(m));
    const root = tmpDir('wb-snap-');
    const a = make({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '0,2,3,4' }, { root, budget });
    const b = make({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '0' }, { root, budget });
    const results = [];
    for (let i = 0; i < 5; i++) results.push(await a.capturer.capture(ctx(), inputs()));
    expect(results.map((r) => r.captured)).toEqual([true, false, true, false, false]);
    expect(results.map((r) => r.reason)).toEqual([undefined, 'not_selected', undefined, 'budget_exhausted', 'budget_exhausted']);
    expect(await b.capturer.capture(ctx({ compilationHash: 'graphB' }), inputs())).toMatchObject({ captured: false, reason: 'budget_exhausted' });
    expect(logs.filter((l) => /budget exhausted/.test(l))).toHaveLength(1);
    expect(fs.readdirSync(path.join(root, 'snapshots', 'graphA', 'rank5')).sort()).toEqual(['call0', 'call2']);
    expect(fs.existsSync(path.join(root, 'snapshots', 'graphB'))).toBe(false);
    expect(a.capturer.stats()).toMatchObject({ forwards: 5, selected: 4, captured: 2, skippedBudget: 2 });
  });

  test('a backend without memory access: a stated no-op, logged once', async () => {
    const { capturer, root, logs } = make({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '-1' }, { noopReason: 'backend_without_memory_access' });
    for (let i = 0; i < 3; i++) {
      expect(await capturer.capture(ctx(), inputs())).toMatchObject({ captured: false, reason: 'backend_without_memory_access' });
    }
    expect(logs.filter((l) => /no-op/.test(l))).toHaveLength(1);
    expect(capturer.stats().noop).toBe(3);
    expect(fs.existsSync(path.join(root, 'snapshots'))).toBe(false);
  });
});

describe("the seed's no-op rule: a backend that cannot read a rank's memory", () => {
  // The real situation on a machine without CUDA: the agent cannot load a CUDA runtime, so it
  // cannot read an engine's CUDA input buffer. Capture is then a stated no-op: one log line, no error.
  const noCuda = cudaAvailable().available ? 'this machine has CUDA' : null;
  (noCuda ? test.skip : test)('CUDA input regions without a loadable CUDA runtime: selected forwards are not captured, one log line, no error', async () => {
    const root = tmpDir('wb-snap-');
    const runDir = path.join(root, 'run');
    const lines: string[] = [];
    const sink = new Writable({ write: (c, _e, cb) => (lines.push(String(c)), cb()) });
    const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
    const snapshot = resolveSnapshotConfig({ WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '-1', WAVEBUS_CACHE_ROOT: root });
    const agent = new Agent({ identity, runDir, snapshot, logger: pino({ level: 'info' }, sink) });
    await agent.start();
    const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
    try {
      // Registering the CUDA buffer succeeds (the engine must not fail over a debug feature) ...
      await client.register({ name: 'ids', kind: 'cuda', cudaIpcHandle: Buffer.alloc(64, 1), offset: 0, nbytes: 64, dtype: 'int32', shape: [16], role: 'input' });
      for (let step = 0; step < 3; step++) {
        const res = await client.beforeForward({ compilationHash: 'g', globalStep: step, isPrompt: false, reqIds: ['a'], positions: [4], rowRequest: [0] }, [
          { region: 'ids', dtype: 'int32', shape: [4] },
        ]);
        expect(res.captured).toBe(false); // ... and so does every selected forward, capturing nothing
      }
      const said = lines.filter((l) => /capture is a no-op here/.test(l));
      expect(said).toHaveLength(1);
      expect(said[0]).toMatch(/CUDA region 'ids' cannot be read: no CUDA runtime can be loaded here/);
      expect(fs.existsSync(path.join(root, 'snapshots'))).toBe(false);
    } finally {
      await client.close();
      await agent.stop();
    }
  });
});

describe('the TypeScript client offers a forward whose inputs it could not stage', () => {
  test("beforeForward(ctx, [], { stagingError }) fails loudly with the cause (ERR_SNAPSHOT_INPUT), and the next forward is offered as usual", async () => {
    const root = tmpDir('wb-snap-');
    const runDir = path.join(root, 'run');
    const shmName = `/wbtest-snap-stage-ts-${process.pid}`;
    const seg = ShmSegment.create(shmName, 16);
    seg.buffer().fill(7);
    seg.close();
    const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
    const snapshot = resolveSnapshotConfig({ WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '0,1', WAVEBUS_CACHE_ROOT: root });
    const agent = new Agent({ identity, runDir, snapshot, logger: pino({ level: 'silent' }) });
    await agent.start();
    const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
    try {
      await client.register({ name: 'input_ids', shmName, nbytes: 16, dtype: 'int64', shape: [2], role: 'input' });
      const ctx = { compilationHash: 'g', globalStep: 1, reqIds: ['a'], positions: [4] };
      const failed = await client.beforeForward(ctx, [], { stagingError: "ConfigError: attach(): input 'attention_mask' did not fit" }).then(
        () => null,
        (e: CaptureError) => [e.message, e.code],
      );
      expect(failed).toEqual([
        "input snapshot failed: rank 0: the engine could not stage the inputs of its forward of wave 1: ConfigError: attach(): input 'attention_mask' did not fit",
        'ERR_SNAPSHOT_INPUT',
      ]);
      const next = await client.beforeForward(ctx, [{ region: 'input_ids', dtype: 'int64', shape: [2] }]); // call 1: staged and captured
      expect(next.captured).toBe(true);
      expect(path.basename(next.callDir!)).toBe('call1');
      await expect(client.beforeForward(ctx, [], { stagingError: 5 as unknown as string })).rejects.toThrow(/stagingError must be a string/);
    } finally {
      await client.close();
      await agent.stop();
      ShmSegment.unlink(shmName);
    }
  });
});

describe('fail loud, leave nothing', () => {
  function noCallDirs(root: string): void {
    const rankDir = snapshotRankDir(path.join(root, 'snapshots'), 'graphA', 5);
    const left = listTree(path.join(root, 'snapshots'));
    expect(left.filter((f) => /\/call\d+\//.test(f))).toEqual([]);
    if (fs.existsSync(rankDir)) expect(fs.readdirSync(rankDir).filter((n) => /^call\d+$/.test(n))).toEqual([]);
  }

  test('unwritable cache root (its parent is a regular file): CaptureError, nothing left', async () => {
    const base = tmpDir('wb-snap-');
    fs.writeFileSync(path.join(base, 'file'), 'x');
    const { capturer } = make({}, { root: path.join(base, 'file', 'cache') });
    await expect(capturer.capture(ctx(), inputs())).rejects.toBeInstanceOf(CaptureError);
    expect(fs.readdirSync(base)).toEqual(['file']);
    expect(capturer.stats().failed).toBe(1);
  });

  test('read() rejecting mid-way: CaptureError naming the cause, no call dir, no temp dir left', async () => {
    const { capturer, root } = make({});
    const ins = inputs();
    ins[2] = { dtype: 'bfloat16', shape: [3, 2], read: async () => Promise.reject(new Error('region gone')) };
    const err = await capturer.capture(ctx(), ins).catch((e) => e);
    expect(err).toBeInstanceOf(CaptureError);
    expect(err.message).toMatch(/region gone/);
    noCallDirs(root);
    const rankDir = snapshotRankDir(path.join(root, 'snapshots'), 'graphA', 5);
    if (fs.existsSync(rankDir)) expect(fs.readdirSync(rankDir)).toEqual([]);
  });

  test('a short buffer is refused before it is written', async () => {
    const { capturer, root } = make({});
    const ins = inputs();
    ins[0] = { dtype: 'float32', shape: [2, 3], read: async () => f32([1, 2, 3]) };
    const err = await capturer.capture(ctx(), ins).catch((e) => e);
    expect(err).toBeInstanceOf(CaptureError);
    expect(err.message).toMatch(/12 bytes, expected 24/);
    noCallDirs(root);
  });

  test('bad input descriptions name the input; no budget spent', async () => {
    const { capturer, budget } = make({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '-1' });
    const ins = inputs();
    ins[1] = { dtype: 'qint8', shape: [3], read: async () => Buffer.alloc(0) };
    await expect(capturer.capture(ctx(), ins)).rejects.toThrow(/inputs\[1\]\.dtype/);
    const ins2 = inputs();
    ins2[3] = { dtype: 'uint8', shape: [-1], read: async () => Buffer.alloc(0) };
    await expect(capturer.capture(ctx(), ins2)).rejects.toThrow(/inputs\[3\]\.shape/);
    expect(budget.consumed).toBe(0);
  });

  test('a malformed forward context is a CaptureError', async () => {
    const { capturer } = make({});
    await expect(capturer.capture(ctx({ rowRequest: [0] }), inputs())).rejects.toThrow(CaptureError);
  });

});

describe('a rerun must not abort the engine', () => {
  test('a selected call<N> that already exists is replaced whole by the newer capture; the forward goes on', async () => {
    const root = tmpDir('wb-snap-');
    const first = make({}, { root });
    const r1 = await first.capturer.capture(ctx(), inputs());
    expect(JSON.parse(fs.readFileSync(path.join(r1.callDir!, 'meta.json'), 'utf8')).global_step).toBe(12);
    // A repeated job: same root, same compilation hash, a fresh process budget: call 0 again.
    const rerun = make({ WAVEBUS_SNAPSHOT_FORMAT: 'npy' }, { root });
    const r2 = await rerun.capturer.capture(ctx({ globalStep: 99 }), inputs());
    expect(r2).toMatchObject({ captured: true, callDir: r1.callDir });
    // The newer capture, whole: its meta.json, its format's files only, and it loads.
    const call = await loadCallDir(r2.callDir!);
    expect(call.meta.global_step).toBe(99);
    expect(fs.readdirSync(r2.callDir!).sort()).toEqual(['meta.json', 'tensor0.npy', 'tensor1.npy', 'tensor2.npy', 'tensor3.npy']);
    expect(rerun.budget.consumed).toBe(1);
    expect(rerun.logs.some((l) => /replaced an earlier capture/.test(l))).toBe(true);
    // Nothing of the old bundle is left beside it.
    expect(fs.readdirSync(path.dirname(r2.callDir!))).toEqual(['call0']);
  });
  test('a failed rerun capture leaves the earlier bundle in place (fail loud, lose nothing complete)', async () => {
    const root = tmpDir('wb-snap-');
    const r1 = await make({}, { root }).capturer.capture(ctx(), inputs());
    const before = fs.readFileSync(path.join(r1.callDir!, 'meta.json'), 'utf8');
    const ins = inputs();
    ins[2] = { ...ins[2], read: async () => Promise.reject(new Error('device gone')) };
    await expect(make({}, { root }).capturer.capture(ctx({ globalStep: 99 }), ins)).rejects.toThrow(/device gone/);
    expect(fs.readFileSync(path.join(r1.callDir!, 'meta.json'), 'utf8')).toBe(before);
    expect(fs.readdirSync(path.dirname(r1.callDir!))).toEqual(['call0']);
  });
});

describe('dtypes: .pt takes any dtype; only .npy refuses what numpy cannot represent', () => {
  const c64 = (vals: number[]) => Buffer.from(new Float32Array(vals).buffer); // (re, im) pairs
  const exotic = (): CaptureInput[] => [
    { dtype: 'complex64', shape: [2], read: async () => c64([1, 2, -3, 0.5]) },
    { dtype: 'complex128', shape: [1], read: async () => Buffer.from(new Float64Array([4, -1]).buffer) },
    { dtype: 'uint16', shape: [3], read: async () => Buffer.from(new Uint16Array([1, 65535, 7]).buffer) },
    { dtype: 'complex32', shape: [1], read: async () => Buffer.from([0, 0x3c, 0, 0xc0]) },
    { dtype: 'float8_e4m3fnuz', shape: [2], read: async () => Buffer.from([1, 2]) },
  ];
  test('pt captures accept any torch dtype, and torch.load reads the ones this torch has', async () => {
    const { capturer } = make({ WAVEBUS_SNAPSHOT_FORMAT: 'pt' });
    const r = await capturer.capture(ctx(), exotic());
    expect(r.captured).toBe(true);
    const call = await loadCallDir(r.callDir!);
    expect(call.tensors.map((t) => t.dtype)).toEqual(['complex64', 'complex128', 'uint16', 'complex32', 'float8_e4m3fnuz']);
    const out = runPython(
      `
import sys, torch
d = sys.argv[1]
a = torch.load(f"{d}/tensor0.pt", weights_only=True); b = torch.load(f"{d}/tensor1.pt", weights_only=True)
print(a.dtype, a.tolist(), b.dtype, b.tolist())
`,
      [r.callDir!],
    );
    expect(out.trim()).toBe('torch.complex64 [(1+2j), (-3+0.5j)] torch.complex128 [(4-1j)]');
  });
  test('npy refuses a dtype numpy cannot represent, asking to re-run with pt; nothing written, no budget spent', async () => {
    const { capturer, root, budget } = make({ WAVEBUS_SNAPSHOT_FORMAT: 'npy' });
    const err = await capturer.capture(ctx(), exotic()).catch((e) => e);
    expect(err).toBeInstanceOf(CaptureError);
    expect(err.message).toMatch(/inputs\[3\]: dtype "complex32" has no \.npy representation; re-run with format "pt"/);
    expect(budget.consumed).toBe(0);
    expect(fs.existsSync(path.join(root, 'snapshots'))).toBe(false);
  });
  test('npy keeps what numpy can represent: complex and unsigned types load in numpy', async () => {
    const { capturer } = make({ WAVEBUS_SNAPSHOT_FORMAT: 'npy' });
    const r = await capturer.capture(ctx(), exotic().slice(0, 3));
    const out = runPython(
      `
import sys, numpy as np
d = sys.argv[1]
print(*[(str(x.dtype), x.tolist()) for x in (np.load(f"{d}/tensor{i}.npy") for i in range(3))])
`,
      [r.callDir!],
    );
    expect(out.trim()).toBe("('complex64', [(1+2j), (-3+0.5j)]) ('complex128', [(4-1j)]) ('uint16', [1, 65535, 7])");
  });
  test('a forward that is not selected never fails over a tensor dtype', async () => {
    const { capturer } = make({ WAVEBUS_SNAPSHOT_FORMAT: 'npy', WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '5' });
    const odd: CaptureInput[] = [{ dtype: 'qint8', shape: [2], read: async () => Buffer.alloc(2) }, ...exotic()];
    for (let i = 0; i < 5; i++) expect(await capturer.capture(ctx(), odd)).toMatchObject({ captured: false, reason: 'not_selected' });
  });
});

describe('interop with numpy and torch (Debian python3)', () => {
  async function capture(format: SnapshotFormat): Promise<string> {
    const { capturer } = make({ WAVEBUS_SNAPSHOT_FORMAT: format });
    const r = await capturer.capture(ctx(), inputs());
    return r.callDir!;
  }

  test('npy: numpy.load reads every input; bf16 via |V2 and meta.json', async () => {
    const dir = await capture('npy');
    const out = runPython(
      `
import json, sys, numpy as np
d = sys.argv[1]
meta = json.load(open(d + "/meta.json"))
a0 = np.load(d + "/tensor0.npy"); a1 = np.load(d + "/tensor1.npy"); a2 = np.load(d + "/tensor2.npy"); a3 = np.load(d + "/tensor3.npy")
assert a2.dtype == np.dtype("V2"), a2.dtype
bf = (a2.view("<u2").astype(np.uint32) << 16).view(np.float32)
print(json.dumps({"a0": a0.tolist(), "d0": str(a0.dtype), "a1": a1.tolist(), "d1": str(a1.dtype), "bf": bf.tolist(), "s2": list(a2.shape),
  "a3": int(a3), "s3": list(a3.shape), "d3": str(a3.dtype), "dt2": meta["inputs"][2]["dtype"]}))
`,
      [dir],
    );
    expect(JSON.parse(out)).toEqual({
      a0: [[1.5, -2, 0.25], [3, 100, -0.5]],
      d0: 'float32',
      a1: [7, -8, 9],
      d1: 'int64',
      bf: [[1.5, -2], [0.25, 3], [100, -0.5]],
      s2: [3, 2],
      a3: 200,
      s3: [],
      d3: 'uint8',
      dt2: 'bfloat16',
    });
  });

  test('pt: torch.load(weights_only=True) reads every input with its dtype', async () => {
    const dir = await capture('pt');
    const out = runPython(
      `
import json, sys, torch
d = sys.argv[1]
ts = [torch.load(d + "/tensor%d.pt" % i, weights_only=True) for i in range(4)]
print(json.dumps([{"dtype": str(t.dtype), "shape": list(t.shape), "values": t.float().tolist() if t.dtype == torch.bfloat16 else t.tolist()} for t in ts]))
`,
      [dir],
    );
    expect(JSON.parse(out)).toEqual([
      { dtype: 'torch.float32', shape: [2, 3], values: [[1.5, -2, 0.25], [3, 100, -0.5]] },
      { dtype: 'torch.int64', shape: [3], values: [7, -8, 9] },
      { dtype: 'torch.bfloat16', shape: [3, 2], values: [[1.5, -2], [0.25, 3], [100, -0.5]] },
      { dtype: 'torch.uint8', shape: [], values: 200 },
    ]);
  });

  test('safetensors: the header and data parse in Python (struct + json + numpy)', async () => {
    const dir = await capture('safetensors');
    const out = runPython(
      `
import json, struct, sys, numpy as np
d = sys.argv[1]
res = []
for i, code in enumerate(["<f4", "<i8", "<u2", "|u1"]):
    raw = open(d + "/tensor%d.safetensors" % i, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    e = h["tensor"]
    a = np.frombuffer(raw[8 + n + e["data_offsets"][0]: 8 + n + e["data_offsets"][1]], dtype=code).reshape(e["shape"])
    if e["dtype"] == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    res.append({"dtype": e["dtype"], "values": a.tolist()})
print(json.dumps(res))
`,
      [dir],
    );
    expect(JSON.parse(out)).toEqual([
      { dtype: 'F32', values: [[1.5, -2, 0.25], [3, 100, -0.5]] },
      { dtype: 'I64', values: [7, -8, 9] },
      { dtype: 'BF16', values: [[1.5, -2], [0.25, 3], [100, -0.5]] },
      { dtype: 'U8', values: 200 },
    ]);
  });

  test('the documented Python replay recipe for npy bf16 gives torch.bfloat16', async () => {
    const dir = await capture('npy');
    const out = runPython(
      `
import json, sys, numpy as np, torch
d = sys.argv[1]
meta = json.load(open(d + "/meta.json"))
inp = meta["inputs"][2]
a = np.load(d + "/tensor%d.%s" % (inp["index"], meta["format"]))
t = torch.from_numpy(a.view("<i2").copy()).view(torch.bfloat16)
print(json.dumps({"dtype": str(t.dtype), "values": t.float().tolist()}))
`,
      [dir],
    );
    expect(JSON.parse(out)).toEqual({ dtype: 'torch.bfloat16', values: [[1.5, -2], [0.25, 3], [100, -0.5]] });
  });
});
