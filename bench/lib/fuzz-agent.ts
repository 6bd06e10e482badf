// Fuzz targets on an agent's sockets: its engine-client ROUTER (ipc; every request kind, DueDumps
// included) and its SUB on the replica wave streams, fed by a rogue PUB that the agents of
// replicas 0 and 1 are pointed at (their own replica's topics, the other's, garbage topics),
// without and with the bus token. With CURVE a rogue PUB cannot even complete the handshake.
import * as fs from 'fs';
import * as path from 'path';
import { Context, Dealer, XPublisher } from 'zeromq';
import { BusToken, createTokenFile, SUBSCRIBER_USER } from '../../src/bus/auth';
import { DEFAULT_MAX_FRAME_BYTES } from '../../src/bus/constants';
import { newKeyPair, writeKeyPair, ZAP_DOMAIN } from '../../src/bus/curve';
import { ZapHandler } from '../../src/bus/zap-handler';
import { decodeBusFrame, encodeBusFrame, replicaTopic, TOPIC } from '../../src/bus/frames';
import { freePortPair } from '../../src/bus/ports';
import { PROTOCOL_VERSION } from '../../src/bus/protocol-version';
import { isOneWayRequest } from '../../src/agent/client-server';
import { RegionKind, RegionRole } from '../../src/client/protocol';
import { agentConfig } from '../../src/guard/agent-config';
import { defaultConfig } from '../../src/guard/config';
import { agentEndpoint } from '../../src/paths';
import { BusFrame, ClientRequest, decode, encode } from '../../src/proto';
import { coversOneof } from './fuzz-kinds';
import { count, droppedFromLog, sleep, startProc, sum, until, roundTrip, within, type Proc } from './fuzz-procs';
import { sameCounts, type FuzzCtx, type FuzzTarget, type SocketResult } from './fuzz-types';

export function busCorpus(epoch: number): [string, Buffer][] {
  const out: [string, Buffer][] = [];
  for (const replica of [0, 1]) {
    out.push(
      encodeBusFrame(epoch, 1, 'head', { epoch, seq: 1, wave: 3, configDue: true, dumpDue: true }, false, replica),
      encodeBusFrame(epoch, 2, 'config', { wave: 3, version: 2, config: agentConfig(defaultConfig(), { hotReload: true, dumpRoot: '' }) }, false, replica),
      encodeBusFrame(epoch, 3, 'dump', { wave: 3, jobs: [{ incidentType: 'manual_trigger', reqId: 'r', blockIds: [1, 2], armWave: 3, dumpDir: '/nonexistent/wavebus-fuzz', jobId: '3/m/r', replica }] }, false, replica),
      encodeBusFrame(epoch, 4, 'heartbeat', { wave: 3, unixMs: 1 }, false, replica),
      // a frame of the other replica's stream, under this replica's topic: refused
      [`${replicaTopic(replica)}${TOPIC.head}`, encodeBusFrame(epoch, 5, 'head', { epoch, seq: 5, wave: 3 }, false, 1 - replica)[1]],
    );
  }
  coversOneof('BusFrame', 'body', out.map(([, b]) => decode(BusFrame, b).body), 'agent SUB');
  return out;
}

export function clientCorpus(): Buffer[] {
  const out = [
    { id: 1, hello: { pid: 1, asyncScheduling: false, language: 'fuzz', protocolVersion: PROTOCOL_VERSION } },
    { id: 1, hello: { pid: 1, asyncScheduling: true, language: 'fuzz', protocolVersion: PROTOCOL_VERSION + 1 } },
    { id: 2, register: { name: 'x', kind: RegionKind.SHM, shmName: '/wavebus-fuzz-none', offset: 0, nbytes: 64, dtype: 'float32', shape: [4, 4], role: RegionRole.INPUT } },
    { id: 3, register: { name: 'k', kind: RegionKind.SHM, shmName: '/wavebus-fuzz-none', nbytes: 64, dtype: 'bfloat16', shape: [1, 2, 2, 8], role: RegionRole.KV_POOL, layer: 'l', kv: 'k' } },
    { id: 4, waveHead: { wave: 7 } },
    { id: 0, waveHead: { wave: 8 } },
    { id: 5, endOfWave: { wave: 7 } },
    { id: 0, endOfWave: { wave: 7, missed: true } },
    { id: 0, endOfWave: { wave: 8, late: true } },
    { id: 6, beforeForward: { context: { compilationHash: 'h', globalStep: 1, reqIds: ['a'], positions: [1], rowRequest: [0] }, inputs: [{ region: 'x', dtype: 'float32', shape: [2] }] } },
    { id: 7, close: {} },
    { id: 8, ping: {} },
    { id: 9, dueDumps: { wave: 7 } },
    { id: 10, dueDumps: { wave: 2 ** 53 - 1 } },
  ].map((m) => encode(ClientRequest, m));
  coversOneof('ClientRequest', 'body', out.map((b) => decode(ClientRequest, b).body), 'agent client ROUTER');
  return out;
}

