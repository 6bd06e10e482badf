// What an agent tells its engine is on: the mailbox's feature bits (the client reads them every
// step without a system call) and the hello's `Features` (proto), from the coordinator's config as
// this rank acts on it (runtime-view.ts), the replica's wake and what this agent runs.
import type { AgentBus } from '../bus/agent-bus';
import { WAKE } from '../bus/replica-wake';
import { MailboxFeature } from '../client/mailbox';
import type { RankIdentity } from '../layout';
import type { FlightRecorder } from './flight-recorder';
import type { RuntimeView } from './runtime-view';

export interface FeatureSources {
  identity: RankIdentity;
  view: () => RuntimeView;
  bus: () => AgentBus | undefined;
  /** A config or a dump job naming this rank is due (wave-duties.ts). */
  due: () => boolean;
  /** Input snapshots from the agent's start (a capturer). */
  snapshots: () => boolean;
  /** Their selection rules, for the client's pre-check (proto SnapshotSelection); undefined with snapshots off. */
  snapshotSelection: () => Record<string, unknown> | undefined;
  /** Input snapshots armed on the running job are in force (live-captures.ts). */
  liveCaptures: () => boolean;
  recorder: () => FlightRecorder | undefined;
  endOfWaveTimeoutMs: number;
}

/** The rank that heads its replica's wave stream (last-PP TP0, CP 0): it relays its engine's wave heads. */
export function headsStream(identity: RankIdentity): boolean {
  return identity.isLastPp && identity.tpRank === 0 && identity.cpRank === 0;
}

export class EngineFeatures {
  constructor(private readonly s: FeatureSources) {}

  /**
   * Whether this rank's engine reads the wave vector at end_of_wave: a last-PP rank always (dumps,
   * config); another stage with dump.pp_stages "all" (it copies its layers), and otherwise only
   * while a config or a job naming it is due (from the vector that carries it through its wave,
   * which the stream decides far enough ahead: decide_ahead). With nothing due there it costs
   * its engine nothing per step.
   */
  private get onVector(): boolean {
    return this.s.identity.isLastPp || this.s.view().ppStages === 'all' || this.s.due();
  }

  /**
   * This rank's engine reads the vector: the config puts the bus on, or the coordinator woke it for
   * something armed (wake ON, src/bus/replica-wake.ts); and the rank is on the vector at all.
   */
  get busOn(): boolean {
    const bus = this.s.bus();
    return (this.s.view().busActive || bus?.wake === WAKE.ON) && Boolean(bus) && this.onVector;
  }

  /** Wake HEADS: this rank heads its replica and something is armed there: its engine sends heads only. */
  get headsOnly(): boolean {
    return !this.busOn && headsStream(this.s.identity) && (this.s.bus()?.wake ?? WAKE.OFF) !== WAKE.OFF;
  }

  /** rank_divergence is on and this rank's digests are compared: a last-PP rank on the bus. */
  get digestsOn(): boolean {
    return Boolean(this.s.bus()) && this.s.identity.isLastPp && this.s.view().detectors.includes('rank_divergence');
  }

  /** The mailbox header's feature bits. */
  bits(): number {
    let bits = 0;
    if (this.busOn) bits |= MailboxFeature.BUS_ACTIVE;
    else if (this.headsOnly) bits |= MailboxFeature.HEADS;
    const view = this.s.view();
    if (view.hotReload) bits |= MailboxFeature.HOT_RELOAD;
    if (view.detectors.length > 0) bits |= MailboxFeature.DETECTORS;
    if (this.s.snapshots()) bits |= MailboxFeature.SNAPSHOTS;
    if (this.s.liveCaptures()) bits |= MailboxFeature.LIVE_CAPTURES;
    if (this.s.recorder()) bits |= MailboxFeature.RECORDER;
    if (this.digestsOn) bits |= MailboxFeature.RANK_DIGEST;
    return bits;
  }

  /** The hello answer's `features`. */
  hello(): Record<string, unknown> {
    const view = this.s.view();
    return {
      tp0: headsStream(this.s.identity),
      // The client sends heads while this is true: with the bus on, or woken (HEADS) on the head rank.
      bus: this.busOn || this.headsOnly,
      detectors: [...view.detectors],
      itemSync: view.itemSync,
      snapshots: this.s.snapshots(),
      endOfWaveTimeoutMs: this.s.endOfWaveTimeoutMs,
      recorderForwards: this.s.recorder()?.forwards ?? 0,
      snapshotSelection: this.s.snapshotSelection(),
    };
  }
}
