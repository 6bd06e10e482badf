// The Python client's snapshot side against the agent's: one forward-context rule on both sides,
// any torch dtype in .pt, unselected forwards never failing over a dtype, a late agent's answer not
// taken for a failed capture, and load_call_dir("~/...").
import * as path from 'path';
import pino from 'pino';
import { Agent } from '../src/agent/agent';
import { resolveIdentity } from '../src/launch/identity';
import type { ForwardContext } from '../src/messages';
import { resolveSnapshotConfig } from '../src/snapshot/config';
import { checkForwardContext } from '../src/snapshot/selector';
import { PYTHON, ROOT, cleanup, runPython, spawnTracked, tmpDir } from './helpers';

const ENV: NodeJS.ProcessEnv = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1' };

afterEach(cleanup);

async function pyAsync(code: string, env: NodeJS.ProcessEnv): Promise<any> {
  const p = spawnTracked(PYTHON, ['-c', code], { env });
  const { code: rc } = await p.exited;
  if (rc !== 0) throw new Error(`python exited ${rc}: ${p.stderr()}`);
  const lines = p.stdout().trim().split('\n');
  return JSON.parse(lines[lines.length - 1]);
}

// snake_case contexts as the Python client takes them; each differs from a good one in one field.
const BASE = { compilation_hash: 'g', global_step: 3, is_prompt: false, req_ids: ['a-1', 'b-2'], positions: [5, 7], row_request: [0, 1], num_speculative_tokens: 0, warmup: false };
const CASES: [string, Record<string, unknown>][] = [
  ['good', {}],
  ['empty row_request (row r = request r)', { row_request: [] }],
  ['empty row_request, more rows than requests', { row_request: [], positions: [5, 7, 0, 0] }],
  ['empty row_request in prefill', { row_request: [], is_prompt: true, positions: [0, 1, 2, 3] }],
  ['row_request shorter than positions', { row_request: [0] }],
  ['row_request past req_ids', { row_request: [0, 2] }],
  ['row_request -2', { row_request: [0, -2] }],
  ['padding row', { row_request: [0, -1], positions: [5, -1] }],
  ['position -2', { positions: [5, -2] }],
  ['position 2^53-1', { positions: [5, 2 ** 53 - 1] }],
  ['position 2^53', { positions: [5, 2 ** 53] }],
  ['global_step 2^53', { global_step: 2 ** 53 }],
  ['global_step -1', { global_step: -1 }],
  ['empty hash', { compilation_hash: '' }],
  ["a '/' in the hash (sanitised into the path)", { compilation_hash: 'a/b' }],
  ['num_speculative_tokens 2^32', { num_speculative_tokens: 2 ** 32 }],
  ['no requests, no rows', { req_ids: [], positions: [], row_request: [] }],
];

function agentAccepts(c: Record<string, unknown>): boolean {
  const ctx: ForwardContext = {
    compilationHash: c.compilation_hash as string,
    globalStep: c.global_step as number,
    isPrompt: c.is_prompt as boolean,
    reqIds: c.req_ids as string[],
    positions: c.positions as number[],
    rowRequest: c.row_request as number[],
    numSpeculativeTokens: c.num_speculative_tokens as number,
    warmup: c.warmup as boolean,
  };
  try {
    checkForwardContext(ctx);
    return true;
  } catch {
    return false;
  }
}

test('the Python client must accept exactly what the agent accepts (one forward-context rule)', () => {
  const contexts = CASES.map(([, over]) => ({ ...BASE, ...over }));
  const out = runPython(
    `
import json, sys
from wavebus_client.forward import context_proto
from wavebus_client.errors import ConfigError
res = []
for c in json.loads(sys.argv[1]):
    try:
        context_proto(c); res.append(True)
    except ConfigError:
        res.append(False)
print(json.dumps(res))`,
    [JSON.stringify(contexts)],
    { env: ENV },
  );
  const client: boolean[] = JSON.parse(out.trim());
  const agent = contexts.map(agentAccepts);
  expect(CASES.map(([name], i) => [name, client[i]])).toEqual(CASES.map(([name], i) => [name, agent[i]]));
  // The rule is not vacuous: both sides refuse some and accept some.
  expect(agent.filter(Boolean).length).toBeGreaterThan(3);
  expect(agent.filter((x) => !x).length).toBeGreaterThan(3);
});

async function withAgent(env: Record<string, string>, body: (runDir: string, root: string) => Promise<void>): Promise<void> {
  const runDir = tmpDir();
  const root = tmpDir();
  const identity = resolveIdentity({ RANK: '0', WORLD_SIZE: '1', LOCAL_RANK: '0', LOCAL_WORLD_SIZE: '1' });
  const snapshot = resolveSnapshotConfig({ WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_CACHE_ROOT: root, ...env });
  const agent = new Agent({ identity, runDir, snapshot, logger: pino({ level: 'silent' }) });
  await agent.start();
  try {
    await body(runDir, root);
  } finally {
    await agent.stop();
  }
}

