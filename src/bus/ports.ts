// Free TCP ports on 127.0.0.1 for the bus (the coordinator binds PUB on P and ROUTER on P+1).
// Used by the demo, the benchmarks and (re-exported by test/helpers.ts) the tests. No unref():
// a CLI process awaiting only this probe would otherwise exit before it answers.
import * as fs from 'fs';
import * as net from 'net';

/** A port the kernel reports free on 127.0.0.1 right now (it may be taken again before use). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

/** Whether `port` can be bound on 127.0.0.1 now. */
export function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

/** The kernel's ephemeral port range (the source ports of outgoing connections), Linux's default if unreadable. */
export function ephemeralPortRange(): [number, number] {
  try {
    const [lo, hi] = fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    if (Number.isInteger(lo) && Number.isInteger(hi) && lo > 0 && lo <= hi) return [lo, hi];
  } catch {
    /* not Linux: the default below */
  }
  return [32768, 60999];
}

/** Where freePortPair looks first: a base port is drawn from [PAIR_LOW, start of the ephemeral range). */
const PAIR_LOW = 20000;

/**
 * A base port P with P and P+1 both free on 127.0.0.1 (the bus binds PUB on P, ROUTER on P+1),
 * drawn below the kernel's ephemeral range: a port from that range can be taken between this
 * probe and the coordinator's bind by any outgoing connection's source port (srun's once took a
 * ROUTER's port; the agents' own connects to the not-yet-bound P+1 can as well). Where the range
 * leaves no room below it, the kernel's choice is used.
 */
export async function freePortPair(): Promise<number> {
  const [ephemeralLow] = ephemeralPortRange();
  const span = ephemeralLow - 1 - PAIR_LOW; // P + 1 stays below the range
  for (let i = 0; i < 200 && span > 0; i++) {
    const p = PAIR_LOW + Math.floor(Math.random() * span);
    if ((await portFree(p)) && (await portFree(p + 1))) return p;
  }
  for (let i = 0; i < 50; i++) {
    const p = await freePort();
    if (p < 65534 && (await portFree(p + 1))) return p;
  }
  throw new Error('no free pair of adjacent ports on 127.0.0.1');
}