/**
 * What the agent's client ROUTER does with this message: it answers every decodable first part,
 * except a wave head or an end-of-wave notice with id 0 (one-way: taken, never answered).
 */
export function clientFate(parts: Buffer[]): 'answered' | 'one_way' | 'undecodable' {
  try {
    const req = decode(ClientRequest, parts[0]);
    return isOneWayRequest(req) ? 'one_way' : 'answered';
  } catch {
    return 'undecodable';
  }
}

/** The engine-client socket of a job's agent A. */
export function clientTarget(name: string, jobName: string): FuzzTarget {
  return {
    name,
    async run(ctx) {
      const t0 = Date.now();
      const job = await ctx.job(jobName);
      if (!job.agent) throw new Error(`${name}: job ${jobName} has no agent`);
      const m = ctx.m;
      const corpus = clientCorpus();
      const expected: Record<string, number> = {};
      const problems: string[] = [];
      let want = 0;
      let got = 0;
      const d = new Dealer({ linger: 0, sendHighWaterMark: 0 });
      d.connect(agentEndpoint(job.agent.runDir, 0));
      const drain = (async () => {
        try {
          for await (const _ of d) got++;
        } catch {
          /* closed */
        }
      })();
      for (let i = 0; i < ctx.frames; i++) {
        const parts = m.parts(() => m.mutate(m.pick(corpus)), 1);
        const fate = clientFate(parts);
        if (fate === 'answered') want++;
        else count(expected, fate);
        await d.send(parts);
      }
      let hung = false;
      await until(() => got >= want, `the agent to answer ${want} decodable requests`, 300000).catch((e) => {
        hung = true;
        problems.push(`${String(e)} (got ${got})`);
      });
      await sleep(300); // anything beyond the expected count would show now
      d.close();
      await drain;
      // Not answered: one-way notices (taken) and what did not decode (dropped).
      const dropped = { undecodable: ctx.frames - got - (expected.one_way ?? 0) };
      const accounted = got === want && dropped.undecodable === (expected.undecodable ?? 0);
      if (!accounted) problems.push(`${name}: ${got} replies for ${want} decodable requests; ${JSON.stringify(expected)}`);
      const alive = await roundTrip(job.agent.runDir, 3000000 + Math.floor(Math.random() * 1000) * 100);
      if (!alive) problems.push(`${name}: no wave round trip after the garbage`);
      return {
        socket: name, frames: ctx.frames, seconds: (Date.now() - t0) / 1000, sent: ctx.frames, accepted: got + (expected.one_way ?? 0),
        dropped, expected_dropped: { undecodable: expected.undecodable ?? 0 }, replies: { got: { answered: got }, expected: { answered: want } }, accounted, hung, alive, problems,
      };
    },
  };
}

/**
 * Send on an XPUB with noDrop (every frame must reach the agents the model counts it for). At the
 * high-water mark zeromq.js rejects with EAGAIN instead of waiting (XPUB always reads as writable),
 * so a busy agent would end the run: wait for room, within a bound.
 */
export async function sendWhenRoom(pub: XPublisher, parts: Buffer[], boundMs = 30000): Promise<void> {
  const deadline = Date.now() + boundMs;
  for (;;) {
    try {
      return await pub.send(parts);
    } catch (e) {
      if ((e as { code?: string }).code !== 'EAGAIN' || Date.now() > deadline) throw e;
      await sleep(2);
    }
  }
}

/** Drops the agent counts after decoding (its stream state), not predicted from the bytes alone. */
const STATE_REASONS = new Set(['wrong_epoch', 'stale']);

/**
 * A rogue PUB that agents of replicas 0 and 1 are pointed at: mutated frames on their own
 * topics, the other replica's, garbage topics and wrong part counts; with `token`, frames without
 * a MAC, with wrong ones, MACed garbage. Afterwards a real coordinator takes over the address and
 * both agents must sync to it and carry a wave.
 */
