// The flight recorder's bundles and report.save_sensitive_info (docs/recorder.md "Sensitive data"):
// a real agent with its ring, a real Python engine process recording forwards through its client
// (input_ids by name, a "draft" region declared token ids, positions not), and the setting sent
// through the AgentConfig proto. false: the token-id files are not written and meta.json names
// them; true: as recorded; "hashed": the keyed hash of each id under the coordinator's key, equal
// for equal tokens across flushes. Every file 0600; every bundle loads and inspects clean. The
// region declaration on both clients and the agent, and the agent's key file checks.
import * as fs from 'fs';
import * as path from 'path';
import pino from 'pino';
import { Agent } from '../src/agent/agent';
import { applyRecorderConfig } from '../src/agent/flight-recorder';
import { holdsTokenIds, RegionTable } from '../src/agent/regions';
import { regionMessage, validateRegion } from '../src/client/region';
import { RegionKind, RegionRole } from '../src/client/protocol';
import { hashTokenIds } from '../src/agent/recorder-sensitive';
import { runtimeView } from '../src/agent/runtime-view';
import { agentConfig } from '../src/guard/agent-config';
import { configFromRaw } from '../src/guard/config';
import type { SensitiveInfo } from '../src/guard/recorder-config';
import { createTokenHashKeyFile, TokenHasher } from '../src/guard/token-hash';
import { resolveIdentity } from '../src/launch/identity';
import { decode, encode, enumValues, messageType } from '../src/proto';
import { loadCallDir } from '../src/snapshot/loader';
import { resolveSnapshotConfig } from '../src/snapshot/config';
import { inspectTree } from '../src/tools/inspect';
import { PYTHON, ROOT, cleanup, runPython, runWavebus, spawnTracked, tmpDir } from './helpers';

afterAll(cleanup);

const ENV: NodeJS.ProcessEnv = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1' };
const IDS = [[101, 7, 2048, 7, 99999, 3], [101, 7, 2048, 7, 99999, 3], [5, 6, 7, 8, 9, 10]];
const DRAFTS = [[1, 2, 3, 4], [1, 2, 3, 4], [4, 3, 2, 1]];

/** Three forwards: 1 and 2 with the same tokens, 3 with others. */
const ENGINE = `
import json, sys, torch
from wavebus_client import Client
from wavebus_client.shm import shm_tensor, release
ids_rows, drafts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
tag = sys.argv[3]
c = Client.connect()
ids, r1 = shm_tensor(f"wbtest-sens-ids-{tag}", [6], torch.int64, region_name="input_ids")
pos, r2 = shm_tensor(f"wbtest-sens-pos-{tag}", [6], torch.int64, region_name="positions")
dr, r3 = shm_tensor(f"wbtest-sens-dr-{tag}", [4], torch.int32, region_name="draft", token_ids=True)
try:
    for r in (r1, r2, r3):
        c.register(r)
    for step, (row, d) in enumerate(zip(ids_rows, drafts)):
        ids.copy_(torch.tensor(row)); pos.copy_(torch.arange(6) + 10 * step); dr.copy_(torch.tensor(d, dtype=torch.int32))
        c.before_forward({"compilation_hash": "g", "global_step": step + 1, "req_ids": ["a"], "positions": pos.tolist()}, [ids, pos, dr])
    print(json.dumps(c.stats))
finally:
    c.close()
    for r in (r1, r2, r3):
        release(r)
`;

function wire(sensitive: SensitiveInfo) {
  const cfg = configFromRaw({ report: { save_sensitive_info: sensitive } }, 'runtime_config.json');
  return runtimeView(decode<any>(messageType('AgentConfig'), encode(messageType('AgentConfig'), agentConfig(cfg, { hotReload: false, dumpRoot: '' }) as unknown as Record<string, unknown>)));
}

const int64s = (b: Buffer) => Array.from({ length: b.length / 8 }, (_, i) => b.readBigInt64LE(i * 8));

let dir: string;
let agent: Agent;
let hasher: TokenHasher;
const flushes = new Map<string, string>();

