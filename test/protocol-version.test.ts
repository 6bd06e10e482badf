// The bus protocol version (proto ProtocolVersion) in the agent <-> coordinator Hello and in the
// tools' status and relay requests: a peer of another version is refused at once, with both
// versions and the side to upgrade named, never left half-working. Deliberately old peers are
// raw ZeroMQ sockets speaking the wire format as a release from before versions did.
import { Dealer, Publisher, Router } from 'zeromq';
import { Coordinator } from '../src/bus/coordinator';
import { requestStatus } from '../src/bus/status-client';
import { AgentBus } from '../src/bus/agent-bus';
import { RelayClient } from '../src/bus/relay-client';
import { PROTOCOL_VERSION } from '../src/bus/protocol-version';
import { decodeAgentMessage, decodeCoordinatorMessage, encodeAgentMessage, encodeBusFrame, encodeCoordinatorMessage, type CoordinatorMsg } from '../src/bus/frames';
import { tcpEndpoint } from '../src/bus/endpoints';
import { freePortPair } from '../src/bus/ports';
import { resolveIdentity } from '../src/launch/identity';
import { identityToProto, type WorldLayout } from '../src/layout';
import { createLogger } from '../src/log';
import { waitFor } from './helpers';

const quiet = createLogger('version-test', 'silent');
const layout: WorldLayout = { worldSize: 2, tp: 2, pp: 1, dp: 1, cp: 1 };
const identity = (rank: number) => resolveIdentity({}, { rank, worldSize: 2, tp: 2, pp: 1 });

test('the version is the proto enum PROTOCOL_VERSION_CURRENT', () => {
  const proto = require('fs').readFileSync(require('path').join(__dirname, '..', 'proto', 'wavebus.proto'), 'utf8') as string;
  expect(PROTOCOL_VERSION).toBe(Number(/PROTOCOL_VERSION_CURRENT = (\d+);/.exec(proto)?.[1]));
  expect(PROTOCOL_VERSION).toBe(10);
});

describe('a new coordinator and old peers', () => {
  let coord: Coordinator;
  let port: number;
  const socks: Dealer[] = [];

  beforeEach(async () => {
    port = await freePortPair();
    coord = new Coordinator({ port, layout, heartbeatMs: 50, logger: quiet });
    await coord.start();
  });
  afterEach(async () => {
    for (const s of socks.splice(0)) s.close();
    await coord.stop();
  });

  /** A raw DEALER: sends `msgs` and returns the first reply that is not a heartbeat (or undefined). */
  async function ask(msgs: Record<string, unknown>[], timeoutMs = 2000): Promise<{ reply?: CoordinatorMsg; dealer: Dealer }> {
    const dealer = new Dealer({ linger: 0, receiveTimeout: timeoutMs });
    socks.push(dealer);
    dealer.connect(tcpEndpoint('127.0.0.1', port + 1));
    for (const m of msgs) await dealer.send(encodeAgentMessage(m));
    for (;;) {
      try {
        const [buf] = await dealer.receive();
        const d = decodeCoordinatorMessage(buf, 1 << 20);
        if (d.ok) return { reply: d.value, dealer };
      } catch {
        return { dealer };
      }
    }
  }

  const hello = (rank: number, protocolVersion?: number) => ({
    globalRank: rank,
    hello: { identity: identityToProto(identity(rank)), subscribed: false, agentVersion: 'old', ...(protocolVersion !== undefined ? { protocolVersion } : {}) },
  });

  test('a Hello without a version (an agent from before versions) is refused, naming both and "upgrade the agent"; the rank never joins', async () => {
    const { reply, dealer } = await ask([hello(0)]);
    expect(reply?.body).toBe('refused');
    expect(reply?.refused).toMatchObject({ protocolVersion: PROTOCOL_VERSION, peerVersion: 0 });
    expect(reply?.refused.error).toMatch(/the agent \(rank 0\) speaks no version .*the coordinator version 10; upgrade the agent/);
    // The old agent carries on as it would: snapshot ask and heartbeats on the same connection.
    await dealer.send(encodeAgentMessage({ globalRank: 0, requestId: 5, snapshot: { globalRank: 0 } }));
    await dealer.send(encodeAgentMessage({ globalRank: 0, heartbeat: { wave: 1, globalRank: 0 } }));
    await waitFor(() => (coord.stats.dropped.protocol_version ?? 0) >= 3, 'the refusal and the two later messages counted');
    expect(coord.liveRanks()).toEqual([]);
    expect(JSON.parse((await requestStatus({ host: '127.0.0.1', port })).statusJson).ranks).toEqual({});
  });

  test('a Hello with an older version is refused naming that version; a newer one says to upgrade the coordinator', async () => {
    // Protocol 6: the snapshot says how far ahead the stream decides (decide_ahead, the coordinator's
    // --lookahead-waves + pp - 1); a protocol-5 agent would compute it itself and copy and switch
    // at another wave than its peers whenever the lookahead is not the default.
    // Protocol 7: with a bus token an agent challenges every new connection (BusChallenge) before
    // sending anything else, and end_of_wave / due_dumps replies say coordinator_lost; a protocol-6
    // coordinator would drop the challenge and never be believed.
    // Protocol 7 also: captures armed on the running job travel on wave heads (snapshot_due, captures);
    // a protocol-6 agent would ignore them and its rank would not capture the forward its peers do.
    // Protocol 8: Region.block_stride, wake on demand, the decision ring and the telemetry ring
    // (docs/bus.md): a protocol-7 agent would read a strided pool's wrong bytes and drop ring heads.
    // Protocol 9: on a token bus without CURVE the agent logs in to the PUB port with PLAIN.
    // Protocol 10: a verdict's replay on another host through its agent (ReplayRequest): a
    // protocol-9 agent would leave it unanswered until the relay's timeout.
    expect(PROTOCOL_VERSION).toBe(10);
    const older = await ask([hello(1, 9)]);
    expect(older.reply?.refused.error).toMatch(/speaks version 9, the coordinator version 10; upgrade the agent/);
    const newer = await ask([hello(1, 11)]);
    expect(newer.reply?.refused.error).toMatch(/speaks version 11, the coordinator version 10; upgrade the coordinator/);
    expect(coord.liveRanks()).toEqual([]);
  });

  test('the same connection saying Hello again with the current version joins', async () => {
    const { reply, dealer } = await ask([hello(0)]);
    expect(reply?.body).toBe('refused');
    await dealer.send(encodeAgentMessage(hello(0, PROTOCOL_VERSION)));
    await waitFor(() => coord.liveRanks().includes(0), 'rank 0 live after a current Hello');
  });

  test('tool requests without a version (an old aggregate or launcher) are refused with the reason', async () => {
    const status = await ask([{ requestId: 3, status: {} }]);
    expect(status.reply).toMatchObject({ requestId: 3, body: 'refused' });
    expect(status.reply?.refused.error).toMatch(/the tool \(status request\) speaks no version .*upgrade the tool/);
    const relay = await ask([{ requestId: 4, relay: { rank: 0, fileList: { root: 'dumps' } } }]);
    expect(relay.reply).toMatchObject({ requestId: 4, body: 'refused' });
    expect(relay.reply?.refused.error).toMatch(/the tool \(relay request\) speaks no version/);
  });

  test('current tools get the coordinator\'s version in every answer', async () => {
    expect((await requestStatus({ host: '127.0.0.1', port })).protocolVersion).toBe(PROTOCOL_VERSION);
    const client = new RelayClient({ host: '127.0.0.1', port });
    try {
      await expect(client.status(2000)).resolves.toMatchObject({ liveRanks: [] });
      await expect(client.relay(0, 'fileList', { root: 'dumps' }, 1000)).rejects.toThrow(/rank 0 is not live/);
    } finally {
      await client.close();
    }
  });
});

