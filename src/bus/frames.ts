// Wire frames of the bus: [topic, BusFrame] on PUB/SUB, AgentMessage / CoordinatorMessage on
// DEALER/ROUTER. Decoding never throws: a bad frame becomes a drop reason that callers count.
import type * as protobuf from 'protobufjs';
import { AgentMessage, BusFrame, CoordinatorMessage, decode, encode, encodeTrusted, longNumber, messageType, toPlain } from '../proto';
import type { Logger } from '../log';
import type { BusToken } from './auth';
import type { ConfigLane, DumpLane, WaveHead } from '../messages';
import { COLUMN_KEYS, columnsFromWire, requestStepError, type ColumnScratch } from '../client/telemetry';
import { wireCensus } from './wire-census';

const RequestStep = messageType('RequestStep');

/** One letter per frame kind, after the replica's prefix. */
export const TOPIC = { head: 'W', config: 'C', dump: 'D', heartbeat: 'H' } as const;
export type FrameKind = keyof typeof TOPIC;
/**
 * A head that carries work for the ranks (a config, a dump or a snapshot due, or captures) goes
 * out under "X" instead of "W": an agent that follows only the waves with work (the host receiver
 * writes everyone's plain vectors: docs/bus.md, "One receiver per host") subscribes to X, C, D and
 * H, and the publisher's filter keeps plain heads from waking it.
 */
export const WORK_HEAD_TOPIC = 'X';
const KIND_OF_TOPIC: Record<string, FrameKind> = { W: 'head', X: 'head', C: 'config', D: 'dump', H: 'heartbeat' };

/** The topics an agent that follows only the waves with work subscribes to (lanes-only). */
export function workTopics(replica: number): string[] {
  return [WORK_HEAD_TOPIC, TOPIC.config, TOPIC.dump, TOPIC.heartbeat].map((k) => `${replicaTopic(replica)}${k}`);
}

/** Whether a head's body carries work for the ranks (it then goes out under WORK_HEAD_TOPIC). */
export function headHasWork(head: Record<string, unknown>): boolean {
  const caps = head.captures as unknown[] | undefined;
  return Boolean(head.configDue || head.dumpDue || head.snapshotDue || (caps && caps.length > 0));
}

/**
 * The topic prefix of one replica's wave stream. ZeroMQ subscriptions match prefixes: the dot ends
 * the number, so "r1." never matches "r10.W".
 */
export function replicaTopic(replica: number): string {
  return `r${replica}.`;
}

/** The full topic of a frame: "r<replica>.<W|C|D|H>" (a head with work: X, encodeBusFrame). */
export function topicOf(replica: number, kind: FrameKind): string {
  return `${replicaTopic(replica)}${TOPIC[kind]}`;
}

const TOPIC_RE = /^r(0|[1-9]\d{0,4})\.([WXCDH])$/;

export interface BusHeartbeat {
  wave: number;
  globalRank: number;
  epochSeen: number;
  lastSeq: number;
  unixMs: number;
  /** The coordinator's: its replica's wake on demand (proto Wake). */
  wake?: number;
}

export interface DecodedFrame {
  epoch: number;
  seq: number;
  replica: number;
  kind: FrameKind;
  head?: WaveHead;
  config?: ConfigLane;
  dump?: DumpLane;
  heartbeat?: BusHeartbeat;
}

export type DropReason =
  | 'frame_count' // wrong number of multipart frames
  | 'oversized' // larger than maxFrameBytes
  | 'truncated' // protobuf ended inside a field
  | 'undecodable' // not protobuf of the expected type
  | 'empty' // decoded, but no body / no epoch / no seq
  | 'wrong_topic' // topic unknown, or does not match the body
  | 'bad_telemetry' // a wave head whose telemetry columns do not add up
  | 'over_limit' // more repeated elements than one frame may hold (wire-census.ts), refused before decoding
  | 'wrong_epoch' // an epoch this subscriber already left or was told is not current
  | 'stale' // seq already covered (duplicate, or covered by the snapshot)
  | 'injected' // discarded by the dropSeqs fault-injection hook
  | 'unknown_request' // a reply to no pending request
  | 'no_mac' // a bus token is configured and the message carries no MAC (auth.ts)
  | 'bad_mac' // a bus token is configured and the message's MAC is wrong
  | 'rank_out_of_range' // claims a global rank outside the job's world
  | 'wrong_connection' // claims a rank that said Hello on another connection
  | 'not_head' // a wave head from a rank that does not head its replica's stream (its last-PP TP0)
  | 'unexpected' // a well-formed message of a kind this socket does not take (an agent's file socket: only file requests)
  | 'busy' // an agent's file socket already serves its limit of requests at once
  | 'bad_snapshot' // a snapshot whose decide_ahead this rank's layout cannot have (constants.ts validDecideAhead)
  | 'stale_proof' // a BusChallenge proof for a replaced connection or another nonce (coordinator-link.ts)
  | 'old_connection' // a coordinator message on an agent connection replaced since, or not proven yet
  | 'protocol_version'; // a hello or tool request of another protocol version (answered with VersionRefused), or a later message of its connection

