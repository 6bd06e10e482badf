// The transport of an engine's client (src/client/transport.ts) on a hostile host.
//
// A signal that lands while a client connects (a sampling profiler's SIGPROF in the engine's
// process, the engine's own timers) must not cost the engine its agent. zmq_connect fails with
// EINTR then, and zeromq.js does not retry it; connectTo() does (src/client/connect.ts), and every
// socket wavebus connects goes through it. The signals here are V8's own sampling profiler (the
// inspector's Profiler at a 50 µs interval sends SIGPROF to this thread), as `node --cpu-prof`.
import * as inspector from 'inspector';
import * as path from 'path';
import * as zmq from 'zeromq';
import { Worker } from 'worker_threads';
import { connectTo } from '../src/client/connect';
import { AgentTransport } from '../src/client/transport';
import { ClientReply, ClientRequest, decode, encode } from '../src/proto';
import { cleanup, tmpDir } from './helpers';

jest.setTimeout(120000);
afterAll(() => cleanup());

const dir = tmpDir('wavebus-signals-');

/** Runs `fn` with this thread's sampling profiler on at `intervalUs`: SIGPROF every interval. */
async function underProfiler<T>(intervalUs: number, fn: () => Promise<T> | T): Promise<T> {
  const s = new inspector.Session();
  s.connect();
  const post = (m: string, p?: object) => new Promise<void>((res, rej) => s.post(m, p ?? {}, (e) => (e ? rej(e) : res())));
  await post('Profiler.enable');
  await post('Profiler.setSamplingInterval', { interval: intervalUs });
  await post('Profiler.start');
  try {
    return await fn();
  } finally {
    await post('Profiler.stop');
    s.disconnect();
  }
}

/** Connects `n` fresh DEALERs with `connect`; counts the EINTR failures and any other failure. */
async function connects(n: number, connect: (s: zmq.Dealer, e: string) => void): Promise<{ eintr: number; other: string[] }> {
  let eintr = 0;
  const other: string[] = [];
  for (let i = 0; i < n; i++) {
    // Closed sockets are reaped by libzmq's own thread: give it a turn (at most 1023 sockets at once).
    if (i % 50 === 0) await new Promise((r) => setTimeout(r, 5));
    const d = new zmq.Dealer({ linger: 0 });
    try {
      connect(d, `ipc://${path.join(dir, `nobody-${i % 7}.sock`)}`);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'EINTR') eintr++;
      else other.push(String(e));
    } finally {
      d.close();
    }
  }
  return { eintr, other };
}

test('under a storm of signals, a bare zmq connect fails with EINTR and connectTo() never does', async () => {
  // The storm is real: the same loop with zeromq.js's connect meets EINTR (about 1 in 1500 here).
  const bare = await underProfiler(50, () => connects(30000, (s, e) => s.connect(e)));
  expect(bare.other).toEqual([]);
  expect(bare.eintr).toBeGreaterThan(0);
  const ours = await underProfiler(50, () => connects(30000, connectTo));
  expect(ours).toEqual({ eintr: 0, other: [] });
});

test("an engine's client under the storm reaches its agent on every new connection", async () => {
  // A stand-in agent: a real ROUTER that answers every request (ClientRequest -> ClientReply ok).
  const endpoint = `ipc://${path.join(dir, 'agent.sock')}`;
  const router = new zmq.Router({ linger: 0 });
  await router.bind(endpoint);
  const serving = (async () => {
    for await (const [who, frame] of router) {
      const req = decode(ClientRequest, frame);
      await router.send([who, encode(ClientReply, { id: req.id, ok: true })]);
    }
  })().catch(() => undefined);
  try {
    const answered = await underProfiler(50, async () => {
      let ok = 0;
      for (let i = 0; i < 400; i++) {
        const t = new AgentTransport(endpoint, { sent: 0 }, { heard: () => undefined, beforeSend: () => undefined, oneWayFailed: () => undefined });
        const r = await t.request({ ping: {} }, 5000);
        if (r.ok) ok++;
        t.closed = true; // no goodbye to the stand-in: just the socket
        await t.close();
      }
      return ok;
    });
    expect(answered).toBe(400);
  } finally {
    router.close();
    await serving;
  }
});

/** A stand-in agent in a worker thread (its own event loop): it answers the n-th request with replies[n], until muted. */
async function standInAgent(endpoint: string, replies: Uint8Array[]): Promise<{ mute(): void; stop(): Promise<number> }> {
  const code = `
    const { workerData, parentPort } = require('worker_threads');
    const zmq = require('zeromq');
    let muted = false;
    const r = new zmq.Router({ linger: 0 });
    // 'mute': no more answers; 'stop': the socket closes here (a worker ended from outside while
    // a zeromq socket is open aborts the process), the loop ends and the worker with it.
    parentPort.on('message', (m) => {
      muted = true;
      if (m === 'stop') {
        r.close();
        parentPort.close();
      }
    });
    (async () => {
      await r.bind(workerData.endpoint);
      parentPort.postMessage('bound');
      let n = 0;
      for await (const [who] of r) {
        const reply = workerData.replies[n++];
        if (!muted && reply) await r.send([who, Buffer.from(reply)]);
      }
    })().catch(() => undefined);`;
  const w = new Worker(code, { eval: true, workerData: { endpoint, replies } });
  await new Promise<void>((res, rej) => {
    w.once('message', () => res());
    w.once('error', rej);
  });
  const exited = new Promise<number>((res) => w.once('exit', res));
  return {
    mute: () => w.postMessage('mute'),
    stop: () => {
      w.postMessage('stop');
      return exited;
    },
  };
}

test('an answer that came in time is taken even when the loop was held past the bound', async () => {
  // The agent (another thread) answers at once; this thread then holds its event loop for 300 ms
  // (an engine process not scheduled on a busy host) while the answer waits in its socket. The
  // 100 ms timer and the answer are both ready when the loop turns: the answer wins. With no
  // answer at all the bound still holds.
  const endpoint = `ipc://${path.join(dir, 'held-agent.sock')}`;
  const agent = await standInAgent(endpoint, [1, 2, 3].map((id) => new Uint8Array(encode(ClientReply, { id, ok: true }))));
  const t = new AgentTransport(endpoint, { sent: 0 }, { heard: () => undefined, beforeSend: () => undefined, oneWayFailed: () => undefined });
  try {
    await expect(t.request({ ping: {} }, 5000)).resolves.toMatchObject({ ok: true }); // connected
    const held = t.request({ ping: {} }, 100);
    await new Promise((r) => setImmediate(r)); // the request is sent
    const until = Date.now() + 300;
    while (Date.now() < until) {
      /* the loop is held: the answer arrives in the socket meanwhile */
    }
    await expect(held).resolves.toMatchObject({ ok: true });
    agent.mute();
    await new Promise((r) => setTimeout(r, 50));
    const started = Date.now();
    await expect(t.request({ ping: {} }, 100)).rejects.toThrow('agent did not answer within 100 ms');
    expect(Date.now() - started).toBeLessThan(1000);
  } finally {
    t.closed = true;
    await t.close();
    await agent.stop();
  }
});
