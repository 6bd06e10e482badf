// The coordinator's fingerprints, one per rank (the latest it sent), and what an incident report
// carries of them: `fingerprint_diff`, what differs between ranks that should agree. Every rank
// should agree on versions, the device and the allow-listed environment; the ranks holding the
// same shard (the same PP stage, TP and CP rank, across DP replicas) on each weight's checksum.
import { rankCoordinates, type WorldLayout } from '../layout';
import { sanitizeFingerprint, VERSION_FIELDS, type Fingerprint } from './fingerprint';

export interface DiffValue {
  /** The value on these ranks; null: the ranks lack it (an env variable unset, a weight not registered). */
  value: string | null;
  ranks: number[];
}

export interface DiffEntry {
  kind: 'version' | 'env' | 'weight';
  /** The field (`torch_version`), the variable (`NCCL_ALGO`) or the weight shard's name. */
  name: string;
  /** Which ranks should agree: "all" or, for a weight, "pp<p>_tp<t>_cp<c>". */
  among: string;
  values: DiffValue[];
}

export interface FingerprintDiff {
  /** Ranks whose fingerprint the coordinator has. */
  ranks: number[];
  differences: DiffEntry[];
}

/** What a redacted variable compares as: present or not, never its value. */
const REDACTED = '<redacted>';

/** One entry per distinct value, ranks in order; undefined when every rank agrees. */
function disagreement(kind: DiffEntry['kind'], name: string, among: string, byRank: [number, string | null][]): DiffEntry | undefined {
  const groups = new Map<string | null, number[]>();
  for (const [rank, v] of byRank) groups.set(v, [...(groups.get(v) ?? []), rank]);
  if (groups.size < 2) return undefined;
  const values = [...groups.entries()].map(([value, ranks]) => ({ value, ranks })).sort((a, b) => a.ranks[0] - b.ranks[0]);
  return { kind, name, among, values };
}

export class FingerprintBook {
  private readonly byRank = new Map<number, Fingerprint>();
  /** The last diff, until a fingerprint comes in: a burst of reports computes it once. */
  private cached: FingerprintDiff | null = null;

  constructor(private readonly layout: WorldLayout) {}

  /** The fingerprint `rank` sent (anything: cut to local limits here). Ranks outside the layout are ignored. */
  set(rank: number, raw: unknown): boolean {
    if (!Number.isInteger(rank) || rank < 0 || rank >= this.layout.worldSize) return false;
    this.byRank.set(rank, sanitizeFingerprint(raw));
    this.cached = null;
    return true;
  }

  get(rank: number): Fingerprint | undefined {
    return this.byRank.get(rank);
  }

  get size(): number {
    return this.byRank.size;
  }

  /** What differs now (a fresh copy: a report may keep it). */
  diff(): FingerprintDiff {
    this.cached ??= this.compute();
    return structuredClone(this.cached);
  }

  private compute(): FingerprintDiff {
    const ranks = [...this.byRank.keys()].sort((a, b) => a - b);
    const fps = ranks.map((r) => [r, this.byRank.get(r)!] as const);
    const differences: DiffEntry[] = [];
    const push = (d: DiffEntry | undefined) => d && differences.push(d);
    for (const [k, field] of VERSION_FIELDS) push(disagreement('version', field, 'all', fps.map(([r, fp]) => [r, fp[k]])));
    const envs = fps.map(([r, fp]) => [r, new Map(fp.env.map((e) => [e.name, e.redacted ? REDACTED : e.value]))] as const);
    const envNames = new Set(fps.flatMap(([, fp]) => fp.env.map((e) => e.name)));
    for (const name of [...envNames].sort()) push(disagreement('env', name, 'all', envs.map(([r, m]) => [r, m.get(name) ?? null])));
    // Weights: the ranks of one shard position across DP replicas, each that registered any weight.
    const shards = new Map<string, [number, Fingerprint][]>();
    for (const [r, fp] of fps) {
      if (fp.weights.length === 0) continue;
      const c = rankCoordinates(r, this.layout);
      const key = `pp${c.ppRank}_tp${c.tpRank}_cp${c.cpRank}`;
      shards.set(key, [...(shards.get(key) ?? []), [r, fp]]);
    }
    for (const [among, members] of [...shards.entries()].sort()) {
      if (members.length < 2) continue;
      const sums = members.map(([r, fp]) => [r, new Map(fp.weights.map((w) => [w.name, w.checksum]))] as const);
      const names = new Set(members.flatMap(([, fp]) => fp.weights.map((w) => w.name)));
      for (const name of [...names].sort()) push(disagreement('weight', name, among, sums.map(([r, m]) => [r, m.get(name) ?? null])));
    }
    return { ranks, differences };
  }

  /** For /healthz: how many ranks sent one, and what differs now (names only). */
  status(): Record<string, unknown> {
    const d = this.diff();
    return { ranks: d.ranks, differences: d.differences.map((e) => `${e.kind}:${e.name}${e.among === 'all' ? '' : `@${e.among}`}`) };
  }
}
