// rank_divergence: tensor-parallel ranks of one replica that decided different tokens in the same
// wave (docs/runtime-guard.md). Not on the native pass: every last-PP rank's engine writes a digest
// of its token column and of its forward's inputs into its decision ring, its agent sends them, and
// the coordinator compares them per replica and wave (src/guard/rank-compare.ts).
import { int, type DetectorCommon } from '../config-schema';
import type { DetectorSpec } from './spec';

export interface RankDivergenceConfig extends DetectorCommon {
  /**
   * Waves a replica's newest digest may run ahead of a wave before that wave is compared without
   * the ranks that have said nothing since (a frozen agent): they are "unknown", never "divergent".
   * A rank that reported a later wave but not this one is unknown at once.
   */
  grace_waves: number;
}

export const RANK_DIVERGENCE: DetectorSpec<'rank_divergence', RankDivergenceConfig> = {
  name: 'rank_divergence',
  params: { grace_waves: int(32, 1, 4096) },
};
