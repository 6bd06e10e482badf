// The job layout: how many ranks, how they split into TP/PP/DP/CP groups, and where a global
// rank sits in them. Ground floor: it imports only the errors, so the bus, the guard, the agent,
// the engine client and the tools can all use it without reaching the launcher or the CLI.
// Resolving this process's identity from flags, torchrun or Slurm is src/launch/identity.ts.
//
// Rank order is vLLM's, TP fastest:
//   global = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank
import { ConfigError } from './errors';

export interface WorldLayout {
  worldSize: number;
  tp: number;
  pp: number;
  dp: number;
  cp: number;
}

export interface RankIdentity extends WorldLayout {
  globalRank: number;
  localRank: number;
  localWorldSize: number;
  nodeRank: number;
  masterAddr: string;
  tpRank: number;
  ppRank: number;
  dpRank: number;
  cpRank: number;
  isLastPp: boolean;
  host: string;
}

/** The code of every layout and identity error. */
export const CODE = 'ERR_IDENTITY';

/** A ConfigError with the identity code (bad sizes, a rank outside the layout). */
export function identityError(message: string): ConfigError {
  return new ConfigError(message, CODE);
}

/**
 * The largest world wavebus serves. The coordinator keeps per-rank state and lists; a made-up
 * world of 10^8 ranks would have it grow by gigabytes before it ever started.
 */
export const MAX_WORLD_SIZE = 65536;

/** `layout`, unless its world is over MAX_WORLD_SIZE (the error names where the size came from). */
export function boundedLayout(layout: WorldLayout, from: string): WorldLayout {
  if (layout.worldSize > MAX_WORLD_SIZE) {
    throw identityError(`${from}=${layout.worldSize} is over the largest world wavebus serves, ${MAX_WORLD_SIZE} ranks (MAX_WORLD_SIZE)`);
  }
  return layout;
}

/** TP/PP/DP/CP coordinates of a global rank (TP fastest, then CP, then PP, then DP). */
export function rankCoordinates(
  globalRank: number,
  layout: WorldLayout,
): { tpRank: number; ppRank: number; dpRank: number; cpRank: number; isLastPp: boolean } {
  const { tp, pp, dp, cp } = layout;
  if (!Number.isInteger(globalRank) || globalRank < 0 || globalRank >= tp * pp * dp * cp) {
    throw identityError(`global rank ${globalRank} is outside the layout tp(${tp})*pp(${pp})*dp(${dp})*cp(${cp})=${tp * pp * dp * cp}`);
  }
  const tpRank = globalRank % tp;
  const cpRank = Math.floor(globalRank / tp) % cp;
  const ppRank = Math.floor(globalRank / (tp * cp)) % pp;
  const dpRank = Math.floor(globalRank / (tp * cp * pp));
  return { tpRank, ppRank, dpRank, cpRank, isLastPp: ppRank === pp - 1 };
}

/** Global rank of the given coordinates (the inverse of rankCoordinates). */
export function globalRankOf(c: { tpRank: number; ppRank: number; dpRank: number; cpRank: number }, layout: WorldLayout): number {
  return ((c.dpRank * layout.pp + c.ppRank) * layout.cp + c.cpRank) * layout.tp + c.tpRank;
}

/** Every global rank of the last pipeline stage, ascending: the ranks that join the bus and dump KV. */
export function lastPpRanks(layout: WorldLayout): number[] {
  const out: number[] = [];
  const world = layout.tp * layout.pp * layout.dp * layout.cp;
  for (let g = 0; g < world; g++) if (rankCoordinates(g, layout).isLastPp) out.push(g);
  return out;
}

/** dump.pp_stages: which pipeline stages copy a dump (the seed: the last one). */
export const PP_STAGES = ['last', 'all'] as const;
export type PpStages = (typeof PP_STAGES)[number];

/** The DP replica (dp rank) of a global rank: derived from the layout, never from what a peer claims. */
export function replicaOf(globalRank: number, layout: WorldLayout): number {
  return rankCoordinates(globalRank, layout).dpRank;
}

/** The rank that heads a replica's wave stream: its last-PP TP0 (CP rank 0). */
export function replicaHead(layout: WorldLayout, replica: number): number {
  return globalRankOf({ dpRank: replica, ppRank: layout.pp - 1, cpRank: 0, tpRank: 0 }, layout);
}

/**
 * The ranks of one replica that copy its dump jobs, ascending: its last-PP TP (and CP) ranks, or
 * with pp_stages "all" every stage's.
 */
export function replicaDumpRanks(layout: WorldLayout, replica: number, ppStages: PpStages = 'last'): number[] {
  const out: number[] = [];
  for (let pp = ppStages === 'all' ? 0 : layout.pp - 1; pp < layout.pp; pp++) {
    for (let cp = 0; cp < layout.cp; cp++) for (let tp = 0; tp < layout.tp; tp++) out.push(globalRankOf({ dpRank: replica, ppRank: pp, cpRank: cp, tpRank: tp }, layout));
  }
  return out.sort((a, b) => a - b);
}

/** Fields of proto message wavebus.RankIdentity (camelCase, as protobufjs fromObject takes them). */
export function identityToProto(id: RankIdentity): Record<string, unknown> {
  return {
    globalRank: id.globalRank,
    localRank: id.localRank,
    worldSize: id.worldSize,
    localWorldSize: id.localWorldSize,
    nodeRank: id.nodeRank,
    tpRank: id.tpRank,
    ppRank: id.ppRank,
    dpRank: id.dpRank,
    cpRank: id.cpRank,
    tpSize: id.tp,
    ppSize: id.pp,
    dpSize: id.dp,
    cpSize: id.cp,
    isLastPp: id.isLastPp,
    host: id.host,
    pid: process.pid,
  };
}
