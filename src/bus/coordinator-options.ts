// The coordinator's options and counters (coordinator.ts), apart so that callers and the pieces
// the coordinator is made of read them without the coordinator itself.
import type { Logger } from '../log';
import type { WorldLayout } from '../layout';
import type { CoordinatorPolicy } from './policy';
import type { CurveServerKeys } from './curve';
import type { BusToken } from './auth';
import type { CoordinatorFileRoots } from './coordinator-files';

export interface CoordinatorOptions {
  host?: string;
  port?: number;
  layout: WorldLayout;
  heartbeatMs?: number;
  /**
   * How many waves ahead each head decides (default DEFAULT_LOOKAHEAD_WAVES, at most
   * maxLookahead(pp)): more waves give a late vector more forwards to arrive, and put a dump that
   * many waves after its detection (src/bus/constants.ts).
   */
  lookaheadWaves?: number;
  /** What to call lookaheadWaves in an error (the flag or variable it came from). */
  lookaheadName?: string;
  /** A rank whose heartbeats stop for this long is not live. Default 3 × heartbeatMs. */
  deadAfterMs?: number;
  /** Bind a non-loopback host without encryption (logs a warning). */
  insecure?: boolean;
  /**
   * CURVE: PUB and ROUTER become CURVE servers with this key pair, and only clients whose public
   * key is on the allow-list complete the handshake. Allows binding a non-loopback host.
   */
  curve?: CurveServerKeys;
  /**
   * The launcher's bus token (auth.ts): every frame published and every ROUTER reply carries its
   * MAC, and messages without a right one are dropped ('no_mac' / 'bad_mac'), except status
   * requests (answered: tools without the token may poll liveness).
   */
  busToken?: BusToken;
  /** Serve /healthz and /metrics here (0 picks a free port); off when undefined. */
  metricsPort?: number;
  metricsHost?: string;
  policy?: CoordinatorPolicy;
  logger?: Logger;
  /** Larger messages from the network are dropped and counted ('oversized'). */
  maxFrameBytes?: number;
  /** How long every expected rank has to ack a dump job. */
  dumpAckTimeoutMs?: number;
  /** The runtime guard's report dir and dump root: served to `wavebus aggregate` (coordinator-files.ts). */
  ownFiles?: () => CoordinatorFileRoots;
}

export interface CoordinatorStats {
  published: number;
  received: number;
  dropped: Record<string, number>;
  /** Accepted messages whose epoch_seen was not this epoch (agents that have not resynced yet). */
  wrongEpochSeen: number;
  /** CURVE peers refused, by reason (unknown_key, wrong_mechanism, bad_zap_request, handshake_failed). */
  refused: Record<string, number>;
  /**
   * Without CURVE, with the token: peers the PUB refused at the handshake for want of the
   * subscriber password, by reason (wrong_mechanism: no PLAIN at all, wrong_password, handshake_failed).
   */
  subscribersRefused: Record<string, number>;
  /** Relayed requests answered at once with a refusal: their rank already had MAX_RELAYS_IN_FLIGHT waiting. */
  relaysRefusedBusy: number;
}
