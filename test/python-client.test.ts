// The Python engine client (clients/python/wavebus_client), driven from jest with Debian's python3:
// generated code in sync with the proto, the mailbox reader, "everything off sends nothing",
// the end_of_wave bound, validation, shm tensors, CUDA absent, and the snapshot replay loader.
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import * as zmq from 'zeromq';
import { ClientReply, ClientRequest, decode, encode } from '../src/proto';
import { columnsFromWire } from '../src/client/telemetry';
import { CLIENT_PROTOCOL_VERSION, RegionRole } from '../src/client/protocol';
import { PYTHON, ROOT, cleanup, freePortPair, runPython, spawnTracked, tmpDir, waitFor } from './helpers';

const PKG = path.join(ROOT, 'clients', 'python');
const PYDIR = path.join(ROOT, 'test', 'python');
const ENV: NodeJS.ProcessEnv = { ...process.env, PYTHONPATH: `${PKG}:${PYDIR}`, PYTHONDONTWRITEBYTECODE: '1' };

afterEach(cleanup);

/** Run a Python snippet that prints one JSON line last; returns it parsed. */
function py(code: string, env: NodeJS.ProcessEnv = ENV): any {
  const out = runPython(code, [], { env }).trim().split('\n');
  return JSON.parse(out[out.length - 1]);
}

/** Run a Python snippet in the background (so this process can answer its socket). */
async function pyAsync(code: string, env: NodeJS.ProcessEnv): Promise<any> {
  const p = spawnTracked(PYTHON, ['-c', code], { env });
  const { code: rc } = await p.exited;
  if (rc !== 0) throw new Error(`python exited ${rc}: ${p.stderr()}`);
  const lines = p.stdout().trim().split('\n');
  return JSON.parse(lines[lines.length - 1]);
}

// ---------------------------------------------------------------- an independent mailbox writer (the layout, in TS)

const HEADER = 64;
const SLOT = 64;

function writeMailboxFile(file: string, features: number, epoch = 1): Buffer {
  const b = Buffer.alloc(HEADER + 8 * SLOT);
  b.write('WBMBOX01', 0, 'latin1');
  b.writeUInt32LE(2, 8); // version 2: a floor at offset 40 (0 here: none)
  b.writeUInt32LE(8, 12);
  b.writeBigUInt64LE(BigInt(features), 16);
  b.writeBigUInt64LE(BigInt(epoch), 24);
  fs.writeFileSync(file, b);
  return b;
}

function putSlot(b: Buffer, wave: number, v: { seq?: number; config?: boolean; dump?: boolean; snapshot?: boolean } = {}): void {
  const off = HEADER + SLOT * (wave % 8);
  b.writeBigUInt64LE(BigInt(v.seq ?? 2), off);
  b.writeBigUInt64LE(BigInt(wave), off + 8);
  b.writeUInt32LE(v.config ? 1 : 0, off + 16);
  b.writeUInt32LE(v.dump ? 1 : 0, off + 20);
  b.writeUInt32LE(v.snapshot ? 1 : 0, off + 24);
}

// ---------------------------------------------------------------- generated code

test('wavebus_pb2.py is exactly what protoc makes of proto/wavebus.proto (regenerate with clients/python/gen_proto.sh)', () => {
  const out = tmpDir();
  const r = spawnSync('bash', [path.join(PKG, 'gen_proto.sh'), out], { encoding: 'utf8' });
  expect(r.stderr).toBe('');
  expect(r.status).toBe(0);
  const fresh = fs.readFileSync(path.join(out, 'wavebus_pb2.py'), 'utf8');
  const committed = fs.readFileSync(path.join(PKG, 'wavebus_client', 'wavebus_pb2.py'), 'utf8');
  expect(committed).toBe(fresh);
});

test('a ClientRequest encoded in Python decodes in TypeScript and a TS ClientReply decodes in Python', () => {
  const hex = py(`
import json
from wavebus_client import wavebus_pb2 as pb
r = pb.ClientRequest(id=7, register=pb.Region(name="layer0.k", kind=pb.REGION_SHM, shm_name="/x", nbytes=64, dtype="bfloat16", shape=[2, 4, 2, 2], role=pb.ROLE_KV_POOL, layer="layer0", kv="k"))
print(json.dumps(r.SerializeToString().hex()))`);
  const req = decode(ClientRequest, Buffer.from(hex, 'hex'));
  expect(req.id).toBe(7);
  expect(req.body).toBe('register');
  expect(req.register).toMatchObject({ name: 'layer0.k', shmName: '/x', nbytes: 64, dtype: 'bfloat16', shape: [2, 4, 2, 2], layer: 'layer0', kv: 'k' });
  const reply = encode(ClientReply, { id: 9, ok: false, error: 'no', errorCode: 'ERR_X', timedOut: true, features: { tp0: true, detectors: ['garbled'], itemSync: true, endOfWaveTimeoutMs: 75 } });
  const back = py(`
import json
from wavebus_client import wavebus_pb2 as pb
r = pb.ClientReply(); r.ParseFromString(bytes.fromhex("${reply.toString('hex')}"))
from wavebus_client.features import Features
print(json.dumps([r.id, r.ok, r.error, r.error_code, r.timed_out, vars(Features.from_reply(r))]))`);
  expect(back).toEqual([9, false, 'no', 'ERR_X', true, { tp0: true, bus: false, detectors: ['garbled'], item_sync: true, snapshots: false, end_of_wave_timeout_ms: 75 }]);
});

// ---------------------------------------------------------------- mailbox

test('the Python mailbox reader follows the layout: features, epoch, slots by wave, seqlock, stale slots', () => {
  const dir = tmpDir();
  const file = path.join(dir, 'mailbox-local0');
  const b = writeMailboxFile(file, 0b0101, 42);
  putSlot(b, 3, { config: true });
  putSlot(b, 10, { dump: true, seq: 6 }); // slot 2, so wave 2 is gone
  putSlot(b, 12, { seq: 5 }); // odd: the writer is mid-write
  putSlot(b, 13, { snapshot: true });
  fs.writeFileSync(file, b);
  const got = py(`
import json
from wavebus_client.mailbox import Mailbox
m = Mailbox(${JSON.stringify(file)})
def v(w):
    x = m.read_wave(w)
    return None if x is None else [x.wave, x.config_due, x.dump_due, x.snapshot_due]
print(json.dumps({"features": m.features, "epoch": m.epoch, "w3": v(3), "w10": v(10), "w2": v(2), "w12": v(12), "w13": v(13), "w11": v(11), "w0": v(0)}))`);
  // w0: slot 0 was never written (seq 0), so it is empty, not "wave 0 with nothing due".
  expect(got).toEqual({ features: 5, epoch: 42, w3: [3, true, false, false], w10: [10, false, true, false], w2: null, w12: null, w13: [13, false, false, true], w11: null, w0: null });
});

test('the Python reader reads the mailbox the agent writes (src/client/mailbox.ts, native writer)', () => {
  // Loaded here, not at the top: they need the native addon, which the other tests do not.
  const { MailboxFeature, MailboxWriter } = require('../src/client/mailbox') as typeof import('../src/client/mailbox');
  const file = path.join(tmpDir(), 'mailbox-local0');
  const w = MailboxWriter.create(file);
  w.setFeatures(MailboxFeature.BUS_ACTIVE | MailboxFeature.DETECTORS);
  w.setEpoch(9);
  w.publish({ wave: 20, configDue: 1, dumpDue: 3 });
  w.publish({ wave: 21, configDue: 0, dumpDue: 0 });
  w.publish({ wave: 30, configDue: 0, dumpDue: 1 }); // overwrites slot 6 (wave 22's)
  const got = py(`
import json
from wavebus_client.mailbox import Mailbox
m = Mailbox(${JSON.stringify(file)})
def v(w):
    x = m.read_wave(w)
    return None if x is None else [x.wave, x.config_due, x.dump_due, x.snapshot_due]
print(json.dumps({"features": m.features, "epoch": m.epoch, "w20": v(20), "w21": v(21), "w30": v(30), "w22": v(22), "w0": v(0), "w12": v(12)}))`);
  w.close({ unlink: true });
  expect(got).toEqual({ features: 5, epoch: 9, w20: [20, true, true, false], w21: [21, false, false, false], w30: [30, false, true, false], w22: null, w0: null, w12: null });
});

