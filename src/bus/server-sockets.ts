// The coordinator's two server sockets, bound: PUB on port, ROUTER on port + 1, with CURVE (and
// its ZAP allow-list in a context of their own) when keys are given. Without CURVE but with the bus
// token, the PUB admits only PLAIN subscribers with the token's subscriber password (auth.ts):
// libzmq keeps every subscription a connected peer sends, without limit, so a peer must prove the
// token before it may send any. Bind failures become ConfigErrors that name the port and the flag
// to change.
import { Context, Publisher, Router } from 'zeromq';
import { ConfigError } from '../errors';
import type { Logger } from '../log';
import { counter } from '../metrics';
import { SUBSCRIBER_USER, type BusToken } from './auth';
import { MAX_PUB_INBOUND_BYTES } from './constants';
import { serverSocketOptions, ZAP_DOMAIN, type CurveServerKeys } from './curve';
import { ZapHandler } from './zap-handler';
import { socketIpOptions, tcpEndpoint } from './endpoints';

const refusalMetric = () => counter('wavebus_curve_refusals_total', 'Bus peers refused by CURVE/ZAP, by reason', ['reason'] as const);
const subscriberRefusalMetric = () =>
  counter('wavebus_subscriber_refusals_total', "Peers refused at the PUB's handshake on a plain-text bus with the token (no subscriber password), by reason", ['reason'] as const);

function isAddrInUse(e: unknown): boolean {
  const err = e as { code?: string; errno?: number; message?: string };
  return err?.code === 'EADDRINUSE' || /address already in use/i.test(String(err?.message ?? e));
}

export interface ServerSockets {
  pub: Publisher;
  router: Router;
  /** With CURVE: the ZAP handler (its refusal counts); stop() it after closing the sockets. */
  zap?: ZapHandler;
  /** Without CURVE, with the token: the PUB's ZAP handler (PLAIN subscribers); stop() it after closing the sockets. */
  subscriberZap?: ZapHandler;
}

export async function bindServerSockets(host: string, port: number, maxFrameBytes: number, curve: CurveServerKeys | undefined, log: Logger, token?: BusToken): Promise<ServerSockets> {
  const ip = socketIpOptions(host);
  // CURVE: an own context, so its ZAP handler (one per context) serves this allow-list only,
  // and is bound before either server socket can accept a peer.
  const context = curve ? new Context() : undefined;
  let zap: ZapHandler | undefined;
  if (context && curve) {
    zap = new ZapHandler(context, { curve: curve.allow }, log, (reason) => refusalMetric().inc({ reason }));
    await zap.start();
  }
  const sec = { ...(context ? { context } : {}), ...serverSocketOptions(curve) };
  // The token without CURVE: the PUB alone in a context whose ZAP handler wants the subscriber
  // password (the ROUTER has its own proof of the token: coordinator-link.ts).
  let subscriberZap: ZapHandler | undefined;
  let pubSec: Record<string, unknown> = sec;
  if (!curve && token) {
    const pubContext = new Context();
    subscriberZap = new ZapHandler(pubContext, { plain: { user: SUBSCRIBER_USER, password: token.subscriberPassword() } }, log, (reason) => subscriberRefusalMetric().inc({ reason }));
    await subscriberZap.start();
    pubSec = { context: pubContext, plainServer: true, zapDomain: ZAP_DOMAIN, zapEnforceDomain: true };
  }
  // sendTimeout 0: a PUB never blocks (beyond its high-water mark it drops), and zeromq.js then
  // sends inside send() every time, never a turn later (send-queue.ts, `immediate`).
  // maxMessageSize: a peer's subscription (or any message) beyond it is a protocol error and
  // libzmq drops the connection before anything is added to its topic trie.
  const pub = new Publisher({ linger: 0, sendTimeout: 0, sendHighWaterMark: 100000, maxMessageSize: MAX_PUB_INBOUND_BYTES, ...ip, ...pubSec });
  // libzmq cuts a peer off beyond maxMessageSize; up to it we drop and count ourselves.
  const router = new Router({ linger: 0, maxMessageSize: 2 * maxFrameBytes, ...ip, ...sec });
  if (zap) for (const s of [pub, router]) watchHandshakes(s, zap);
  if (subscriberZap) watchHandshakes(pub, subscriberZap);
  const bindOne = async (sock: Publisher | Router, p: number, what: string): Promise<void> => {
    const endpoint = tcpEndpoint(host, p);
    try {
      await sock.bind(endpoint);
    } catch (e) {
      if (isAddrInUse(e)) {
        throw new ConfigError(`port ${p} (${what} ${endpoint}) is already in use; pick another --port (the bus uses port and port+1)`, 'ERR_PORT_IN_USE');
      }
      throw new ConfigError(`cannot bind ${what} to ${endpoint} (--host ${host} --port ${port}): ${String((e as Error).message ?? e)}`, 'ERR_BIND');
    }
  };
  try {
    await bindOne(pub, port, 'PUB');
    await bindOne(router, port + 1, 'ROUTER');
  } catch (e) {
    pub.close();
    router.close();
    await zap?.stop();
    await subscriberZap?.stop();
    throw e;
  }
  return { pub, router, zap, subscriberZap };
}

/**
 * Count handshakes that fail before ZAP is asked: a wrong server key, a plain-text peer.
 * (ZAP refusals also raise an auth failure; the handler has counted those already.)
 */
export function watchHandshakes(sock: Publisher | Router, zap: ZapHandler): void {
  const failed = (e: { address?: string; error?: Error }) => zap.refuse('handshake_failed', { address: e.address, error: e.error?.message });
  sock.events.on('handshake:error:protocol', failed);
  sock.events.on('handshake:error:other', failed);
}
