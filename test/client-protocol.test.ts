// The client <-> agent protocol version: one number in proto/wavebus.proto (enum ProtocolVersion),
// read by TypeScript and Python; the client's hello carries it, the agent's reply carries its own,
// and either side refuses another version at once, naming both and the side to upgrade. Old peers
// are played by raw ZeroMQ sockets that speak the messages as a build from before versions did.
// Before any hello, connect() waits (bounded) for the agent to create the mailbox and write its header.
import * as fs from 'fs';
import * as path from 'path';
import pino from 'pino';
import * as zmq from 'zeromq';
import { Agent } from '../src/agent/agent';
import { CLIENT_PROTOCOL_VERSION, RegionKind, RegionRole } from '../src/client/protocol';
import { MAILBOX_LAYOUT, MailboxFeature, MailboxWriter } from '../src/client/mailbox';
import { WavebusClient } from '../src/client/client';
import { resolveIdentity } from '../src/launch/identity';
import { agentEndpoint, mailboxPath } from '../src/paths';
import { ClientReply, ClientRequest, decode, encode } from '../src/proto';
import { ConfigError, ProtocolError } from '../src/errors';
import { PYTHON, ROOT, cleanup, runPython, spawnTracked, tmpDir } from './helpers';

const PKG = path.join(ROOT, 'clients', 'python');
const ENV: NodeJS.ProcessEnv = { ...process.env, PYTHONPATH: PKG, PYTHONDONTWRITEBYTECODE: '1' };

afterAll(cleanup);

/** A Python script run without blocking this process (the agent under test runs in it); its last line, parsed. */
async function py(code: string, args: string[], env: NodeJS.ProcessEnv = ENV): Promise<any> {
  const p = spawnTracked(PYTHON, ['-c', code, ...args], { env });
  const { code: rc } = await p.exited;
  if (rc !== 0) throw new Error(`python exited ${rc}: ${p.stderr()}`);
  return JSON.parse(p.stdout().trim().split('\n').pop()!);
}

/** A real agent (no coordinator, snapshots off) in its own run dir. */
async function startAgent(): Promise<{ agent: Agent; runDir: string; close: () => Promise<void> }> {
  const runDir = path.join(tmpDir('wb-proto-'), 'run');
  const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
  const agent = new Agent({ identity, runDir, logger: pino({ level: 'silent' }) });
  await agent.start();
  return { agent, runDir, close: () => agent.stop() };
}

/** One request from a raw DEALER (an engine client of another build) and the agent's reply. */
async function rawRequest(endpoint: string, requests: Record<string, unknown>[]): Promise<Record<string, any>[]> {
  const s = new zmq.Dealer({ linger: 0, receiveTimeout: 5000 });
  s.connect(endpoint);
  try {
    const out: Record<string, any>[] = [];
    for (const [i, body] of requests.entries()) {
      await s.send(encode(ClientRequest, { id: i + 1, ...body }));
      const [frame] = await s.receive();
      out.push(decode(ClientReply, frame));
    }
    return out;
  } finally {
    s.close();
  }
}

/** An agent from before versions: answers hello ok, with features and without protocol_version. */
async function oldAgent(runDir: string): Promise<{ endpoint: string; hellos: Record<string, any>[]; close: () => Promise<void> }> {
  const endpoint = agentEndpoint(runDir, 0);
  const router = new zmq.Router({ linger: 0 });
  await router.bind(endpoint);
  const hellos: Record<string, any>[] = [];
  const loop = (async () => {
    try {
      for await (const [peer, frame] of router) {
        const req = decode(ClientRequest, frame);
        if (req.body === 'hello') hellos.push(req.hello);
        const reply = req.body === 'hello' ? { features: { tp0: true, bus: true, detectors: [], endOfWaveTimeoutMs: 50 } } : {};
        await router.send([peer, encode(ClientReply, { id: req.id, ok: true, ...reply })]);
      }
    } catch {
      /* closed */
    }
  })();
  return {
    endpoint,
    hellos,
    close: async () => {
      router.close();
      await loop;
    },
  };
}

