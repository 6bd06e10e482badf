// Shared by `bench bus` and its bare floor (bus-bare.ts): every child process notes, per wave,
// one or more CLOCK_MONOTONIC times (process.hrtime.bigint(), shared by every process on one
// Linux machine) and sends them all in one message after the end wave, so nothing but the bus
// runs while waves are measured. Lines: `<rank>` then `<wave> <t0> [<t1> ...]`.
import { Pull, Push } from 'zeromq';
import { freePort } from '../../src/bus/ports';

export function percentile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * q))];
}

export const round = (x: number) => Math.round(x * 10) / 10;

/** { p50_us, p99_us } of `xs` (µs), rounded; xs is sorted in place. */
export function p50p99(xs: number[]): { p50_us: number; p99_us: number; n: number } {
  xs.sort((a, b) => a - b);
  return { p50_us: round(percentile(xs, 0.5)), p99_us: round(percentile(xs, 0.99)), n: xs.length };
}

/** rank → wave → the times that child noted for it. */
export type ReceiptTimes = Map<number, Map<number, bigint[]>>;

/** The parent's end: a PULL socket that gathers every child's receipts. */
export class Receipts {
  readonly times: ReceiptTimes = new Map();
  /** Ranks that said they are ready (bare children: after their first frame). */
  readonly ready = new Set<number>();
  private readonly pull = new Pull({ linger: 0 });
  private loop?: Promise<void>;
  port = 0;

  async start(): Promise<void> {
    this.port = await freePort();
    await this.pull.bind(`tcp://127.0.0.1:${this.port}`);
    this.loop = (async () => {
      for (;;) {
        let msg: Buffer[];
        try {
          msg = await this.pull.receive();
        } catch {
          return;
        }
        const [head, ...lines] = msg[0].toString().split('\n');
        if (head.startsWith('ready ')) {
          this.ready.add(Number(head.slice(6)));
          continue;
        }
        const mine = new Map<number, bigint[]>();
        for (const line of lines) {
          const [w, ...ts] = line.split(' ');
          mine.set(Number(w), ts.map((t) => BigInt(t)));
        }
        this.times.set(Number(head), mine);
      }
    })();
  }

  /** Wait until `n` children reported (or `ms` passed). */
  async waitFor(n: number, ms: number): Promise<void> {
    const until = Date.now() + ms;
    while (this.times.size < n && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
  }

  async close(): Promise<void> {
    this.pull.close();
    await this.loop;
  }
}

/** The child's end: note times per wave, send them all once. */
export class ReceiptLog {
  private readonly push = new Push({ linger: 0 });
  private readonly lines: string[] = [];

  constructor(private readonly rank: number, reportPort: number) {
    this.push.connect(`tcp://127.0.0.1:${reportPort}`);
  }

  note(wave: number, ...times: bigint[]): void {
    this.lines.push(`${wave} ${times.join(' ')}`);
  }

  ready(): void {
    void this.push.send(`ready ${this.rank}`);
  }

  flush(): Promise<void> {
    return this.push.send(`${this.rank}\n${this.lines.join('\n')}`);
  }

  close(): void {
    this.push.close();
  }
}

/**
 * Publish→last-receipt latency per wave (µs; index `index` of each child's times is the
 * receipt), over waves [from, to); a wave some child never noted is lost.
 */
export function lastReceipt(times: ReceiptTimes, published: Map<number, bigint>, from: number, to: number, n: number, index = 0): { lat: number[]; lost: number } {
  const lat: number[] = [];
  let lost = 0;
  for (let w = from; w < to; w++) {
    let last = -1n;
    let have = 0;
    for (const mine of times.values()) {
      const t = mine.get(w)?.[index];
      if (t === undefined) continue;
      have++;
      if (t > last) last = t;
    }
    if (have < n) lost++;
    else lat.push(Number(last - published.get(w)!) / 1000);
  }
  return { lat, lost };
}

/** Every child's `times[b] - ref(wave, times)` in µs, over waves [from, to): one hop's samples. */
export function hop(times: ReceiptTimes, from: number, to: number, ref: (wave: number, t: bigint[]) => bigint | undefined, b: number): number[] {
  const out: number[] = [];
  for (const mine of times.values()) {
    for (let w = from; w < to; w++) {
      const t = mine.get(w);
      const a = t && ref(w, t);
      if (t && a !== undefined && t[b] !== undefined) out.push(Number(t[b] - a) / 1000);
    }
  }
  return out;
}
