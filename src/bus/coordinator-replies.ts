// What the coordinator answers about itself: the status JSON (/healthz, StatusReply.status_json),
// the StatusReply, and the snapshot a (re)joining agent gets for its replica's stream.
import type { Coordinator } from './coordinator';
import { PROTOCOL_VERSION } from './protocol-version';
import { layoutJson } from '../paths';
import { getHeapSpaceStatistics } from 'v8';

/** The JSON /healthz serves and StatusReply.status_json carries; per-replica wave and pending dumps. */
export function statusJson(c: Coordinator): Record<string, unknown> {
  let policyStatus: Record<string, unknown> = {};
  try {
    policyStatus = c.policy?.status() ?? {};
  } catch (e) {
    policyStatus = { policy_error: String(e) };
  }
  const replicas: Record<string, unknown> = {};
  for (const s of c.streams.all()) {
    // wake: on demand (off, heads, on; docs/control.md, "An idle job").
    replicas[String(s.replica)] = { wave: s.wave, seq: s.seq, config_version: s.lastConfig.version, pending_dumps: c.ledger.pendingIds(s.replica), wake: c.wake.statusJson(s.replica) };
  }
  return {
    epoch: c.epoch,
    seq: c.seq,
    wave: c.wave,
    live_ranks: c.liveRanks(),
    expected_ranks: c.expectedRanks,
    // Tools map a rank to its KV dump dir (dp*_tp*_pp*_cp*) with it (aggregate).
    layout: layoutJson(c.layout),
    // The head of wave N publishes the vector of N + decide_ahead (lookahead + pp - 1).
    decide_ahead: c.decideAhead,
    ready: c.ready,
    config_version: Math.max(...c.streams.all().map((s) => s.lastConfig.version)),
    pending_dumps: c.ledger.pendingIds(),
    replicas,
    dumps: c.ledger.status(),
    late_vectors: c.vectors.status().late,
    // Which ranks sent a fingerprint, and what differs between them now (docs/fingerprints.md).
    fingerprints: c.fingerprints.status(),
    missed_vectors: c.vectors.status().missed,
    // Telemetry-ring steps each rank's agent dropped as garbage (docs/python-client.md, "The tensor hot path").
    ring_garbage: c.vectors.status().ringGarbage,
    // Engines that died under their agents, newest last (each agent flushed its flight recorder).
    engine_crashes: c.crashes.status(),
    // Incidents' verdicts (wavebus verdict --coordinator, docs/verdict.md): counts and the newest.
    verdicts: c.verdicts.status(),
    // Every message the ROUTER took in, and what it dropped of them by reason (the rest it handled).
    received: c.stats.received,
    dropped: { ...c.stats.dropped },
    // Relays answered at once with "too many in flight" (each one answered, none lost).
    relays_refused_busy: c.stats.relaysRefusedBusy,
    security: {
      ...(c.curve ? { curve: true, allowed_keys: c.opts.curve!.allow.size, refused: { ...c.stats.refused } } : { curve: false }),
      bus_token: c.opts.busToken !== undefined,
      // Without CURVE, with the token: peers the PUB refused for want of the subscriber password.
      ...(!c.curve && c.opts.busToken ? { subscribers_refused: { ...c.stats.subscribersRefused } } : {}),
    },
    ranks: c.rankTable.statusJson(),
    memory: memoryJson(),
    ...policyStatus,
  };
}

/**
 * This process's memory in bytes: RSS, the JS heap in use and reserved, memory outside it (Buffers,
 * zmq messages), and what V8 reserved for its young and old generations. It tells something kept
 * (heap_used after GCs grows) from V8 sizing its heap (new_space grows up to its cap as a busy
 * process runs) and from the C allocator (RSS grows, the rest does not).
 */
export function memoryJson(): Record<string, number> {
  const m = process.memoryUsage();
  const spaces = getHeapSpaceStatistics(); // once per status, not once per space
  const space = (name: string) => spaces.find((s) => s.space_name === name)?.space_size ?? 0;
  return { rss: m.rss, heap_used: m.heapUsed, heap_total: m.heapTotal, new_space: space('new_space'), old_space: space('old_space'), external: m.external, array_buffers: m.arrayBuffers };
}

export function statusReply(c: Coordinator): Record<string, unknown> {
  return {
    epoch: c.epoch,
    seq: c.seq,
    wave: c.wave,
    liveRanks: c.liveRanks(),
    expectedRanks: c.expectedRanks,
    ready: c.ready,
    statusJson: JSON.stringify(statusJson(c)),
    protocolVersion: PROTOCOL_VERSION,
  };
}

/** Everything an agent of `replica` needs to follow that replica's stream from now on. */
export function snapshotReply(c: Coordinator, replica: number): Record<string, unknown> {
  const s = c.streams.stream(replica);
  let cfg = { configVersion: s.lastConfig.version, config: s.lastConfig.config, manualDumpDone: 0 };
  if (c.policy) {
    try {
      cfg = c.policy.snapshotState(replica);
    } catch (e) {
      c.log.error({ replica, err: String(e) }, 'policy.snapshotState failed; the snapshot carries the last published config');
    }
  }
  // seq is the stream's last one assigned: the state below already includes every frame up to it.
  return {
    epoch: c.epoch,
    seq: s.seq,
    wave: s.wave,
    replica,
    configVersion: cfg.configVersion,
    config: cfg.config,
    pending: c.ledger.lanes(replica),
    manualDumpDone: cfg.manualDumpDone,
    protocolVersion: PROTOCOL_VERSION,
    decideAhead: c.decideAhead,
    captures: c.control.captures.inForce(replica),
    wake: c.wake.of(replica),
  };
}
