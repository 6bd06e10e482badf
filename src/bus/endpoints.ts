// Bus addresses: parsing HOST:PORT, building tcp:// endpoints, and the loopback rule
// (binding anything but loopback needs CURVE keys, or an explicit --insecure).
import { isIP } from 'net';
import { ConfigError } from '../errors';
import type { Logger } from '../log';

export interface HostPort {
  host: string;
  port: number;
}

/** Bus base port: PUB binds `port`, ROUTER binds `port + 1`, so both must be valid. */
export function parseBusPort(raw: unknown, flag = '--port'): number {
  const s = String(raw).trim();
  const n = /^\d+$/.test(s) ? Number(s) : NaN;
  if (!Number.isInteger(n) || n < 1 || n > 65534) {
    throw new ConfigError(`${flag}: expected a port number 1..65534 (the ROUTER uses port+1), got ${JSON.stringify(raw)}`);
  }
  return n;
}

/** Parse "HOST:PORT" or "[v6]:PORT"; `what` names the flag or variable for the error message. */
export function parseHostPort(raw: string, what = '--coordinator'): HostPort {
  const s = String(raw).trim();
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(s) ?? /^([^:\s]+):(\d+)$/.exec(s);
  if (!m || m[1] === '') {
    throw new ConfigError(`${what}: expected HOST:PORT (e.g. 127.0.0.1:29600), got ${JSON.stringify(raw)}`);
  }
  checkHost(m[1], what);
  return { host: m[1], port: parseBusPort(m[2], what) };
}

const HOST_NAME = /^[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?$/;

/** An IP literal or a host name; anything else would reach libzmq as a bare "Invalid argument". */
export function checkHost(host: string, what: string): void {
  const h = host.replace(/^\[|\]$/g, '');
  if (isIP(h) === 0 && (h.length > 253 || !HOST_NAME.test(h))) {
    throw new ConfigError(`${what}: ${JSON.stringify(host)} is not an IP address or a host name`);
  }
}

export function isLoopback(host: string): boolean {
  const h = host.trim().toLowerCase();
  return h === 'localhost' || h === '::1' || h === '[::1]' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h);
}

function isIpv6(host: string): boolean {
  return host.includes(':');
}

/** The endpoint string libzmq expects; "localhost" is pinned to 127.0.0.1 (libzmq binds IPs, not names). */
export function tcpEndpoint(host: string, port: number): string {
  const h = host === 'localhost' ? '127.0.0.1' : host.replace(/^\[|\]$/g, '');
  return isIpv6(h) ? `tcp://[${h}]:${port}` : `tcp://${h}:${port}`;
}

/** Socket options a tcp endpoint on this host needs (IPv6 is off by default in libzmq). */
export function socketIpOptions(host: string): { ipv6?: boolean } {
  return isIpv6(host.replace(/^\[|\]$/g, '')) ? { ipv6: true } : {};
}

/**
 * The loopback rule. Loopback always binds. Anything else needs CURVE keys (`curve`: PUB and
 * ROUTER are CURVE servers with an allow-list) or `insecure`, which binds in plain text and logs
 * a warning.
 */
export function checkBindAllowed(host: string, opts: { insecure: boolean; curve?: boolean; logger?: Logger; where?: string }): void {
  if (isLoopback(host) || opts.curve) return;
  if (!opts.insecure) {
    throw new ConfigError(
      `${opts.where ?? `--host ${host}`}: refusing to bind the bus to a non-loopback address without CURVE keys; ` +
        `pass --curve-secret-key FILE --curve-allow FILE|DIR (see docs/security.md), or --insecure to accept plain-text traffic that anyone who can reach ${host} can read and inject`,
      'ERR_INSECURE_BIND',
    );
  }
  opts.logger?.warn({ host }, 'binding the bus to a non-loopback address WITHOUT encryption or authentication (--insecure)');
}
