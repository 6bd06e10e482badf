// The public API of the `wavebus` package (`require('wavebus')`). Everything a user or an engine
// needs is named here; other modules are internal and may change.

// ---- in the engine: the client, and shared memory for regions it registers
export { WavebusClient, MailboxFeature } from './client/client';
export type { ClientRegion, ClientFeatures, ConnectOptions, EndOfWaveResult, WeightShard, HostWeight, SharedWeight, TensorBatch, TensorBatchOptions, TensorStep } from './client/client';
export type { StepTelemetry, RequestStep, NonFiniteRow, ForwardContext } from './messages';
export { ShmSegment, cudaAvailable } from './memory';

// ---- errors (each carries a stable `code`)
export { ERROR_CODES, isErrorCode, type ErrorCodeInfo } from './errors';
export {
  WavebusError,
  ConfigError,
  ProtocolError,
  CaptureError,
  NativeError,
  UnsafePathError,
  KvDirNameError,
  ArtifactFormatError,
  AggregateError,
  CompareInputError,
  JsoncError,
  LaunchError,
  RootRefusedError,
  ControlError,
} from './errors';

// ---- the processes, for embedding them instead of running `wavebus launch`
export { Coordinator } from './bus/coordinator';
export { Agent } from './agent/agent';
export { launch } from './launch/launcher';

// ---- fingerprints and hashed token ids (docs/fingerprints.md)
export { FingerprintBook, type FingerprintDiff, type DiffEntry } from './guard/fingerprint-diff';
export type { Fingerprint } from './guard/fingerprint';
export { TokenHasher } from './guard/token-hash';
export type { RecorderFlushListing } from './guard/recorder-listing';
export { parseLaunchOptions } from './launch/options';
export type { LaunchOptions } from './launch/options';

// ---- artifacts: write, read, verify, gather, compare
export { Tensor } from './artifacts/tensor';
export type { DType } from './artifacts/dtype';
export { writeNpy } from './artifacts/npy';
export { writePt } from './artifacts/pt';
export { writeSafetensors } from './artifacts/safetensors';
export { readNpyHeader } from './artifacts/npy-reader';
export { readSafetensorsHeader } from './artifacts/safetensors-reader';
export { readPt } from './artifacts/pt-reader';
export { loadCallDir } from './snapshot/loader';
export type { LoadedCall, LoadedTensor } from './snapshot/loader';
export { inspectTree } from './tools/inspect';
export type { InspectResult, BundleReport } from './tools/inspect';
export { aggregate } from './tools/aggregate';
export type { AggregateOptions } from './tools/aggregate';
export { compareCaptures } from './tools/compare';
export type { CompareOptions, CompareResult } from './tools/compare';
export { bisect } from './tools/bisect';
export type { BisectOptions, BisectResult } from './tools/bisect';
export { buildReport, writeReport } from './tools/report';
export type { ReportOptions } from './tools/report';
export type { RecorderFlush, CrashSummary } from './tools/report/recorder-section';
export { buildTrace, writeTrace } from './tools/trace';
export type { TraceEvent, TraceFile } from './tools/trace';
