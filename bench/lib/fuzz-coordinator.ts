// The coordinator side of the fuzz bench (bench/fuzz.ts): the valid AgentMessages mutated, the
// model that predicts what the coordinator's ROUTER does with each message (from the same
// decoders, the bus token's MAC check and a copy of its connection state), and the jobs the
// targets run against: a coordinator without keys, one with the bus token, one with CURVE.
import * as fs from 'fs';
import * as path from 'path';
import { BusToken, createTokenFile } from '../../src/bus/auth';
import { DEFAULT_MAX_FRAME_BYTES, NONCE_BYTES } from '../../src/bus/constants';
import { writeKeyPair, loadClientKeys, type CurveClientKeys } from '../../src/bus/curve';
import { decodeAgentMessage, encodeAgentMessage, type AgentMsg } from '../../src/bus/frames';
import { unauthenticatedRefusal } from '../../src/bus/router-inbox';
import { coversOneof, perKind } from './fuzz-kinds';
import { freePortPair } from '../../src/bus/ports';
import { PROTOCOL_VERSION, peerVersionOf } from '../../src/bus/protocol-version';
import { startProc, statusOf, until, type CoordinatorHandle, type Proc } from './fuzz-procs';

/** The fuzzed coordinators' world (their --world-size): rank 0 is its only rank, and heads replica 0. */
export const FUZZ_WORLD = 1;

const IDENTITY = { globalRank: 0, worldSize: 1, tpSize: 1, ppSize: 1, dpSize: 1, cpSize: 1, isLastPp: true, host: 'fuzz', pid: 1 };

/** Protocol versions a hello or tool request claims: none, every older one, this one, future ones, the extremes. */
export const VERSIONS = [...Array.from({ length: PROTOCOL_VERSION + 3 }, (_, v) => v), 100, 2 ** 31, 2 ** 32 - 1];

