// The Python client's pre-check of the input-snapshot rules (clients/python/wavebus_client/
// snapshot_select.py): with snapshots on, a forward no rule could select never reaches the agent,
// the client counts every post-warmup forward itself, and the agent numbers captures by that count.
// Its own file: the capture budget is per process (the seed's), and these captures spend it.
import * as fs from 'fs';
import * as path from 'path';
import pino from 'pino';
import { Agent } from '../src/agent/agent';
import { WavebusClient } from '../src/client/client';
import { resolveIdentity } from '../src/launch/identity';
import { resolveSnapshotConfig } from '../src/snapshot/config';
import { PYTHON, ROOT, cleanup, spawnTracked, tmpDir } from './helpers';

const ENV: NodeJS.ProcessEnv = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1' };

afterEach(cleanup);

async function py(code: string, env: NodeJS.ProcessEnv): Promise<any> {
  const p = spawnTracked(PYTHON, ['-c', code], { env });
  const { code: rc } = await p.exited;
  if (rc !== 0) throw new Error(`python exited ${rc}: ${p.stderr()}`);
  const lines = p.stdout().trim().split('\n');
  return JSON.parse(lines[lines.length - 1]);
}

async function withAgent(env: Record<string, string>, body: (runDir: string) => Promise<void>): Promise<void> {
  const runDir = tmpDir();
  const identity = resolveIdentity({ RANK: '0', WORLD_SIZE: '1', LOCAL_RANK: '0', LOCAL_WORLD_SIZE: '1' });
  const snapshot = resolveSnapshotConfig({ WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_CACHE_ROOT: tmpDir(), ...env });
  const agent = new Agent({ identity, runDir, snapshot, logger: pino({ level: 'silent' }) });
  await agent.start();
  try {
    await body(runDir);
  } finally {
    await agent.stop();
  }
}

