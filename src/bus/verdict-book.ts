// The incidents' verdicts (docs/verdict.md) as `wavebus verdict --coordinator` reports them: the
// coordinator keeps the newest few for its status document and counts, per verdict and host, the
// incidents whose latest verdict it is (/metrics). An incident judged again moves from its old
// verdict to the new one, so a re-run never counts it twice. Everything here came over the bus:
// bounded, checked, and refused with the field named.
import { gauge } from '../metrics';

export const VERDICTS = ['deterministic', 'device-local', 'transient', 'inconclusive'] as const;
export type VerdictName = (typeof VERDICTS)[number];

/** Verdicts listed in the status document (newest last); the gauge counts every incident remembered. */
const LISTED = 16;
/** Incidents remembered (for a re-run to move, not add); the oldest is forgotten beyond it. */
const REMEMBERED = 4096;
/** Distinct host labels on the gauge; a host beyond them is counted under `other` (bounded series). */
const MAX_HOSTS = 64;
const MAX_REASON = 512;
const MAX_FINGERPRINT = 1024;
const FLUSH = /^(incident-wave\d+(-dp\d+)?|crash-[A-Za-z0-9._-]{1,128}|flush-capture-\d+)$/;
const HOST = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const MODULE = /^[A-Za-z0-9_.]{0,256}$/;

export interface VerdictRecord {
  incident: string;
  replica: number;
  verdict: VerdictName;
  host: string;
  devices: number[];
  ranks: number[];
  reason: string;
  bisect_module: string | null;
  /** device-local: the devices named (host, CPU or CUDA device, torch), one line. */
  fingerprint: string | null;
  time: string;
}

/** A note the coordinator does not keep; its message names the field. */
export class BadVerdictNote extends Error {}

const u32s = (v: unknown, field: string, max: number): number[] => {
  const a = Array.isArray(v) ? v : [];
  if (a.length > max) throw new BadVerdictNote(`verdict.${field}: ${a.length} entries (at most ${max})`);
  return a.map((x) => Number(x));
};

export class VerdictBook {
  private readonly byIncident = new Map<string, VerdictRecord>();
  private readonly hosts = new Set<string>();
  private readonly counted = gauge('wavebus_incident_verdicts', "Incidents by their latest verdict (wavebus verdict --coordinator) and the incident's host", ['verdict', 'host'] as const);

  constructor(private readonly worldSize: number) {
    for (const verdict of VERDICTS) this.counted.inc({ verdict, host: 'other' }, 0);
  }

  /** Check and keep one note (a ControlRequest.verdict); returns what was kept. */
  note(n: Record<string, any> | undefined): VerdictRecord {
    if (!n) throw new BadVerdictNote('verdict: missing');
    const incident = String(n.incident ?? '');
    if (!FLUSH.test(incident)) throw new BadVerdictNote(`verdict.incident: expected incident-wave<w>[-dp<r>], crash-<run> or flush-capture-<n>, got ${JSON.stringify(incident.slice(0, 80))}`);
    const verdict = String(n.verdict ?? '') as VerdictName;
    if (!VERDICTS.includes(verdict)) throw new BadVerdictNote(`verdict.verdict: expected ${VERDICTS.join(' | ')}, got ${JSON.stringify(verdict.slice(0, 40))}`);
    const host = String(n.host ?? '');
    if (!HOST.test(host)) throw new BadVerdictNote(`verdict.host: expected letters, digits, . _ - (at most 64), got ${JSON.stringify(host.slice(0, 80))}`);
    const ranks = u32s(n.ranks, 'ranks', this.worldSize);
    const bad = ranks.find((r) => r >= this.worldSize);
    if (bad !== undefined) throw new BadVerdictNote(`verdict.ranks: rank ${bad} is not in this job (world size ${this.worldSize})`);
    const module = String(n.bisectModule ?? '');
    if (!MODULE.test(module)) throw new BadVerdictNote(`verdict.bisect_module: expected a module path, got ${JSON.stringify(module.slice(0, 80))}`);
    const rec: VerdictRecord = {
      incident,
      replica: Number(n.replica ?? 0),
      verdict,
      host,
      devices: u32s(n.devices, 'devices', 4096),
      ranks,
      reason: String(n.reason ?? '').slice(0, MAX_REASON),
      bisect_module: module || null,
      fingerprint: String(n.fingerprint ?? '').slice(0, MAX_FINGERPRINT).replace(/[\x00-\x1f\x7f]/g, ' ') || null, // printed by `wavebus status`
      time: new Date().toISOString(),
    };
    const old = this.byIncident.get(incident);
    if (old) {
      this.counted.dec({ verdict: old.verdict, host: this.label(old.host) });
      this.byIncident.delete(incident); // re-inserted below: newest last
    } else if (this.byIncident.size >= REMEMBERED) {
      this.byIncident.delete(this.byIncident.keys().next().value as string); // forgotten, still counted
    }
    this.byIncident.set(incident, rec);
    this.counted.inc({ verdict, host: this.label(host) });
    return rec;
  }

  private label(host: string): string {
    if (this.hosts.has(host)) return host;
    if (this.hosts.size >= MAX_HOSTS) return 'other';
    this.hosts.add(host);
    return host;
  }

  /** The status document's `verdicts`: counts of the incidents remembered by verdict, and the newest few. */
  status(): { counts: Record<string, number>; latest: VerdictRecord[] } {
    const counts: Record<string, number> = Object.fromEntries(VERDICTS.map((v) => [v, 0]));
    for (const r of this.byIncident.values()) counts[r.verdict]++;
    return { counts, latest: [...this.byIncident.values()].slice(-LISTED) };
  }
}