export function agentCorpus(): Buffer[] {
  const files = [{ path: 'rank0/a.pt', bytes: 10, checksum: 'crc32c:00000000' }];
  const telemetry = {
    wave: 4,
    requests: [{ reqId: 'req-1', newTokenIds: [1, 2], newTokenLogprobs: [-0.5, -1], newTokenRanks: [0, 1], draftLen: 2, accepted: 1, blockIds: [3, 4], promptLen: 9, numOutputTokens: 2 }],
    nonFinite: [{ row: 0, reqId: 'req-1', kind: 'nan' }],
  };
  const out = [
    { globalRank: 7, hello: { identity: { ...IDENTITY, globalRank: 7 }, subscribed: true, agentVersion: 'x', protocolVersion: PROTOCOL_VERSION } },
    // rank 0, this version: the fuzzer joins as the world's only rank (its later messages count as that rank's)
    { globalRank: 0, hello: { identity: IDENTITY, subscribed: true, agentVersion: 'x', protocolVersion: PROTOCOL_VERSION } },
    { globalRank: 0, hello: { identity: IDENTITY, subscribed: true, agentVersion: 'old', protocolVersion: PROTOCOL_VERSION - 1 } },
    { globalRank: 7, requestId: 3, snapshot: { globalRank: 7 } },
    { globalRank: 0, requestId: 4, snapshot: { globalRank: 0 } },
    { globalRank: 0, heartbeat: { wave: 5, globalRank: 0, epochSeen: 9, lastSeq: 10, unixMs: 1 } },
    { globalRank: 7, dumpResult: { globalRank: 7, jobId: '5/manual/req', wave: 5, files, bytes: 10, error: '', skippedReason: '' } },
    { globalRank: 0, dumpResult: { globalRank: 0, jobId: '5/manual/req', wave: 5, files, bytes: 10, error: '', skippedReason: '' } },
    { globalRank: 0, waveHead: { wave: 5, telemetry } },
    { globalRank: 7, waveHead: { wave: 5 } },
    { requestId: 1, status: { protocolVersion: PROTOCOL_VERSION } },
    { requestId: 2, status: {} }, // a tool from before versions: refused
    { globalRank: 7, requestId: 99, fileList: { globalRank: 7, files } },
    { globalRank: 0, requestId: 98, fileChunk: { globalRank: 0, root: 'dumps', path: 'a', offset: 0, data: Buffer.from('abc'), crc32c: 1, eof: true } },
    // the header of a chunk whose bytes follow as a second frame
    { globalRank: 0, requestId: 97, fileChunk: { globalRank: 0, root: 'dumps', path: 'a', offset: 0, crc32c: 1, eof: true } },
    { globalRank: 0, requestId: 96, fileServe: { globalRank: 0, endpoint: 'tcp://127.0.0.1:1', serverKey: '' } },
    // a new agent connection's challenge (answered with a proof only by a coordinator with the token)
    { globalRank: 0, challenge: { nonce: Buffer.alloc(16, 7) } },
    // a tool's relay to rank 0 (the coordinator's own reports: no agent needed)
    { requestId: 95, relay: { rank: 0, fileList: { root: 'reports', prefix: '' }, protocolVersion: PROTOCOL_VERSION } },
    // a tool's control requests (answered: a status, an unknown arm), and agents' words on a capture
    { requestId: 94, control: { protocolVersion: PROTOCOL_VERSION, status: {} } },
    { requestId: 93, control: { protocolVersion: PROTOCOL_VERSION, query: { id: 'capture-1' } } },
    // `wavebus verdict --coordinator`'s note (kept for the status document and /metrics, or refused naming its field)
    { requestId: 91, control: { protocolVersion: PROTOCOL_VERSION, verdict: { incident: 'incident-wave5', verdict: 'device-local', host: 'node-1', devices: [0], ranks: [0], reason: 'rank 0 alone', fingerprint: 'node-1 cpu' } } },
    { globalRank: 0, captureResult: { globalRank: 0, armId: 'capture-1', wave: 5, callDir: '/x/call0', error: '', done: true } },
    { globalRank: 7, captureResult: { globalRank: 7, armId: 'capture-1', wave: 5, callDir: '', error: 'x', done: false } },
    // a rank's fingerprint (stored cut to local limits; mutations make garbage of its strings and lists)
    { globalRank: 0, fingerprint: { wavebusVersion: '0.1.0', language: 'python', env: [{ name: 'NCCL_ALGO', value: 'Ring' }, { name: 'NCCL_X_TOKEN', redacted: true }], weights: [{ name: 'w', checksum: 'crc32c:0123abcd', bytes: 4, dtype: 'float32' }] } },
    { globalRank: 7, fingerprint: { wavebusVersion: '0.1.0' } },
    // an agent's word that its engine died (kept in /healthz engine_crashes, bounded)
    { globalRank: 0, engineCrash: { enginePid: 4242, exitKnown: true, signal: 'SIGKILL', lastWave: 12, forwardsFlushed: 3, flushDir: '/x/recorder/crash-a', note: 'RuntimeError' } },
    // rank_divergence: a rank's digests (compared only with the detector on), an answer to a column ask
    { globalRank: 0, decided: { decisions: [{ wave: 5, tokenCrc: 1, rows: 3, inputCrc: 2, inputTokens: 3, flags: 7 }] } },
    { globalRank: 7, requestId: 92, decidedColumn: { wave: 5, found: true, column: Buffer.alloc(12) } },
    // a verdict's replay answer nobody asked this connection for
    { globalRank: 0, requestId: 91, replay: { globalRank: 0, error: 'x', tensors: [{ call: 1, rank: 0, shape: [1, 8], dtype: 'float32', maxAbsDiff: 0.5, withinTolerance: false }] } },
  ].map((m) => encodeAgentMessage(m));
  coversOneof('AgentMessage', 'body', corpusKinds(out), 'coordinator ROUTER');
  return out;
}

/** The body kinds of a corpus of valid AgentMessages. */
function corpusKinds(corpus: Buffer[]): Array<string | undefined> {
  return corpus.map((b) => {
    const d = decodeAgentMessage(b, DEFAULT_MAX_FRAME_BYTES);
    return d.ok ? d.value.body : undefined;
  });
}