test('a Python client asleep on the mailbox is woken by the agent\'s native writer in another process; bound and overwritten answered', async () => {
  const { MailboxWriter } = require('../src/client/mailbox') as typeof import('../src/client/mailbox');
  const dir = tmpDir();
  const file = path.join(dir, 'mailbox-local0');
  const marker = path.join(dir, 'waiting');
  const w = MailboxWriter.create(file);
  w.publish({ wave: 40, configDue: 0, dumpDue: 0 });
  const pending = pyAsync(
    `
import json, time
from wavebus_client.mailbox import Mailbox, WaveVector
m = Mailbox(${JSON.stringify(file)})
out = {"can_wait": m.can_wait, "timeout": m.wait_wave(9, 0.05), "overwritten": m.wait_wave(32, 20)}
open(${JSON.stringify(marker)}, "w").close()
t = time.monotonic()
v = m.wait_wave(9, 20)
out["woken"] = [v.wave, v.dump_due, time.monotonic() - t < 20]
print(json.dumps(out))`,
    ENV,
  );
  await waitFor(() => fs.existsSync(marker), 'the Python reader to start waiting');
  await new Promise((r) => setTimeout(r, 100));
  w.publish({ wave: 9, configDue: 0, dumpDue: 2 });
  const got = await pending;
  w.close({ unlink: true });
  expect(got).toEqual({ can_wait: true, timeout: 'timeout', overwritten: 'overwritten', woken: [9, true, true] });
});

test('a Python writer and reader agree, and a bad mailbox file is refused with its name', () => {
  const dir = tmpDir();
  const good = path.join(dir, 'mb');
  const bad = path.join(dir, 'bad');
  fs.writeFileSync(bad, Buffer.alloc(576));
  const short = path.join(dir, 'short');
  fs.writeFileSync(short, Buffer.alloc(10));
  const got = py(`
import json
from wavebus_client.mailbox import Mailbox, MailboxWriter
from wavebus_client.errors import ProtocolError
w = MailboxWriter(${JSON.stringify(good)}, features=1, epoch=3)
m = Mailbox(${JSON.stringify(good)})
out = {"before": m.read_wave(17) is None}
w.publish(17, dump_due=True)
x = m.read_wave(17)
out["after"] = [x.wave, x.dump_due, x.config_due]
w.begin(18)  # a writer that stopped mid-write: the reader gives up instead of spinning forever
out["midwrite"] = m.read_wave(18) is None
w.set_features(9)
out["features"] = m.features
errs = []
for p in (${JSON.stringify(bad)}, ${JSON.stringify(short)}, ${JSON.stringify(path.join(dir, 'missing'))}):
    try:
        Mailbox(p)
        errs.append("no error")
    except ProtocolError as e:
        errs.append([e.code, str(e)])
out["errors"] = errs
print(json.dumps(out))`);
  expect(got.before).toBe(true);
  expect(got.after).toEqual([17, true, false]);
  expect(got.midwrite).toBe(true);
  expect(got.features).toBe(9);
  expect(got.errors[0][1]).toContain(bad);
  expect(got.errors[0][1]).toContain('bad magic');
  expect(got.errors[1][1]).toContain(short);
  expect(got.errors[1][1]).toMatch(/10 bytes, expected at least 576/);
  expect(got.errors[2][0]).toBe('ERR_MAILBOX_MISSING');
  expect(got.errors[2][1]).toContain('is the wavebus agent of this rank running');
});

// ---------------------------------------------------------------- everything off

test('with every feature off the client sends nothing: a ROUTER at its endpoint receives zero messages over 1000 steps', async () => {
  const dir = tmpDir();
  writeMailboxFile(path.join(dir, 'mailbox-local0'), 0);
  const router = new zmq.Router({ linger: 0 });
  await router.bind(`ipc://${path.join(dir, 'agent-local0.sock')}`);
  let received = 0;
  const counting = (async () => {
    try {
      for await (const _ of router) received++;
    } catch {
      /* closed */
    }
  })();
  const got = await pyAsync(
    `
import json, sys, torch
from wavebus_client import Client
from wavebus_client.shm import shm_tensor, release
c = Client.connect()
t, region = shm_tensor("wbtest-off-${process.pid}", [4, 8], torch.float32)
sent = c.register(region)
tel = {"requests": [{"req_id": "r1", "new_token_ids": [5]}]}
results = []
for w in range(1000):
    c.wave_head(w, tel)
    results.append(c.end_of_wave(w))
cap = c.before_forward({"compilation_hash": "h"}, [t])
c.close()
release(region)
print(json.dumps({"enabled": c.enabled, "register_sent": sent, "stats": c.stats, "sent_any": any(r.sent for r in results),
                  "timed_out_any": any(r.timed_out for r in results), "capture": list(cap), "zmq_imported": "zmq" in sys.modules}))`,
    { ...ENV, WAVEBUS_RUN_DIR: dir, LOCAL_RANK: '0' },
  );
  router.close();
  await counting;
  expect(received).toBe(0);
  expect(got.enabled).toBe(false);
  expect(got.register_sent).toBe(false);
  expect(got.stats.requests_sent).toBe(0);
  expect(got.sent_any).toBe(false);
  expect(got.timed_out_any).toBe(false);
  expect(got.capture).toEqual([false, '']);
  // Not even a ZeroMQ context was made: the all-off path cannot touch the network.
  expect(got.zmq_imported).toBe(false);
});

// ---------------------------------------------------------------- talking to an agent (a ROUTER this test answers)

interface Seen {
  body: string;
  req: Record<string, any>;
}

/** Answers like an agent: hello with `features`, register ok, end_of_wave per `onEndOfWave` (undefined: never). */
async function fakeAgentSocket(endpoint: string, features: Record<string, unknown> /* proto Features */, onEndOfWave: (wave: number) => Record<string, unknown> | undefined) {
  const router = new zmq.Router({ linger: 0 });
  await router.bind(endpoint);
  const seen: Seen[] = [];
  const loop = (async () => {
    try {
      for await (const [peer, frame] of router) {
        const req = decode(ClientRequest, frame);
        seen.push({ body: req.body, req });
        let reply: Record<string, unknown> | undefined = {};
        if (req.body === 'hello') reply = { features, protocolVersion: CLIENT_PROTOCOL_VERSION };
        if (req.body === 'endOfWave') reply = onEndOfWave(req.endOfWave.wave);
        if (req.body === 'register' && req.register.name === 'refused') reply = { ok: false, error: 'region refused by test', errorCode: 'ERR_REGION' };
        if (req.body === 'beforeForward') reply = { captured: true, callDir: '/snap/h/rank0/call0' };
        if (req.body === 'dueDumps') reply = { dueReqIds: [8, 11].includes(Number(req.dueDumps.wave)) ? ['r-due'] : [] };
        if (reply !== undefined) await router.send([peer, encode(ClientReply, { id: req.id, ok: true, ...reply })]);
      }
    } catch {
      /* closed */
    }
  })();
  return {
    seen,
    close: async () => {
      router.close();
      await loop;
    },
  };
}

