// The bus's defaults, in one place: the coordinator, agents, tools and commands all read them here.

/** The coordinator's PUB port; its ROUTER is on the next one. */
export const DEFAULT_BUS_PORT = 29600;
/** Heartbeat period both ways; a peer silent for 3 periods is lost. */
export const DEFAULT_HEARTBEAT_MS = 500;
/** Largest frame any bus socket accepts (ZeroMQ maxMessageSize). */
export const DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024;