test('a forward no rule could select is not offered to the agent, and captures keep the call index the client counted', async () => {
  await withAgent({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '3', WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '50', WAVEBUS_SNAPSHOT_FORMAT: 'pt', WAVEBUS_SNAPSHOT_MAX_CAPTURES: '10' }, async (runDir) => {
    const got = await py(
      `
import json, os, torch
from wavebus_client import Client
from wavebus_client.shm import shm_tensor
c = Client.connect()
c.hello()
z, r = shm_tensor("wbtest-snap-pre-${process.pid}", [2], torch.int64, region_name="input_ids"); c.register(r)
ctx = lambda pos, warm=False: {"compilation_hash": "g", "global_step": 1, "req_ids": ["a"], "positions": pos, "warmup": warm}
out = [list(c.before_forward(ctx([5]), [z])) for _ in range(3)]     # calls 0..2: no rule fires
out.append(list(c.before_forward(ctx([5], True), [z])))              # warmup: neither counted nor offered
out.append(list(c.before_forward(ctx([5]), [z])))                    # call 3: the call rule
out.append(list(c.before_forward(ctx([49]), [z])))                   # call 4: token 50 is made from position 49
c.close()
print(json.dumps({"out": [[a, os.path.basename(b)] for a, b in out], "not_offered": c.stats["forwards_not_offered"]}))`,
      { ...ENV, WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' },
    );
    expect(got.out).toEqual([[false, ''], [false, ''], [false, ''], [false, ''], [true, 'call3'], [true, 'call4']]);
    // Four forwards never reached the agent; had it counted the two it was offered itself, the
    // first would be its call 0 (not selected) and the second call 1, not call3 and call4.
    expect(got.not_offered).toBe(4);
  });
});


test('the TypeScript client offers only what the agent selects, with its own count', async () => {
  await withAgent({ WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '3', WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '50', WAVEBUS_SNAPSHOT_FORMAT: 'npy', WAVEBUS_SNAPSHOT_MAX_CAPTURES: '10' }, async (runDir) => {
    const shmName = `wbtest-snap-pre-ts-${process.pid}`;
    fs.writeFileSync(path.join('/dev/shm', shmName), Buffer.alloc(64));
    const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
    try {
      await client.register({ name: 'input_ids', kind: 'shm', shmName, offset: 0, nbytes: 64, dtype: 'int64', shape: [8], role: 'input' });
      const input = [{ region: 'input_ids', dtype: 'int64', shape: [2] }];
      const ctx = (positions: number[], warmup = false) => ({ compilationHash: 'g', globalStep: 1, reqIds: ['a'], positions, warmup });
      const out: [boolean, string][] = [];
      for (const c of [ctx([5]), ctx([5]), ctx([5]), ctx([5], true), ctx([5]), ctx([49])]) {
        const r = await client.beforeForward(c, input);
        out.push([r.captured, path.basename(r.callDir ?? '')]);
      }
      expect(out).toEqual([[false, ''], [false, ''], [false, ''], [false, ''], [true, 'call3'], [true, 'call4']]);
      expect(client.stats.forwardsNotOffered).toBe(4);
    } finally {
      await client.close();
      fs.rmSync(path.join('/dev/shm', shmName), { force: true });
    }
  });
});

test("the client's pre-check never says no where the agent's selector selects (random forwards, every rule kind)", () => {
  const { CaptureSelector } = require('../src/snapshot/selector') as typeof import('../src/snapshot/selector');
  const { spawnSync } = require('child_process') as typeof import('child_process');
  let seed = 7;
  const rand = (n: number) => ((seed = (seed * 48271) % 2147483647) % n); // exact in doubles
  const configs = [
    { CAPTURE_AT_CALL: undefined },
    { CAPTURE_AT_CALL: '2,5' },
    { CAPTURE_AT_CALL: '-1' },
    { CAPTURE_TOKEN: '10,20' },
    { CAPTURE_REQUEST: 'b' },
    { CAPTURE_AT_CALL: '1', CAPTURE_TOKEN: '7', CAPTURE_REQUEST: 'zz' },
  ];
  const forwards = Array.from({ length: 60 }, () => {
    const n = rand(4);
    const reqIds = Array.from({ length: n }, () => ['a', 'b', 'b-3', 'bb-1', 'zz-9', 'c'][rand(6)]);
    return {
      compilation_hash: ['g', 'h'][rand(2)], global_step: 1, is_prompt: rand(4) === 0, req_ids: reqIds,
      positions: Array.from({ length: n + rand(2) }, () => rand(25) - 1), row_request: [] as number[],
      num_speculative_tokens: rand(3), warmup: rand(8) === 0,
    };
  });
  const cases: { config: number; i: number; callIndex: number | null; agent: boolean }[] = [];
  configs.forEach((env, k) => {
    const full = Object.fromEntries(Object.entries({ ENABLE: '1', ...env }).filter(([, v]) => v !== undefined).map(([key, v]) => [`WAVEBUS_SNAPSHOT_${key}`, v as string]));
    const cfg = resolveSnapshotConfig({ ...full, WAVEBUS_CACHE_ROOT: tmpDir() });
    const sel = new CaptureSelector(cfg);
    forwards.forEach((f, i) => {
      const s = sel.evaluate({ compilationHash: f.compilation_hash, globalStep: 1, isPrompt: f.is_prompt, reqIds: f.req_ids, positions: f.positions, rowRequest: [], numSpeculativeTokens: f.num_speculative_tokens, warmup: f.warmup });
      cases.push({ config: k, i, callIndex: s.callIndex, agent: s.selected });
    });
  });
  // The same rules as the agent's hello would give them (snapshotSelection), through the Python pre-check.
  const { snapshotSelection } = require('../src/agent/input-capture') as typeof import('../src/agent/input-capture');
  const { SnapshotCapturer } = require('../src/snapshot/capture') as typeof import('../src/snapshot/capture');
  const sels = configs.map((env) => {
    const full = Object.fromEntries(Object.entries({ ENABLE: '1', ...env }).filter(([, v]) => v !== undefined).map(([key, v]) => [`WAVEBUS_SNAPSHOT_${key}`, v as string]));
    return snapshotSelection(new SnapshotCapturer(resolveSnapshotConfig({ ...full, WAVEBUS_CACHE_ROOT: tmpDir() }), { globalRank: 0, tpRank: 0, ppRank: 0, dpRank: 0, cpRank: 0 }));
  });
  const code = `
import json, sys
from wavebus_client import wavebus_pb2 as pb
from wavebus_client.snapshot_select import CallCounter, SnapshotPrecheck
d = json.load(sys.stdin)
out = []
for s in d["sels"]:
    r = pb.ClientReply()
    r.features.snapshot_selection.CopyFrom(pb.SnapshotSelection(call_rule=s["callRule"], call_indices=s["callIndices"], token_targets=s["tokenTargets"], request_ids=s["requestIds"], rank_selected=s["rankSelected"]))
    pre, calls = SnapshotPrecheck.from_reply(r), CallCounter()
    out.append([[i, pre.could_fire(f, i)] for f in d["forwards"] for i in [calls.count(f)]])
print(json.dumps(out))`;
  const r = spawnSync(PYTHON, ['-c', code], { input: JSON.stringify({ sels, forwards }), env: ENV, encoding: 'utf8' });
  expect(r.stderr).toBe('');
  const client: [number | null, boolean][][] = JSON.parse(r.stdout);
  const wrong = cases.filter((c) => client[c.config][c.i][0] !== c.callIndex || (c.agent && !client[c.config][c.i][1]));
  expect(wrong).toEqual([]);
  // Not vacuous: the agent selects some, and the client spares the agent many.
  expect(cases.filter((c) => c.agent).length).toBeGreaterThan(10);
  expect(cases.filter((c) => !client[c.config][c.i][1]).length).toBeGreaterThan(cases.length / 3);
});

test("a capture armed on the running job counts its own calls: the client's count (the startup rules') never reaches an arm", async () => {
  const { LiveCaptures, offerForward } = require('../src/agent/live-captures') as typeof import('../src/agent/live-captures');
  const { RegionTable } = require('../src/agent/regions') as typeof import('../src/agent/regions');
  const { inputCapturer } = require('../src/agent/input-capture') as typeof import('../src/agent/input-capture');
  const identity = resolveIdentity({ RANK: '0', WORLD_SIZE: '1', LOCAL_RANK: '0', LOCAL_WORLD_SIZE: '1' });
  const root = tmpDir();
  const log = pino({ level: 'silent' });
  // Startup rules that select nothing here (token 999), as the walkthrough's job: the client counts and offers.
  const startup = inputCapturer(resolveSnapshotConfig({ WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_CAPTURE_TOKEN: '999', WAVEBUS_CACHE_ROOT: root }), identity, log);
  const results: Record<string, unknown>[] = [];
  const live = new LiveCaptures(identity, path.join(root, 'live'), log, (r) => results.push(r));
  // `wavebus capture --next` at wave 40: call 0 of the arm's own count, in wave 40 only.
  live.add([{ id: 'capture-1', replica: 0, wave: 40, untilWave: 40, requestIds: [], tokenTargets: [], callIndices: [0], tpRanks: [], format: 1, maxCaptures: 1, flushRecorder: false }]);
  const bf = { context: { compilationHash: 'g', globalStep: 40, isPrompt: false, reqIds: ['a'], positions: [5], rowRequest: [], numSpeculativeTokens: 0, warmup: false }, inputs: [], wave: 40, callIndexPlus1: 38 };
  const got = await offerForward(startup, live, new RegionTable(), bf, () => {}, () => {}, () => 0);
  expect(got).toMatchObject({ captured: true });
  expect(path.basename(String(got.callDir))).toBe('call0');
  // Under the arm's own folder (its id and wave), so another arm's call0 never replaces it.
  expect(String(got.callDir)).toBe(path.join(root, 'live', 'live', 'capture-1-wave40', 'g', 'rank0', 'call0'));
  expect(results).toEqual([expect.objectContaining({ armId: 'capture-1', wave: 40, done: true, error: '' })]);
});

test("an engine that could not stage a forward's inputs: every capture armed over that wave fails on this rank with the cause, logged, and before_forward answers an error", async () => {
  const { LiveCaptures, offerForward } = require('../src/agent/live-captures') as typeof import('../src/agent/live-captures');
  const { RegionTable } = require('../src/agent/regions') as typeof import('../src/agent/regions');
  const identity = resolveIdentity({ RANK: '0', WORLD_SIZE: '1', LOCAL_RANK: '0', LOCAL_WORLD_SIZE: '1' });
  const root = tmpDir();
  const lines: string[] = [];
  const log = pino({ level: 'info' }, { write: (s: string) => lines.push(s) });
  const results: Record<string, unknown>[] = [];
  const live = new LiveCaptures(identity, root, log, (r) => results.push(r));
  const arm = { replica: 0, requestIds: [], tokenTargets: [], tpRanks: [], format: 1, maxCaptures: 4, flushRecorder: false };
  // --next at wave 40; a --request capture over waves 30..100; one over waves 50..60 does not cover 40.
  live.add([
    { ...arm, id: 'capture-1', wave: 40, untilWave: 40, callIndices: [0] },
    { ...arm, id: 'capture-2', wave: 30, untilWave: 100, callIndices: [], requestIds: ['a'] },
    { ...arm, id: 'capture-3', wave: 50, untilWave: 60, callIndices: [0] },
  ]);
  const cause = "ConfigError: attach(): input 'attention_mask' has 900 elements, more than its staging region's 600";
  const bf = { context: { compilationHash: 'g', globalStep: 40, isPrompt: false, reqIds: ['a'], positions: [5], rowRequest: [], numSpeculativeTokens: 0, warmup: false }, inputs: [], wave: 40, stagingError: cause };
  const err = await offerForward(undefined, live, new RegionTable(), bf, () => {}, () => {}, () => 0).then(() => undefined, (e: Error & { code?: string }) => e);
  expect({ code: err?.code, message: err?.message }).toEqual({ code: 'ERR_SNAPSHOT_INPUT', message: `rank 0: the engine could not stage the inputs of its forward of wave 40: ${cause}` });
  // What `wavebus capture` prints per rank; the --next arm is done here (its only wave), the other goes on.
  expect(results).toEqual([
    { armId: 'capture-1', wave: 40, callDir: '', error: err!.message, done: true },
    { armId: 'capture-2', wave: 40, callDir: '', error: err!.message, done: false },
  ]);
  expect(fs.existsSync(path.join(root, 'live'))).toBe(false); // nothing that looks captured
  const logged = lines.map((l) => JSON.parse(l)).filter((l) => l.level === 50);
  expect(logged).toEqual([expect.objectContaining({ wave: 40, arms: ['capture-1', 'capture-2'], err: cause, msg: "input snapshot failed: the engine could not stage the forward's inputs" })]);
});