test('the floor and pending_dump: waves below the floor end at once; pending_dump is a memory load unless a decided wave still to end has a dump due, then asked of the agent once; pending_dumps gives the same answers in one call', async () => {
  const dir = tmpDir();
  const mbox = path.join(dir, 'mailbox-local0');
  writeMailboxFile(mbox, 1 | 4);
  const agent = await fakeAgentSocket(`ipc://${path.join(dir, 'agent-local0.sock')}`, { tp0: false, bus: true, endOfWaveTimeoutMs: 300 }, () => ({ dumpsWritten: 1 }));
  const got = await pyAsync(
    `
import json
from wavebus_client import Client, MailboxWriter
c = Client.connect()
c.hello()                     # as an engine starts: the per-step calls below never include the connect
sent0 = c.stats["requests_sent"]
w = MailboxWriter.attach(${JSON.stringify(mbox)})  # play the agent's part in its file
out = {}
w.publish(7, floor=8)         # the head of wave 6 decided wave 7 (nothing due); waves below 8 are decided
r6 = c.end_of_wave(6)         # no slot holds 6, but it is below the floor: nothing due, no wait
out["w6"] = [r6.sent, r6.timed_out, r6.vector.implied]
out["p6"] = [c.pending_dump("r-due"), c.stats["requests_sent"] - sent0]
out["d6"] = [c.pending_dumps(["r-due", "other"]), c.stats["requests_sent"] - sent0]  # the step's requests in one call
w.publish(8, dump_due=1, floor=9)
r7 = c.end_of_wave(7)
out["w7"] = [r7.sent, r7.timed_out]
out["p7"] = [c.pending_dump("r-due"), c.pending_dump("other"), c.pending_dump("r-due"), c.stats["due_dumps_asked"]]
out["d7"] = [c.pending_dumps(["other", "r-due", "x"]), c.stats["due_dumps_asked"]]
r8 = c.end_of_wave(8)         # the dump: the agent does it
out["w8"] = [r8.sent, r8.dumps_written]
out["p8"] = [c.pending_dump("r-due"), c.stats["due_dumps_asked"]]  # wave 9 not decided yet: asked (nothing due there)
out["d8"] = [c.pending_dumps(["r-due"]), c.pending_dumps([]), c.stats["due_dumps_asked"]]
# Three waves ahead (--lookahead-waves 3): 9 and 10 decided with nothing due, 11 with a dump; all
# below the floor, so the engine hears of wave 11's dump two waves before its copy.
w.publish(9, floor=10)
w.publish(10, floor=11)
w.publish(11, dump_due=1, floor=12)
out["p11"] = [c.pending_dump("r-due"), c.pending_dump("other"), c.stats["due_dumps_asked"]]
r9 = c.end_of_wave(9)         # nothing due in 9: the next step's first question is pending_dumps's own
out["d9"] = [r9.sent, c.pending_dumps(["other", "r-due"]), c.pending_dumps(["other"]), c.stats["due_dumps_asked"]]
try:
    c.pending_dumps("r-due")  # one id where a list goes
except Exception as e:
    out["d_str"] = [type(e).__name__, str(e)]
try:
    c.pending_dumps(5)
except Exception as e:
    out["d_int"] = [type(e).__name__, str(e)]
out["d_gen"] = c.pending_dumps(x for x in ["other", "r-due"])  # any iterable of ids
out["stats"] = c.stats
c.close()
print(json.dumps(out))`,
    { ...ENV, WAVEBUS_RUN_DIR: dir, LOCAL_RANK: '0' },
  );
  await agent.close();
  expect(got.w6).toEqual([false, false, true]);
  expect(got.p6).toEqual([false, 0]); // nothing due next: a memory load, nothing sent
  expect(got.w7).toEqual([false, false]);
  expect(got.p7).toEqual([true, false, true, 1]); // wave 8's ids asked once
  expect(got.w8).toEqual([true, 1]);
  expect(got.p8).toEqual([false, 2]);
  expect(got.p11).toEqual([true, false, 3]); // 9 and 10 memory loads, 11's ids asked once
  // pending_dumps: the same answers for a step's requests in one call, the kept ones in order.
  expect([got.d6, got.d7, got.d8]).toEqual([[[], 0], [['r-due'], 1], [[], [], 2]]);
  // Settled by its own first id: wave 11's answer (kept until the wave ends) read, not asked again.
  expect(got.d9).toEqual([false, ['r-due'], [], 3]);
  expect(got.d_str).toEqual(['ConfigError', "pending_dumps(): req_ids must be a sequence of request ids, got the str 'r-due'"]);
  expect(got.d_int).toEqual(['ConfigError', 'pending_dumps(): req_ids must be a sequence of request ids, got int']);
  expect(got.d_gen).toEqual(['r-due']);
  expect(got.stats.end_of_wave_waited).toBe(0);
  expect(agent.seen.filter((x) => x.body === 'dueDumps').map((x) => Number(x.req.dueDumps.wave))).toEqual([8, 9, 11]);
});

test('before_forward with only the bus on: no message while its wave\'s vector has no snapshot_due; a capture armed on the running job (snapshot_due) is offered; a slot being written is never read as nothing due', async () => {
  const dir = tmpDir();
  const mbox = path.join(dir, 'mailbox-local0');
  writeMailboxFile(mbox, 1); // the bus alone: neither snapshots nor the recorder
  const agent = await fakeAgentSocket(`ipc://${path.join(dir, 'agent-local0.sock')}`, { tp0: false, bus: true, endOfWaveTimeoutMs: 300 }, () => ({}));
  const got = await pyAsync(
    `
import json
from wavebus_client import Client, MailboxWriter
c = Client.connect()
c.hello()
w = MailboxWriter.attach(${JSON.stringify(mbox)})  # play the agent's part in its file
ctx = {"compilation_hash": "h", "global_step": 0}
out = {}
w.publish(4, floor=5)
w.publish(5, config_due=1, dump_due=1, floor=6)  # due, but no snapshot: before_forward says no
r4 = c.end_of_wave(4)
sent0 = c.stats["requests_sent"]
out["f5"] = [list(c.before_forward(ctx, [])), c.stats["requests_sent"] - sent0, r4.sent, r4.vector.wave]
w.publish(6, snapshot_due=1, floor=7)  # a capture armed on the running job covers wave 6
c.end_of_wave(5)
sent0 = c.stats["requests_sent"]
out["f6"] = [list(c.before_forward(ctx, [])), c.stats["requests_sent"] - sent0]
w.begin(7)  # the writer died mid-write: the slot stays odd
c.end_of_wave(6)
fast0 = c.stats["end_of_wave_fast"]
out["f7"] = list(c.before_forward(ctx, []))
r7 = c.end_of_wave(7)
out["e7"] = [r7.timed_out, c.stats["end_of_wave_fast"] - fast0]
c.close()
print(json.dumps(out))`,
    { ...ENV, WAVEBUS_RUN_DIR: dir, LOCAL_RANK: '0' },
  );
  await agent.close();
  expect(got.f5).toEqual([[false, ''], 0, false, 4]);
  expect(got.f6).toEqual([[true, '/snap/h/rank0/call0'], 1]);
  expect(agent.seen.filter((x) => x.body === 'beforeForward').map((x) => Number(x.req.beforeForward.wave))).toEqual([6]);
  // Wave 7's slot is busy: not a vector, so no capture is offered and end_of_wave waits its bound for it.
  expect(got.f7).toEqual([false, '']);
  expect(got.e7).toEqual([true, 0]);
});

