// The engine client's counters (WavebusClient.stats): what its calls did, and what they skipped
// or gave up so that the engine's step went on. Each part of the client counts into the one object.

/** A fresh set of counters, all 0. */
export function newClientStats() {
  return {
    sent: 0, endOfWaveTimeouts: 0, endOfWaveCalls: 0, dueWaves: 0, rejoins: 0, endOfWaveErrors: 0,
    /** Times the agent stopped answering (each starts a stretch of degraded mode). */
    agentLost: 0,
    /** Times it answered again afterwards. */
    agentBack: 0,
    /** Calls that returned at once, without the agent, because it was unavailable. */
    skippedUnavailable: 0,
    /** beforeForward calls that went on uncaptured because the agent was unavailable. */
    snapshotsSkipped: 0,
    probes: 0,
    /** endOfWave calls that found no vector and slept on the mailbox (0 in a healthy steady state). */
    vectorWaits: 0,
    /** ... of which the vector came within the bound (the agent is told: /metrics per rank). */
    lateVectors: 0,
    /** endOfWave calls that returned at once because the vectors had stalled (vector-stall.ts). */
    stalledSkips: 0,
    /** Answers in which the agent said its coordinator is lost. */
    coordinatorLost: 0,
    /** Forwards copied into the flight recorder's ring (docs/recorder.md). */
    recorded: 0,
    /** Forwards the recorder was on for but could not copy (an input in CUDA memory; lastError says why). */
    notRecorded: 0,
    /** Snapshots on: forwards the agent's selection rules do not select, not offered (no message). */
    forwardsNotOffered: 0,
  };
}

export type ClientStats = ReturnType<typeof newClientStats>;
