// The bus's defaults, in one place: the coordinator, agents, tools and commands all read them here.

/** The coordinator's PUB port; its ROUTER is on the next one. */
export const DEFAULT_BUS_PORT = 29600;
/** Heartbeat period both ways; a peer silent for 3 periods is lost. */
export const DEFAULT_HEARTBEAT_MS = 500;
/** Largest frame any bus socket accepts (ZeroMQ maxMessageSize). */
export const DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024;
/**
 * How many waves ahead the coordinator decides: the head of wave N (telemetry of N-1) publishes the
 * vector of wave N + LOOKAHEAD_WAVES, so each vector has a whole forward to reach the mailboxes
 * before any rank's end_of_wave needs it (docs/architecture.md, "Waves").
 */
export const LOOKAHEAD_WAVES = 1;