test('end_of_wave: fast path without a message when the wave is in the mailbox with nothing due; bounded wait with timed_out when it never arrives', async () => {
  const dir = tmpDir();
  const mbox = path.join(dir, 'mailbox-local0');
  const FEAT = 1 | 4; // bus + detectors
  writeMailboxFile(mbox, FEAT);
  const agent = await fakeAgentSocket(`ipc://${path.join(dir, 'agent-local0.sock')}`, { tp0: true, bus: true, endOfWaveTimeoutMs: 1500 }, (wave) =>
    wave === 7 ? { dumpsWritten: 2 } : undefined,
  );
  const got = await pyAsync(
    `
import json, torch
from wavebus_client import Client, MailboxWriter
from wavebus_client.shm import kv_pool_shm, release
c = Client.connect()
kv, regions = kv_pool_shm("wbtest-kv-${process.pid}", ["model.layers.0", "model.layers.1"], 4, 2, 2, 8, torch.bfloat16)
n = c.register_all(regions)
n_again = c.register_all(regions)  # once per region
out = {"registered": n, "again": n_again}
out["head"] = c.wave_head(5, {"requests": [{"req_id": "r1", "new_token_ids": [11, 12], "block_ids": [0, 1]}],
                              "non_finite": [{"row": 0, "req_id": "r1", "kind": "nan"}]})
r5 = c.end_of_wave(5)  # never arrives: bounded
out["w5"] = [r5.sent, r5.timed_out]
w = MailboxWriter.attach(${JSON.stringify(mbox)})  # play the agent's part in its file
sent_before = c.stats["requests_sent"]
w.publish(6)
r6 = c.end_of_wave(6)
out["w6"] = [r6.sent, r6.timed_out, c.stats["requests_sent"] - sent_before]
w.publish(7, dump_due=True)
r7 = c.end_of_wave(7)
out["w7"] = [r7.sent, r7.timed_out, r7.dumps_written]
out["bound_ms"] = c.agent_features.end_of_wave_timeout_ms
out["stats"] = c.stats
c.close()
for r in regions[::2]:
    release(r)
print(json.dumps(out))`,
    { ...ENV, WAVEBUS_RUN_DIR: dir, LOCAL_RANK: '0' },
  );
  await agent.close();
  expect(got.registered).toBe(4);
  expect(got.again).toBe(0);
  expect(got.head).toBe(true);
  // Wave 5's vector never comes: the client sleeps on the mailbox for the bound (no request), then
  // tells the agent one-way that it went on without it.
  expect(got.w5).toEqual([false, true]);
  expect(got.stats.end_of_wave_timeouts).toBe(1);
  expect(got.stats.end_of_wave_waited).toBe(1);
  const missed = agent.seen.find((s) => s.body === 'endOfWave')!.req;
  expect(missed).toMatchObject({ id: 0, endOfWave: { wave: 5, missed: true } });
  expect(got.w6).toEqual([false, false, 0]);
  expect(got.stats.end_of_wave_fast).toBe(1);
  expect(got.w7).toEqual([true, false, 2]);
  expect(got.bound_ms).toBe(1500);
  const bodies = agent.seen.map((s) => s.body);
  // The late vector's wait also pings the agent once (is anybody updating the mailbox?).
  expect(bodies).toEqual(['hello', 'register', 'register', 'register', 'register', 'waveHead', 'ping', 'endOfWave', 'endOfWave', 'close']);
  const regs = agent.seen.filter((s) => s.body === 'register').map((s) => s.req.register);
  expect(regs.map((r) => r.name)).toEqual(['model.layers.0.k', 'model.layers.0.v', 'model.layers.1.k', 'model.layers.1.v']);
  expect(regs[1]).toMatchObject({ shmName: `/wbtest-kv-${process.pid}`, dtype: 'bfloat16', shape: [4, 2, 2, 8], nbytes: 256, layer: 'model.layers.0', kv: 'v', role: RegionRole.KV_POOL });
  expect(regs[1].offset).toBeGreaterThanOrEqual(256);
  const head = agent.seen.find((s) => s.body === 'waveHead')!.req.waveHead;
  expect(head.wave).toBe(5);
  expect(head.telemetry.wave).toBe(4);
  // columns: the request takes slot 0 (its id travels once), its tokens and block table
  const cols = columnsFromWire(head.telemetry.columns);
  expect(cols.rows).toBe(1);
  expect(cols.bind).toEqual([expect.objectContaining({ slot: 0, reqId: 'r1' })]);
  expect([...cols.tokenCount]).toEqual([2]);
  expect([...cols.tokenIds]).toEqual([11, 12]);
  expect(cols.blocks).toEqual([{ slot: 0, blockIds: [0, 1] }]);
  expect(head.telemetry.nonFinite[0]).toMatchObject({ row: 0, reqId: 'r1', kind: 'nan' });
  expect(agent.seen.filter((s) => s.body === 'endOfWave').map((s) => s.req.endOfWave.wave)).toEqual([5, 7]);
  expect(agent.seen[0].req.hello).toMatchObject({ language: 'python', asyncScheduling: false });
  expect(fs.existsSync(`/dev/shm/wbtest-kv-${process.pid}`)).toBe(false); // unlinked by release
});

test('wave_head: only TP0 sends, token telemetry only with detectors on; before_forward sends only with snapshots on; agent errors raise', async () => {
  const dir = tmpDir();
  const mbox = path.join(dir, 'mailbox-local1');
  writeMailboxFile(mbox, 1 | 8); // bus + snapshots, detectors off
  // The fake agent declares a generous bound (as the first test does): this jest process answers it,
  // and on a loaded machine its event loop can be later than the default 50 ms + margin.
  const agent = await fakeAgentSocket(`ipc://${path.join(dir, 'agent-local1.sock')}`, { tp0: true, bus: true, snapshots: true, endOfWaveTimeoutMs: 1500 }, () => ({}));
  const got = await pyAsync(
    `
import json, torch
from wavebus_client import Client, CaptureError, AgentError
from wavebus_client.shm import shm_tensor
c = Client.connect()
ids, reg = shm_tensor("wbtest-in-${process.pid}", [2, 16], torch.int64, region_name="input_ids")
c.register(reg)
out = {}
try:
    c.register({"name": "refused", "shm_name": "/x", "nbytes": 4, "dtype": "int32", "shape": [1]})
except AgentError as e:
    out["refused"] = [e.code, str(e)]
c.wave_head(1, {"requests": [{"req_id": "a", "new_token_ids": [1]}]})
out["capture"] = list(c.before_forward({"compilation_hash": "abc", "global_step": 3, "req_ids": ["a"], "positions": [4, 5], "row_request": [0, 0]}, [ids[1], ("input_ids", 0, "int64", [2])]))
out["stats"] = c.stats
c.close()
print(json.dumps(out))`,
    { ...ENV, WAVEBUS_RUN_DIR: dir, LOCAL_RANK: '1' },
  );
  await agent.close();
  expect(got.refused[0]).toBe('ERR_REGION');
  expect(got.refused[1]).toContain("'refused'");
  expect(got.capture).toEqual([true, '/snap/h/rank0/call0']);
  expect(got.stats.captures).toBe(1);
  const head = agent.seen.find((s) => s.body === 'waveHead')!.req.waveHead;
  expect(head.wave).toBe(1);
  // Detectors off: only what a manual dump needs travels (the request and its blocks), no tokens.
  const cols = columnsFromWire(head.telemetry.columns);
  expect(cols.bind).toEqual([expect.objectContaining({ slot: 0, reqId: 'a' })]);
  expect(cols.tokenCount.length + cols.tokenIds.length).toBe(0);
  const bf = agent.seen.find((s) => s.body === 'beforeForward')!.req.beforeForward;
  expect(bf.context).toMatchObject({ compilationHash: 'abc', globalStep: 3, reqIds: ['a'], positions: [4, 5], rowRequest: [0, 0] });
  expect(bf.inputs).toEqual([
    { region: 'input_ids', offset: 128, dtype: 'int64', shape: [16] },
    { region: 'input_ids', offset: 0, dtype: 'int64', shape: [2] },
  ]);
});

test('a rank that is not TP0 sends no wave_head; a failed capture raises CaptureError', async () => {
  const dir = tmpDir();
  writeMailboxFile(path.join(dir, 'mailbox-local0'), 1 | 4 | 8);
  const router = new zmq.Router({ linger: 0 });
  await router.bind(`ipc://${path.join(dir, 'agent-local0.sock')}`);
  const seen: string[] = [];
  const loop = (async () => {
    try {
      for await (const [peer, frame] of router) {
        const req = decode(ClientRequest, frame);
        seen.push(req.body);
        const reply =
          req.body === 'hello'
            ? { ok: true, features: { tp0: false, bus: true, snapshots: true }, protocolVersion: CLIENT_PROTOCOL_VERSION }
            : req.body === 'beforeForward'
              ? { ok: false, error: 'snapshot dir not writable', errorCode: 'ERR_CAPTURE_WRITE' }
              : { ok: true };
        await router.send([peer, encode(ClientReply, { id: req.id, ...reply })]);
      }
    } catch {
      /* closed */
    }
  })();
  const got = await pyAsync(
    `
import json
from wavebus_client import Client, CaptureError
c = Client.connect(call_timeout_ms=5000)  # this fake agent sends no interim answer: give it time under load
out = {"head": c.wave_head(1, {"requests": []})}
try:
    c.before_forward({"compilation_hash": "h"}, [])
    out["raised"] = None
except CaptureError as e:
    out["raised"] = [e.code, str(e)]
c.close()
print(json.dumps(out))`,
    { ...ENV, WAVEBUS_RUN_DIR: dir, LOCAL_RANK: '0' },
  );
  router.close();
  await loop;
  expect(got.head).toBe(false);
  expect(got.raised[0]).toBe('ERR_CAPTURE_WRITE');
  expect(got.raised[1]).toContain('snapshot dir not writable');
  expect(seen).toEqual(['hello', 'beforeForward', 'close']);
});

