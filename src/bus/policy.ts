// What the coordinator asks of the logic that decides what is due (the runtime guard).
// The bus moves frames; the policy decides which lanes each wave of each replica carries.
import type { AgentConfig, DumpJob, DumpResult, StepTelemetry } from '../messages';
import type { DumpLedger } from '../guard/dump-ledger';
import type { FingerprintBook } from '../guard/fingerprint-diff';
import type { ReportVerdict } from '../guard/report-verdicts';

export interface DueLanes {
  /** A new effective config, applied by every rank of the replica at the end of the vector's wave (head + decideAheadWaves(pp), src/bus/constants.ts). */
  config?: { version: number; config: AgentConfig };
  /** Dump jobs armed for the vector's wave (head + decideAheadWaves(pp), src/bus/constants.ts), copied at its end by each job's ranks (its replica's). */
  dumps: DumpJob[];
}

export interface CoordinatorPolicy {
  /**
   * The head of `replica` (its last-PP TP0) began `wave` of that replica's stream; `telemetry` is
   * what it observed in the previous wave (null when none was sent). Runs detectors, writes
   * reports, arms dumps; returns the lanes of the vector published now on that replica's stream,
   * that of `vectorWave` (wave + the coordinator's decideAhead, src/bus/constants.ts; a caller
   * without a coordinator may leave it out: wave + decideAheadWaves(pp) at the default lookahead).
   */
  onWaveHead(replica: number, wave: number, telemetry: StepTelemetry | null, vectorWave?: number): DueLanes;
  /**
   * The dump ledger the policy arms through. The coordinator counts acks and timeouts in this
   * same object (one ledger); without one it keeps its own.
   */
  readonly ledger?: DumpLedger;
  /** Each rank's fingerprint; the coordinator stores what ranks send in this same book when given. */
  readonly fingerprints?: FingerprintBook;
  /** A rank acked (or failed) a dump job (already counted in the ledger). */
  onDumpResult?(result: DumpResult): void;
  /** Ranks that have not acked `jobId` when its ack timeout expired (already in the ledger). */
  onDumpTimeout?(jobId: string, missingRanks: number[]): void;
  /** An agent said hello (what it runs that the policy's records name: its flight recorder's K). */
  onAgentHello?(rank: number, hello: { recorderForwards: number }): void;
  /**
   * rank_divergence: a rank's digests of the waves its engine decided; `ask` fetches one rank's
   * token column of a wave from its agent, or with `inputs` the per-row digests of its forward's
   * inputs (only after a mismatch).
   */
  onRankDecisions?(rank: number, decisions: { wave: number; tokenCrc: number; rows: number; inputCrc: number; inputTokens: number; flags: number }[], ask: (rank: number, wave: number, inputs?: boolean) => Promise<{ column: Buffer | null; error?: string }>): void;
  /** A checked verdict note (docs/verdict.md): written into the incident report naming its flush; that report's path, or undefined when none does. */
  onVerdict?(v: ReportVerdict): string | undefined;
  /** Merged into /healthz and StatusReply.status_json. */
  status(): Record<string, unknown>;
  /** What a (re)joining agent of `replica` needs beyond its stream's position. */
  snapshotState(replica: number): { configVersion: number; config: AgentConfig | null; manualDumpDone: number };
  /** Release timers, file watchers. */
  close?(): void;
}