test('the version is the proto enum ProtocolVersion.PROTOCOL_VERSION_CURRENT, the same in TypeScript and Python, and --version reports it', () => {
  expect(Number.isInteger(CLIENT_PROTOCOL_VERSION) && CLIENT_PROTOCOL_VERSION > 0).toBe(true);
  const py = runPython('import wavebus_client.wavebus_pb2 as pb, wavebus_client as w; print(pb.PROTOCOL_VERSION_CURRENT, w.protocol_version())', [], { env: ENV }).trim();
  expect(py).toBe(`${CLIENT_PROTOCOL_VERSION} ${CLIENT_PROTOCOL_VERSION}`);
  const p = spawnTracked(PYTHON, ['-m', 'wavebus_client', '--version'], { env: ENV });
  return p.exited.then(({ code }) => {
    expect(code).toBe(0);
    expect(p.stdout().trim()).toBe(`wavebus_client 0.1.0 (client protocol ${CLIENT_PROTOCOL_VERSION})`);
  });
});

test('the agent refuses a hello from a client of another version at once, naming both versions and the side to upgrade, and then refuses its work', async () => {
  const a = await startAgent();
  try {
    const endpoint = agentEndpoint(a.runDir, 0);
    // A client from before versions: its hello has no protocol_version (0).
    const [old, reg] = await rawRequest(endpoint, [
      { hello: { pid: 4242, asyncScheduling: false, language: 'python' } },
      { register: { name: 'in0', kind: RegionKind.SHM, shmName: '/x', nbytes: 4, dtype: 'float32', shape: [1], role: RegionRole.INPUT } },
    ]);
    expect(old).toMatchObject({ ok: false, errorCode: 'ERR_PROTOCOL_VERSION', protocolVersion: CLIENT_PROTOCOL_VERSION, features: null });
    expect(old.error).toContain('the client speaks version 0 (from before protocol versions)');
    expect(old.error).toContain(`this agent speaks version ${CLIENT_PROTOCOL_VERSION}`);
    expect(old.error).toContain('upgrade the engine client');
    // Refused means not greeted: its regions are not taken either.
    expect(reg).toMatchObject({ ok: false, errorCode: 'ERR_NO_HELLO' });
    // A client newer than the agent: the agent is the side to upgrade.
    const [newer] = await rawRequest(endpoint, [{ hello: { pid: 1, language: 'typescript', protocolVersion: CLIENT_PROTOCOL_VERSION + 1 } }]);
    expect(newer).toMatchObject({ ok: false, errorCode: 'ERR_PROTOCOL_VERSION', protocolVersion: CLIENT_PROTOCOL_VERSION });
    expect(newer.error).toContain(`the client speaks version ${CLIENT_PROTOCOL_VERSION + 1}, this agent speaks version ${CLIENT_PROTOCOL_VERSION}; upgrade wavebus on this host (the agent)`);
    // The same version is greeted, and the reply says which version the agent speaks.
    const [ok] = await rawRequest(endpoint, [{ hello: { pid: 2, language: 'typescript', protocolVersion: CLIENT_PROTOCOL_VERSION } }]);
    expect(ok).toMatchObject({ ok: true, protocolVersion: CLIENT_PROTOCOL_VERSION });
    expect(ok.features).toEqual({ tp0: true, bus: false, detectors: [], itemSync: false, snapshots: false, endOfWaveTimeoutMs: 50, recorderForwards: 0, snapshotSelection: null });
  } finally {
    await a.close();
  }
});