test('an agent that never answers: register raises AgentUnavailableError, end_of_wave still returns within its bound', async () => {
  const dir = tmpDir();
  writeMailboxFile(path.join(dir, 'mailbox-local0'), 1);
  const got = await pyAsync(
    `
import json
from wavebus_client import Client, AgentUnavailableError
c = Client.connect(hello_timeout_ms=200)
r = c.end_of_wave(3)
out = {"eow": [r.sent, r.timed_out], "timeouts": c.stats["end_of_wave_timeouts"]}
try:
    c.register({"name": "in0", "shm_name": "/in0", "nbytes": 8, "dtype": "float32", "shape": [2]})
except AgentUnavailableError as e:
    out["register"] = [e.code, str(e)]
# register_all: a silent agent does not cut the list short; every region is kept for when it answers.
more = [{"name": f"kv{i}", "shm_name": "/kv", "offset": 8 * i, "nbytes": 8, "dtype": "float32", "shape": [2]} for i in range(3)]
try:
    c.register_all(more)
except AgentUnavailableError as e:
    out["register_all"] = e.code
out["kept"] = sorted(c._regions)
c.close()
print(json.dumps(out))`,
    { ...ENV, WAVEBUS_RUN_DIR: dir, LOCAL_RANK: '0' },
  );
  expect(got.eow).toEqual([true, true]);
  expect(got.timeouts).toBe(1);
  expect(got.register[0]).toBe('ERR_AGENT_UNAVAILABLE');
  expect(got.register_all).toBe('ERR_AGENT_UNAVAILABLE');
  expect(got.kept).toEqual(['in0', 'kv0', 'kv1', 'kv2']);
  // end_of_wave found the agent silent: register() does not wait again, it says so at once.
  expect(got.register[1]).toMatch(/not answering \(end_of_wave\(3\): no answer within 50 ms\)/);
});

test('regions registered while everything is off are sent once the agent turns something on', async () => {
  const dir = tmpDir();
  const mbox = path.join(dir, 'mailbox-local0');
  writeMailboxFile(mbox, 0);
  const agent = await fakeAgentSocket(`ipc://${path.join(dir, 'agent-local0.sock')}`, { tp0: true, bus: true, endOfWaveTimeoutMs: 5000 }, () => ({}));
  const got = await pyAsync(
    `
import json
from wavebus_client import Client, MailboxWriter
c = Client.connect()
out = {"sent": c.register({"name": "in0", "shm_name": "/in0", "nbytes": 8, "dtype": "float32", "shape": [2]})}
MailboxWriter.attach(${JSON.stringify(mbox)}).set_features(1)  # the agent joined the bus
c.hello()  # (learns the bound; the step below would otherwise say hello within the default 50 ms)
r = c.end_of_wave(4)
out["eow"] = [r.sent, r.timed_out]
c.close()
print(json.dumps(out))`,
    { ...ENV, WAVEBUS_RUN_DIR: dir, LOCAL_RANK: '0' },
  );
  await agent.close();
  expect(got.sent).toBe(false);
  expect(got.eow).toEqual([true, false]);
  expect(agent.seen.map((s) => s.body)).toEqual(['hello', 'register', 'endOfWave', 'close']);
  expect(agent.seen[1].req.register.name).toBe('in0');
});

// ---------------------------------------------------------------- validation

test('bad input gets a clear error naming the argument', () => {
  const dir = tmpDir();
  writeMailboxFile(path.join(dir, 'mailbox-local0'), 0);
  const got = py(
    `
import json, torch
from wavebus_client import Client, ConfigError, nonfinite_rows
from wavebus_client.telemetry import telemetry_proto
from wavebus_client.forward import context_proto
c = Client.connect()
cases = {
  "neg_dim": lambda: c.register({"name": "x", "shm_name": "/x", "nbytes": 16, "dtype": "float32", "shape": [4, -1]}),
  "dtype": lambda: c.register({"name": "x", "shm_name": "/x", "nbytes": 16, "dtype": "float128", "shape": [4]}),
  "nbytes": lambda: c.register({"name": "x", "shm_name": "/x", "nbytes": 15, "dtype": "float32", "shape": [4]}),
  "unknown_field": lambda: c.register({"name": "x", "shm_name": "/x", "nbytes": 16, "dtype": "float32", "shape": [4], "colour": 1}),
  "kv_shape": lambda: c.register({"name": "k", "shm_name": "/x", "nbytes": 16, "dtype": "float32", "shape": [4], "role": "kv_pool", "layer": "l0", "kv": "k"}),
  "kv_kv": lambda: c.register({"name": "k", "shm_name": "/x", "nbytes": 16, "dtype": "float32", "shape": [1, 1, 1, 4], "role": "kv_pool", "layer": "l0", "kv": "q"}),
  # block_stride (an interleaved pool): at least one block; nbytes = (blocks - 1) strides + one block; kv_pool only
  "stride_small": lambda: c.register({"name": "k", "shm_name": "/x", "nbytes": 64, "dtype": "float32", "shape": [2, 2, 1, 4], "role": "kv_pool", "layer": "l0", "kv": "k", "block_stride": 16}),
  "stride_nbytes": lambda: c.register({"name": "k", "shm_name": "/x", "nbytes": 64, "dtype": "float32", "shape": [2, 2, 1, 4], "role": "kv_pool", "layer": "l0", "kv": "k", "block_stride": 96}),
  "stride_input": lambda: c.register({"name": "x", "shm_name": "/x", "nbytes": 16, "dtype": "float32", "shape": [4], "block_stride": 32}),
  "cuda_handle": lambda: c.register({"name": "g", "kind": "cuda", "cuda_ipc_handle": b"short", "nbytes": 16, "dtype": "float32", "shape": [4]}),
  "no_shm_name": lambda: c.register({"name": "x", "nbytes": 16, "dtype": "float32", "shape": [4]}),
  "wave": lambda: c.end_of_wave(-1),
  "wave_type": lambda: c.wave_head("3"),
  "tel_field": lambda: telemetry_proto({"requests": [{"req_id": "a", "tokens": [1]}]}, 1),
  "tel_token": lambda: telemetry_proto({"requests": [{"req_id": "a", "new_token_ids": [1, -2]}]}, 1),
  "tel_kind": lambda: telemetry_proto({"non_finite": [{"row": 1, "kind": "inf"}]}, 1),
  "tel_logprobs": lambda: telemetry_proto({"requests": [{"req_id": "a", "new_token_ids": [1, 2], "new_token_logprobs": [0.5]}]}, 1),
  "ctx_rows": lambda: context_proto({"compilation_hash": "h", "req_ids": ["a"], "positions": [1, 2], "row_request": [0, 1]}),
  "ctx_hash": lambda: context_proto({"compilation_hash": ""}),
  "nonfinite_len": lambda: nonfinite_rows(torch.zeros(3, 4), ["a"]),
}
out = {}
for k, f in cases.items():
    try:
        f()
        out[k] = "no error"
    except ConfigError as e:
        out[k] = str(e)
c.close()
print(json.dumps(out))`,
    { ...ENV, WAVEBUS_RUN_DIR: dir, LOCAL_RANK: '0' },
  );
  expect(got.neg_dim).toBe("register(): region 'x': shape [4, -1] has a negative dimension");
  expect(got.dtype).toMatch(/register\(\): region 'x': dtype: unknown dtype 'float128'; valid: float64, float32/);
  expect(got.nbytes).toMatch(/nbytes 15 does not match shape \[4\] of float32 \(16 bytes\)/);
  expect(got.unknown_field).toMatch(/unknown region field\(s\) colour/);
  expect(got.kv_shape).toMatch(/kv_pool region has shape \[num_blocks, block_size, num_kv_heads, head_dim\], got \[4\]/);
  expect(got.kv_kv).toMatch(/kv must be 'k' or 'v'.*got 'q'/);
  expect(got.stride_small).toMatch(/region 'k': block_stride 16 is below one block \(32 bytes\)/);
  expect(got.stride_nbytes).toMatch(/region 'k': nbytes 64 does not match shape \[2, 2, 1, 4\] of float32 \(128 bytes\)/);
  expect(got.stride_input).toMatch(/region 'x': block_stride is only for kv_pool regions/);
  expect(got.cuda_handle).toMatch(/cuda_ipc_handle must be 64 bytes, got 5/);
  expect(got.no_shm_name).toMatch(/shm_name is required/);
  expect(got.wave).toBe('end_of_wave(): wave must be a non-negative integer, got -1');
  expect(got.wave_type).toBe("wave_head(): wave must be a non-negative integer, got '3'");
  expect(got.tel_field).toMatch(/telemetry\.requests\[0\]: unknown field\(s\) tokens/);
  expect(got.tel_token).toMatch(/telemetry\.requests\[0\]\.new_token_ids\[1\] must be in 0\.\.4294967295, got -2/);
  expect(got.tel_kind).toMatch(/non_finite\[0\]\.kind must be one of nan, pos_inf, neg_inf, non_finite, got 'inf'/);
  expect(got.tel_logprobs).toMatch(/new_token_logprobs has 1 values for 2 new_token_ids/);
  expect(got.ctx_rows).toMatch(/row_request\[1\] must be an integer in -1\.\.0, got 1/);
  expect(got.ctx_hash).toMatch(/compilation_hash must be a non-empty string/);
  expect(got.nonfinite_len).toMatch(/row_req_ids has 1 entries for 3 logits rows/);
});

