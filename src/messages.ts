// TypeScript shapes of the decoded protobuf messages (proto/wavebus.proto), as `decode()` returns
// them: camelCase fields, 64-bit integers as numbers, defaults filled in.

export interface WaveHead {
  epoch: number;
  seq: number;
  wave: number;
  configDue: boolean;
  dumpDue: boolean;
  /** A capture armed on the running job covers this wave (protocol 7): engines offer its forward. */
  snapshotDue?: boolean;
  /** Captures armed at this head (src/bus/capture-arms.ts CaptureArmMsg). */
  captures?: Array<Record<string, any>>;
}

/** proto AgentConfig: what every rank acts on from the runtime config (src/guard/agent-config.ts builds it). */
export interface AgentConfig {
  busActive: boolean;
  hotReload: boolean;
  /** The enabled detectors, by config name. */
  detectors: string[];
  itemSync: boolean;
  /** proto TensorFormat number (src/artifacts/tensor-format.ts maps it). */
  dumpFormat: number;
  freeHeadroomBytes: number;
  dumpRoot: string;
  /** dump.pp_stages is "all". */
  allPpStages: boolean;
  /** recorder.on: the flight recorder's triggers in force (src/guard/recorder-config.ts). */
  recorderOn: string[];
  /** recorder.forwards / max_bytes; 0: as the agent started (the ring is sized at startup only). */
  recorderForwards: number;
  recorderMaxBytes: number;
  /** proto SensitiveInfo number: report.save_sensitive_info (src/guard/recorder-config.ts maps it). */
  saveSensitiveInfo: number;
  /** verdict.auto / verdict.allow_live_device (docs/verdict.md "Automatically after an incident"). */
  verdictAuto: boolean;
  verdictAllowLiveDevice: boolean;
}

export interface ConfigLane {
  wave: number;
  version: number;
  /** null only when a peer sent a lane without one. */
  config: AgentConfig | null;
}

export interface DumpJob {
  incidentType: string;
  reqId: string;
  blockIds: number[];
  detectWave: number;
  armWave: number;
  dumpDir: string;
  requestFinishedAtDump: boolean;
  jobId: string;
  /** The DP replica that owns the request (0 in a job without DP). */
  replica: number;
  /** Global ranks that copy the job; the ledger's expected ranks (empty: the seed's last-PP rule). */
  ranks: number[];
}

export interface DumpLane {
  wave: number;
  jobs: DumpJob[];
}

export interface FileEntry {
  path: string;
  bytes: number;
  checksum: string;
}

export interface DumpResult {
  globalRank: number;
  jobId: string;
  wave: number;
  files: FileEntry[];
  bytes: number;
  error: string;
  skippedReason: string;
  /** The KV layers this rank copied (absent from older agents). */
  layers?: string[];
  /** This rank's flight recorder flush at the dump's wave (proto RecorderFlushAccount). */
  recorderFlush?: RecorderFlushAccount;
}

export interface RecorderFlushAccount {
  dir: string;
  forwards: number[];
  leftOut: number[];
  error: string;
}

export interface RequestStep {
  reqId: string;
  newTokenIds: number[];
  newTokenLogprobs: number[];
  newTokenRanks: number[];
  draftLen: number;
  accepted: number;
  blockIds: number[];
  finished: boolean;
  freed: boolean;
  promptLen: number;
  numOutputTokens: number;
  /** The prompt's token ids, if the engine has them (reports keep them with save_sensitive_info). */
  promptTokenIds?: number[];
}

export interface NonFiniteRow {
  row: number;
  reqId: string;
  kind: 'nan' | 'pos_inf' | 'neg_inf' | 'non_finite' | string;
}

// Step telemetry in columns (proto TelemetryColumns); client/telemetry.ts builds and reads them.
export interface SlotBinding {
  slot: number;
  reqId: string;
  promptLen: number;
  /** With the first binding of a request only, when the engine gave them. */
  promptTokenIds?: number[];
}

export interface SlotBlocks {
  slot: number;
  blockIds: number[];
}

export interface TelemetryColumns {
  rows: number;
  /** [rows] the request's slot. */
  slot: Uint32Array;
  /** [rows] new tokens this step, or empty: no tokens in this step's telemetry. */
  tokenCount: Uint32Array;
  /** [sum tokenCount] request by request. */
  tokenIds: Uint32Array;
  /** [tokenIds.length] or empty; NaN where a request had none. */
  tokenLogprobs: Float32Array;
  /** [tokenIds.length] or empty; 0 (argmax) where a request had none. */
  tokenRanks: Uint32Array;
  /** [rows] or empty (no speculative decoding). */
  draftLen: Uint32Array;
  accepted: Uint32Array;
  /** [rows] FLAG_FINISHED | FLAG_FREED (client/telemetry.ts). */
  flags: Uint8Array;
  /** [rows] or empty: the engine's count of output tokens (else the coordinator counts). */
  numOutputTokens: Uint32Array;
  /** Slots taken by a request this step. */
  bind: SlotBinding[];
  /** Slots whose block table changed this step. */
  blocks: SlotBlocks[];
}

export interface StepTelemetry {
  wave: number;
  /** Row form: one entry per running request (tests, older clients). */
  requests?: RequestStep[];
  nonFinite: NonFiniteRow[];
  /** Column form, as clients send it (see telemetry.ts). */
  columns?: TelemetryColumns | null;
}

export interface ForwardContext {
  compilationHash: string;
  globalStep: number;
  isPrompt: boolean;
  reqIds: string[];
  positions: number[];
  rowRequest: number[];
  numSpeculativeTokens: number;
  warmup: boolean;
}