test('an old Python client (a raw pyzmq hello without a version) is refused by the agent with both versions named', async () => {
  const a = await startAgent();
  try {
    const got = await py(
      `
import json, sys, zmq
import wavebus_client.wavebus_pb2 as pb
ctx = zmq.Context(); s = ctx.socket(zmq.DEALER); s.setsockopt(zmq.LINGER, 0); s.setsockopt(zmq.RCVTIMEO, 5000)
s.connect(sys.argv[1])
s.send(pb.ClientRequest(id=1, hello=pb.ClientHello(pid=7, language="python")).SerializeToString())
r = pb.ClientReply(); r.ParseFromString(s.recv())
print(json.dumps({"ok": r.ok, "code": r.error_code, "error": r.error, "version": r.protocol_version}))
s.close(); ctx.term()
`,
      [agentEndpoint(a.runDir, 0)],
    );
    expect(got).toMatchObject({ ok: false, code: 'ERR_PROTOCOL_VERSION', version: CLIENT_PROTOCOL_VERSION });
    expect(got.error).toMatch(/client speaks version 0 .*this agent speaks version \d+; upgrade the engine client/);
  } finally {
    await a.close();
  }
});

test('the TypeScript client talks to an agent of its own version, and refuses an agent from before versions at once', async () => {
  const a = await startAgent();
  try {
    // Same version: the hello goes through. The client's own mailbox file, with a feature on, so it talks.
    const mb = MailboxWriter.create(path.join(tmpDir('wb-proto-mb-'), 'mailbox'));
    mb.setFeatures(MailboxFeature.BUS_ACTIVE);
    const client = await WavebusClient.connect({ endpoint: agentEndpoint(a.runDir, 0), mailbox: mb.path, helloTimeoutMs: 3000 });
    try {
      await client.waveHead(1);
      expect(client.reportedFeatures()).toMatchObject({ tp0: true, bus: false, endOfWaveTimeoutMs: 50 });
    } finally {
      await client.close();
      mb.close();
    }
  } finally {
    await a.close();
  }

  const runDir = tmpDir('wb-proto-old-');
  const agent = await oldAgent(runDir);
  const mb = MailboxWriter.create(mailboxPath(runDir, 0));
  mb.setFeatures(MailboxFeature.BUS_ACTIVE);
  const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' }, helloTimeoutMs: 3000 });
  try {
    const err = await client.waveHead(1).then(
      () => undefined,
      (e: Error & { code?: string }) => e,
    );
    expect(err).toBeDefined();
    expect(err!.code).toBe('ERR_PROTOCOL_VERSION');
    expect(err!.message).toContain(`the agent speaks version 0 (from before protocol versions), this client speaks version ${CLIENT_PROTOCOL_VERSION}; upgrade wavebus on this host (the agent)`);
    // Not a lost agent: nothing degraded silently, and no wave head went to an agent of another version.
    expect(client.agentUnavailable).toBe(false);
    expect(client.reportedFeatures()).toBeUndefined();
    expect(agent.hellos[0]).toMatchObject({ language: 'typescript', protocolVersion: CLIENT_PROTOCOL_VERSION });
    await expect(client.endOfWave(1)).rejects.toMatchObject({ code: 'ERR_PROTOCOL_VERSION' });
  } finally {
    await client.close();
    mb.close();
    await agent.close();
  }
});

test('the Python client refuses an agent from before versions at once, and sends its version in the hello', async () => {
  const runDir = tmpDir('wb-proto-oldpy-');
  const agent = await oldAgent(runDir);
  const mb = MailboxWriter.create(mailboxPath(runDir, 0));
  mb.setFeatures(MailboxFeature.BUS_ACTIVE);
  try {
    const p = spawnTracked(
      PYTHON,
      [
        '-c',
        `
import json
from wavebus_client import Client, ProtocolError
c = Client.connect(hello_timeout_ms=3000)
try:
    c.hello()
    print(json.dumps({"raised": None}))
except ProtocolError as e:
    print(json.dumps({"raised": type(e).__name__, "code": e.code, "message": str(e), "unavailable": c.agent_unavailable, "features": c.agent_features is not None}))
c.close()
`,
      ],
      { env: { ...ENV, WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } },
    );
    const { code } = await p.exited;
    expect(code).toBe(0);
    const got = JSON.parse(p.stdout().trim().split('\n').pop()!);
    expect(got).toMatchObject({ raised: 'ProtocolError', code: 'ERR_PROTOCOL_VERSION', unavailable: false, features: false });
    expect(got.message).toContain(`the agent speaks version 0 (from before protocol versions), this client speaks version ${CLIENT_PROTOCOL_VERSION}; upgrade wavebus on this host (the agent)`);
    expect(agent.hellos[0]).toMatchObject({ language: 'python', protocolVersion: CLIENT_PROTOCOL_VERSION });
  } finally {
    mb.close();
    await agent.close();
  }
});

