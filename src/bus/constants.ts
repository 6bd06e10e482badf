// The bus's defaults, in one place: the coordinator, agents, tools and commands all read them here.

/** The coordinator's PUB port; its ROUTER is on the next one. */
export const DEFAULT_BUS_PORT = 29600;
/** Heartbeat period both ways; a peer silent for 3 periods is lost. */
export const DEFAULT_HEARTBEAT_MS = 500;
/**
 * Node flags the coordinator is started with (the launcher and the benches' jobs pass them; run by
 * hand: `node --max-semi-space-size=1 $(which wavebus) coordinator`). A busy coordinator's young
 * generation otherwise grows from 1 MiB to V8's cap of 16 MiB per semi-space (32 MiB of RSS) though
 * it keeps ~12 MiB alive in all: most of the RSS the 64-agent soak saw grow (docs/bus.md, "Memory").
 */
export const COORDINATOR_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=1'];
/** Largest frame any bus socket accepts (ZeroMQ maxMessageSize). */
export const DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024;
/**
 * How many waves ahead the coordinator decides: the head of wave N (telemetry of N-1) publishes the
 * vector of wave N + LOOKAHEAD_WAVES, so each vector has a whole forward to reach the mailboxes
 * before any rank's end_of_wave needs it (docs/architecture.md, "Waves").
 */
export const LOOKAHEAD_WAVES = 1;

/**
 * How many waves ahead a replica's stream decides, in one place for the coordinator's streams, the
 * guard, the ledger and the agents: the head of wave N publishes the vector of N + this. The head
 * is the last PP stage's TP0, and in a pipeline a stage works ahead of the last one (stage p on up
 * to pp-1-p later micro-steps), so when head N goes out a stage-0 rank may already be in wave
 * N + pp - 1. Deciding pp - 1 waves further than LOOKAHEAD_WAVES gives every stage's rank the vector
 * (and any config or dump job in it) before it ends that wave, with the margin the last stage has;
 * every rank then copies, and switches config, at the same wave. It depends on the layout only, not
 * on dump.pp_stages, so a switch of pp_stages never changes how far ahead the stream is
 * (docs/runtime-guard.md, "Pipeline stages").
 */
export function decideAheadWaves(pp: number): number {
  return LOOKAHEAD_WAVES + Math.max(0, Math.floor(pp) - 1);
}
