// What the coordinator's stream tells an agent, as it arrives: a snapshot (the config in force,
// pending dump lanes, captures, the floor of the waves it covers) and each wave (its vector, config
// and dump lanes, captures). Both end in the vector published to the engine's mailbox; what is due
// at a wave's end is settled by wave-duties.ts (through the agent's settle: one path for every rank).
import type { Logger } from '../log';
import type { AgentConfig } from '../messages';
import type { SnapshotReplyMsg, WaveEvent } from '../bus/agent-bus';
import { WAVE_HISTORY, type WaveBook } from './wave-book';
import type { WaveDuties } from './wave-duties';
import type { LiveCaptures } from './live-captures';
import type { AgentRecorder } from './agent-recorder';
import type { VectorWrites } from './vector-writes';
import type { WaveTimeline } from './timeline';

export interface ArrivalDeps {
  log: Logger;
  duties: WaveDuties;
  waves: WaveBook;
  live: LiveCaptures;
  timeline: WaveTimeline;
  rec(): AgentRecorder | undefined;
  vectors(): VectorWrites | undefined;
  applyConfig(cfg: AgentConfig | null, where: string): void;
  /** The engine has ended every wave up to `upTo` (wave-duties.ts). */
  settle(upTo: number): void;
  publishFeatures(): void;
}

export class WaveArrivals {
  constructor(private readonly d: ArrivalDeps) {}

  onSnapshot(s: SnapshotReplyMsg): void {
    const d = this.d;
    d.log.debug({ epoch: s.epoch, seq: s.seq, wave: s.wave, decideAhead: s.decideAhead }, 'snapshot');
    // Checked by the bus (validDecideAhead): the coordinator's, the same for every rank of the job.
    d.duties.ahead = s.decideAhead;
    // The snapshot's config is the one in force now (configs it supersedes are dropped).
    d.duties.clearConfigs();
    d.applyConfig(s.config, 'SnapshotReply.config');
    d.live.add(s.captures);
    d.rec()?.arms(s.captures);
    d.live.seen(s.wave);
    d.vectors()?.setEpoch(s.epoch);
    const ended = d.waves.ended;
    // A lane of a wave already ended here was copied (its acks may still be on their way) or given up.
    for (const lane of s.pending) if (!ended.has(lane.wave)) d.duties.lanes.set(lane.wave, lane);
    // The snapshot covers the vectors published up to it (the last head's wave + decide_ahead):
    // their frames will never be delivered on their own, so the waves with a pending dump lane get
    // their vector now, and every other wave up to the last one is decided with nothing due (the
    // floor). A fresh coordinator (no head yet) has decided nothing, so nothing is due up to
    // the look-ahead: the engine's first wave ends at once.
    const last = s.wave + s.decideAhead;
    d.settle(d.duties.knownEnded(last));
    d.publishFeatures();
    for (const lane of s.pending) if (lane.wave <= last && !ended.has(lane.wave)) this.arrive(lane.wave, false, true);
    if (!d.waves.has(last)) this.arrive(last, false, d.duties.lanes.has(last), last + 1);
    else this.raiseFloor(last + 1);
  }

  onWave(w: WaveEvent): void {
    const d = this.d;
    const wave = w.head.wave;
    // Guarded: the log line's object would be built on every wave even with debug off.
    if (d.log.isLevelEnabled('debug')) d.log.debug({ wave, seq: w.head.seq, config: w.config?.version, dumps: w.dump?.jobs.map((j) => j.jobId) }, 'wave');
    if (w.dump) d.duties.lanes.set(wave, w.dump);
    d.live.seen(wave);
    if (w.head.captures?.length) {
      d.live.add(w.head.captures);
      d.rec()?.arms(w.head.captures);
    }
    // Every rank takes a config at the end of its wave, through settle(): a rank whose engine is off
    // the vector goes on it now (publishFeatures), before its engine reaches that wave.
    if (w.config) d.duties.addConfig(wave, w.config.config);
    // What is due in a wave the engine has already ended is settled at once (acked, applied).
    d.settle(d.duties.knownEnded(wave));
    if (d.live.changed() || w.config || w.dump) d.publishFeatures();
    // The newest vector: every wave up to it is decided (a skipped wave has nothing due).
    this.arrive(wave, w.head.configDue, w.head.dumpDue, wave + 1, w.head.snapshotDue);
  }

  /**
   * Wave `wave`'s vector is known: publish it to the engine (with the floor after it, when given)
   * and wake end_of_wave waiters.
   */
  private arrive(wave: number, configDue: boolean, dumpDue: boolean, floor?: number, snapshotDue = this.d.live.covers(wave)): void {
    const d = this.d;
    // Lanes-only: the host receiver writes this rank's vectors.
    d.vectors()?.publish({ wave, configDue, dumpDue, snapshotDue }, floor);
    d.timeline.record('vector', wave, d.timeline.now());
    d.waves.arrive(wave, floor);
    d.duties.forgetBefore(wave - WAVE_HISTORY);
  }

  private raiseFloor(floor: number): void {
    this.d.vectors()?.setFloor(floor);
    this.d.waves.setFloor(floor);
  }
}
