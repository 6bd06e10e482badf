// What arrives on the coordinator's ROUTER, opened: the frame count, the bus token's MAC (checked
// before anything in the message is read), the decode, and a data frame only after a file chunk.
// Anything else is dropped and counted; nothing here throws on input from the network.
import type { ColumnScratch } from '../client/telemetry';
import type { BusToken } from './auth';
import { decodeAgentMessage, type AgentMsg, type DropCounter } from './frames';

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