/** Hellos of every protocol version, for ranks in and out of the world. */
export function helloCorpus(): Buffer[] {
  const out: Buffer[] = [];
  for (const v of VERSIONS) {
    for (const rank of [0, 1]) out.push(encodeAgentMessage({ globalRank: rank, hello: { identity: { ...IDENTITY, globalRank: rank }, subscribed: true, agentVersion: `v${v}`, protocolVersion: v } }));
    out.push(encodeAgentMessage({ requestId: 5, status: { protocolVersion: v } }));
  }
  // after a hello: what its connection sends next (dropped while the connection is refused)
  out.push(encodeAgentMessage({ globalRank: 0, heartbeat: { wave: 1, globalRank: 0, epochSeen: 1, lastSeq: 1, unixMs: 1 } }));
  out.push(encodeAgentMessage({ globalRank: 0, requestId: 6, snapshot: { globalRank: 0 } }));
  return out;
}

/** A drop reason (or none: handled), and the body of the coordinator's reply when it sends one at once. */
export interface Fate {
  drop?: string;
  reply?: 'refused' | 'status' | 'snapshot' | 'relay' | 'proof' | 'control';
  /** An answer (file list, chunk, serve) predicted as asked by nobody: its request id. The coordinator
   *  takes it instead when that id happens to be a request it forwarded to this connection from a
   *  relay and still waits on (fuzz-router.ts reconciles those). */
  answerId?: number;
}

/** The state of one connection the model keeps (what the coordinator keeps per connection). */
interface ConnState {
  /** The coordinator has a bus token (it answers a challenge only then). */
  token: boolean;
  refused: boolean;
  helloAs: Set<number>;
  /** Whether rank r's messages are this connection's to send (no other connection said Hello as r). */
  mine(r: number): boolean;
}

/** How the coordinator's ROUTER treats one AgentMessage body kind (coordinator-dispatch.ts RouterDispatch.onMessage). */
interface BodyRule {
  /** The rank the message claims, checked against the world (none: a tool's request, any rank). */
  claims?: (m: AgentMsg) => number;
  /** Without the bus token's MAC: taken (a liveness poll), or dropped with a refusal that names the token. */
  withoutMac?: 'taken' | 'refusal';
  /** Its fate once the MAC, rank and version gates let it through. */
  fate(s: ConnState, m: AgentMsg, claimed: number): Fate;
}

const ownRank = (m: AgentMsg) => m.globalRank;
const fromThisConnection = (s: ConnState, m: AgentMsg): Fate => (s.mine(m.globalRank) ? {} : { drop: 'wrong_connection' });
// Nobody asked this connection for files or its file socket: an answer to nothing.
const unasked = (_s: ConnState, m: AgentMsg): Fate => ({ drop: 'unknown_request', answerId: Number(m.requestId) });

/** Every AgentMessage body kind of the proto, and what the coordinator does with it (checked at load). */
export const AGENT_BODIES = perKind<BodyRule>('AgentMessage', 'body', {
  hello: {
    claims: (m) => m.hello?.identity?.globalRank ?? m.globalRank,
    fate: (s, _m, r) => {
      s.refused = false;
      s.helloAs.add(r);
      return {};
    },
  },
  snapshot: { claims: (m) => m.snapshot?.globalRank ?? m.globalRank, fate: (s, _m, r) => (s.mine(r) ? { reply: 'snapshot' } : { drop: 'wrong_connection' }) },
  heartbeat: { claims: ownRank, fate: fromThisConnection },
  dumpResult: { claims: ownRank, fate: fromThisConnection },
  waveHead: { claims: ownRank, fate: fromThisConnection }, // rank 0 heads replica 0 (the world's only replica)
  status: { withoutMac: 'taken', fate: () => ({ reply: 'status' }) },
  relay: { withoutMac: 'refusal', fate: () => ({ reply: 'relay' }) },
  control: { withoutMac: 'refusal', fate: () => ({ reply: 'control' }) }, // answered, armed or refused in words
  captureResult: { claims: ownRank, fate: fromThisConnection },
  fingerprint: { claims: ownRank, fate: fromThisConnection }, // stored only from the connection the rank said Hello on
  engineCrash: { claims: ownRank, fate: fromThisConnection }, // recorded only from the connection the rank said Hello on
  fileList: { claims: ownRank, fate: unasked },
  fileChunk: { claims: ownRank, fate: unasked },
  fileServe: { claims: ownRank, fate: unasked },
  decided: { claims: ownRank, fate: fromThisConnection }, // taken only from the connection the rank said Hello on
  decidedColumn: { claims: ownRank, fate: unasked },
  replay: { claims: ownRank, fate: unasked }, // a ReplayReply nobody asked this connection for
  // A new agent connection's challenge (coordinator-link.ts): the nonce back under the token's MAC.
  challenge: { claims: ownRank, fate: (s, m) => (s.token && m.challenge?.nonce?.length === NONCE_BYTES ? { reply: 'proof' } : { drop: 'unexpected' }) },
}, 'the coordinator model (AGENT_BODIES)');

