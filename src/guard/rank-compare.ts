// rank_divergence on the coordinator (docs/runtime-guard.md): the digests every last-PP rank of a
// replica sent for each wave, compared once every such rank reported the wave or went past it
// without (its agent sends every wave its ring holds, oldest first, so a wave it skipped never
// comes), or once the replica's newest digest is grace_waves past it (a silent rank: a frozen
// agent). Ranks without the wave's digest are then "unknown", never "divergent". The comparison runs here, not on an agent, because only the coordinator hears
// every rank of a replica, remote hosts included, and it already holds the telemetry that maps a
// row to its request. A mismatch gives the groups of ranks that agree (tokens, and inputs).
import { replicaDumpRanks, type WorldLayout } from '../layout';
import { DECISION as FLAG, type Decision } from '../client/decision-layout';

/** Waves kept per replica before the oldest is dropped unsettled (a replica far ahead of a rank). */
const MAX_OPEN_WAVES = 64;

/** A rank's digests of one wave, as its agent read them from its decision ring and sent them (without the ring's input-row count). */
export type RankDecisionMsg = Omit<Decision, 'inputRows'>;

export interface RankGroup {
  ranks: number[];
  digest: string;
}

export interface Divergence {
  replica: number;
  wave: number;
  /** Ranks that agree on the token column, largest group first (one group: only the inputs differ). */
  tokenGroups: RankGroup[];
  /** The same by input digest; empty when a rank wrote none. */
  inputGroups: RankGroup[];
  /** true: the inputs already differed; false: the same inputs, different tokens; null: not known. */
  inputsDiffered: boolean | null;
  unknownRanks: number[];
}

export interface CompareCounts {
  agreed: number;
  diverged: number;
  /** Waves compared without every rank (some unknown). */
  partial: number;
  /** Waves with fewer than two known ranks: nothing to compare. */
  unknown: number;
}

function hex(n: number): string {
  return (n >>> 0).toString(16).padStart(8, '0');
}

function groupsBy(known: [number, RankDecisionMsg][], key: (d: RankDecisionMsg) => string): RankGroup[] {
  const m = new Map<string, number[]>();
  for (const [rank, d] of known) {
    const k = key(d);
    const g = m.get(k);
    if (g) g.push(rank);
    else m.set(k, [rank]);
  }
  return [...m.entries()]
    .map(([digest, ranks]) => ({ digest, ranks: ranks.sort((a, b) => a - b) }))
    .sort((a, b) => b.ranks.length - a.ranks.length || a.ranks[0] - b.ranks[0]);
}

class ReplicaDigests {
  readonly expected: number[];
  readonly waves = new Map<number, Map<number, RankDecisionMsg>>();
  newest = -1;
  /** Per rank: the newest wave it reported. */
  readonly rankNewest = new Map<number, number>();
  readonly counts: CompareCounts = { agreed: 0, diverged: 0, partial: 0, unknown: 0 };
  /** Per rank: waves that rank never reported by the time they were compared. */
  readonly unknownByRank = new Map<number, number>();

  constructor(readonly replica: number, layout: WorldLayout) {
    this.expected = replicaDumpRanks(layout, replica, 'last');
  }
}

export class RankCompare {
  private readonly replicas: ReplicaDigests[];
  private readonly replicaOfRank = new Map<number, ReplicaDigests>();

  constructor(layout: WorldLayout) {
    this.replicas = Array.from({ length: layout.dp }, (_, r) => new ReplicaDigests(r, layout));
    for (const rd of this.replicas) for (const g of rd.expected) this.replicaOfRank.set(g, rd);
  }

  /** Whether `rank`'s digests are compared (a last-PP rank). */
  compares(rank: number): boolean {
    return this.replicaOfRank.has(rank);
  }