export type Decoded<T> = { ok: true; value: T } | { ok: false; reason: DropReason; detail?: string };

/**
 * A frame of `replica`'s stream. `trusted`: a body this process built from its own numbers and
 * flags (wave heads, heartbeats), encoded without verify (proto.ts encodeTrusted).
 */
export function encodeBusFrame(epoch: number, seq: number, kind: FrameKind, body: Record<string, unknown>, trusted = false, replica = 0): [string, Buffer] {
  const msg = { epoch, seq, replica, [kind]: body };
  const topic = kind === 'head' && headHasWork(body) ? `${replicaTopic(replica)}${WORK_HEAD_TOPIC}` : topicOf(replica, kind);
  return [topic, trusted ? encodeTrusted(BusFrame, msg) : encode(BusFrame, msg)];
}

function classify(e: unknown): DropReason {
  // protobufjs reports a message that ends inside a field as a RangeError ("index out of range").
  return e instanceof RangeError || /index out of range/.test(String(e)) ? 'truncated' : 'undecodable';
}

function safeDecode<T>(type: Parameters<typeof decode>[0], bytes: Uint8Array): Decoded<T> {
  const refused = wireCensus(type, bytes);
  if (refused) return { ok: false, reason: refused.reason, detail: refused.detail };
  try {
    return { ok: true, value: decode<T>(type, bytes) };
  } catch (e) {
    return { ok: false, reason: classify(e), detail: String(e) };
  }
}

/** Validate and decode a message received on SUB; with `token`, its MAC is checked before anything else is read. */
export function decodeBusFrame(parts: Buffer[], maxFrameBytes: number, token?: BusToken): Decoded<DecodedFrame> {
  if (parts.length !== 2) return { ok: false, reason: 'frame_count', detail: `${parts.length} frames` };
  const topicBuf = parts[0];
  let bytes = parts[1];
  if (bytes.length > maxFrameBytes) return { ok: false, reason: 'oversized', detail: `${bytes.length} bytes` };
  if (token) {
    const o = token.open('pub', bytes, undefined, topicBuf);
    if (!o.ok) return { ok: false, reason: o.reason, detail: `topic ${JSON.stringify(topicBuf.toString('latin1').slice(0, 16))}` };
    bytes = o.msg;
  }
  const m = TOPIC_RE.exec(topicBuf.length <= 8 ? topicBuf.toString('latin1') : '');
  if (!m) return { ok: false, reason: 'wrong_topic', detail: `topic ${JSON.stringify(topicBuf.toString('latin1').slice(0, 16))}` };
  const kind = KIND_OF_TOPIC[m[2]];
  const replica = Number(m[1]);
  const d = safeDecode<Record<string, any>>(BusFrame, bytes);
  if (!d.ok) return d;
  const f = d.value;
  if (!f.body || !(f.epoch > 0) || !(f.seq > 0)) return { ok: false, reason: 'empty' };
  if (f.body !== kind) return { ok: false, reason: 'wrong_topic', detail: `topic ${m[0]} carries ${f.body}` };
  if (f.replica !== replica) return { ok: false, reason: 'wrong_topic', detail: `topic ${m[0]} carries a frame of replica ${f.replica}` };
  return { ok: true, value: { epoch: f.epoch, seq: f.seq, replica, kind, [kind]: f[kind] } };
}

export type AgentMsg = Record<string, any> & { globalRank: number; epochSeen: number; requestId: number; body?: string };
export type CoordinatorMsg = Record<string, any> & { epoch: number; requestId: number; body?: string };

/**
 * Validate and decode one AgentMessage payload received on the coordinator's ROUTER. With
 * `scratch`, a wave head's telemetry columns are valid until the next decode with it.
 */
export function decodeAgentMessage(bytes: Buffer, maxFrameBytes: number, scratch?: ColumnScratch): Decoded<AgentMsg> {
  if (bytes.length > maxFrameBytes) return { ok: false, reason: 'oversized', detail: `${bytes.length} bytes` };
  const refused = wireCensus(AgentMessage, bytes);
  if (refused) return { ok: false, reason: refused.reason, detail: refused.detail };
  let m: protobuf.Message & Record<string, any>;
  try {
    m = AgentMessage.decode(bytes) as protobuf.Message & Record<string, any>;
  } catch (e) {
    return { ok: false, reason: classify(e), detail: String(e) };
  }
  if (m.body === 'waveHead') return waveHeadOf(m, scratch);
  const value = toPlain<AgentMsg>(AgentMessage, m);
  if (!value.body) return { ok: false, reason: 'empty' };
  return { ok: true, value };
}

