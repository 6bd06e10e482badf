// An incident's fingerprint_diff on the report page: what differs between ranks that should agree
// (versions, device and environment across all ranks; weight checksums across DP replicas).
import { esc } from './html';

/** A small table, or a line saying the report has none / found none. Garbage in the file is shown as absent. */
export function fingerprintHtml(report: Record<string, unknown>): string {
  const d = report.fingerprint_diff as { ranks?: unknown; differences?: unknown } | undefined;
  if (!d || typeof d !== 'object' || !Array.isArray(d.differences)) return '<p>No fingerprints in this report (a coordinator from before them).</p>';
  const ranks = Array.isArray(d.ranks) ? d.ranks.map(Number).join(', ') : '?';
  if (d.differences.length === 0) return `<p>Ranks ${esc(ranks)} agree on versions, device, environment and weight checksums.</p>`;
  const rows = d.differences.slice(0, 200).map((e: any) => {
    const values = Array.isArray(e?.values) ? e.values.map((v: any) => `${v?.value === null ? '(absent)' : esc(String(v?.value))} on ${esc(Array.isArray(v?.ranks) ? v.ranks.join(',') : '?')}`).join('<br>') : '';
    return `<tr><td>${esc(String(e?.kind))}</td><td>${esc(String(e?.name))}</td><td>${esc(String(e?.among))}</td><td>${values}</td></tr>`;
  });
  return `<p>Fingerprints of ranks ${esc(ranks)}; what differs:</p><table><tr><th>kind</th><th>name</th><th>among</th><th>values</th></tr>${rows.join('')}</table>`;
}