test('connect() names the missing environment variable, and waits for a missing mailbox only as long as asked', () => {
  const dir = tmpDir();
  const base: NodeJS.ProcessEnv = { ...ENV };
  delete base.WAVEBUS_RUN_DIR;
  delete base.LOCAL_RANK;
  const code = `
import json
from wavebus_client import Client, WavebusError
try:
    Client.connect(mailbox_wait_s=0.1)
    print(json.dumps("no error"))
except WavebusError as e:
    print(json.dumps([e.code, str(e)]))`;
  expect(py(code, base)[1]).toMatch(/WAVEBUS_RUN_DIR is not set/);
  expect(py(code, { ...base, WAVEBUS_RUN_DIR: dir })[1]).toMatch(/LOCAL_RANK is not set/);
  expect(py(code, { ...base, WAVEBUS_RUN_DIR: dir, LOCAL_RANK: 'one' })[1]).toMatch(/LOCAL_RANK must be a non-negative integer, got 'one'/);
  const missing = py(code, { ...base, WAVEBUS_RUN_DIR: dir, LOCAL_RANK: '2' });
  expect(missing[0]).toBe('ERR_MAILBOX_MISSING');
  expect(missing[1]).toContain(path.join(dir, 'mailbox-local2'));
});

// ---------------------------------------------------------------- telemetry helpers

test('nonfinite_rows finds the non-finite rows of the logits and their kind', () => {
  const got = py(`
import json, torch, math
from wavebus_client import nonfinite_rows
x = torch.zeros(6, 5)
x[1, 2] = math.nan
x[2, 0] = math.inf
x[3, 4] = -math.inf
x[4, 1] = math.nan; x[4, 3] = math.inf
rows = nonfinite_rows(x, ["a", "b", None, "d", "e", "f"])
bf = nonfinite_rows(x.to(torch.bfloat16))
print(json.dumps({"rows": [[r.row, r.req_id, r.kind] for r in rows], "bf16": [[r.row, r.kind] for r in bf], "clean": len(nonfinite_rows(torch.ones(3, 3)))}))`);
  expect(got.rows).toEqual([
    [1, 'b', 'nan'],
    [2, '', 'pos_inf'],
    [3, 'd', 'neg_inf'],
    [4, 'e', 'non_finite'],
  ]);
  expect(got.bf16).toEqual([
    [1, 'nan'],
    [2, 'pos_inf'],
    [3, 'neg_inf'],
    [4, 'non_finite'],
  ]);
  expect(got.clean).toBe(0);
});

// ---------------------------------------------------------------- shm and CUDA

test('shm_tensor: the bytes another process reads from /dev/shm are the tensor, and the segment is unlinked at exit', async () => {
  const name = `wbtest-shm-${process.pid}`;
  const p = spawnTracked(
    PYTHON,
    [
      '-c',
      `
import json, sys, torch
from wavebus_client.shm import shm_tensor
t, region = shm_tensor("${name}", [3, 4], torch.bfloat16, region_name="in0")
t.copy_(torch.arange(12, dtype=torch.float32).view(3, 4) * 0.5)
print(json.dumps({"region": {"name": region.name, "shm_name": region.shm_name, "nbytes": region.nbytes, "dtype": region.dtype, "shape": region.shape, "offset": region.offset},
                  "hex": t.view(torch.int16).numpy().tobytes().hex()}), flush=True)
sys.stdin.readline()`,
    ],
    { env: ENV, stdio: ['pipe', 'pipe', 'pipe'] },
  );
  const line = await new Promise<string>((resolve, reject) => {
    const t = setInterval(() => {
      if (p.stdout().includes('\n')) {
        clearInterval(t);
        resolve(p.stdout().split('\n')[0]);
      }
    }, 20);
    void p.exited.then(() => reject(new Error(`python exited early: ${p.stderr()}`)));
  });
  const got = JSON.parse(line);
  expect(got.region).toEqual({ name: 'in0', shm_name: `/${name}`, nbytes: 24, dtype: 'bfloat16', shape: [3, 4], offset: 0 });
  const bytes = fs.readFileSync(`/dev/shm/${name}`);
  expect(bytes.subarray(0, 24).toString('hex')).toBe(got.hex);
  expect(bytes.readUInt16LE(2)).toBe(0x3f00); // bf16 0.5
  p.child.stdin!.end('\n');
  const { code } = await p.exited;
  expect(code).toBe(0);
  expect(p.stderr()).toBe(''); // no resource_tracker complaints
  expect(fs.existsSync(`/dev/shm/${name}`)).toBe(false);
});

test('cuda_region explains that CUDA is absent in a process without it', () => {
  const got = py(`
import json, torch
from wavebus_client.cuda import cuda_region, cuda_available
from wavebus_client import CudaUnavailableError
try:
    cuda_region(torch.zeros(4), "in0")
    print(json.dumps("no error"))
except CudaUnavailableError as e:
    print(json.dumps([cuda_available(), e.code, str(e)]))`);
  if (got === 'no error') return; // a machine with CUDA: this test is about its absence
  expect(got[0]).toBe(false);
  expect(got[1]).toBe('ERR_CUDA_UNAVAILABLE');
  expect(got[2]).toContain('CUDA is not available in this process');
});

// ---------------------------------------------------------------- replay loader

/** Load call dirs in one Python process; `verify:<dir>` loads with verify=True. */
function loadBundles(dirs: string[]): any[] {
  const r = spawnSync(PYTHON, [path.join(PYDIR, 'load_bundle.py'), ...dirs], { encoding: 'utf8', env: ENV });
  if (r.status !== 0) throw new Error(r.stderr);
  return JSON.parse(r.stdout.trim());
}

function writeBundles(root: string, formats: string[]): Record<string, any[]> {
  const r = spawnSync(PYTHON, [path.join(PYDIR, 'write_bundle.py'), root, ...formats], { encoding: 'utf8', env: ENV });
  if (r.status !== 0) throw new Error(r.stderr);
  return JSON.parse(r.stdout.trim());
}

test('load_call_dir returns the exact tensors of npy, pt and safetensors call dirs written with numpy/torch', () => {
  const root = tmpDir();
  const formats = ['npy', 'pt', 'safetensors'];
  const expected = writeBundles(root, formats);
  const got = loadBundles(formats.map((f) => `verify:${path.join(root, f)}`));
  formats.forEach((f, i) => {
    expect(got[i].error).toBeUndefined();
    expect(got[i].tensors).toEqual(expected[f]);
    expect(expected[f].map((t: any[]) => t[0])).toEqual(['float32', 'bfloat16', 'int64', 'bool', 'float16', 'uint8']);
  });
});

