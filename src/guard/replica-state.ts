// The guard's state of one DP replica. Each replica steps on its own, with its own scheduler,
// step count and requests, so each has its own request table (request ids may repeat across
// replicas), telemetry slots and detector state, automatic-dump quota (the seed's guard runs in
// each engine process, i.e. per replica), manual-dump watermark and last wave. The config in
// force is the job's, one for every replica; each replica takes a new one at its own next head.
// Its copy window follows its armed dumps until its telemetry of their arm wave is in.
import type { RuntimeConfig } from './config';
import { DetectorSet } from './detectors';
import { AutoDumpQuota } from './quotas';
import { CopyWindow } from './copy-window';
import { RequestTable } from './requests';
import { StepPass } from './step-pass';

export class ReplicaState {
  readonly requests = new RequestTable();
  readonly pass = new StepPass();
  readonly autoQuota = new AutoDumpQuota();
  /** This replica's armed dumps whose request may still be freed before the copy (copy-window.ts). */
  readonly window = new CopyWindow();
  detectors: DetectorSet;
  /** The guard's detector generation `detectors` was built for (a new one restarts their state). */
  private detectorGen: number;
  unattributedNonFinite = 0;
  lastUnattributedLogWave = -1;
  lastWave = -1;
  /** Config version last published on this replica's stream (0: none yet). */
  configSent = 0;

  constructor(
    readonly replica: number,
    /** Global rank of the replica's head (last-PP TP0): the seed's report writer; goes into reports. */
    readonly headRank: number,
    /** The dump.manual_dump watermark this replica has served. */
    public manualDone: number,
    cfg: RuntimeConfig,
    gen: number,
  ) {
    this.detectors = new DetectorSet(cfg);
    this.detectorGen = gen;
  }

  /** New windows/thresholds (generation `gen`): a new, zeroed state slab under the same slots. */
  syncDetectors(cfg: RuntimeConfig, gen: number): void {
    if (gen === this.detectorGen) return;
    this.detectors = new DetectorSet(cfg);
    this.detectorGen = gen;
  }

  status(): Record<string, unknown> {
    return {
      wave: this.lastWave,
      head_rank: this.headRank,
      manual_dump_done: this.manualDone,
      auto_dumps_used: this.autoQuota.used,
      config_version: this.configSent,
      tracked_requests: this.requests.reqs.size,
      unattributed_non_finite: this.unattributedNonFinite,
      unbound_telemetry_rows: this.pass.unboundRows,
    };
  }
}