/**
 * What the coordinator's ROUTER does with one message of one connection (src/bus/router-inbox.ts,
 * coordinator.ts, protocol-version.ts, rank-table.ts): the same decoder and MAC check, and a copy of
 * the state this connection can change (refused for its version; ranks it said Hello as).
 */
export class CoordinatorModel {
  private readonly state: ConnState;

  constructor(
    /** Ranks another connection said Hello as (their messages from us: wrong_connection). */
    registered: Set<number>,
    private readonly token?: BusToken,
    private readonly world = FUZZ_WORLD,
  ) {
    const helloAs = new Set<number>();
    this.state = { token: token !== undefined, refused: false, helloAs, mine: (r) => !registered.has(r) || helloAs.has(r) };
  }

  /** The ranks this connection said Hello as (registered for the next connections). */
  get hellos(): number[] {
    return [...this.state.helloAs];
  }

  fate(parts: Buffer[]): Fate {
    const max = DEFAULT_MAX_FRAME_BYTES;
    if (parts.length !== 1 && parts.length !== 2) return { drop: 'frame_count' };
    const [payload, data] = parts;
    if (payload.length > max || (data !== undefined && data.length > max)) return { drop: 'oversized' };
    let bytes = payload;
    let authed = this.token === undefined;
    if (this.token) {
      const o = this.token.open('to-coordinator', payload, data);
      if (o.ok) {
        bytes = o.msg;
        authed = true;
      } else if (o.reason === 'bad_mac') return { drop: 'bad_mac' };
      // Without the MAC only a small status or relay request is decoded at all.
      else if (unauthenticatedRefusal(payload, data)) return { drop: 'no_mac' };
    }
    const d = decodeAgentMessage(bytes, max);
    if (!d.ok) return { drop: d.reason };
    const m = d.value;
    if (data !== undefined && m.body !== 'fileChunk') return { drop: 'frame_count' };
    const rule = AGENT_BODIES[m.body ?? ''];
    if (!rule) return { drop: 'undecodable' }; // a decoded body always names a proto member
    if (!authed && rule.withoutMac !== 'taken') return { drop: 'no_mac', ...(rule.withoutMac === 'refusal' ? { reply: m.body === 'control' ? ('control' as const) : ('relay' as const) } : {}) };
    const claimed = rule.claims ? rule.claims(m) : -1;
    if (rule.claims && !(Number.isInteger(claimed) && claimed >= 0 && claimed < this.world)) return { drop: 'rank_out_of_range' };
    const v = peerVersionOf(m);
    if (v === undefined && this.state.refused) return { drop: 'protocol_version' };
    if (v !== undefined && v !== PROTOCOL_VERSION) {
      if (m.body === 'hello') this.state.refused = true;
      return { drop: 'protocol_version', reply: 'refused' };
    }
    return rule.fate(this.state, m, claimed);
  }
}

export interface Job {
  coord: CoordinatorHandle;
  /** Ranks some connection said Hello as on this coordinator (agent A's, and the fuzzers' of earlier targets). */
  registered: Set<number>;
  /**
   * Request ids the coordinator forwarded (from a relay) to any fuzzer connection of this job. It
   * may still wait on them when a later target's connection says Hello as the same rank, and then
   * takes that connection's answer with such an id as the answer.
   */
  forwardedIds: Set<number>;
  /** Agent A (rank 0) and its run directory, when the job has one. */
  agent?: { proc: Proc; runDir: string; dumpRoot: string };
  dir: string;
  keys?: { dir: string; fuzzer: CurveClientKeys; stranger: CurveClientKeys; serverPub: string };
  tokenFile?: string;
  /** The coordinator's report and dump roots (its own files, served to `wavebus aggregate`). */
  reportDir: string;
  dumpDir: string;
}