export function subTarget(name: string, opts: { token?: boolean }): FuzzTarget {
  return {
    name,
    async run(ctx) {
      const t0 = Date.now();
      const m = ctx.m;
      const problems: string[] = [];
      const dir = path.join(ctx.root, name);
      fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
      const tokenFile = opts.token ? createTokenFile(dir) : undefined;
      const token = tokenFile ? BusToken.load(tokenFile, 'fuzz') : undefined;
      const sec = tokenFile ? ['--bus-token-file', tokenFile] : [];
      const rogue = await freePortPair();
      // With the token the agents' SUB subscribes with PLAIN and the token's subscriber password: the
      // fuzzing PUB, a holder of the token, admits it as the coordinator does (server-sockets.ts).
      const context = token ? new Context() : undefined;
      const zap = context && token ? new ZapHandler(context, { plain: { user: SUBSCRIBER_USER, password: token.subscriberPassword() } }) : undefined;
      await zap?.start();
      const plain = context ? { context, plainServer: true, zapDomain: ZAP_DOMAIN, zapEnforceDomain: true } : {};
      const pub = new XPublisher({ linger: 0, sendHighWaterMark: 1000, noDrop: true, ...plain });
      await pub.bind(`tcp://127.0.0.1:${rogue}`);
      const agents: Array<{ replica: number; proc: Proc; runDir: string; expected: Record<string, number>; samples: Record<string, Buffer[]>; decoded: number }> = [];
      for (const replica of [0, 1]) {
        const runDir = path.join(dir, `r${replica}`);
        const proc = startProc(`agent ${name} r${replica}`, ['agent', '--coordinator', `127.0.0.1:${rogue}`, '--rank', String(replica), '--local-rank', '0', '--world-size', '2', '--tp', '1', '--dp', '2', '--run-dir', runDir, '--heartbeat-ms', '200', ...sec], ctx.env);
        ctx.procs.push(proc);
        agents.push({ replica, proc, runDir, expected: {}, samples: {}, decoded: 0 });
      }
      await pub.receive(); // their subscriptions: from here on nothing we send is lost
      await pub.receive();
      const corpus = busCorpus(424242);
      const topics = [0, 1].flatMap((r) => [...Object.values(TOPIC).map((t) => replicaTopic(r) + t), `${replicaTopic(r)}X`, replicaTopic(r), `${replicaTopic(r)}WW`, `${replicaTopic(r)}H\u0000`]);
      topics.push('r99999.W', 'r01.W', 'r2.W', 'W', '', 'r0', 'r1');
      let sent = 0;
      const send = async (parts: Buffer[]) => {
        for (const a of agents) {
          if (!(parts.length > 0 && parts[0].subarray(0, 3).toString('latin1') === replicaTopic(a.replica))) continue; // filtered by ZeroMQ
          const d = decodeBusFrame(parts, DEFAULT_MAX_FRAME_BYTES, token);
          if (d.ok) a.decoded++;
          else {
            count(a.expected, d.reason);
            if (!a.samples[d.reason] && parts.every((x) => x.length < 1 << 20)) a.samples[d.reason] = parts;
          }
        }
        sent++;
        await sendWhenRoom(pub, parts);
      };
      const seal = (topic: string, body: Buffer) => (token ? token.seal('pub', body, undefined, Buffer.from(topic)) : body);
      for (let i = 0; i < ctx.frames; i++) {
        const [topic, body] = m.pick(corpus);
        const r = m.rand();
        let parts: Buffer[];
        if (r < 0.5) parts = [Buffer.from(topic), m.mutate(body)];
        else if (r < 0.65) parts = [Buffer.from(m.pick(topics)), m.mutate(body)];
        else if (r < 0.75) parts = [Buffer.from(topic), ...m.parts(() => m.mutate(body), 1)];
        else if (r < 0.9) parts = [Buffer.from(topic), seal(topic, m.mutate(body))]; // MACed garbage (a holder of the token)
        else parts = [Buffer.from(topic), m.mutate(seal(topic, body))]; // a MACed frame, mutated
        await send(parts);
      }
      if (ctx.oversized) await send([Buffer.from(`${replicaTopic(0)}W`), Buffer.alloc(DEFAULT_MAX_FRAME_BYTES + 1)]);
      // Each agent logs a reason's running total at most every 5 s: wait that out, then one more
      // frame per reason seen makes it log the final total.
      await sleep(5200);
      for (const a of agents) for (const parts of Object.values(a.samples)) await send(parts);
      let hung = false;
      await until(() => agents.every((a) => Object.keys(a.expected).every((k) => (droppedFromLog(a.proc.err)[k] ?? 0) >= a.expected[k])), `the ${name} agents to log their drop totals`, 60000).catch((e) => {
        hung = true;
        problems.push(String(e));
      });
      const dropped: Record<string, number> = {};
      const expected: Record<string, number> = {};
      let accounted = true;
      let decoded = 0;
      for (const a of agents) {
        const got = droppedFromLog(a.proc.err);
        const predicted: Record<string, number> = {};
        const state: Record<string, number> = {};
        for (const [k, v] of Object.entries(got)) (a.expected[k] === undefined && STATE_REASONS.has(k) ? state : predicted)[k] = v;
        // Decode-level drops exactly as predicted; drops of the stream state only among frames that decoded.
        if (!sameCounts(predicted, a.expected) || sum(state) > a.decoded) {
          accounted = false;
          problems.push(`${name} replica ${a.replica}: dropped ${JSON.stringify(got)}, expected ${JSON.stringify(a.expected)} (+ at most ${a.decoded} state drops)`);
        }
        for (const [k, v] of Object.entries(got)) dropped[`r${a.replica}.${k}`] = v;
        for (const [k, v] of Object.entries(a.expected)) expected[`r${a.replica}.${k}`] = v;
        decoded += a.decoded;
      }
      pub.close();
      await zap?.stop();
      // A real coordinator takes over the address the agents were pointed at: both must sync to it.
      const cfgDir = path.join(dir, 'runtime', 'config');
      fs.mkdirSync(cfgDir, { recursive: true });
      const cfg = path.join(cfgDir, 'runtime_config.json');
      const overlay = { detector: { logits_finite: { enabled: true, on_trigger: ['report'] } } };
      fs.writeFileSync(cfg, JSON.stringify(overlay));
      const coord = startProc(`coordinator ${name}`, ['coordinator', '--port', String(rogue), '--world-size', '2', '--tp', '1', '--dp', '2', '--heartbeat-ms', '200', '--runtime-config-path', cfg, '--additional-config', JSON.stringify({ runtime_config: overlay }), ...sec], ctx.env);
      ctx.procs.push(coord);
      const { requestStatus } = await import('../../src/bus/coordinator');
      let alive = await until(async () => (await requestStatus({ host: '127.0.0.1', port: rogue }, 500, undefined, token)).ready, `the ${name} agents to join a real coordinator after the garbage`, 30000).then(
        () => true,
        (e) => {
          problems.push(String(e));
          return false;
        },
      );
      for (const a of agents) {
        if (!(await roundTrip(a.runDir, 1000000 + a.replica * 1000))) {
          alive = false;
          problems.push(`${name} replica ${a.replica}: no wave round trip after the garbage`);
        }
      }
      return { socket: name, frames: ctx.frames, seconds: (Date.now() - t0) / 1000, sent, accepted: decoded, dropped, expected_dropped: expected, accounted, hung, alive, problems };
    },
  };
}

