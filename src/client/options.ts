// What connect() takes and what the client's calls return; connect()'s checks of its options.
import { ConfigError } from '../errors';
import { agentEndpoint, mailboxPath } from '../paths';
import { checkSnapshotGating, type SnapshotConfig } from '../snapshot/config';
import { MailboxFeature, MailboxReader } from './mailbox';
import type { SnapshotSelectionMsg } from './snapshot-precheck';

const DEFAULT_HELLO_TIMEOUT_MS = 1000;
const DEFAULT_CAPTURE_TIMEOUT_MS = 120000;
const DEFAULT_PROBE_INTERVAL_MS = 1000;
const DEFAULT_MAILBOX_WAIT_MS = 10000;

/** The agent's hello answer (proto Features): which features are on. */
export interface ClientFeatures {
  tp0: boolean;
  bus: boolean;
  /** The enabled detectors, by config name. */
  detectors: string[];
  itemSync: boolean;
  snapshots: boolean;
  endOfWaveTimeoutMs: number;
  /** With snapshots on: the agent's selection rules (proto SnapshotSelection; null when none). */
  snapshotSelection?: SnapshotSelectionMsg | null;
}

export interface ConnectOptions {
  /** ipc:// endpoint of this rank's agent; default from WAVEBUS_RUN_DIR and LOCAL_RANK. */
  endpoint?: string;
  /** Path of the agent's mailbox; default from WAVEBUS_RUN_DIR and LOCAL_RANK. */
  mailbox?: string;
  env?: NodeJS.ProcessEnv;
  /** The engine schedules asynchronously (refused when snapshots are on). */
  asyncScheduling?: boolean;
  /**
   * Longest a per-step call (endOfWave, beforeForward until the agent answers) waits on the agent.
   * Default: the agent's end-of-wave bound (`--end-of-wave-timeout-ms`, 50 ms).
   */
  callTimeoutMs?: number;
  /** Longest hello and register() wait outside a step (default 1000 ms). */
  helloTimeoutMs?: number;
  /** Longest a capture the agent has begun may take to finish (default 120000 ms). */
  captureTimeoutMs?: number;
  /** While the agent is unavailable, how often a call sends it a probe (default 1000 ms). */
  probeIntervalMs?: number;
  /**
   * Longest connect() waits for the agent to create the mailbox and write its header (an engine
   * may start before its agent; default 10000 ms, 0: one try).
   */
  mailboxWaitMs?: number;
  /** The engine's own version string, sent in this rank's fingerprint (docs/fingerprints.md). */
  engineVersion?: string;
  /** The device this rank computes on, for its fingerprint (default "cpu"). */
  deviceName?: string;
}

export interface BeforeForwardResult {
  captured: boolean;
  callDir?: string;
  /** The agent did not answer (dead or frozen): the forward goes on without a snapshot. */
  unavailable?: boolean;
}

export interface EndOfWaveResult {
  /** Set when the agent answered with an error; counted in stats.endOfWaveErrors, never thrown. */
  error?: string;
  /** Something was due for this rank in this wave and the agent handled it. */
  due: boolean;
  /** The wave vector did not arrive within the bound; the step went on without it. */
  timedOut: boolean;
}

export interface ClientBounds {
  call?: number;
  hello: number;
  capture: number;
  probe: number;
}

/**
 * Checks the options, finds the agent's endpoint and mailbox, and maps the mailbox once the agent
 * has written its header (waiting at most mailboxWaitMs); sends nothing.
 */
export async function openConnection(opts: ConnectOptions): Promise<{ endpoint: string; mailbox: MailboxReader; asyncScheduling: boolean; bounds: ClientBounds }> {
  const env = opts.env ?? process.env;
  let endpoint = opts.endpoint;
  let mbox = opts.mailbox;
  if (!endpoint || !mbox) {
    const runDir = env.WAVEBUS_RUN_DIR;
    if (!runDir) throw new ConfigError('WAVEBUS_RUN_DIR is not set (start the job under `wavebus launch`, or pass endpoint and mailbox)');
    const lr = env.LOCAL_RANK;
    if (lr === undefined || !/^\d+$/.test(lr)) throw new ConfigError(`LOCAL_RANK='${lr ?? ''}' is not a non-negative integer`);
    endpoint = endpoint ?? agentEndpoint(runDir, Number(lr));
    mbox = mbox ?? mailboxPath(runDir, Number(lr));
  }
  // Every option is checked before the wait: a bad one fails at once, not after the bound.
  const bound = (v: number | undefined, name: string, def?: number, min = 1): number | undefined => {
    if (v === undefined) return def;
    if (!Number.isSafeInteger(v) || v < min) {
      throw new ConfigError(`connect(): ${name} must be a ${min === 0 ? 'non-negative' : 'positive'} integer (ms), got ${String(v)}`);
    }
    return v;
  };
  const bounds = {
    call: bound(opts.callTimeoutMs, 'callTimeoutMs'),
    hello: bound(opts.helloTimeoutMs, 'helloTimeoutMs', DEFAULT_HELLO_TIMEOUT_MS) as number,
    capture: bound(opts.captureTimeoutMs, 'captureTimeoutMs', DEFAULT_CAPTURE_TIMEOUT_MS) as number,
    probe: bound(opts.probeIntervalMs, 'probeIntervalMs', DEFAULT_PROBE_INTERVAL_MS) as number,
  };
  const waitMs = bound(opts.mailboxWaitMs, 'mailboxWaitMs', DEFAULT_MAILBOX_WAIT_MS, 0) as number;
  // The header is read only once the agent has written it (magic last): never a half-initialised one.
  const reader = await MailboxReader.waitOpen(mbox, waitMs);
  if (opts.asyncScheduling && (reader.features() & MailboxFeature.SNAPSHOTS) !== 0) {
    reader.close();
    // Refused at startup, not at the first forward: the agent says snapshots are on.
    checkSnapshotGating({ enabled: true } as SnapshotConfig, { asyncScheduling: true, backendHasMemoryAccess: true });
  }
  return { endpoint, mailbox: reader, asyncScheduling: opts.asyncScheduling ?? false, bounds };
}
