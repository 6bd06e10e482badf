// The simulated engine's stand-in for a TP group's collective: a real TP group is in lockstep,
// because every forward all-reduces across its ranks, so no rank's forward ends before every rank
// of its group reached it. The simulated ranks have no collective, so each step they meet here:
// every rank of the group tells every other "I reached step N" over a Unix socket (one 4-byte
// message per peer per step) and goes on once it has heard step N from all of them. Only the
// group's ranks on this host take part (a group spread over hosts is in lockstep per host).
import * as fs from 'fs';
import * as net from 'net';
import * as path from 'path';

const CONNECT_RETRY_MS = 10;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export function barrierSocketPath(dir: string, group: number, tpRank: number): string {
  return path.join(dir, `tp-g${group}-r${tpRank}.sock`);
}

export class TpBarrier {
  /** How many peers reached each step not yet passed here (each peer sends each step once, in order). */
  private readonly reached = new Map<number, number>();
  private waiting?: { step: number; resolve: () => void };
  /** A peer went away (it died or finished): nobody can be waited for any more. */
  private broken = false;

  private constructor(
    private readonly server: net.Server,
    private readonly out: net.Socket[],
    private readonly peers: number,
  ) {}

  /**
   * Listens on this rank's socket in `dir`, then connects to each peer's (they start in any order:
   * a socket not there yet is retried until `timeoutMs`). `peerTpRanks`: the other local ranks of the group.
   */
  static async open(dir: string, group: number, tpRank: number, peerTpRanks: number[], timeoutMs = 30000): Promise<TpBarrier> {
    const server = net.createServer();
    const barrier = new TpBarrier(server, [], peerTpRanks.length);
    server.on('connection', (s) => barrier.accept(s));
    const own = barrierSocketPath(dir, group, tpRank);
    fs.rmSync(own, { force: true });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(own, () => {
        server.off('error', reject);
        resolve();
      });
    });
    const deadline = Date.now() + timeoutMs;
    for (const peer of peerTpRanks) barrier.out.push(await connectRetrying(barrierSocketPath(dir, group, peer), deadline));
    return barrier;
  }

  private accept(s: net.Socket): void {
    let pending: Buffer = Buffer.alloc(0);
    s.on('data', (b: Buffer) => {
      pending = pending.length ? Buffer.concat([pending, b]) : b;
      let off = 0;
      for (; off + 4 <= pending.length; off += 4) this.note(pending.readUInt32LE(off));
      pending = pending.subarray(off);
    });
    s.on('error', () => undefined); // a peer that dies mid-write: 'close' follows
    s.on('close', () => this.breakUp());
  }

  private note(step: number): void {
    this.reached.set(step, (this.reached.get(step) ?? 0) + 1);
    this.release();
  }

  private release(): void {
    const w = this.waiting;
    if (w && (this.broken || (this.reached.get(w.step) ?? 0) >= this.peers)) {
      this.waiting = undefined;
      this.reached.delete(w.step);
      w.resolve();
    }
  }

  private breakUp(): void {
    this.broken = true;
    this.release();
  }

  /** This rank reached `step`: resolves once every peer has reached it too (at once without peers). */
  arrive(step: number): Promise<void> {
    if (this.peers === 0) return Promise.resolve();
    const msg = Buffer.allocUnsafe(4);
    msg.writeUInt32LE(step >>> 0, 0);
    for (const s of this.out) if (!s.destroyed) s.write(msg);
    return new Promise((resolve) => {
      this.waiting = { step, resolve };
      this.release();
    });
  }

  close(): void {
    for (const s of this.out) s.end();
    this.server.close();
  }
}

async function connectRetrying(p: string, deadline: number): Promise<net.Socket> {
  for (;;) {
    try {
      return await new Promise<net.Socket>((resolve, reject) => {
        const s = net.createConnection(p, () => {
          s.off('error', reject);
          s.on('error', () => undefined); // the peer went away: its 'close' on our inbound side tells us
          resolve(s);
        });
        s.once('error', reject);
      });
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if ((code !== 'ENOENT' && code !== 'ECONNREFUSED') || Date.now() > deadline) throw new Error(`TP barrier: cannot connect to ${p}: ${(e as Error).message}`);
      await sleep(CONNECT_RETRY_MS);
    }
  }
}