describe('an old coordinator (answers without a version) and new peers', () => {
  let pub: Publisher;
  let router: Router;
  let port: number;
  let timer: NodeJS.Timeout;
  let received = 0;
  const epoch = 777;

  beforeEach(async () => {
    port = await freePortPair();
    pub = new Publisher({ linger: 0 });
    router = new Router({ linger: 0 });
    await pub.bind(tcpEndpoint('127.0.0.1', port));
    await router.bind(tcpEndpoint('127.0.0.1', port + 1));
    let seq = 0;
    timer = setInterval(() => {
      const [topic, frame] = encodeBusFrame(epoch, ++seq, 'heartbeat', { wave: 0, unixMs: Date.now() }, true);
      pub.send([topic, frame]).catch(() => undefined);
    }, 50);
    // Answers as a coordinator from before versions: no protocol_version anywhere.
    (async () => {
      for (;;) {
        let parts: Buffer[];
        try {
          parts = await router.receive();
        } catch {
          return;
        }
        received++;
        const d = decodeAgentMessage(parts[1], 1 << 20);
        if (!d.ok) continue;
        const m = d.value;
        let body: Record<string, unknown> | undefined;
        if (m.body === 'snapshot') body = { snapshot: { epoch, seq: 0, wave: 0, configVersion: 0, pending: [], manualDumpDone: 0 } };
        if (m.body === 'status') body = { status: { epoch, liveRanks: [0], expectedRanks: [0, 1], ready: false, statusJson: '{}' } };
        if (m.body === 'relay') body = { relay: { rank: 0, fileList: { globalRank: 0, root: 'dumps', files: [] } } };
        if (body) await router.send([parts[0], encodeCoordinatorMessage({ epoch, requestId: m.requestId, ...body })]).catch(() => undefined);
      }
    })();
  });
  afterEach(() => {
    clearInterval(timer);
    pub.close();
    router.close();
  });

  test('a new agent refuses it at once: names both versions and "upgrade the coordinator", never syncs, stops sending', async () => {
    const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity: identity(0), heartbeatMs: 50, logger: quiet });
    const mismatch = new Promise<Error>((resolve) => bus.once('protocol-mismatch', resolve));
    let synced = false;
    bus.on('snapshot', () => (synced = true));
    await bus.start();
    try {
      const e = await mismatch;
      expect(e).toMatchObject({ code: 'ERR_PROTOCOL_VERSION' });
      expect(e.message).toMatch(/the coordinator speaks no version \(a release from before versions\), the agent \(rank 0\) version 10; upgrade the coordinator/);
      expect(bus.stats.refused).toBe(e.message);
      await new Promise((r) => setTimeout(r, 300));
      const after = received;
      await new Promise((r) => setTimeout(r, 300)); // 6 heartbeat periods
      expect(received).toBe(after);
      expect(synced).toBe(false);
      expect(bus.synced).toBe(false);
    } finally {
      await bus.stop();
    }
  });

  test('requestStatus and the relay client refuse its answers, naming the coordinator as the side to upgrade', async () => {
    await expect(requestStatus({ host: '127.0.0.1', port })).rejects.toMatchObject({ code: 'ERR_PROTOCOL_VERSION', message: expect.stringMatching(/coordinator speaks no version .*upgrade the coordinator/) });
    const client = new RelayClient({ host: '127.0.0.1', port });
    try {
      await expect(client.status(2000)).rejects.toMatchObject({ code: 'ERR_PROTOCOL_VERSION' });
      await expect(client.relay(0, 'fileList', { root: 'dumps' }, 1000)).rejects.toThrow(/upgrade the coordinator/);
    } finally {
      await client.close();
    }
  });
});
