// Which pipeline stages copy a dump, per DP replica, by wave: dump.pp_stages of the config in force
// at the dump's copy wave. The stream hands each replica a config for the end of its vector's wave
// (the apply wave, the same on every rank of the replica); the dump ledger asks this schedule for
// the stages of every job it arms, so a switch of pp_stages and a dump armed in the same vector
// agree on every rank with no special case (docs/runtime-guard.md, "Pipeline stages").
import type { PpStages } from '../layout';

/** Config switches remembered per replica (a job is armed for the newest wave, so few are ever asked). */
const STAGE_HISTORY = 8;

export class StageSchedule {
  /** Per replica, pp_stages of each config by the wave it applies at, oldest first. */
  private readonly byReplica = new Map<number, { from: number; stages: PpStages }[]>();

  /**
   * A config with pp_stages `stages` applies on every rank of `replica` at the end of `applyWave`
   * (before that wave's copies). A later call for an apply wave at or before one already scheduled
   * replaces those (an engine that restarted its wave numbers).
   */
  configFrom(replica: number, applyWave: number, stages: PpStages): void {
    const list = (this.byReplica.get(replica) ?? []).filter((e) => e.from < applyWave);
    list.push({ from: applyWave, stages });
    this.byReplica.set(replica, list.slice(-STAGE_HISTORY));
  }

  /**
   * The stages of a dump of `replica` copied at the end of `wave`: those of the newest config that
   * applies at or before it; before any config, the seed's "last". A job is armed for the newest
   * vector only, so its copy wave is never before the apply wave of the config it follows, and every
   * stage it names had that config (and the job) from the stream before its engine reached the copy
   * wave (decideAheadWaves, src/bus/constants.ts).
   */
  stagesAt(replica: number, wave: number): PpStages {
    const list = this.byReplica.get(replica) ?? [];
    for (let i = list.length - 1; i >= 0; i--) if (list[i].from <= wave) return list[i].stages;
    return 'last';
  }
}
