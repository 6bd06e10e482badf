// How a dump job and its wave directory are named (the seed's layout): one place for the ledger,
// the wave streams (a queued job's id) and the orphan scan.
import { joinUnder, safeComponent } from '../artifacts/sanitize';

/** Replica tag of dump dirs and job ids: none in a job without DP (the seed's layout), else `dp<r>`. */
function replicaTag(replica: number | undefined, sep: string): string {
  return replica === undefined ? '' : `${sep}dp${replica}`;
}

/** <dump_root>/<incident_type>/<req_id>/wave_<wave>[_dp<replica>]; `replica`: undefined in a job without DP (dp = 1). */
export function waveDir(dumpRoot: string, incidentType: string, reqId: string, wave: number, replica?: number): string {
  return joinUnder(dumpRoot, safeComponent(incidentType, 'incident_type'), safeComponent(reqId, 'req_id'), `wave_${wave}${replicaTag(replica, '_')}`);
}

/** Where a dump refused before it named a request records why: <dump_root>/<incident_type>/wave_<wave>[_dp<replica>]. */
export function incidentWaveDir(dumpRoot: string, incidentType: string, wave: number, replica?: number): string {
  return joinUnder(dumpRoot, safeComponent(incidentType, 'incident_type'), `wave_${wave}${replicaTag(replica, '_')}`);
}

/** <arm wave>/<incident_type>/<req_id>[@dp<replica>]. */
export function jobIdOf(armWave: number, incidentType: string, reqId: string, replica?: number): string {
  return `${armWave}/${incidentType}/${reqId}${replicaTag(replica, '@')}`;
}
