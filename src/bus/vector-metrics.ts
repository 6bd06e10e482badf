// Late and missed wave vectors per rank, as each agent reports them in its heartbeats: an
// end_of_wave that had to wait for its vector (late, within the bound) or went on without it
// (missed, the bound ran out). Served on /metrics (gauges: the agent's counts since it started)
// and in /healthz, so a slow bus is never silent.
import { gauge } from '../metrics';

export interface VectorCounts {
  late: number;
  missed: number;
  /** Telemetry-ring steps the agent dropped as garbage (ring-heads.ts). */
  ringGarbage: number;
}

export class VectorMetrics {
  private readonly byRank = new Map<number, VectorCounts>();
  private readonly late = gauge('wavebus_late_vectors', 'end_of_wave calls that waited for a late wave vector (it came within the bound), per rank, since its agent started', ['rank'] as const);
  private readonly ringGarbage = gauge('wavebus_ring_garbage', 'telemetry-ring steps whose columns the agent dropped as garbage (torn write, row or token id out of range, bad counts), per rank, since its agent started', ['rank'] as const);
  private readonly missed = gauge('wavebus_missed_vectors', 'end_of_wave calls that went on without their wave vector (the bound ran out), per rank, since its agent started', ['rank'] as const);

  /** A heartbeat from `rank` (its counters; absent fields, as from an older agent, read 0). */
  note(rank: number, hb: { lateVectors?: number | Long; missedVectors?: number | Long; ringGarbage?: number | Long }): void {
    const c = { late: Number(hb.lateVectors ?? 0), missed: Number(hb.missedVectors ?? 0), ringGarbage: Number(hb.ringGarbage ?? 0) };
    if (![c.late, c.missed, c.ringGarbage].every((v) => Number.isSafeInteger(v) && v >= 0)) return;
    this.byRank.set(rank, c);
    this.late.set({ rank: String(rank) }, c.late);
    this.missed.set({ rank: String(rank) }, c.missed);
    this.ringGarbage.set({ rank: String(rank) }, c.ringGarbage);
  }

  /** For /healthz: { late: {rank: n}, missed: {rank: n}, ringGarbage: {rank: n} }. */
  status(): { late: Record<string, number>; missed: Record<string, number>; ringGarbage: Record<string, number> } {
    const late: Record<string, number> = {};
    const missed: Record<string, number> = {};
    const ringGarbage: Record<string, number> = {};
    for (const [rank, c] of [...this.byRank].sort((a, b) => a[0] - b[0])) {
      late[rank] = c.late;
      missed[rank] = c.missed;
      ringGarbage[rank] = c.ringGarbage;
    }
    return { late, missed, ringGarbage };
  }
}

type Long = { toNumber(): number };
