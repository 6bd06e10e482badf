// The floor for `bench bus`: a bare zeromq.js PUB to N SUB processes (real child processes, like
// the agents) that only note receipt time. No protobuf, no MAC, no Clone-pattern bookkeeping, no
// mailbox: the frame is a one-letter topic and the wave as 8 bytes. Same socket options and the
// same receive loop (one awaited receive() per message) as the agents' SUB.
import { spawn, type ChildProcess } from 'child_process';
import { Publisher, Subscriber } from 'zeromq';
import { freePort } from '../../src/bus/ports';
import { ReceiptLog, Receipts } from './bus-receipts';

export interface BareRun {
  receipts: Receipts;
  /** wave → publish time (before send). */
  published: Map<number, bigint>;
  /** wave → time the send call returned. */
  sent: Map<number, bigint>;
}

/** Publish waves 1..endWave every `pace` ms to `n` bare subscribers; their receipts in `receipts`. */
export async function bareBus(n: number, endWave: number, pace: number): Promise<BareRun> {
  const port = await freePort();
  const pub = new Publisher({ linger: 0, sendHighWaterMark: 100000 });
  await pub.bind(`tcp://127.0.0.1:${port}`);
  const receipts = new Receipts();
  await receipts.start();
  const children: ChildProcess[] = [];
  for (let r = 0; r < n; r++) {
    children.push(spawn(process.execPath, [__filename, '--bare-child', String(r), String(port), String(receipts.port), String(endWave)], { stdio: ['ignore', 'ignore', 'inherit'] }));
  }
  const published = new Map<number, bigint>();
  const sent = new Map<number, bigint>();
  try {
    // Readiness: heartbeats until every child has seen one (a SUB misses what precedes its join).
    const deadline = Date.now() + 60000;
    while (receipts.ready.size < n) {
      if (Date.now() > deadline) throw new Error(`bench bus (bare): subscribers not ready after 60 s (${receipts.ready.size} of ${n})`);
      await pub.send(['H', Buffer.alloc(8)]);
      await new Promise((r) => setTimeout(r, 20));
    }
    for (let w = 1; w <= endWave; w++) {
      const body = Buffer.allocUnsafe(8);
      body.writeBigUInt64BE(BigInt(w));
      published.set(w, process.hrtime.bigint());
      await pub.send(['W', body]);
      sent.set(w, process.hrtime.bigint());
      await new Promise((r) => setTimeout(r, pace));
    }
    await receipts.waitFor(n, 10000);
  } finally {
    for (const c of children) c.kill('SIGTERM');
    await Promise.all(children.map((c) => (c.exitCode !== null ? null : new Promise((r) => c.once('exit', r)))));
    pub.close();
    await receipts.close();
  }
  return { receipts, published, sent };
}

async function bareChild(rank: number, port: number, reportPort: number, endWave: number): Promise<void> {
  const sub = new Subscriber({ linger: 0, receiveHighWaterMark: 100000 });
  sub.subscribe();
  sub.connect(`tcp://127.0.0.1:${port}`);
  const log = new ReceiptLog(rank, reportPort);
  let ready = false;
  const stop = () => {
    sub.close();
    log.close();
    process.exit(0);
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  while (!sub.closed) {
    let parts: Buffer[];
    try {
      parts = await sub.receive();
    } catch {
      return;
    }
    const t = process.hrtime.bigint();
    if (!ready) {
      ready = true;
      log.ready();
    }
    if (parts[0][0] !== 0x57 /* 'W' */) continue;
    const wave = Number(parts[1].readBigUInt64BE(0));
    log.note(wave, t);
    if (wave >= endWave) await log.flush();
  }
}

if (require.main === module && process.argv[2] === '--bare-child') {
  const [rank, port, reportPort, endWave] = process.argv.slice(3).map(Number);
  bareChild(rank, port, reportPort, endWave).catch((e) => {
    process.stderr.write(`bench bare subscriber ${rank}: ${String(e)}\n`);
    process.exit(1);
  });
}