test('the Python client reports an agent that refused it for its version with the agent\'s words', async () => {
  const a = await startAgent();
  const mb = MailboxWriter.create(path.join(tmpDir('wb-proto-mb-'), 'mailbox'));
  mb.setFeatures(MailboxFeature.BUS_ACTIVE);
  try {
    // This build's client, told by the agent it is too old: played by patching the version it sends.
    const got = await py(
      `
import json, sys
import wavebus_client.client as cm
from wavebus_client import Client, ProtocolError
cm.CLIENT_PROTOCOL_VERSION = 0  # a client from before versions, otherwise this build
c = Client.connect(sys.argv[1], sys.argv[2], hello_timeout_ms=3000)
try:
    c.hello(); print(json.dumps({"raised": None}))
except ProtocolError as e:
    print(json.dumps({"code": e.code, "message": str(e)}))
c.close()
`,
      [agentEndpoint(a.runDir, 0), mb.path],
    );
    expect(got.code).toBe('ERR_PROTOCOL_VERSION');
    expect(got.message).toContain('refused the client');
    expect(got.message).toContain(`the client speaks version 0 (from before protocol versions), this agent speaks version ${CLIENT_PROTOCOL_VERSION}; upgrade the engine client`);
  } finally {
    mb.close();
    await a.close();
  }
});