test('load_call_dir refuses a call dir that does not match its meta.json, naming the file', () => {
  const root = tmpDir();
  writeBundles(root, ['npy', 'pt']);
  const mk = (name: string, format = 'npy'): string => {
    const d = path.join(root, name);
    fs.cpSync(path.join(root, format), d, { recursive: true });
    return d;
  };
  const meta = (d: string) => JSON.parse(fs.readFileSync(path.join(d, 'meta.json'), 'utf8'));
  const setMeta = (d: string, m: any) => fs.writeFileSync(path.join(d, 'meta.json'), JSON.stringify(m));
  const cases: [string, string | RegExp][] = [];

  const shape = mk('shape');
  const m1 = meta(shape);
  m1.inputs[0].shape = [3, 2];
  setMeta(shape, m1);
  cases.push([shape, `${path.join(shape, 'tensor0.npy')}: shape [2, 3], but meta.json says [3, 2]`]);

  const dtype = mk('dtype');
  const m2 = meta(dtype);
  m2.inputs[1].dtype = 'float16';
  setMeta(dtype, m2);
  cases.push([dtype, `${path.join(dtype, 'tensor1.npy')}: holds |V2, but meta.json says float16 (stored as <f2)`]);

  const ptDtype = mk('ptdtype', 'pt');
  const m3 = meta(ptDtype);
  m3.inputs[2].dtype = 'torch.int32';
  setMeta(ptDtype, m3);
  cases.push([ptDtype, `${path.join(ptDtype, 'tensor2.pt')}: holds int64, but meta.json says int32`]);

  const missing = mk('missing');
  const m4 = meta(missing);
  m4.files = m4.files.filter((f: any) => f.name !== 'tensor3.npy');
  setMeta(missing, m4);
  fs.rmSync(path.join(missing, 'tensor3.npy'));
  cases.push([missing, `${path.join(missing, 'tensor3.npy')}: missing (meta.json lists 6 inputs, format npy)`]);

  const listed = mk('listed');
  fs.rmSync(path.join(listed, 'tensor3.npy'));
  cases.push([listed, `${path.join(listed, 'tensor3.npy')}: listed in meta.json but missing`]);

  const extra = mk('extra');
  fs.copyFileSync(path.join(extra, 'tensor0.npy'), path.join(extra, 'tensor6.npy'));
  cases.push([extra, `${path.join(extra, 'tensor6.npy')}: not described by meta.json, which lists 6 inputs (format npy)`]);

  const stray = mk('stray');
  fs.writeFileSync(path.join(stray, 'notes.txt'), 'x');
  cases.push([stray, `${path.join(stray, 'notes.txt')}: not described by meta.json, which lists 6 inputs (format npy)`]);

  const schema = mk('schema');
  setMeta(schema, { ...meta(schema), schema: 2 });
  cases.push([schema, `${path.join(schema, 'meta.json')}: schema 2 is not supported (this loader reads schema 1)`]);

  const corrupt = mk('corrupt');
  const f0 = path.join(corrupt, 'tensor0.npy');
  const b = fs.readFileSync(f0);
  b[b.length - 1] ^= 0xff;
  fs.writeFileSync(f0, b);
  cases.push([`verify:${corrupt}`, new RegExp(`^${f0}: checksum crc32c:[0-9a-f]{8} does not match meta.json's crc32c:[0-9a-f]{8}$`)]);

  const truncated = mk('truncated');
  fs.truncateSync(path.join(truncated, 'tensor2.npy'), 10);
  cases.push([truncated, /tensor2\.npy: 10 bytes, meta\.json says \d+$/]);

  const noMeta = mk('nometa');
  fs.rmSync(path.join(noMeta, 'meta.json'));
  cases.push([noMeta, `${path.join(noMeta, 'meta.json')}: missing (an incomplete or foreign call dir)`]);

  const fmt = mk('fmt');
  setMeta(fmt, { ...meta(fmt), format: 'h5' });
  cases.push([fmt, `${path.join(fmt, 'meta.json')}: field "format" must be one of npy, pt, safetensors, got 'h5'`]);

  const got = loadBundles([...cases.map((c) => c[0]), corrupt]);
  cases.forEach(([dir, want], i) => {
    expect([dir, got[i].type]).toEqual([dir, 'ReplayError']);
    if (typeof want === 'string') expect(got[i].error).toBe(want);
    else expect(got[i].error).toMatch(want);
  });
  // Without verify only sizes are checked: the corrupted bytes load (verify is what reads every byte).
  expect(got[cases.length].ok).toBe(true);
});

test.each(['npy', 'pt', 'safetensors'] as const)('load_call_dir loads a %s call dir written by wavebus (SnapshotCapturer)', async (format) => {
  const { CaptureBudget } = require('../src/snapshot/budget') as typeof import('../src/snapshot/budget');
  const { SnapshotCapturer } = require('../src/snapshot/capture') as typeof import('../src/snapshot/capture');
  const { resolveSnapshotConfig } = require('../src/snapshot/config') as typeof import('../src/snapshot/config');
  const cacheRoot = tmpDir();
  const config = { ...resolveSnapshotConfig({ WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_FORMAT: format, WAVEBUS_SNAPSHOT_CAPTURE_AT_CALL: '-1' }), snapshotRoot: path.join(cacheRoot, 'snapshots') };
  const quiet = { info: () => undefined, warn: () => undefined };
  const capturer = new SnapshotCapturer(config, { globalRank: 3, tpRank: 1, ppRank: 0, dpRank: 0, cpRank: 0 }, { budget: new CaptureBudget(4, () => undefined), log: quiet });
  const f32 = Buffer.alloc(24);
  [1.5, -2, Infinity, 0, 3.25, -0.5].forEach((v, i) => f32.writeFloatLE(v, i * 4));
  const bf16 = Buffer.from([0x80, 0x3f, 0xc0, 0xbf, 0x62, 0x7f]); // 1.0, -1.5, 3.0e38
  const i64 = Buffer.alloc(16);
  i64.writeBigInt64LE(-1n, 0);
  i64.writeBigInt64LE(1n << 40n, 8);
  const inputs = [
    { dtype: 'float32', shape: [2, 3], data: f32 },
    { dtype: 'bfloat16', shape: [3], data: bf16 },
    { dtype: 'int64', shape: [2], data: i64 },
    { dtype: 'bool', shape: [2, 2], data: Buffer.from([1, 0, 0, 1]) },
    { dtype: 'uint8', shape: [], data: Buffer.from([200]) },
  ];
  if (format !== 'pt') inputs.push({ dtype: 'float8_e4m3fn', shape: [4], data: Buffer.from([0x38, 0xb8, 0x7e, 0x00]) });
  const res = await capturer.capture(
    { compilationHash: 'graph-a', globalStep: 7, isPrompt: false, reqIds: ['r1'], positions: [11], rowRequest: [0], numSpeculativeTokens: 0, warmup: false },
    inputs.map((x) => ({ dtype: x.dtype, shape: x.shape, read: async () => x.data })),
  );
  expect(res.captured).toBe(true);
  const [got] = loadBundles([`verify:${res.callDir}`]);
  expect(got.error).toBeUndefined();
  const hasFp8 = format !== 'pt';
  expect(got.tensors).toEqual(
    inputs.map((x) => [x.dtype === 'float8_e4m3fn' && got.warnings.length ? 'uint8' : x.dtype, x.shape, x.data.toString('hex')]),
  );
  if (hasFp8 && got.tensors[5][0] === 'uint8') expect(got.warnings.join('\n')).toMatch(/has no float8_e4m3fn; returning its raw bits as uint8/);
  if (format === 'pt') {
    // fp8 in .pt needs torch >= 2.1: the loader says so, naming the file.
    const fp8 = await capturer.capture(
      { compilationHash: 'graph-a', globalStep: 8, isPrompt: false, reqIds: ['r1'], positions: [12], rowRequest: [0], numSpeculativeTokens: 0, warmup: false },
      [{ dtype: 'float8_e5m2', shape: [2], read: async () => Buffer.from([0x3c, 0xbc]) }],
    );
    expect(fp8.captured).toBe(true);
    const [r] = loadBundles([fp8.callDir!]);
    if (!r.ok) expect(r.error).toMatch(/tensor0\.pt: torch\.load failed .*cannot load float8_e5m2 from \.pt/);
    else expect(r.tensors[0][0]).toBe('float8_e5m2');
  }
});

test('crc32c in Python equals the native CRC-32C wavebus writes into meta.json', () => {
  // Sizes on both sides of the vectorised path (64 KiB) and an odd tail.
  const sizes = [0, 1, 9, 4096, 65535, 65536, 300001];
  const datas = sizes.map((n) => Buffer.from(Array.from({ length: n }, (_, i) => (i * 131 + 7) & 0xff)));
  const { crc32c } = require('../src/artifacts/checksum') as typeof import('../src/artifacts/checksum');
  const want = datas.map((d) => crc32c(d));
  const dir = tmpDir();
  datas.forEach((d, i) => fs.writeFileSync(path.join(dir, `d${i}`), d));
  const got = py(`
import json
from wavebus_client.checksum import crc32c, crc32c_file
print(json.dumps([crc32c_file(${JSON.stringify(dir)} + "/d%d" % i) for i in range(${sizes.length})] + [crc32c(b"123456789")]))`);
  expect(got).toEqual([...want, 0xe3069283]);
});

// ---------------------------------------------------------------- a real agent (src/agent/agent.ts), in this process

