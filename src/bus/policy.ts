// What the coordinator asks of the logic that decides what is due (the runtime guard).
// The bus moves frames; the policy decides which lanes each wave carries.
import type { AgentConfig, DumpJob, DumpResult, StepTelemetry } from '../messages';

export interface DueLanes {
  /** A new effective config, applied by every rank at the end of this wave. */
  config?: { version: number; config: AgentConfig };
  /** Dump jobs armed for this wave, copied at its end by every last-PP TP rank. */
  dumps: DumpJob[];
}

export interface CoordinatorPolicy {
  /**
   * TP0 of the last PP stage began `wave`; `telemetry` is what it observed in the previous wave
   * (null when none was sent). Runs detectors, writes reports, arms dumps; returns the lanes due now.
   */
  onWaveHead(wave: number, telemetry: StepTelemetry | null): DueLanes;
  /** A rank acked (or failed) a dump job. */
  onDumpResult(result: DumpResult): void;
  /** Ranks that have not acked `jobId` when its ack timeout expired. */
  onDumpTimeout?(jobId: string, missingRanks: number[]): void;
  /** Merged into /healthz and StatusReply.status_json. */
  status(): Record<string, unknown>;
  /** What a (re)joining agent needs beyond the bus position. */
  snapshotState(): { configVersion: number; config: AgentConfig | null; manualDumpDone: number };
  /** Release timers, file watchers. */
  close?(): void;
}
