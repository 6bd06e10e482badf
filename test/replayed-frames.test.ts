// Issue 28, lower: a bus frame keeps its MAC however often it is sent, so whoever binds the
// coordinator's port after it died can replay frames it recorded. Only a frame newer than every
// one the agent saw of its epoch is a sign of life (src/bus/frame-freshness.ts): the agent still
// finds its coordinator lost, and counts the replays as stale drops.
import * as fs from 'fs';
import * as path from 'path';
import { Subscriber } from 'zeromq';
import { AgentBus } from '../src/bus/agent-bus';
import { BusToken, createTokenFile, SUBSCRIBER_USER } from '../src/bus/auth';
import { Coordinator } from '../src/bus/coordinator';
import { FrameFreshness } from '../src/bus/frame-freshness';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { attackScript, cleanup, cleanupUsers, describeAsRoot, freePortPair, jsonEvents, otherUser, spawnAs, tmpDir, waitFor } from './helpers';

const quiet = createLogger('replayed-frames-test', 'silent');

afterAll(async () => {
  await cleanup();
  cleanupUsers();
});

test('freshness: newer than every frame seen of its epoch, per epoch', () => {
  const f = new FrameFreshness();
  expect(f.fresh(7, 1)).toBe(true);
  expect(f.fresh(7, 2)).toBe(true);
  expect(f.fresh(7, 2)).toBe(false);
  expect(f.fresh(7, 1)).toBe(false);
  expect(f.fresh(9, 1)).toBe(true); // a new epoch starts its own count
  expect(f.fresh(7, 3)).toBe(true);
  expect(f.fresh(9, 1)).toBe(false);
});