export interface JobSpec {
  name: string;
  token?: boolean;
  curve?: boolean;
  agent?: boolean;
}

/** Start a coordinator (world 1) with the spec's security, and agent A for rank 0 when asked. */
export async function startJob(spec: JobSpec, root: string, procs: Proc[], env: NodeJS.ProcessEnv): Promise<Job> {
  const dir = path.join(root, spec.name);
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  const cfg = path.join(dir, 'runtime', 'config', 'runtime_config.json');
  fs.mkdirSync(path.dirname(cfg), { recursive: true });
  // One detector on (report only), so agents use the bus and the round trip exercises it.
  const overlay = { detector: { logits_finite: { enabled: true, on_trigger: ['report'] } } };
  fs.writeFileSync(cfg, JSON.stringify(overlay));
  const reportDir = path.join(dir, 'report');
  const dumpDir = path.join(dir, 'kv_cache');
  const port = await freePortPair();
  const args = ['coordinator', '--port', String(port), '--world-size', String(FUZZ_WORLD), '--tp', '1', '--heartbeat-ms', '200', '--runtime-config-path', cfg,
    '--runtime-report-dir', reportDir, '--runtime-dump-dir', dumpDir, '--additional-config', JSON.stringify({ runtime_config: overlay })];
  const agentSec: string[] = [];
  const job: Job = { coord: { proc: undefined as unknown as Proc, port, polls: 0 }, registered: new Set(spec.agent ? [0] : []), forwardedIds: new Set(), dir, reportDir, dumpDir };
  if (spec.curve) {
    const kd = path.join(dir, 'keys');
    const allow = path.join(dir, 'allowed');
    fs.mkdirSync(allow, { recursive: true });
    writeKeyPair(kd, 'coordinator');
    for (const n of ['agent', 'fuzzer']) fs.copyFileSync(writeKeyPair(kd, n).pubFile, path.join(allow, `${n}.pub`));
    writeKeyPair(kd, 'stranger');
    const serverPub = path.join(kd, 'coordinator.pub');
    job.keys = { dir: kd, serverPub, fuzzer: loadClientKeys(serverPub, path.join(kd, 'fuzzer.key'))!, stranger: loadClientKeys(serverPub, path.join(kd, 'stranger.key'))! };
    job.coord.curve = job.keys.fuzzer;
    args.push('--curve-secret-key', path.join(kd, 'coordinator.key'), '--curve-allow', allow);
    agentSec.push('--curve-server-key', serverPub, '--curve-key', path.join(kd, 'agent.key'));
  }
  if (spec.token) {
    job.tokenFile = createTokenFile(dir);
    job.coord.token = BusToken.load(job.tokenFile, 'fuzz');
    args.push('--bus-token-file', job.tokenFile);
    agentSec.push('--bus-token-file', job.tokenFile);
  }
  job.coord.proc = startProc(`coordinator (${spec.name})`, args, env);
  procs.push(job.coord.proc);
  await until(() => job.coord.proc.out.includes('"started"') || job.coord.proc.exit, `the ${spec.name} coordinator to start`);
  if (spec.agent) {
    const runDir = path.join(dir, 'agent');
    const dumpRoot = path.join(dir, 'agent-dumps');
    fs.mkdirSync(dumpRoot, { recursive: true });
    const proc = startProc(`agent A (${spec.name})`, ['agent', '--coordinator', `127.0.0.1:${port}`, '--rank', '0', '--world-size', '1', '--tp', '1', '--run-dir', runDir, '--heartbeat-ms', '200', '--dump-root', dumpRoot, ...agentSec], env);
    procs.push(proc);
    job.agent = { proc, runDir, dumpRoot };
    await until(async () => (await statusOf(job.coord, 500)).ready, `the ${spec.name} bus to be ready`);
  } else {
    await until(() => statusOf(job.coord, 500), `the ${spec.name} coordinator to answer`);
  }
  return job;
}
