// The status client: what tools that are not agents (tests, the prober, scripts) use to ask a
// coordinator for its status over its ROUTER. CURVE and the bus token as every bus client has them.
import { Dealer } from 'zeromq';
import { ProtocolError, WavebusError } from '../errors';
import { PROTOCOL_VERSION, versionMismatch } from './protocol-version';
import { DEFAULT_MAX_FRAME_BYTES } from './constants';
import { socketIpOptions, tcpEndpoint } from './endpoints';
import { decodeCoordinatorMessage, encodeAgentMessage } from './frames';
import { clientSocketOptions, type CurveClientKeys } from './curve';
import type { BusToken } from './auth';
import { connectTo } from '../client/connect';

export interface StatusReplyMsg {
  epoch: number;
  seq: number;
  wave: number;
  liveRanks: number[];
  expectedRanks: number[];
  ready: boolean;
  statusJson: string;
  protocolVersion: number;
}

/**
 * Ask a coordinator for its status. Rejects with ERR_TIMEOUT when nothing answers, and with
 * ERR_PROTOCOL_VERSION when the coordinator speaks another protocol version. A CURVE
 * coordinator needs `curve` (client keys whose public key is on its allow-list); without them it
 * never answers, so this times out.
 */
export async function requestStatus(coordinator: { host: string; port: number }, timeoutMs = 2000, curve?: CurveClientKeys, token?: BusToken): Promise<StatusReplyMsg> {
  // sendTimeout too: after a refused CURVE handshake libzmq drops the pipe while it reconnects,
  // and a send without a pipe would wait forever.
  const dealer = new Dealer({ linger: 0, receiveTimeout: timeoutMs, sendTimeout: timeoutMs, maxMessageSize: 2 * DEFAULT_MAX_FRAME_BYTES, ...socketIpOptions(coordinator.host), ...clientSocketOptions(curve) });
  try {
    connectTo(dealer, tcpEndpoint(coordinator.host, coordinator.port + 1));
    const ask = encodeAgentMessage({ requestId: 1, status: { protocolVersion: PROTOCOL_VERSION } });
    try {
      await dealer.send(token ? token.seal('to-coordinator', ask) : ask);
    } catch {
      throw new WavebusError('ERR_TIMEOUT', `could not send a status request to coordinator ${tcpEndpoint(coordinator.host, coordinator.port + 1)} within ${timeoutMs} ms`);
    }
    for (;;) {
      let parts: Buffer[];
      try {
        parts = await dealer.receive();
      } catch {
        throw new WavebusError('ERR_TIMEOUT', `no status reply from coordinator ${tcpEndpoint(coordinator.host, coordinator.port + 1)} within ${timeoutMs} ms`);
      }
      // With a token, only the coordinator that holds it is believed.
      const d = decodeCoordinatorMessage(parts[parts.length - 1], DEFAULT_MAX_FRAME_BYTES, token);
      if (!d.ok) continue;
      const m = d.value;
      if (m.body === 'refused') throw new ProtocolError(m.refused.error, 'ERR_PROTOCOL_VERSION');
      if (m.body !== 'status') continue;
      const v = Number(m.status.protocolVersion ?? 0);
      if (v !== PROTOCOL_VERSION) throw new ProtocolError(versionMismatch('coordinator', v, 'tool', PROTOCOL_VERSION), 'ERR_PROTOCOL_VERSION');
      return m.status as StatusReplyMsg;
    }
  } finally {
    dealer.close();
  }
}
