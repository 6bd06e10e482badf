// What an agent is started with (the `agent` command's flags, a test's or the simulated job's choices).
import type { ArtifactModes } from '../artifacts/artifact-mode';
import type { BusToken } from '../bus/auth';
import type { AgentBusOptions } from '../bus/agent-bus-types';
import type { TokenHasher } from '../guard/token-hash';
import type { RankIdentity } from '../layout';
import type { Logger } from '../log';
import type { SnapshotConfig } from '../snapshot/config';
import type { DirectFilesSettings } from './direct-files';
import type { RecorderSettings } from './recorder-ring';
import type { LocalRoots } from './roots';

export interface AgentOptions {
  identity: RankIdentity;
  runDir: string;
  /** Coordinator bus address; absent for ranks that are not on the bus. */
  coordinator?: { host: string; port: number };
  heartbeatMs?: number;
  /** How long end_of_wave may wait for a wave vector that has not arrived. */
  endOfWaveTimeoutMs?: number;
  stagingBytes?: number;
  /** Pinned chunk each CUDA region bounces device → host copies through (default 8 MiB). */
  cudaStagingBytes?: number;
  snapshot?: SnapshotConfig;
  /**
   * This host's roots (--dump-root, the snapshot cache root): the agent writes bundles and serves
   * files only under them. A dump root from the bus may only narrow `dumps` (agent/roots.ts).
   */
  roots?: LocalRoots;
  logger?: Logger;
  /** Test / fault-injection hook passed to the bus. */
  dropSeqs?: (seq: number) => boolean;
  /** CURVE client keys for the bus (see src/bus/curve.ts). */
  curve?: { serverPublicKey: string; publicKey: string; secretKey: string };
  /** The files those keys came from (--curve-server-key, --curve-key), for verdict.auto's CLI. */
  curveFiles?: { serverKey: string; key: string };
  /** The launcher's bus token (src/bus/auth.ts): coordinator messages without its MAC are dropped. */
  busToken?: BusToken;
  /** --artifact-mode: KV dumps and input snapshots (default: DEFAULT_ARTIFACT_MODES). */
  artifactModes?: ArtifactModes;
  /**
   * Direct file serving for `wavebus aggregate` with CURVE (direct-files.ts): on unless
   * `enabled` is false; `host` / `port` override the bound address (default: this host's
   * address toward the coordinator, an ephemeral port).
   */
  directFiles?: DirectFilesSettings;
  /** The flight recorder (WAVEBUS_RECORD_FORWARDS): off when absent (docs/recorder.md). */
  recorder?: RecorderSettings;
  /**
   * report.save_sensitive_info "hashed": the key the recorder's bundles hash token ids with
   * (--token-hash-key-file / $WAVEBUS_TOKEN_HASH_KEY_FILE, the coordinator's; absent: a key of this
   * agent's life only, made at the first hashed flush).
   */
  tokenHasher?: TokenHasher;
  /** --verdict-arg: what `wavebus verdict` needs beside the flush under verdict.auto (auto-verdict.ts). */
  verdictArgs?: string[];
}

/** What the agent runs besides its options that its bus says: the receiver role, the recorder's K, the counts in each heartbeat. */
export type AgentBusState = Pick<AgentBusOptions, 'lanesOnly' | 'recorderForwards' | 'vectorCounts'>;

/** The options of the bus an agent with these options joins at `coordinator`. */
export function agentBusOptions(opts: AgentOptions, coordinator: { host: string; port: number }, logger: Logger, state: AgentBusState): AgentBusOptions {
  return { ...state, coordinator, identity: opts.identity, heartbeatMs: opts.heartbeatMs, logger, dropSeqs: opts.dropSeqs, curve: opts.curve, busToken: opts.busToken };
}