test('an empty row_request from Python is captured by a real agent (it used to fail every forward with CaptureError)', async () => {
  await withAgent({ WAVEBUS_SNAPSHOT_CAPTURE_REQUEST: 'b' }, async (runDir) => {
    const got = await pyAsync(
      `
import json, torch
from wavebus_client import Client
from wavebus_client.shm import shm_tensor
from wavebus_client.replay import load_call_dir
c = Client.connect()
ids, r = shm_tensor("wbtest-snap-rr-${process.pid}", [3], torch.int64, region_name="input_ids"); c.register(r)
captured, d = c.before_forward({"compilation_hash": "g", "global_step": 1, "req_ids": ["a-1", "b-2"], "positions": [5, 9, -1], "row_request": []}, [ids])
meta, _ = load_call_dir(d)
c.close()
print(json.dumps({"captured": captured, "row_request": meta["row_request"], "matches": meta["matches"]}))`,
      { ...ENV, WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' },
    );
    expect(got.captured).toBe(true);
    expect(got.row_request).toEqual([0, 1, -1]);
    expect(got.matches).toEqual([{ batch_index: 1, request_id: 'b-2', position: 9, reason: 'request' }]);
  });
});

test('.pt captures accept any torch dtype from Python; a forward that is not selected never fails over a dtype', async () => {
  await withAgent({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '1', WAVEBUS_SNAPSHOT_FORMAT: 'pt' }, async (runDir) => {
    const got = await pyAsync(
      `
import json, torch
from wavebus_client import Client
from wavebus_client.shm import shm_tensor
from wavebus_client.replay import load_call_dir
c = Client.connect()
z, r = shm_tensor("wbtest-snap-cx-${process.pid}", [3], torch.complex64, region_name="freqs"); c.register(r)
z.copy_(torch.tensor([1 + 2j, -3j, 0.5]))
ctx = {"compilation_hash": "g", "global_step": 1, "req_ids": ["a"], "positions": [4]}
first = c.before_forward(ctx, [z])            # call 0: not selected
captured, d = c.before_forward(ctx, [z])      # call 1: selected, .pt
meta, ts = load_call_dir(d)
c.close()
print(json.dumps({"first": list(first), "captured": captured, "dtype": meta["inputs"][0]["dtype"], "same": torch.equal(ts[0], z)}))`,
      { ...ENV, WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' },
    );
    expect(got.first).toEqual([false, '']);
    expect(got).toMatchObject({ captured: true, dtype: 'complex64', same: true });
  });
});

test("a forward whose inputs the engine could not stage: before_forward(staging_error=...) fails loudly with the cause, and the next forward is offered as usual", async () => {
  await withAgent({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '0,1' }, async (runDir) => {
    const got = await pyAsync(
      `
import json, torch
from wavebus_client import Client
from wavebus_client.errors import CaptureError
from wavebus_client.shm import shm_tensor
c = Client.connect()
ids, r = shm_tensor("wbtest-snap-stage-${process.pid}", [2], torch.int64, region_name="input_ids"); c.register(r)
ctx = {"compilation_hash": "g", "global_step": 1, "req_ids": ["a"], "positions": [4]}
try:
    c.before_forward(ctx, [], staging_error="ConfigError: attach(): input 'attention_mask' did not fit")
    failed = None
except CaptureError as e:
    failed = [str(e), e.code]
captured, d = c.before_forward(ctx, [ids])   # call 1: staged and captured
c.close()
print(json.dumps({"failed": failed, "captured": captured, "call": d.rsplit("/", 1)[-1]}))`,
      { ...ENV, WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' },
    );
    expect(got.failed).toEqual([
      "before_forward(): capture failed: rank 0: the engine could not stage the inputs of its forward of wave 1: ConfigError: attach(): input 'attention_mask' did not fit",
      'ERR_SNAPSHOT_INPUT',
    ]);
    expect(got).toMatchObject({ captured: true, call: 'call1' });
  });
});

test('a forward the agent reaches after the engine\'s deadline is not captured, said and counted: not a failed capture, and the agent is not taken for lost', async () => {
  // Call 0 only: the late forward spends no budget (the budget is the process's, shared by this file's tests).
  await withAgent({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '0' }, async (runDir) => {
    // The late agent is a test double of the clock: the client's wall clock (what accept_by is
    // computed from) runs 1 s behind for the first forward, so the agent reaches that request past
    // accept_by while the client still waits for its answer (its own deadline is monotonic).
    const got = await pyAsync(
      `
import json, time, torch
import wavebus_client.live_capture as lc
from wavebus_client import Client
from wavebus_client.shm import shm_tensor
c = Client.connect()
ids, r = shm_tensor("wbtest-snap-late-${process.pid}", [2], torch.int64, region_name="input_ids"); c.register(r)
ctx = {"compilation_hash": "g", "global_step": 1, "req_ids": ["a"], "positions": [4]}
class BehindClock:
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(lambda: time.time() - 1.0)
lc.time = BehindClock
late = c.before_forward(ctx, [ids])
lc.time = time
c.close()
print(json.dumps({"late": list(late), "skipped": c.stats["snapshots_skipped"], "lost": c.stats["agent_lost"], "unavailable": c.agent_unavailable}))`,
      { ...ENV, WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' },
    );
    // Offered and skipped (an answer that captured or refused nothing would not count it); the agent
    // answered (ERR_CLIENT_GONE, nothing copied), so it is not marked lost.
    expect(got).toEqual({ late: [false, ''], skipped: 1, lost: 0, unavailable: false });
  });
});

test('load_call_dir("~/...") works (expanduser)', async () => {
  await withAgent({}, async (runDir, root) => {
    const home = path.dirname(root);
    const got = await pyAsync(
      `
import json, os, torch
from wavebus_client import Client
from wavebus_client.shm import shm_tensor
from wavebus_client.replay import load_call_dir
c = Client.connect()
t, r = shm_tensor("wbtest-snap-home-${process.pid}", [2], torch.float32, region_name="x"); c.register(r)
captured, d = c.before_forward({"compilation_hash": "g", "req_ids": ["a"], "positions": [0]}, [t])
c.close()
rel = "~/" + os.path.relpath(d, os.environ["HOME"])
meta, ts = load_call_dir(rel)
print(json.dumps({"rel": rel, "n": len(ts)}))`,
      { ...ENV, WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0', HOME: home },
    );
    expect(got.rel.startsWith('~/')).toBe(true);
    expect(got.n).toBe(1);
  });
});
