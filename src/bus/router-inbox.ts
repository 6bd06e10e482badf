// What arrives on the coordinator's ROUTER, opened: the frame count, the bus token's MAC (checked
// before anything in the message is read), the decode, and a data frame only after a file chunk.
// Anything else is dropped and counted; nothing here throws on input from the network. Then the
// admission: the MAC, the rank and the protocol version decide whether the coordinator acts on it.
import type { ColumnScratch } from '../client/telemetry';
import type { BusToken } from './auth';
import { decodeAgentMessage, type AgentMsg, type DropCounter } from './frames';
import { PROTOCOL_VERSION, type VersionGate } from './protocol-version';

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
  let bytes = payload;
  let authed = token === undefined;
  if (token && payload.length <= maxFrameBytes && (data === undefined || data.length <= maxFrameBytes)) {
    const o = token.open('to-coordinator', payload, data);
    if (o.ok) {
      bytes = o.msg;
      authed = true;
    } else if (o.reason === 'bad_mac') {
      drops.drop('bad_mac', `${payload.length} bytes`);
      return undefined;
    }
  }
  const d = decodeAgentMessage(bytes, maxFrameBytes, scratch);
  if (!d.ok) {
    drops.drop(d.reason, d.detail);
    return undefined;
  }
  const msg = d.value;
  if (data !== undefined) {
    if (msg.body !== 'fileChunk') {
      drops.drop('frame_count', `a data frame after a ${msg.body} message (only a file chunk has one)`);
      return undefined;
    }
    if (data.length > maxFrameBytes) {
      drops.drop('oversized', `data frame of ${data.length} bytes`);
      return undefined;
    }
  }
  return { routingId, msg, data, authed };
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
