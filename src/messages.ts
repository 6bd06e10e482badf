// TypeScript shapes of the decoded protobuf messages (proto/wavebus.proto), as `decode()` returns
// them: camelCase fields, 64-bit integers as numbers, defaults filled in.
import type { TelemetryColumns } from './client/telemetry';

export interface WaveHead {
  epoch: number;
  seq: number;
  wave: number;
  configDue: boolean;
  dumpDue: boolean;
}

export interface ConfigLane {
  wave: number;
  version: number;
  configJson: string;
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