const NO_BYTES = Buffer.alloc(0);

/**
 * A decoded TelemetryColumns with its absent bytes fields as empty Buffers, as toPlain() gives
 * them: on the message, an absent field reads as protobufjs's shared empty array (proto3 writers
 * such as Python's leave empty columns out).
 */
function presentBytes(c: Record<string, any>): Record<string, unknown> {
  const out: Record<string, unknown> = { rows: c.rows, bind: c.bind, blocks: c.blocks };
  for (const key of COLUMN_KEYS) out[key] = c[key] instanceof Uint8Array ? c[key] : NO_BYTES;
  return out;
}

/**
 * The wave head (once per engine step) read straight off the decoded message, in the shape
 * toPlain() gives, without its generic conversion of every field: the columns stay the decoded
 * Buffers until columnsFromWire turns them into typed arrays, checked once (the guard then trusts
 * them). uint64 fields are numbers, as everywhere else.
 */
function waveHeadOf(m: Record<string, any>, scratch?: ColumnScratch): Decoded<AgentMsg> {
  const wh = m.waveHead;
  const tel = wh.telemetry;
  let telemetry: Record<string, unknown> | null = null;
  if (tel) {
    let columns = null;
    if (tel.columns) {
      try {
        columns = columnsFromWire(presentBytes(tel.columns), scratch);
      } catch (e) {
        return { ok: false, reason: 'bad_telemetry', detail: (e as Error).message };
      }
    }
    const requests = tel.requests.length > 0 ? tel.requests.map((r: protobuf.Message) => toPlain<Record<string, any>>(RequestStep, r)) : [];
    for (let i = 0; i < requests.length; i++) {
      const bad = requestStepError(requests[i] as never, i);
      if (bad) return { ok: false, reason: 'bad_telemetry', detail: bad };
    }
    telemetry = {
      wave: longNumber(tel.wave),
      requests,
      nonFinite: tel.nonFinite.map((r: Record<string, any>) => ({ row: r.row, reqId: r.reqId, kind: r.kind })),
      columns,
    };
  }
  return { ok: true, value: { globalRank: m.globalRank, epochSeen: longNumber(m.epochSeen), requestId: longNumber(m.requestId), body: 'waveHead', waveHead: { wave: longNumber(wh.wave), telemetry, ringSeq: longNumber(wh.ringSeq) } } };
}

/** Validate and decode one CoordinatorMessage payload received on an agent's DEALER; with `token`, its MAC first. */
export function decodeCoordinatorMessage(bytes: Buffer, maxFrameBytes: number, token?: BusToken, data?: Buffer): Decoded<CoordinatorMsg> {
  if (bytes.length > maxFrameBytes) return { ok: false, reason: 'oversized', detail: `${bytes.length} bytes` };
  if (token) {
    const o = token.open('from-coordinator', bytes, data);
    if (!o.ok) return { ok: false, reason: o.reason };
    bytes = o.msg;
  }
  const d = safeDecode<CoordinatorMsg>(CoordinatorMessage, bytes);
  if (d.ok && !d.value.body) return { ok: false, reason: 'empty' };
  return d;
}

export function encodeAgentMessage(msg: Record<string, unknown>): Buffer {
  return encode(AgentMessage, msg);
}

export function encodeCoordinatorMessage(msg: Record<string, unknown>): Buffer {
  return encode(CoordinatorMessage, msg);
}

/**
 * Counts dropped frames by reason and logs each reason at most once per `logEveryMs`, so a
 * flood of garbage costs a counter increment, not a log line, per frame.
 */
export class DropCounter {
  readonly counts: Record<string, number> = {};
  private lastLog = new Map<string, number>();

  constructor(
    private readonly logger: Logger | undefined,
    private readonly where: string,
    private readonly onDrop?: (reason: DropReason) => void,
    private readonly logEveryMs = 5000,
  ) {}

  drop(reason: DropReason, detail?: string): void {
    this.counts[reason] = (this.counts[reason] ?? 0) + 1;
    this.onDrop?.(reason);
    const now = Date.now();
    const last = this.lastLog.get(reason);
    if (last === undefined || now - last >= this.logEveryMs) {
      this.lastLog.set(reason, now);
      this.logger?.warn({ where: this.where, reason, detail, total: this.counts[reason] }, 'dropped a bus frame');
    }
  }
}
