// Free TCP ports on 127.0.0.1 for the bus (the coordinator binds PUB on P and ROUTER on P+1).
// Used by the demo, the benchmarks and (re-exported by test/helpers.ts) the tests. No unref():
// a CLI process awaiting only this probe would otherwise exit before it answers.
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

/** A base port P with P and P+1 both free on 127.0.0.1 (the bus binds PUB on P, ROUTER on P+1). */
export async function freePortPair(): Promise<number> {
  for (let i = 0; i < 50; i++) {
    const p = await freePort();
    if (p < 65534 && (await portFree(p + 1))) return p;
  }
  throw new Error('no free pair of adjacent ports on 127.0.0.1');
}