/** A promise's state without waiting for it: 'pending', or what it settled with. */
function track<T>(p: Promise<T>): { state: () => 'pending' | 'resolved' | 'rejected'; promise: Promise<T> } {
  let state: 'pending' | 'resolved' | 'rejected' = 'pending';
  p.then(() => (state = 'resolved'), () => (state = 'rejected'));
  return { state: () => state, promise: p };
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('connect() waits for the agent to write its mailbox header (as the Python client does)', () => {
  test('an engine started before its agent: connect() is still waiting, then resolves once the real agent has started', async () => {
    const runDir = path.join(tmpDir('wb-proto-early-'), 'run'); // not there yet: the agent creates it
    const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
    const agent = new Agent({ identity, runDir, logger: pino({ level: 'silent' }) });
    const connecting = track(WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' }, mailboxWaitMs: 30000 }));
    try {
      await sleep(300);
      expect(connecting.state()).toBe('pending'); // no mailbox yet: neither failed nor connected
      await agent.start();
      const client = await connecting.promise;
      try {
        // The agent's own mailbox, read whole: no feature on (no coordinator), so nothing is due.
        expect(client.featureFlags()).toBe(0);
        await expect(client.endOfWave(1)).resolves.toEqual({ due: false, timedOut: false });
      } finally {
        await client.close();
      }
    } finally {
      await agent.stop();
    }
  });

  test('a mailbox file whose header is not written yet is not read: connect() resolves only after the header, with its feature bits', async () => {
    // The state between the agent creating and sizing the file and writing the header (magic last).
    const file = path.join(tmpDir('wb-proto-hdr-'), 'mailbox-local0');
    fs.writeFileSync(file, Buffer.alloc(MAILBOX_LAYOUT.fileBytes), { mode: 0o600 });
    const connecting = track(WavebusClient.connect({ endpoint: 'ipc:///nonexistent/wb-proto-hdr.sock', mailbox: file, mailboxWaitMs: 30000 }));
    await sleep(300);
    expect(connecting.state()).toBe('pending');
    const mb = MailboxWriter.create(file); // takes over the zeroed file and writes the header
    mb.setFeatures(MailboxFeature.BUS_ACTIVE | MailboxFeature.DETECTORS);
    try {
      const client = await connecting.promise;
      try {
        expect(client.featureFlags()).toBe(MailboxFeature.BUS_ACTIVE | MailboxFeature.DETECTORS);
      } finally {
        await client.close();
      }
    } finally {
      mb.close();
    }
  });

  test('after mailboxWaitMs it fails by name: ERR_MAILBOX_MISSING (never created), ERR_MAILBOX_FORMAT (header never written); a bad bound fails at once', async () => {
    const dir = tmpDir('wb-proto-never-');
    const endpoint = 'ipc:///nonexistent/wb-proto-never.sock';
    const missing = path.join(dir, 'mailbox-local0');
    let started = performance.now();
    const e1 = await WavebusClient.connect({ endpoint, mailbox: missing, mailboxWaitMs: 300 }).then(() => undefined, (e: unknown) => e);
    expect(performance.now() - started).toBeGreaterThanOrEqual(300); // it did wait the bound
    expect(e1).toBeInstanceOf(ProtocolError);
    expect(e1).toMatchObject({ code: 'ERR_MAILBOX_MISSING' });
    expect((e1 as Error).message).toBe(`mailbox ${missing} does not exist (is the wavebus agent of this rank running?) (waited 300 ms)`);

    const zeroed = path.join(dir, 'mailbox-local1');
    fs.writeFileSync(zeroed, Buffer.alloc(MAILBOX_LAYOUT.fileBytes), { mode: 0o600 });
    started = performance.now();
    const e2 = await WavebusClient.connect({ endpoint, mailbox: zeroed, mailboxWaitMs: 300 }).then(() => undefined, (e: unknown) => e);
    expect(performance.now() - started).toBeGreaterThanOrEqual(300);
    expect(e2).toBeInstanceOf(ProtocolError);
    expect(e2).toMatchObject({ code: 'ERR_MAILBOX_FORMAT' });
    expect((e2 as Error).message).toContain(`${zeroed} is not a version-2 wavebus mailbox`);
    expect((e2 as Error).message).toMatch(/\(waited 300 ms\)$/);

    // 0: one try, no wait.
    await expect(WavebusClient.connect({ endpoint, mailbox: missing, mailboxWaitMs: 0 })).rejects.toMatchObject({ code: 'ERR_MAILBOX_MISSING', message: expect.stringContaining('(waited 0 ms)') });
    // A bad bound is refused before any wait, naming the option (the mailbox is missing too).
    for (const bad of [-1, 1.5, Number.NaN]) {
      const e = await WavebusClient.connect({ endpoint, mailbox: missing, mailboxWaitMs: bad }).then(() => undefined, (x: unknown) => x);
      expect(e).toBeInstanceOf(ConfigError);
      expect((e as Error).message).toBe(`connect(): mailboxWaitMs must be a non-negative integer (ms), got ${String(bad)}`);
    }
  });
});

test('beforeForward with every feature off returns at once, even when a stale vector says a snapshot is due (as the Python client does)', async () => {
  // A mailbox whose agent is gone (its close() clears the features) but whose slot still holds a
  // vector with snapshot_due: off means no capture can be in force, so nothing is offered.
  const dir = tmpDir('wb-proto-off-');
  const mb = MailboxWriter.create(path.join(dir, 'mailbox'));
  mb.publish({ wave: 1, configDue: 0, dumpDue: 0, snapshotDue: 1 });
  const client = await WavebusClient.connect({ endpoint: `ipc://${path.join(dir, 'nobody.sock')}`, mailbox: mb.path, helloTimeoutMs: 200, callTimeoutMs: 50 });
  try {
    const ctx = { compilationHash: 'h', globalStep: 1 };
    expect(client.beforeForwardNow(ctx, [])).toEqual({ captured: false }); // a value, not a promise
    expect(client.agentUnavailable).toBe(false); // nothing was asked
    // The same vector with a feature on: the forward is offered (to an agent that does not answer).
    mb.setFeatures(MailboxFeature.BUS_ACTIVE);
    const offered = client.beforeForwardNow(ctx, []);
    expect(offered).toBeInstanceOf(Promise);
    expect(await offered).toMatchObject({ captured: false, unavailable: true });
  } finally {
    await client.close();
    mb.close();
  }
});
