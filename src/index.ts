// The public API of the `wavebus` package (`require('wavebus')`). Everything a user or an engine
// needs is named here; other modules are internal and may change.

// ---- in the engine: the client, and shared memory for regions it registers
export { WavebusClient, MailboxFeature } from './client';
export type { ClientRegion, ClientFeatures, ConnectOptions, EndOfWaveResult } from './client';
export type { StepTelemetry, RequestStep, NonFiniteRow, ForwardContext } from './messages';
export { ShmSegment, cudaAvailable } from './memory';

// ---- errors (each carries a stable `code`)
export { WavebusError, ConfigError, ProtocolError, CaptureError, NativeError } from './errors';
export { ArtifactFormatError } from './readers';
export { AggregateError } from './aggregate';
export { LaunchError } from './launcher';
export { CompareInputError } from './assemble';

// ---- the processes, for embedding them instead of running `wavebus launch`
export { Coordinator } from './bus/coordinator';
export { Agent } from './agent';
export { launch, parseLaunchOptions } from './launcher';
export type { LaunchOptions } from './launcher';

// ---- artifacts: write, read, verify, gather, compare
export { Tensor } from './tensor';
export type { DType } from './dtype';
export { writeNpy } from './npy';
export { writePt } from './pt';
export { writeSafetensors } from './safetensors';
export { readNpyHeader, readSafetensorsHeader, readPt } from './readers';
export { loadCallDir } from './snapshot/loader';
export type { LoadedCall, LoadedTensor } from './snapshot/loader';
export { inspectTree } from './inspect';
export type { InspectResult, BundleReport } from './inspect';
export { aggregate } from './aggregate';
export type { AggregateOptions } from './aggregate';
export { compareCaptures } from './compare';
export type { CompareOptions, CompareResult } from './compare';
