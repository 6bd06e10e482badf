// The agent bus's options, events and counters (agent-bus.ts), apart so the agent and tests
// read them without the bus itself.
import type { RankIdentity } from '../layout';
import type { Logger } from '../log';
import type { AgentConfig, ConfigLane, DumpLane, WaveHead } from '../messages';
import type { CoordinatorMsg } from './frames';
import type { CurveClientKeys } from './curve';
import type { BusToken } from './auth';

export interface AgentBusOptions {
  coordinator: { host: string; port: number };
  identity: RankIdentity;
  heartbeatMs?: number;
  /** Coordinator silent for this long → 'coordinator-lost'. Default 3 × heartbeatMs. */
  deadAfterMs?: number;
  logger?: Logger;
  maxFrameBytes?: number;
  /**
   * Test / fault-injection hook: frames whose seq this returns true for are discarded on
   * arrival, exactly as if the network had lost them. Never set it in production.
   */
  dropSeqs?: (seq: number) => boolean;
  agentVersion?: string;
  /** The flight recorder's K (0: off), told in Hello so incident reports can list the flush. */
  recorderForwards?: number;
  /**
   * CURVE client keys: SUB and DEALER encrypt and authenticate to a coordinator with this server
   * key; this agent's public key must be on the coordinator's allow-list.
   */
  curve?: CurveClientKeys;
  /**
   * The launcher's bus token (auth.ts): every coordinator frame and reply must carry its MAC
   * (others are dropped and counted as 'no_mac' / 'bad_mac' before anything in them is read),
   * and every message to the coordinator carries one.
   */
  busToken?: BusToken;
  /** The agent's late and missed wave-vector counts and its engine clients, sent with every heartbeat (/metrics per rank; the wake's grace). */
  vectorCounts?: () => { lateVectors: number; missedVectors: number; ringGarbage?: number; engineClients?: number };
  /**
   * Follow only the waves with work (heads under X, the C and D lanes, heartbeats: frames.ts
   * workTopics): the host receiver writes this rank's plain vectors (docs/bus.md, "One receiver
   * per host"). The stream's seqs then jump over the plain heads, so a jump is no gap here.
   */
  lanesOnly?: boolean;
}

export interface WaveEvent {
  head: WaveHead;
  config?: ConfigLane;
  dump?: DumpLane;
}

export interface SnapshotReplyMsg {
  epoch: number;
  seq: number;
  wave: number;
  /** The replica whose stream it describes (the coordinator derives it from the asking rank). */
  replica: number;
  configVersion: number;
  config: AgentConfig | null;
  pending: DumpLane[];
  manualDumpDone: number;
  protocolVersion: number;
  /** The head of wave N publishes the vector of N + this (lookahead + pp - 1, src/bus/constants.ts). */
  decideAhead: number;
  /** Captures armed on the running job and in force for this replica (protocol 7; CaptureArm). */
  captures?: Record<string, any>[];
  /** The replica's wake on demand (proto Wake: 0 off, 1 heads, 2 on). */
  wake?: number;
}

export type ResyncReason = 'gap' | 'epoch' | 'coordinator-silent' | 'reconnect' | 'receiver';

export interface AgentBusStats {
  received: number;
  dropped: Record<string, number>;
  resyncs: number;
  waves: number;
  /** Frames already covered by a snapshot when they arrived (normal after a sync). */
  covered: number;
  /** Messages to the coordinator that could not be queued (its connection was full or absent). */
  unsent: number;
  /**
   * With a bus token: messages not sent because the peer of the connection had not proven the
   * token (a dead coordinator, or a process squatting its port), and connections opened (each one
   * challenged; coordinator-link.ts).
   */
  unproven: number;
  connections: number;
  /** SUBs replaced while the coordinator was lost and nothing was heard (bus-subscription.ts). */
  subRenewals: number;
  /** Why the coordinator and this agent do not talk (protocol versions), when they do not. */
  refused?: string;
}

/**
 * A request handler answers a CoordinatorMessage with an AgentMessage body, e.g. `{ fileList: {...} }`;
 * a body with a payload (payload.ts: a file chunk's data) goes out as [message, payload].
 */
export type RequestHandler = (request: CoordinatorMsg) => Promise<Record<string, unknown>>;

