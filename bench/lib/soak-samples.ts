// What `bench soak` watches while it runs, beside its pass rule: each process's RSS sampled across
// the run (not only after warm-up and at the end: a leak that a GC or a trim hides at the end shows
// as a peak), and which agent holds each replica's host-receiver role (docs/bus.md, "One receiver
// per host"). The receiver writes every local rank's vectors, so its memory and CPU are not those of
// the other agents; a soak that reports agents without saying which one received says too little.
import * as fs from 'fs';
import { receiverLockPath } from '../../src/agent/host-receiver';

/** RSS in kB of a process (0 once it is gone: a death is counted elsewhere). */
export function rssKb(pid: number): number {
  try {
    return Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/**
 * The pid holding the flock on `file`, read from /proc/locks (the kernel's list, by device and
 * inode), or undefined when nobody holds it. The agent takes its role with flock(2), so the lock is
 * the truth of who receives, whatever the agents log.
 */
export function flockHolder(file: string, locks = '/proc/locks'): number | undefined {
  let ino: number;
  try {
    ino = fs.statSync(file).ino;
  } catch {
    return undefined;
  }
  let text: string;
  try {
    text = fs.readFileSync(locks, 'utf8');
  } catch {
    return undefined;
  }
  for (const line of text.split('\n')) {
    // "1: FLOCK  ADVISORY  WRITE 30835 fe:00:2171175 0 EOF" (a blocked waiter's line has "->")
    const f = line.trim().split(/\s+/);
    if (f[1] !== 'FLOCK' || f.includes('->')) continue;
    const dev = f[5]?.split(':');
    if (dev?.length === 3 && Number(dev[2]) === ino) return Number(f[4]);
  }
  return undefined;
}

export interface ReceiverSeen {
  replica: number;
  /** The global rank of the agent holding the role, or null when none held it then. */
  global_rank: number | null;
  wave: number;
}

/** RSS of every process every `every` waves of replica 0, and the receivers when sampled. */
export class SoakSamples {
  readonly waves: number[] = [];
  /** kB, one array per process: [coordinator, agent 0, agent 1, ...]. */
  readonly rss: number[][];
  readonly receivers: ReceiverSeen[] = [];

  constructor(
    private readonly pids: () => number[],
    private readonly runDir: string,
    private readonly dp: number,
    readonly every: number,
  ) {
    this.rss = pids().map(() => []);
  }

  /** Sample at `wave` when it is one of the sampled waves (or `force`). */
  take(wave: number, force = false): void {
    if (!force && wave % this.every !== 0) return;
    this.waves.push(wave);
    const pids = this.pids();
    pids.forEach((pid, i) => this.rss[i].push(rssKb(pid)));
    const agents = pids.slice(1);
    for (let r = 0; r < this.dp; r++) {
      const pid = flockHolder(receiverLockPath(this.runDir, r));
      const g = pid === undefined ? -1 : agents.indexOf(pid);
      const last = [...this.receivers].reverse().find((x) => x.replica === r);
      const now = g >= 0 ? g : null;
      // Listed when first seen and whenever the role moved: a move is an agent lost or restarted.
      if (!last || last.global_rank !== now) this.receivers.push({ replica: r, global_rank: now, wave });
    }
  }

  /** The JSON: the sampled waves, the coordinator's series, the receivers' and the other agents' peak series, in MB. */
  summary(receiverRanks: number[]): Record<string, unknown> {
    const mb = (kb: number) => +(kb / 1024).toFixed(1);
    const agents = this.rss.slice(1);
    const others = agents.filter((_, g) => !receiverRanks.includes(g));
    const peakAt = (i: number, series: number[][]) => Math.max(0, ...series.map((s) => s[i] ?? 0));
    const peakRatio = (s: number[]) => (s.length && s[0] > 0 ? +(Math.max(...s) / s[0]).toFixed(3) : null);
    return {
      every_waves: this.every,
      waves: this.waves,
      coordinator_mb: this.rss[0].map(mb),
      receivers_mb: receiverRanks.map((g) => ({ global_rank: g, mb: (agents[g] ?? []).map(mb) })),
      other_agents_max_mb: this.waves.map((_, i) => mb(peakAt(i, others))),
      // The highest sample over the first, per process: a peak the end sample would not show.
      peak_ratio_max: Math.max(0, ...this.rss.map((s) => peakRatio(s) ?? 0)),
      receivers: this.receivers,
    };
  }
}
