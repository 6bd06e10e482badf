// The bus's defaults, in one place: the coordinator, agents, tools and commands all read them here.
import { ConfigError } from '../errors';
import { native } from '../native';

/** The coordinator's PUB port; its ROUTER is on the next one. */
export const DEFAULT_BUS_PORT = 29600;
/** Heartbeat period both ways; a peer silent for 3 periods is lost. */
export const DEFAULT_HEARTBEAT_MS = 500;
/**
 * Node flags the coordinator is started with (the launcher and the benches' jobs pass them; run by
 * hand: `node --max-semi-space-size=1 --heap-growing-percent=50 $(which wavebus) coordinator`).
 * A busy coordinator's young generation otherwise grows from 1 MiB to V8's cap of 16 MiB per
 * semi-space (32 MiB of RSS) though it keeps ~12 MiB alive in all. What outlives two scavenges
 * (0.6-1 KB a wave in the soak, most of it with dumps) dies in the old generation, which V8 lets
 * grow to several times what is live before a full collection: in the soak it rose 10 -> 24 MB of
 * dead objects, the RSS that climbed. 50 % growth (at the coordinator's size V8's 8 MB minimum step
 * decides) collects them sooner. Not settable in NODE_OPTIONS (docs/bus.md, "Memory").
 */
export const COORDINATOR_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=1', '--heap-growing-percent=50'];
/** Largest frame any bus socket accepts (ZeroMQ maxMessageSize). */
export const DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024;
/**
 * Largest message the coordinator's PUB takes from a peer (its maxMessageSize). A PUB receives only
 * subscriptions (a topic of at most 8 bytes, frames.ts) and the handshake's commands (a CURVE
 * INITIATE with its metadata: a few hundred bytes). Without a limit libzmq added one subscription
 * of 24 MB to its topic trie a node per byte: the coordinator grew to 2.5 GB and kept it.
 */
export const MAX_PUB_INBOUND_BYTES = 1024;
/**
 * How many waves ahead the coordinator decides by default (the coordinator's `--lookahead-waves`,
 * `$WAVEBUS_LOOKAHEAD_WAVES`): the head of wave N (telemetry of N-1) publishes the vector of wave
 * N + lookahead, so each vector has `lookahead` whole forwards to reach the mailboxes before any
 * rank's end_of_wave needs it, and the mailbox floor tells every rank that nothing is due before
 * it (docs/architecture.md, "Waves"). More waves ahead: fewer steps that wait on a late vector,
 * and a dump copied that many waves after its detection.
 */
export const DEFAULT_LOOKAHEAD_WAVES = 1;

/** Vectors the mailbox ring holds (native/mailbox.h, read from the addon: its one source). */
const MAILBOX_SLOTS: number = native.mailboxLayout.slots;

/**
 * The furthest a stream may decide ahead: two waves short of the mailbox ring (8 vectors), because a
 * TP rank may end its wave one wave after its head began the next, so a vector must not overwrite
 * the slot of a wave some rank has yet to end.
 */
export const MAX_DECIDE_AHEAD = MAILBOX_SLOTS - 2;

/**
 * How many waves ahead a replica's stream decides: the head of wave N publishes the vector of N +
 * this. The coordinator computes it once (checkLookahead) and hands it to its streams, the guard
 * (the vector wave of each head) and every agent (SnapshotReply.decide_ahead). The head is the last
 * PP stage's TP0, and in a pipeline a stage works ahead of the last one (stage p on up to pp-1-p
 * later micro-steps), so when head N goes out a stage-0 rank may already be in wave N + pp - 1.
 * Deciding pp - 1 waves further than the lookahead gives every stage's rank the vector (and any
 * config or dump job in it) before it ends that wave, with the margin the last stage has; every
 * rank then copies, and switches config, at the same wave. It depends on the layout only, not on
 * dump.pp_stages, so a switch of pp_stages never changes how far ahead the stream is
 * (docs/runtime-guard.md, "Pipeline stages").
 */
export function decideAheadWaves(pp: number, lookahead = DEFAULT_LOOKAHEAD_WAVES): number {
  return lookahead + Math.max(0, Math.floor(pp) - 1);
}

/**
 * The largest lookahead a layout with `pp` stages allows: MAX_DECIDE_AHEAD in all, and never less
 * than 1 (a pipeline of more than MAX_DECIDE_AHEAD stages decides pp waves ahead as before).
 */
export function maxLookahead(pp: number): number {
  return Math.max(1, MAX_DECIDE_AHEAD - Math.max(0, Math.floor(pp) - 1));
}

/** Whether `d` (SnapshotReply.decide_ahead, from the network) is lookahead + pp - 1 for an allowed lookahead. */
export function validDecideAhead(d: unknown, pp: number): d is number {
  const least = decideAheadWaves(pp, 1);
  return typeof d === 'number' && Number.isSafeInteger(d) && d >= least && d <= least - 1 + maxLookahead(pp);
}

/**
 * A lookahead as given (the coordinator's option or flag; undefined: the default), checked against
 * the layout; returns how far ahead the streams decide (decideAheadWaves).
 */
export function checkLookahead(lookahead: number | undefined, pp: number, name = '--lookahead-waves'): number {
  const l = lookahead ?? DEFAULT_LOOKAHEAD_WAVES;
  const max = maxLookahead(pp);
  if (!Number.isSafeInteger(l) || l < 1 || l > max) {
    throw new ConfigError(`${name}: expected an integer in 1..${max} (the mailbox holds ${MAILBOX_SLOTS} vectors; pp=${pp} adds ${Math.max(0, pp - 1)} waves), got ${JSON.stringify(lookahead)}`);
  }
  return decideAheadWaves(pp, l);
}

/** The bytes of a BusChallenge nonce (an agent's new connection, with a bus token: coordinator-link.ts). */
export const NONCE_BYTES = 16;
