// The bus protocol's version, read from proto/wavebus.proto (enum ProtocolVersion), and the one
// way a mismatch is worded: both versions, and which side to upgrade.
import { enumValues } from '../proto';

const versions = enumValues('ProtocolVersion');

/** The protocol version this build speaks. */
export const PROTOCOL_VERSION: number = versions.PROTOCOL_VERSION_CURRENT;

const shown = (v: number) => (v ? `version ${v}` : 'no version (a release from before versions)');

/**
 * The refusal text: `peer` ("agent rank 3", "tool") sent `peerVersion`, `self` ("coordinator")
 * speaks `selfVersion`; the older side is the one to upgrade.
 */
export function versionMismatch(peer: string, peerVersion: number, self: string, selfVersion: number): string {
  const older = peerVersion < selfVersion ? peer : self;
  return `bus protocol mismatch: the ${peer} speaks ${shown(peerVersion)}, the ${self} ${shown(selfVersion)}; upgrade the ${older} so both speak the same version`;
}

/** The version a hello, status, relay or control request carries; undefined for messages that carry none. */
export function peerVersionOf(msg: { body?: string } & Record<string, any>): number | undefined {
  const carrier = msg.body === 'hello' ? msg.hello : msg.body === 'status' ? msg.status : msg.body === 'relay' ? msg.relay : msg.body === 'control' ? msg.control : undefined;
  return msg.body === 'hello' || msg.body === 'status' || msg.body === 'relay' || msg.body === 'control' ? Number(carrier?.protocolVersion ?? 0) : undefined;
}

export type GateResult = { action: 'ok' } | { action: 'refuse'; peerVersion: number; error: string } | { action: 'drop' };

/**
 * The coordinator's check of every hello and tool request. An agent connection whose Hello was
 * refused stays refused (its heartbeats, acks and snapshot asks are dropped) until it says Hello
 * again with this version: an old agent must not half-join (be live but unable to relay chunks).
 */
export class VersionGate {
  private readonly refusedConns: string[] = [];

  check(msg: { body?: string } & Record<string, any>, routingId: Buffer, rank: number): GateResult {
    const v = peerVersionOf(msg);
    // No refused connection (the usual case): every message but a mismatch is let through without naming its connection.
    if (this.refusedConns.length === 0 && (v === undefined || v === PROTOCOL_VERSION)) return { action: 'ok' };
    const conn = routingId.toString('hex');
    if (v === undefined) return this.refusedConns.includes(conn) ? { action: 'drop' } : { action: 'ok' };
    if (v === PROTOCOL_VERSION) {
      if (msg.body === 'hello') this.forget(conn);
      return { action: 'ok' };
    }
    if (msg.body === 'hello' && !this.refusedConns.includes(conn)) {
      this.refusedConns.push(conn);
      if (this.refusedConns.length > 256) this.refusedConns.shift();
    }
    const peer = msg.body === 'hello' ? `agent (rank ${rank})` : `tool (${msg.body} request)`;
    return { action: 'refuse', peerVersion: v, error: versionMismatch(peer, v, 'coordinator', PROTOCOL_VERSION) };
  }

  private forget(conn: string): void {
    const i = this.refusedConns.indexOf(conn);
    if (i >= 0) this.refusedConns.splice(i, 1);
  }
}