test('a real agent and the Python client: hello, register shm regions, a captured forward that loads back with load_call_dir', async () => {
  const { Agent } = require('../src/agent/agent') as typeof import('../src/agent/agent');
  const { resolveIdentity } = require('../src/launch/identity') as typeof import('../src/launch/identity');
  const { resolveSnapshotConfig } = require('../src/snapshot/config') as typeof import('../src/snapshot/config');
  const runDir = tmpDir();
  const cacheRoot = tmpDir();
  const identity = resolveIdentity({ RANK: '0', WORLD_SIZE: '1', LOCAL_RANK: '0', LOCAL_WORLD_SIZE: '1' });
  const snapshot = { ...resolveSnapshotConfig({ WAVEBUS_SNAPSHOT_ENABLE: '1', WAVEBUS_SNAPSHOT_FORMAT: 'npy' }), snapshotRoot: path.join(cacheRoot, 'snapshots') };
  const agent = new Agent({ identity, runDir, snapshot, logger: require('pino')({ level: 'silent' }) });
  await agent.start();
  try {
    const got = await pyAsync(
      `
import json, torch
from wavebus_client import Client
from wavebus_client.shm import shm_tensor, kv_pool_shm
from wavebus_client.replay import load_call_dir
c = Client.connect()
out = {"features": c.features, "hello": vars(c.hello())}
ids, r_ids = shm_tensor("wbtest-e2e-ids-${process.pid}", [2, 5], torch.int64, region_name="input_ids")
hid, r_hid = shm_tensor("wbtest-e2e-hid-${process.pid}", [2, 4], torch.bfloat16, region_name="hidden")
kv, r_kv = kv_pool_shm("wbtest-e2e-kv-${process.pid}", ["model.layers.0"], 4, 2, 1, 8, torch.float16)
out["registered"] = c.register(r_ids) + c.register(r_hid) + c.register_all(r_kv)
ids.copy_(torch.arange(10).view(2, 5) * 7)
hid.copy_(torch.linspace(-2, 2, 8).view(2, 4))
captured, call_dir = c.before_forward({"compilation_hash": "graph-e2e", "global_step": 1, "req_ids": ["req-a"], "positions": [4, 5], "row_request": [0, 0]},
                                      [ids, hid[1], ("input_ids", 40, "int64", [5])])
out["captured"], out["call_dir"] = captured, call_dir
meta, ts = load_call_dir(call_dir)
out["same"] = [torch.equal(ts[0], ids), torch.equal(ts[1], hid[1]), torch.equal(ts[2], ids[1])]
out["dtypes"] = [str(t.dtype) for t in ts]
out["meta"] = {k: meta[k] for k in ("hash", "format", "global_rank", "req_ids", "positions")}
r = c.end_of_wave(1)  # not on the bus: returns at once, nothing sent
out["eow"] = [r.sent, r.timed_out]
out["stats"] = c.stats
c.close()
print(json.dumps(out))`,
      { ...ENV, WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' },
    );
    expect(got.features).toBe(8); // snapshots only: no bus without a coordinator
    expect(got.hello).toMatchObject({ tp0: true, bus: false, snapshots: true });
    expect(got.registered).toBe(4);
    expect(got.captured).toBe(true);
    expect(got.call_dir).toBe(path.join(cacheRoot, 'snapshots', 'graph-e2e', 'rank0', 'call0'));
    expect(got.same).toEqual([true, true, true]);
    expect(got.dtypes).toEqual(['torch.int64', 'torch.bfloat16', 'torch.int64']);
    expect(got.meta).toEqual({ hash: 'graph-e2e', format: 'npy', global_rank: 0, req_ids: ['req-a'], positions: [4, 5] });
    expect(got.eow).toEqual([false, false]);
    expect(got.stats.end_of_wave_sent).toBe(0);
  } finally {
    await agent.stop();
  }
});

test('a real coordinator, agent and Python client: wave_head drives the bus, end_of_wave sees each wave', async () => {
  const { Agent } = require('../src/agent/agent') as typeof import('../src/agent/agent');
  const { Coordinator } = require('../src/bus/coordinator') as typeof import('../src/bus/coordinator');
  const { resolveIdentity } = require('../src/launch/identity') as typeof import('../src/launch/identity');
  const pino = require('pino');
  const silent = pino({ level: 'silent' });
  const runDir = tmpDir();
  const identity = resolveIdentity({ RANK: '0', WORLD_SIZE: '1', LOCAL_RANK: '0', LOCAL_WORLD_SIZE: '1' });
  const heads: [number, unknown][] = [];
  const { agentConfig } = require('../src/guard/agent-config') as typeof import('../src/guard/agent-config');
  const { defaultConfig } = require('../src/guard/config') as typeof import('../src/guard/config');
  const cfg = agentConfig(defaultConfig(), { hotReload: true, dumpRoot: '' });
  const policy = {
    onWaveHead: (_replica: number, wave: number, telemetry: unknown) => {
      heads.push([wave, telemetry]);
      return wave === 2 ? { config: { version: 2, config: cfg }, dumps: [] } : { dumps: [] };
    },
    onDumpResult: () => undefined,
    status: () => ({}),
    snapshotState: () => ({ configVersion: 1, config: cfg, manualDumpDone: 0 }),
  };
  const port = await freePortPair();
  const coordinator = new Coordinator({ host: '127.0.0.1', port, layout: identity, heartbeatMs: 200, policy, logger: silent });
  await coordinator.start();
  const agent = new Agent({ identity, runDir, coordinator: { host: '127.0.0.1', port }, endOfWaveTimeoutMs: 5000, logger: silent });
  await agent.start();
  try {
    const got = await pyAsync(
      `
import json, time, torch
from wavebus_client import Client
from wavebus_client.shm import shm_tensor
c = Client.connect()
t, region = shm_tensor("wbtest-bus-${process.pid}", [4], torch.float32, region_name="in0")
out = {"features_at_connect": c.features, "sent_at_register": None}
# The agent may still be joining the bus: a register made while everything is off is kept.
out["sent_at_register"] = c.register(region)
deadline = time.monotonic() + 30
while not c.features & 1 and time.monotonic() < deadline:
    time.sleep(0.02)
out["features"] = c.features
out["hello"] = vars(c.hello())  # the agent's typed Features, from the coordinator's AgentConfig
res = []
for w in range(1, 6):
    # from wave 3 on, one running request (detectors are off: its token columns stay out)
    tel = {"requests": [{"req_id": "py-1-ab", "new_token_ids": [w], "block_ids": [2, 5], "prompt_len": 4}]} if w >= 3 else None
    head = c.wave_head(w, tel)
    r = c.end_of_wave(w)
    res.append([w, head, r.sent, r.timed_out, None if r.vector is None else r.vector.config_due])
out["waves"] = res
out["stats"] = c.stats
c.close()
print(json.dumps(out))`,
      { ...ENV, WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' },
    );
    expect(got.features & 3).toBe(3); // bus + hot reload
    expect(got.hello).toEqual({ tp0: true, bus: true, detectors: [], item_sync: false, snapshots: false, end_of_wave_timeout_ms: 5000 });
    for (const [w, head, , timedOut, configDue] of got.waves) {
      expect([w, head, timedOut]).toEqual([w, true, false]);
      expect([w, configDue]).toEqual([w, w === 3]);
    }
    // The head of wave 2 decided a config: it is due in wave 3 (decided a wave ahead), so the
    // client had to ask its agent to apply it at the end of wave 3.
    expect(got.waves[2][2]).toBe(true);
    expect(got.stats.end_of_wave_timeouts).toBe(0);
    expect(heads.map((h) => h[0])).toEqual([1, 2, 3, 4, 5]);
    expect(heads.slice(0, 2).every((h) => h[1] === null)).toBe(true);
    // Python's wave heads reached the policy through the agent's byte relay, columns intact.
    for (const [, t] of heads.slice(2)) {
      const c = (t as { columns: { rows: number; tokenIds: Uint32Array; flags: Uint8Array } }).columns;
      expect([c.rows, c.tokenIds.length, c.flags.length]).toEqual([1, 0, 1]);
    }
    expect((heads[2][1] as { columns: { bind: unknown[]; blocks: unknown[] } }).columns).toMatchObject({ bind: [{ slot: 0, reqId: 'py-1-ab', promptLen: 4 }], blocks: [{ slot: 0, blockIds: [2, 5] }] });
    expect(agent.stats.waveHeadsRelayed).toBe(5);
    if (got.sent_at_register === false) expect(got.features_at_connect).toBe(0);
  } finally {
    await agent.stop();
    await coordinator.stop();
  }
});