/**
 * With CURVE, a rogue PUB cannot reach an agent at all: neither a plain one nor one with a
 * server key other than the coordinator's the agent was given. Its frames go nowhere; the agent
 * drops nothing because it receives nothing.
 */
export function subCurveTarget(name: string): FuzzTarget {
  return {
    name,
    async run(ctx) {
      const t0 = Date.now();
      const dir = path.join(ctx.root, name);
      const problems: string[] = [];
      const kd = path.join(dir, 'keys');
      writeKeyPair(kd, 'coordinator');
      writeKeyPair(kd, 'agent');
      const refused: Record<string, number> = {};
      let sent = 0;
      const procs: Proc[] = [];
      for (const kind of ['plain', 'wrong_server_key'] as const) {
        const rogue = await freePortPair();
        const other = newKeyPair();
        const pub = new XPublisher({ linger: 0, ...(kind === 'wrong_server_key' ? { curveServer: true, curveSecretKey: other.secretKey, curvePublicKey: other.publicKey } : {}) });
        await pub.bind(`tcp://127.0.0.1:${rogue}`);
        const proc = startProc(`agent ${name} ${kind}`, ['agent', '--coordinator', `127.0.0.1:${rogue}`, '--rank', '0', '--world-size', '1', '--tp', '1', '--run-dir', path.join(dir, kind), '--heartbeat-ms', '200',
          '--curve-server-key', path.join(kd, 'coordinator.pub'), '--curve-key', path.join(kd, 'agent.key')], ctx.env);
        ctx.procs.push(proc);
        procs.push(proc);
        const sub = await within(pub.receive().then(() => true, () => false), 3000, false);
        if (sub) problems.push(`${name}: the agent subscribed to a ${kind} rogue PUB`);
        else count(refused, kind);
        const corpus = busCorpus(1);
        for (let i = 0; i < Math.min(ctx.frames, 1000); i++) {
          const [topic, body] = ctx.m.pick(corpus);
          await pub.send([Buffer.from(topic), ctx.m.mutate(body)]);
          sent++;
        }
        pub.close();
      }
      await sleep(500);
      const dropped: Record<string, number> = {};
      for (const p of procs) for (const [k, v] of Object.entries(droppedFromLog(p.err))) dropped[k] = (dropped[k] ?? 0) + v;
      const alive = procs.every((p) => !p.exit);
      const accounted = Object.keys(dropped).length === 0 && sum(refused) === 2;
      if (!accounted) problems.push(`${name}: dropped ${JSON.stringify(dropped)} (expected none: nothing reaches the agent)`);
      return { socket: name, frames: sent, seconds: (Date.now() - t0) / 1000, sent, accepted: 0, dropped, expected_dropped: {}, refused, accounted, hung: false, alive, problems };
    },
  };
}
