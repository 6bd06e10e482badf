// What arrives on the coordinator's ROUTER, opened: the frame count and sizes, the bus token's MAC
// (checked before anything in the message is read; without it, only a small status or relay
// request is read at all), the decode (its repeated fields counted first, wire-census.ts), and a
// data frame only after a file chunk.
// Anything else is dropped and counted; nothing here throws on input from the network. Then the
// admission: the MAC, the rank and the protocol version decide whether the coordinator acts on it.
import * as protobuf from 'protobufjs';
import type { ColumnScratch } from '../client/telemetry';
import type { BusToken } from './auth';
import { decodeAgentMessage, type AgentMsg, type DropCounter } from './frames';
import { PROTOCOL_VERSION, type VersionGate } from './protocol-version';
import { AgentMessage } from '../proto';

export interface RouterMessage {
  routingId: Buffer;
  msg: AgentMsg;
  /** A file chunk's data frame (payload.ts). */
  data?: Buffer;
  /** The message carried the bus token's MAC (always true without a token). */
  authed: boolean;
}

export function openRouterMessage(parts: Buffer[], maxFrameBytes: number, token: BusToken | undefined, scratch: ColumnScratch, drops: DropCounter): RouterMessage | undefined {
  // [identity, message], or [identity, FileChunk message, its data] (payload.ts).
  if (parts.length !== 2 && parts.length !== 3) {
    drops.drop('frame_count', `${parts.length} frames (expected identity + 1, or + 2 for a file chunk)`);
    return undefined;
  }
  const [routingId, payload, data] = parts;
  if (payload.length > maxFrameBytes || (data !== undefined && data.length > maxFrameBytes)) {
    drops.drop('oversized', `${payload.length} bytes${data !== undefined ? ` and a data frame of ${data.length}` : ''}`);
    return undefined;
  }
  let bytes = payload;
  let authed = token === undefined;
  if (token) {
    // The MAC's place is checked in O(1); a frame that has one costs one HMAC pass and no decode.
    const o = token.open('to-coordinator', payload, data);
    if (o.ok) {
      bytes = o.msg;
      authed = true;
    } else if (o.reason === 'bad_mac') {
      drops.drop('bad_mac', `${payload.length} bytes`);
      return undefined;
    } else {
      const why = unauthenticatedRefusal(payload, data);
      if (why) {
        drops.drop('no_mac', why);
        return undefined;
      }
    }
  }
  const d = decodeAgentMessage(bytes, maxFrameBytes, scratch);
  if (!d.ok) {
    drops.drop(d.reason, d.detail);
    return undefined;
  }
  const msg = d.value;
  if (data !== undefined && msg.body !== 'fileChunk') {
    drops.drop('frame_count', `a data frame after a ${msg.body} message (only a file chunk has one)`);
    return undefined;
  }
  return { routingId, msg, data, authed };
}

/** The largest message read without the bus token's MAC: a status or relay request is a few dozen bytes. */
export const MAX_UNAUTHENTICATED_BYTES = 4096;
/** AgentMessage's body fields a message without the MAC may carry: status (answered), relay and control (refused with a reason). */
const bodyField = (name: string): number => AgentMessage.fields[name].id;
const STATUS_FIELD = bodyField('status');
const RELAY_FIELD = bodyField('relay');
const CONTROL_FIELD = bodyField('control');
/** The field numbers of AgentMessage's oneof body, from the schema. */
const BODY_FIELDS = new Set(AgentMessage.oneofs.body.fieldsArray.map((f) => f.id));

/**
 * Why a message without the bus token's MAC is not read any further (undefined: it is a small
 * status or relay request, decoded next). Looks at its size and, within MAX_UNAUTHENTICATED_BYTES,
 * at its top-level field numbers only: no such message costs more than a bounded walk.
 */