beforeAll(async () => {
  dir = tmpDir('wavebus-recsens-');
  const runDir = path.join(dir, 'run');
  fs.mkdirSync(runDir, { mode: 0o700 });
  const keyFile = createTokenHashKeyFile(dir);
  hasher = TokenHasher.load(keyFile, 'test');
  const identity = resolveIdentity({ RANK: '0', WORLD_SIZE: '1', LOCAL_RANK: '0', LOCAL_WORLD_SIZE: '1' });
  const snapshot = resolveSnapshotConfig({ WAVEBUS_CACHE_ROOT: path.join(dir, 'cache') });
  agent = new Agent({
    identity, runDir, snapshot, logger: pino({ level: 'silent' }), recorder: { forwards: 4, maxBytes: 1 << 16 },
    // As `wavebus agent --token-hash-key-file` loads it (the launcher gives the coordinator's).
    tokenHasher: TokenHasher.load(keyFile, '--token-hash-key-file'),
  });
  await agent.start();
  const p = spawnTracked(PYTHON, ['-c', ENGINE, JSON.stringify(IDS), JSON.stringify(DRAFTS), String(process.pid)], { env: { ...ENV, WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
  const { code } = await p.exited;
  if (code !== 0) throw new Error(`engine exited ${code}: ${p.stderr()}`);
  expect(JSON.parse(p.stdout().trim().split('\n').pop()!).recorded).toBe(3);
  // One flush per setting, the setting sent as the coordinator sends it (AgentConfig), at flush time.
  for (const s of [false, true, 'hashed', 'hashed'] as SensitiveInfo[]) {
    applyRecorderConfig(agent.recorder, wire(s), pino({ level: 'silent' }), new Set());
    const name = `flush-${String(s)}-${flushes.size}`;
    const r = await agent.recorder!.flush(name, 'user');
    expect(r!.forwards.map((f) => [f.forward, f.callDir !== '', f.error ?? ''])).toEqual([[1, true, ''], [2, true, ''], [3, true, '']]);
    flushes.set(name, r!.dir);
  }
}, 60000);

afterAll(async () => {
  await agent?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

const callDir = (flush: string, forward: number) => path.join(flushes.get(flush)!, 'g', 'rank0', `call${forward}`);
const meta = (flush: string, forward: number) => JSON.parse(fs.readFileSync(path.join(callDir(flush, forward), 'meta.json'), 'utf8'));

function allFiles(d: string): string[] {
  return fs.readdirSync(d, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? allFiles(path.join(d, e.name)) : [path.join(d, e.name)]));
}

test('which input holds token ids: the engine says (TokenIds), else the name input_ids', () => {
  const T = enumValues('TokenIds');
  expect(holdsTokenIds('input_ids', T.TOKEN_IDS_BY_NAME)).toBe(true);
  expect(holdsTokenIds('input_ids', undefined)).toBe(true);
  expect(holdsTokenIds('input_ids', T.TOKEN_IDS_NO)).toBe(false);
  expect(holdsTokenIds('draft', T.TOKEN_IDS_YES)).toBe(true);
  expect(holdsTokenIds('positions', T.TOKEN_IDS_BY_NAME)).toBe(false);
  // The TypeScript client's wire form, and its refusals.
  const base = { name: 'toks', shmName: '/x', nbytes: 8, dtype: 'int64', shape: [1], role: 'input' as const };
  expect([undefined, true, false].map((tokenIds) => regionMessage({ ...base, tokenIds }).tokenIds)).toEqual([T.TOKEN_IDS_BY_NAME, T.TOKEN_IDS_YES, T.TOKEN_IDS_NO]);
  expect(() => validateRegion({ ...base, role: 'kv_pool', layer: 'l', kv: 'k', shape: [1, 1, 1, 1], tokenIds: true })).toThrow(/region 'toks'\.tokenIds must be a boolean, and only on an input region/);
  // The agent refuses a TokenIds it does not know (a newer peer), naming the region and field.
  const table = new RegionTable();
  expect(() => table.register({ name: 'toks', kind: RegionKind.SHM, shmName: '/wbtest-none', offset: 0, nbytes: 8, cudaIpcHandle: Buffer.alloc(0), device: 0, dtype: 'int64', shape: [1], role: RegionRole.INPUT, layer: '', kv: '', tokenIds: 7 }))
    .toThrow(/region 'toks'\.token_ids: unknown TokenIds 7/);
  expect(table.tokenIds('toks')).toBe(false);
  // The Python client refuses a token_ids that is not a bool, and on a KV region.
  const out = runPython(
    `
from wavebus_client.region import Region, validate
from wavebus_client.errors import ConfigError
for kw in ({"token_ids": "yes"}, {"role": "kv_pool", "layer": "l", "kv": "k", "shape": [1, 1, 1, 1], "token_ids": True}):
    try:
        validate(Region(name="x", shm_name="/x", dtype="int64", **{"shape": [1], "nbytes": 8, **kw}))
        print("accepted")
    except ConfigError as e:
        print(e)`,
    [],
    { env: ENV },
  );
  expect(out.trim().split('\n')).toEqual(["register(): region 'x': token_ids must be True, False or None, got 'yes'", "register(): region 'x': token_ids is only for input regions"]);
});

test('save_sensitive_info false: the token-id files are not written, meta.json names them, the rest loads', async () => {
  const f = 'flush-false-0';
  for (const fwd of [1, 2, 3]) {
    expect(fs.readdirSync(callDir(f, fwd)).sort()).toEqual(['meta.json', 'tensor1.npy']);
    const m = meta(f, fwd);
    expect(m.withheld).toEqual([
      { index: 0, name: 'input_ids', reason: 'save_sensitive_info is false' },
      { index: 2, name: 'draft', reason: 'save_sensitive_info is false' },
    ]);
    expect(m.hashed).toBeUndefined();
    expect(m.recorder.save_sensitive_info).toBe(false);
    expect(m.inputs.map((i: any) => [i.index, i.dtype, i.shape])).toEqual([[0, 'int64', [6]], [1, 'int64', [6]], [2, 'int32', [4]]]);
    expect(m.files.map((x: any) => x.name)).toEqual(['tensor1.npy']);
    const loaded = await loadCallDir(callDir(f, fwd));
    expect(loaded.tensors.map((t) => t.index)).toEqual([1]);
    expect(int64s(loaded.tensors[0].data).map(Number)).toEqual([0, 1, 2, 3, 4, 5].map((x) => x + 10 * (fwd - 1)));
  }
  // Nothing in the bytes written holds the ids (99999 as int64 little-endian).
  const needle = Buffer.alloc(8);
  needle.writeBigInt64LE(99999n);
  for (const file of allFiles(flushes.get(f)!)) expect(fs.readFileSync(file).includes(needle)).toBe(false);
  expect(inspectTree(flushes.get(f)!, { verify: true }).problems).toEqual([]);
  // Python's loader names the withheld input and what replay needs; withheld_ok gives None in its place.
  const py = runPython(
    `
import json, sys
from wavebus_client.replay import load_call_dir, ReplayError
try:
    load_call_dir(sys.argv[1]); print("loaded")
except ReplayError as e:
    print(e)
_, ts = load_call_dir(sys.argv[1], withheld_ok=True)
print(json.dumps([None if t is None else t.tolist() for t in ts]))`,
    [callDir(f, 1)],
    { env: ENV },
  );
  const [err, ts] = py.trim().split('\n');
  expect(err).toMatch(/tensor0\.npy: input 0 \(input_ids\) was withheld: save_sensitive_info is false; replay needs the flush written with report\.save_sensitive_info true/);
  expect(JSON.parse(ts)).toEqual([null, [0, 1, 2, 3, 4, 5], null]);
});

test('save_sensitive_info true: every input as recorded', async () => {
  const f = 'flush-true-1';
  for (const fwd of [1, 2, 3]) {
    const m = meta(f, fwd);
    expect(m.withheld).toBeUndefined();
    expect(m.hashed).toBeUndefined();
    expect(m.recorder.save_sensitive_info).toBe(true);
    const { tensors } = await loadCallDir(callDir(f, fwd));
    expect(int64s(tensors[0].data).map(Number)).toEqual(IDS[fwd - 1]);
    expect([...new Int32Array(tensors[2].data.buffer.slice(tensors[2].data.byteOffset, tensors[2].data.byteOffset + tensors[2].data.length))]).toEqual(DRAFTS[fwd - 1]);
  }
});

test('save_sensitive_info "hashed": each id as its keyed hash, equal for equal tokens across flushes, never the ids', async () => {
  const [a, b] = ['flush-hashed-2', 'flush-hashed-3'];
  const ids = async (f: string, fwd: number, index: number) => int64s((await loadCallDir(callDir(f, fwd))).tensors.find((t) => t.index === index)!.data);
  for (const f of [a, b]) {
    for (const fwd of [1, 2, 3]) {
      const m = meta(f, fwd);
      expect(m.withheld).toBeUndefined();
      expect(m.recorder.save_sensitive_info).toBe('hashed');
      expect(m.hashed).toEqual([
        { index: 0, name: 'input_ids', from_dtype: 'int64', ...hasher.scheme },
        { index: 2, name: 'draft', from_dtype: 'int32', ...hasher.scheme },
      ]);
      expect(m.hashed[0].key_source).toBe('file');
      expect(m.inputs.map((i: any) => [i.dtype, i.shape])).toEqual([['int64', [6]], ['int64', [6]], ['int64', [4]]]);
      // The same values the reports' hasher gives each id under this key (TokenHasher.hash).
      const want = IDS[fwd - 1].map((id) => BigInt.asIntN(64, BigInt(`0x${hasher.hash(id)}`)));
      expect(await ids(f, fwd, 0)).toEqual(want);
      expect((await ids(f, fwd, 0)).some((h, i) => h === BigInt(IDS[fwd - 1][i]))).toBe(false);
      expect((await ids(f, fwd, 2)).length).toBe(4);
    }
    expect(inspectTree(flushes.get(f)!, { verify: true }).problems).toEqual([]);
  }
  // Forwards 1 and 2 hold the same tokens; 3 others. Across the two flushes, the same values.
  expect(await ids(a, 1, 0)).toEqual(await ids(a, 2, 0));
  expect(await ids(a, 1, 0)).not.toEqual(await ids(a, 3, 0));
  for (const fwd of [1, 2, 3]) expect(await ids(b, fwd, 0)).toEqual(await ids(a, fwd, 0));
  expect(await ids(a, 1, 2)).toEqual(await ids(b, 2, 2));
  expect(await ids(a, 1, 2)).not.toEqual(await ids(a, 3, 2));
  // Positions are not token ids: as recorded.
  expect((await ids(a, 3, 1)).map(Number)).toEqual([20, 21, 22, 23, 24, 25]);
  // Another key gives other values: the hash is keyed.
  const other = hashTokenIds(Buffer.from(new BigInt64Array(IDS[0].map(BigInt)).buffer), 'int64', TokenHasher.ephemeral())!;
  expect(int64s(other)).not.toEqual(await ids(a, 1, 0));
});

test('wavebus agent refuses a key file others can read, naming the flag or the variable', () => {
  const key = path.join(dir, 'open.key');
  fs.writeFileSync(key, `${'ab'.repeat(32)}\n`, { mode: 0o644 });
  fs.chmodSync(key, 0o644);
  const env = { ...process.env, RANK: '0', WORLD_SIZE: '1', LOCAL_RANK: '0', LOCAL_WORLD_SIZE: '1', WAVEBUS_RECORD_FORWARDS: '2' };
  const byFlag = runWavebus(['agent', '--token-hash-key-file', key], { env, cwd: dir, timeout: 30000 });
  expect(byFlag.code).not.toBe(0);
  expect(byFlag.stderr).toContain(`--token-hash-key-file ${key}: permissions 0644 are too open for the token hash key`);
  const byEnv = runWavebus(['agent'], { env: { ...env, WAVEBUS_TOKEN_HASH_KEY_FILE: key }, cwd: dir, timeout: 30000 });
  expect(byEnv.code).not.toBe(0);
  expect(byEnv.stderr).toContain(`WAVEBUS_TOKEN_HASH_KEY_FILE ${key}: permissions 0644`);
});

test('every file the flushes wrote is 0600', () => {
  let n = 0;
  for (const d of flushes.values()) {
    for (const file of allFiles(d)) {
      expect({ file, mode: (fs.statSync(file).mode & 0o777).toString(8) }).toEqual({ file, mode: '600' });
      n++;
    }
  }
  expect(n).toBeGreaterThan(20);
});
