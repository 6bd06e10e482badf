// Readiness: the launcher asks the coordinator for its status until the job is ready (not a fixed
// sleep: it asks again STATUS_GAP_MS after each answer), with the job's CURVE keys or bus token.
import { setTimeout as sleep } from 'timers/promises';
import * as zmq from 'zeromq';
import type { BusToken } from '../bus/auth';
import { clientSocketOptions, type CurveClientKeys } from '../bus/curve';
import { HostPort, socketIpOptions, tcpEndpoint } from '../bus/endpoints';
import { CoordinatorMessage, decode, AgentMessage, encode } from '../proto';
import { ProtocolError } from '../errors';
import { PROTOCOL_VERSION } from '../bus/protocol-version';
import { wireCensus } from '../bus/wire-census';
import { DEFAULT_MAX_FRAME_BYTES } from '../bus/constants';
import { connectTo } from '../client/connect';

const STATUS_POLL_MS = 250;
/**
 * After an answer that is not ready yet, the next ask waits this long: answers come back within a
 * millisecond, and asking again at once kept the coordinator busy answering (about half a second
 * of its CPU over a job's start, measured in bench overhead's profiles) while the ranks start.
 */
const STATUS_GAP_MS = 20;

export interface StatusSnapshot {
  ready: boolean;
  liveRanks: number[];
  expectedRanks: number[];
  epoch: number;
}

/**
 * Ask the coordinator (DEALER → ROUTER on port + 1) for its status until `isReady` says so.
 * Each ask waits at most STATUS_POLL_MS for an answer; `abort` rejects to stop early.
 */
export async function waitForCoordinator(
  coordinator: HostPort,
  isReady: (s: StatusSnapshot) => boolean,
  abort: Promise<never>,
  curve?: CurveClientKeys,
  token?: BusToken,
): Promise<StatusSnapshot> {
  const sock = new zmq.Dealer({ linger: 0, receiveTimeout: STATUS_POLL_MS, sendTimeout: 0, maxMessageSize: 2 * DEFAULT_MAX_FRAME_BYTES, ...socketIpOptions(coordinator.host), ...clientSocketOptions(curve) });
  connectTo(sock, tcpEndpoint(coordinator.host, coordinator.port + 1));
  let last: StatusSnapshot | undefined;
  const ask = encode(AgentMessage, { status: { protocolVersion: PROTOCOL_VERSION } });
  const request = token ? token.seal('to-coordinator', ask) : ask;
  let stopped = false;
  abort.catch(() => (stopped = true));
  try {
    while (!stopped) {
      try {
        await sock.send(request);
      } catch {
        /* queue full while the coordinator is not up yet; ask again next round */
      }
      const got = sock.receive();
      got.catch(() => undefined);
      let frames: Buffer[] | undefined;
      try {
        frames = await Promise.race([got, abort]);
      } catch (e) {
        if (stopped) throw e;
        continue; // receive timed out: ask again
      }
      for (const f of frames.slice(-1)) {
        let msg: Record<string, any>;
        try {
          // With the token, an answer from whatever else holds the port is not believed.
          let bytes = f;
          if (token) {
            const o = token.open('from-coordinator', f);
            if (!o.ok) continue;
            bytes = o.msg;
          }
          if (wireCensus(CoordinatorMessage, bytes)) continue; // more elements than a status reply has: not decoded
          msg = decode(CoordinatorMessage, bytes);
        } catch {
          continue; // not ours to crash on
        }
        // The coordinator speaks another protocol version: no poll will ever pass, say why now.
        if (msg.body === 'refused' && msg.refused) throw new ProtocolError(String(msg.refused.error), 'ERR_PROTOCOL_VERSION');
        if (msg.body !== 'status' || !msg.status) continue;
        last = { ready: !!msg.status.ready, liveRanks: msg.status.liveRanks ?? [], expectedRanks: msg.status.expectedRanks ?? [], epoch: Number(msg.epoch ?? 0) };
        if (isReady(last)) return last;
      }
      await Promise.race([sleep(STATUS_GAP_MS), abort]);
    }
    return await abort;
  } finally {
    sock.close();
  }
}