  /**
   * `rank` reported these waves; returns the divergences of every wave now settled. A rank outside
   * the last PP stage, a wave already compared, or a repeated report is ignored.
   */
  add(rank: number, decisions: RankDecisionMsg[], graceWaves: number): Divergence[] {
    const rd = this.replicaOfRank.get(rank);
    if (!rd) return [];
    for (const d of decisions) {
      const wave = Number(d.wave);
      if (!Number.isSafeInteger(wave) || wave < 0) continue;
      // An engine that numbers its waves again from below (a restart): start over.
      if (wave + MAX_OPEN_WAVES < rd.newest) {
        rd.waves.clear();
        rd.rankNewest.clear();
        rd.newest = -1;
      }
      if (wave + graceWaves <= rd.newest && !rd.waves.has(wave)) continue; // settled already
      let m = rd.waves.get(wave);
      if (!m) rd.waves.set(wave, (m = new Map()));
      if (!m.has(rank)) m.set(rank, { wave, tokenCrc: d.tokenCrc >>> 0, rows: d.rows >>> 0, inputCrc: d.inputCrc >>> 0, inputTokens: d.inputTokens >>> 0, flags: d.flags >>> 0 });
      if (wave > rd.newest) rd.newest = wave;
      if (wave > (rd.rankNewest.get(rank) ?? -1)) rd.rankNewest.set(rank, wave);
    }
    return this.settle(rd, graceWaves);
  }

  private settle(rd: ReplicaDigests, graceWaves: number): Divergence[] {
    const out: Divergence[] = [];
    const waves = [...rd.waves.keys()].sort((a, b) => a - b);
    for (const wave of waves) {
      const m = rd.waves.get(wave)!;
      const whole = rd.expected.every((g) => m.has(g) || (rd.rankNewest.get(g) ?? -1) > wave);
      const due = whole || wave + graceWaves <= rd.newest || rd.waves.size > MAX_OPEN_WAVES;
      if (!due) continue;
      rd.waves.delete(wave);
      const d = this.compare(rd, wave, m);
      if (d) out.push(d);
    }
    return out;
  }

  private compare(rd: ReplicaDigests, wave: number, m: Map<number, RankDecisionMsg>): Divergence | null {
    const known = rd.expected.filter((g) => m.has(g)).map((g) => [g, m.get(g)!] as [number, RankDecisionMsg]);
    const unknownRanks = rd.expected.filter((g) => !m.has(g));
    for (const g of unknownRanks) rd.unknownByRank.set(g, (rd.unknownByRank.get(g) ?? 0) + 1);
    if (known.length < 2) {
      rd.counts.unknown++;
      return null;
    }
    if (unknownRanks.length > 0) rd.counts.partial++;
    const tokenGroups = groupsBy(known, (d) => `${hex(d.tokenCrc)}/${d.rows}`);
    const withInputs = known.every(([, d]) => (d.flags & FLAG.flagInputs) !== 0);
    const inputGroups = withInputs ? groupsBy(known, (d) => `${hex(d.inputCrc)}/${d.inputTokens}`) : [];
    // Inputs that differ are a divergence even when this wave's tokens happen to agree: the KV
    // written from them differs, and the next waves' tokens follow.
    if (tokenGroups.length === 1 && inputGroups.length <= 1) {
      rd.counts.agreed++;
      return null;
    }
    rd.counts.diverged++;
    return { replica: rd.replica, wave, tokenGroups, inputGroups, inputsDiffered: withInputs ? inputGroups.length > 1 : null, unknownRanks };
  }

  status(): Record<string, unknown> {
    return Object.fromEntries(
      this.replicas.map((rd) => [
        String(rd.replica),
        // waves_with_unknown: waves settled without some rank's digest (partial + unknown): those
        // ranks were not compared there, which is no divergence and no agreement either.
        { ...rd.counts, waves_with_unknown: rd.counts.partial + rd.counts.unknown, newest_wave: rd.newest, open_waves: rd.waves.size, unknown_by_rank: Object.fromEntries(rd.unknownByRank) },
      ]),
    );
  }

  /** The counts of every replica (for /metrics). */
  counts(): { replica: number; counts: CompareCounts; unknownByRank: Map<number, number> }[] {
    return this.replicas.map((rd) => ({ replica: rd.replica, counts: rd.counts, unknownByRank: rd.unknownByRank }));
  }
}

/** The first row where `other` differs from `ref` (int32 columns), or the shorter length when one is a prefix; null when equal. */
export function firstDifferingRow(ref: Int32Array, other: Int32Array): number | null {
  const n = Math.min(ref.length, other.length);
  for (let i = 0; i < n; i++) if (ref[i] !== other[i]) return i;
  return ref.length === other.length ? null : n;
}
