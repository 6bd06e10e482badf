// What a rank's agent owes the waves to come: the configs it applies and the dump lanes it copies,
// each at the end of the wave its vector named (the same wave on every rank of the replica), and
// the newest wave its engine is known to have ended. settle() is the one path by which every rank,
// of every stage, on the vector or off it, takes a config at its wave and gives up a job whose wave
// its engine has already ended (docs/runtime-guard.md, "Pipeline stages").
import type { Logger } from '../log';
import type { AgentConfig, DumpJob, DumpLane } from '../messages';

export interface DutyHooks {
  /** Apply a config now (`wave`: the one it applies at; `ended`: the engine's wave now). */
  apply(config: AgentConfig | null, wave: number, ended: number): void;
  /** Ack a job naming this rank for a wave its engine ended without copying it: wave_already_ended. */
  giveUp(job: DumpJob, wave: number, ended: number): void;
}

/**
 * The jobs among `jobs` that this rank copies: those naming it (the job carries its replica's dump
 * ranks; the stream is already this replica's). A job without ranks follows the seed's last-PP rule.
 */
export function jobsFor(rank: { globalRank: number; isLastPp: boolean }, jobs: DumpJob[]): DumpJob[] {
  const g = rank.globalRank;
  return jobs.filter((j) => (j.ranks && j.ranks.length > 0 ? j.ranks.includes(g) : rank.isLastPp));
}

/**
 * The hooks an agent registers: a config is applied through `applyConfig` (`where` names it in
 * log lines); a job given up is logged and acked through `ackGivenUp` (wave_already_ended, `why`
 * saying nothing was copied).
 */
export function agentDutyHooks(
  log: Logger,
  applyConfig: (config: AgentConfig | null, where: string) => void,
  ackGivenUp: (job: DumpJob, why: string) => void,
): DutyHooks {
  return {
    apply: (cfg, wave, ended) => {
      applyConfig(cfg, `ConfigLane.config of wave ${wave}`);
      if (wave !== ended) log.info({ wave, ended }, 'config applied after its wave ended here (the engine ran ahead of its vector)');
    },
    giveUp: (job, wave, ended) => {
      log.warn({ job_id: job.jobId, wave, ended }, 'dump job for a wave already ended here: acked wave_already_ended');
      ackGivenUp(job, `the engine had ended wave ${wave} (it was at wave ${ended}) before this rank had the job; nothing was copied`);
    },
  };
}

export class WaveDuties {
  /** Dump lanes by wave (every job of the wave: due-dump queries need them all), kept until settled. */
  readonly lanes = new Map<number, DumpLane>();
  private readonly configs = new Map<number, AgentConfig | null>();
  /** The wave the engine last ended as the agent knows it (its end_of_wave calls, missed ones included). */
  lastEnded = -1;

  constructor(
    /** A last-stage rank knows its engine's waves only from its calls; an earlier stage also from the stream. */
    private readonly isLastPp: boolean,
    /** How far ahead the stream decides: the coordinator's decide_ahead from each snapshot (src/bus/constants.ts). */
    public ahead: number,
    /** The jobs among these that this rank copies. */
    private readonly mine: (jobs: DumpJob[]) => DumpJob[],
    private readonly hooks: DutyHooks,
  ) {}

  addConfig(wave: number, config: AgentConfig | null): void {
    this.configs.set(wave, config);
  }

  /** A snapshot's config is the one in force: the configs it supersedes are dropped. */
  clearConfigs(): void {
    this.configs.clear();
  }

  /** A config or a job naming this rank is due in a wave not settled yet: the engine must read the vector. */
  get due(): boolean {
    if (this.configs.size > 0) return true;
    for (const lane of this.lanes.values()) if (this.mine(lane.jobs).length > 0) return true;
    return false;
  }

  /**
   * The newest wave this rank's engine has surely ended, given the newest vector `vectorWave`: the
   * one it last told, and for a stage before the last also what the stream shows: the head
   * published `vectorWave` at the start of wave vectorWave - ahead, so the last stage had ended the
   * one before, and an earlier stage, which works ahead of it in the pipeline, had too (one wave of
   * slack for a stage that lags its place). That catches an engine that went past a wave without
   * its agent (it ran further ahead of its head than the stream decides).
   */
  knownEnded(vectorWave: number): number {
    if (this.isLastPp) return this.lastEnded;
    return Math.max(this.lastEnded, vectorWave - this.ahead - 2);
  }

  /**
   * The engine has ended every wave up to `upTo`: the configs of those waves apply now (in order) and
   * the jobs naming this rank in those waves' lanes are given up (acked at once, so the manifest
   * says so for this rank instead of waiting for the ack timeout), except the lane of `copyAt` (the
   * wave whose end_of_wave runs now: the caller copies it, after its config applied). True when
   * anything changed (the rank's place on the vector may have).
   */
  settle(upTo: number, copyAt?: number): boolean {
    // Called on every wave: nothing to settle (the usual case) costs no copy and no sort.
    if (upTo < 0 || (this.configs.size === 0 && this.lanes.size === 0)) return false;
    let changed = false;
    for (const w of [...this.configs.keys()].sort((a, b) => a - b)) {
      if (w > upTo) break;
      const config = this.configs.get(w)!;
      this.configs.delete(w);
      this.hooks.apply(config, w, upTo);
      changed = true;
    }
    for (const [w, lane] of [...this.lanes]) {
      if (w > upTo || w === copyAt) continue;
      this.lanes.delete(w);
      for (const job of this.mine(lane.jobs)) this.hooks.giveUp(job, w, upTo);
      changed = true;
    }
    return changed;
  }

  /** Forget lanes far behind `wave` (bounded memory). */
  forgetBefore(wave: number): void {
    for (const k of this.lanes.keys()) if (k < wave) this.lanes.delete(k);
  }
}