describeAsRoot('a local user replays recorded bus frames on the port of a dead coordinator', () => {
  test('the agent finds its coordinator lost all the same, and counts the replays as stale', async () => {
    const user = otherUser('replay');
    const { dir, script } = attackScript('zmtp-peer.js', 'wavebus-replay-', 'peer.js');
    const token = BusToken.load(createTokenFile(tmpDir('wavebus-replay-token-')), 'test token');
    const port = await freePortPair();
    const c = new Coordinator({ port, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, logger: quiet, busToken: token, heartbeatMs: 100 });
    await c.start();
    // What a local user that learned the subscriber password can record (a squatter after an
    // earlier death hears it from a reconnecting agent: PLAIN sends it in clear, as the replayer
    // below shows): the coordinator's frames, MACs and all.
    const recorder = new Subscriber({ linger: 0, plainUsername: SUBSCRIBER_USER, plainPassword: token.subscriberPassword() });
    recorder.subscribe();
    recorder.connect(`tcp://127.0.0.1:${port}`);
    const recorded: [string, string][] = [];
    const recording = (async () => {
      for await (const [topic, body] of recorder) {
        recorded.push([topic.toString('base64'), body.toString('base64')]);
        if (recorded.length >= 30) break;
      }
    })();
    const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity: resolveIdentity({}, { rank: 0, worldSize: 1 }), heartbeatMs: 100, busToken: token, logger: quiet });
    let lost = 0;
    let alive = 0;
    bus.on('coordinator-lost', () => lost++);
    bus.on('coordinator-alive', () => alive++);
    await bus.start();
    let replayer: ReturnType<typeof spawnAs> | undefined;
    try {
      await waitFor(() => bus.synced, 'the agent to sync');
      await recording;
      recorder.close();
      const file = path.join(dir, 'frames.json');
      fs.writeFileSync(file, JSON.stringify(recorded));
      fs.chmodSync(file, 0o644);
      await c.stop();
      const aliveBefore = alive;
      // The second uid takes the PUB port and replays, one frame every 20 ms: far more often
      // than the 300 ms after which a silent coordinator is lost.
      replayer = spawnAs(user, process.execPath, [script, 'pub-plain', '127.0.0.1', String(port), '20', file], { stdio: ['pipe', 'pipe', 'pipe'] });
      const events = () => jsonEvents(replayer!);
      await waitFor(() => events().some((e) => e.event === 'bound'), 'the replayer to bind the PUB port', 10000);
      await waitFor(() => lost > 0, 'the agent to find its coordinator lost', 10000);
      await waitFor(() => events().some((e) => e.event === 'replayed' && e.frames >= 40), 'frames replayed to the agent', 20000).catch((e: Error) => {
        throw new Error(`${e.message}; the replayer said ${JSON.stringify(events())}, stderr ${JSON.stringify(replayer!.stderr().slice(-400))}; agent bus ${JSON.stringify(bus.stats)}`);
      });
      // Every replay arrived and was refused as a sign of life: the coordinator never came back.
      await waitFor(() => (bus.stats.dropped.stale ?? 0) >= 30, 'replays counted as stale drops', 10000);
      expect(alive).toBe(aliveBefore);
      expect(lost).toBe(1);
      expect(bus.synced).toBe(false);
      expect(bus.stats.dropped.bad_mac ?? 0).toBe(0); // they carry good MACs: only their seq gives them away
      // The squatter heard the subscriber password (the documented limit of PLAIN), never the token.
      expect(events().find((e) => e.event === 'plain-hello')).toMatchObject({ user: SUBSCRIBER_USER, password: token.subscriberPassword() });
    } finally {
      replayer?.child.stdin?.end();
      await replayer?.exited;
      await bus.stop();
      await c.stop();
    }
  }, 60000);

  test.each([
    ['with the bus token', true],
    ['without a token (both ports squatted)', false],
  ])('a squatter that breaks the ZMTP handshake does not cut the agent off, %s: its sockets are renewed, and it syncs with the coordinator once it is back', async (_what, withToken) => {
    const user = otherUser('zmtpbad');
    const { dir, script } = attackScript('zmtp-peer.js', 'wavebus-badhs-', 'peer.js');
    const file = path.join(dir, 'frames.json');
    fs.writeFileSync(file, JSON.stringify([[Buffer.from('r0.H').toString('base64'), Buffer.alloc(32, 7).toString('base64')]]));
    fs.chmodSync(file, 0o644);
    const token = withToken ? BusToken.load(createTokenFile(tmpDir('wavebus-badhs-token-')), 'test token') : undefined;
    const port = await freePortPair();
    const layout = { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 };
    let c = new Coordinator({ port, layout, logger: quiet, busToken: token, heartbeatMs: 100 });
    await c.start();
    const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity: resolveIdentity({}, { rank: 0, worldSize: 1 }), heartbeatMs: 100, busToken: token, logger: quiet });
    let lost = 0;
    bus.on('coordinator-lost', () => lost++);
    await bus.start();
    let squatter: ReturnType<typeof spawnAs> | undefined;
    let routerSquatter: ReturnType<typeof spawnAs> | undefined;
    try {
      await waitFor(() => bus.synced, 'the agent to sync');
      await c.stop();
      await waitFor(() => lost > 0, 'the agent to find its coordinator lost', 10000);
      // Every connection gets a message where the PUB's READY belongs: libzmq ends that endpoint
      // for good on such a protocol error. Only a renewed SUB connects again.
      squatter = spawnAs(user, process.execPath, [script, 'pub-no-ready', '127.0.0.1', String(port), '20', file], { stdio: ['pipe', 'pipe', 'pipe'] });
      // Without a token the DEALER reconnects as ZeroMQ does: the same bad handshake on port+1.
      if (!withToken) routerSquatter = spawnAs(user, process.execPath, [script, 'pub-no-ready', '127.0.0.1', String(port + 1), '20', file], { stdio: ['pipe', 'pipe', 'pipe'] });
      const events = () => jsonEvents(squatter!);
      await waitFor(() => events().filter((e) => e.event === 'subscriber-gone').length >= 2, 'the agent to connect again after a broken handshake', 20000).catch((e: Error) => {
        throw new Error(`${e.message}; the squatter said ${JSON.stringify(events())}; agent bus ${JSON.stringify(bus.stats)}`);
      });
      expect(bus.stats.subRenewals).toBeGreaterThanOrEqual(1);
      if (routerSquatter) {
        const said = () => jsonEvents(routerSquatter!);
        await waitFor(() => said().filter((e) => e.event === 'subscriber-gone').length >= 1, 'the DEALER to meet the bad handshake on port+1', 20000);
      }
      for (const sq of [squatter, routerSquatter]) {
        sq?.child.stdin?.end();
        await sq?.exited;
      }
      squatter = routerSquatter = undefined;
      // The coordinator comes back on its port: the agent syncs again within a few windows.
      c = new Coordinator({ port, layout, logger: quiet, busToken: token, heartbeatMs: 100 });
      await c.start();
      await waitFor(() => bus.synced, 'the agent to sync with the coordinator that came back', 20000);
    } finally {
      for (const sq of [squatter, routerSquatter]) {
        sq?.child.stdin?.end();
        await sq?.exited;
      }
      await bus.stop();
      await c.stop();
    }
  }, 60000);
});
