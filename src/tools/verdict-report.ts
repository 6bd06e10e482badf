// `wavebus verdict --coordinator`: the verdict, once written beside the flush, told to the job's
// coordinator over its authenticated control channel (the bus token's MAC, or CURVE), for its status
// document and /metrics (docs/verdict.md "In status and /metrics"). The coordinator keeps a short
// note, not verdict.json: the replays' tensors stay where the artifacts are.
import { ControlClient, type ControlTarget } from './control-client';
import type { Verdict } from './verdict';
import { describeDevice } from './verdict-fingerprint';

/** The note for ControlRequest.verdict: the incident's host and devices (device-local: the ones named). */
export function verdictNote(v: Verdict): Record<string, unknown> {
  const same = v.replays.find((r) => r.role === 'same');
  return {
    incident: v.incident.id,
    verdict: v.verdict,
    host: v.host ?? same?.host ?? 'local',
    devices: v.devices ?? same?.devices ?? [],
    replica: v.incident.replica,
    ranks: v.incident.ranks,
    reason: v.reason,
    bisectModule: v.bisect?.first?.module ?? '',
    fingerprint: (v.fingerprint ?? []).map((d) => `device ${d.index}: ${describeDevice(d)}`).join('; ').slice(0, 1024),
  };
}

/** Tell the coordinator; throws a ControlError (no answer, refused) naming why. */
export async function reportVerdict(target: ControlTarget, v: Verdict, timeoutMs: number): Promise<void> {
  const client = new ControlClient(target);
  try {
    await client.probe(timeoutMs);
    await client.request({ verdict: verdictNote(v) }, timeoutMs);
  } finally {
    await client.close().catch(() => undefined);
  }
}
