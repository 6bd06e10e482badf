// Where the coordinator runs: whether the coordinator address is this host's (then node 0 binds
// it) and whether its bus ports are free, checked before anything is spawned.
import * as dns from 'dns';
import * as net from 'net';
import * as os from 'os';
import { ConfigError } from '../errors';
import { isLoopback } from '../bus/endpoints';
import { launchError } from './options';

function localAddresses(): Set<string> {
  const out = new Set<string>(['0.0.0.0', '::']);
  for (const list of Object.values(os.networkInterfaces())) for (const a of list ?? []) out.add(a.address);
  return out;
}

/**
 * The IP this host should bind the coordinator to, or undefined when `host` is not an address
 * of this host (the coordinator then runs elsewhere). libzmq binds IPs, not names.
 */
export async function localBindAddress(host: string): Promise<string | undefined> {
  const h = host.replace(/^\[|\]$/g, '');
  if (h === 'localhost') return '127.0.0.1';
  const locals = localAddresses();
  const isLocal = (ip: string) => isLoopback(ip) || locals.has(ip);
  if (net.isIP(h)) return isLocal(h) ? h : undefined;
  let addrs: dns.LookupAddress[];
  try {
    addrs = await dns.promises.lookup(h, { all: true });
  } catch (e) {
    throw launchError(`coordinator host ${JSON.stringify(host)} (from --master-addr / --coordinator) does not resolve: ${(e as Error).message}`);
  }
  const local = addrs.map((a) => a.address).filter(isLocal);
  return local.find((a) => !isLoopback(a)) ?? local[0];
}

/** Fail before spawning anything when the bus ports are taken (the coordinator would die on bind). */
export async function checkPortFree(host: string, port: number, role: string): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const s = net.createServer();
    s.once('error', (e: NodeJS.ErrnoException) => {
      if (e.code === 'EADDRINUSE') {
        reject(
          new ConfigError(
            `--port ${port - (role === 'ROUTER' ? 1 : 0)}: ${host}:${port} is already in use (the coordinator's ${role} socket needs it); ` +
              'pick another --port (or WAVEBUS_PORT), or stop what holds it',
            'ERR_PORT_IN_USE',
          ),
        );
      } else {
        reject(launchError(`cannot bind ${host}:${port} for the coordinator's ${role} socket: ${e.message}`));
      }
    });
    s.listen({ host, port, exclusive: true }, () => s.close(() => resolve()));
  });
}