export function unauthenticatedRefusal(payload: Buffer, data: Buffer | undefined): string | undefined {
  if (data !== undefined) return `a message of ${payload.length} bytes with a data frame, without the bus token's MAC`;
  if (payload.length > MAX_UNAUTHENTICATED_BYTES) return `${payload.length} bytes without the bus token's MAC (only a status, relay or control request of at most ${MAX_UNAUTHENTICATED_BYTES} bytes is read without it)`;
  const body = lastBodyField(payload);
  if (body === STATUS_FIELD || body === RELAY_FIELD || body === CONTROL_FIELD) return undefined;
  return `a message ${body === undefined ? 'that does not parse' : `with body field ${body}`} without the bus token's MAC`;
}

/** The field number of the last top-level length-delimited field of AgentMessage's oneof body, or undefined. */
function lastBodyField(b: Buffer): number | undefined {
  const r = protobuf.Reader.create(b);
  let body: number | undefined;
  try {
    while (r.pos < r.len) {
      const tag = r.uint32();
      const id = tag >>> 3;
      if ((tag & 7) === 2 && BODY_FIELDS.has(id)) body = id;
      r.skipType(tag & 7);
    }
  } catch {
    return undefined;
  }
  return body;
}

/** What admitRouterMessage needs of the coordinator. */
export interface Admission {
  drops: DropCounter;
  versions: VersionGate;
  worldSize: number;
  reply(routingId: Buffer, msg: Record<string, unknown>): void;
}

/**
 * Whether an opened message may be acted on: only a liveness poll is taken without the bus
 * token's MAC (a relay gets a clear refusal), only ranks of this job's layout exist (a made-up rank
 * number is garbage, not a new agent), and a connection of another protocol version is refused
 * once and then dropped. Returns the rank the message speaks for, or undefined when it was dropped.
 */
export function admitRouterMessage(opened: RouterMessage, a: Admission): number | undefined {
  const { routingId, msg, authed } = opened;
  if (!authed && msg.body !== 'status') {
    a.drops.drop('no_mac', `a ${msg.body} message without the bus token's MAC`);
    if (msg.body === 'relay') {
      a.reply(routingId, { requestId: msg.requestId, relay: { rank: Number(msg.relay?.rank ?? 0), protocolVersion: PROTOCOL_VERSION, error: 'this coordinator requires the bus token for relay requests (--bus-token-file, or WAVEBUS_BUS_TOKEN_FILE)' } });
    }
    // A control request is refused in words too (nothing armed), so the tool says why at once.
    if (msg.body === 'control') {
      a.reply(routingId, { requestId: msg.requestId, control: { protocolVersion: PROTOCOL_VERSION, errorCode: 'ERR_CONTROL_REFUSED', error: 'this coordinator requires the bus token for control requests (--bus-token-file, or WAVEBUS_BUS_TOKEN_FILE); nothing was armed' } });
    }
    return undefined;
  }
  const rank: number = msg.globalRank;
  // A snapshot request names its rank in its body too: that one is the rank it is answered for.
  const claimed = msg.body === 'hello' ? (msg.hello?.identity?.globalRank ?? rank) : msg.body === 'snapshot' ? (msg.snapshot?.globalRank ?? rank) : rank;
  if (msg.body !== 'status' && msg.body !== 'relay' && msg.body !== 'control' && !(Number.isInteger(claimed) && claimed >= 0 && claimed < a.worldSize)) {
    a.drops.drop('rank_out_of_range', `rank ${claimed} of a world of ${a.worldSize}`);
    return undefined;
  }
  const gate = a.versions.check(msg, routingId, claimed);
  if (gate.action !== 'ok') {
    a.drops.drop('protocol_version', gate.action === 'refuse' ? gate.error : `a ${msg.body} message on a connection refused for its protocol version`);
    if (gate.action === 'refuse') a.reply(routingId, { requestId: msg.requestId, refused: { protocolVersion: PROTOCOL_VERSION, peerVersion: gate.peerVersion, error: gate.error } });
    return undefined;
  }
  return rank;
}
