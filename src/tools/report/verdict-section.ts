// A recorder flush's verdict.json (`wavebus verdict`, docs/verdict.md) on the page: the verdict,
// its reason, and each replay's outputs out of tolerance with their errors. Read from the tree:
// bounded, checked, escaped.
import { esc } from './html';
import { describeDevice, type DeviceFingerprint } from '../verdict-fingerprint';

export interface VerdictSummary {
  file: string;
  verdict: string;
  reason: string;
  bisectFirst: string | null;
  /** device-local: the devices named, one line each (host, CPU or CUDA device, torch). */
  devices: string[];
  replays: { role: string; host: string; devices: number[]; ran: string; ok: boolean; error: string; compared: number; bitExact: number; badCount: number; bad: { call: number; rank: number; maxAbs: number; mismatched: number; numel: number }[] }[];
}

const KINDS = new Set(['deterministic', 'device-local', 'transient', 'inconclusive']);
const str = (v: unknown, n: number) => (typeof v === 'string' ? v.slice(0, n) : '');
const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : v === 'inf' ? Infinity : NaN);

/** verdict.json parsed for the page, or the reason it is not shown. */
export function readVerdict(file: string, doc: any): VerdictSummary | string {
  if (!doc || typeof doc !== 'object' || !KINDS.has(doc.verdict)) return 'not a verdict (verdict is not one of deterministic, device-local, transient, inconclusive)';
  const replays = (Array.isArray(doc.replays) ? doc.replays.slice(0, 8) : []).map((r: any) => {
    const tensors = Array.isArray(r?.tensors) ? r.tensors.slice(0, 65536) : [];
    return {
      role: str(r?.role, 16), host: str(r?.host, 64), ran: str(r?.ran, 160), devices: Array.isArray(r?.devices) ? r.devices.filter(Number.isSafeInteger).slice(0, 64) : [],
      ok: r?.ok === true, error: str(r?.error, 400), compared: tensors.length, bitExact: tensors.filter((t: any) => t?.bit_exact === true).length, badCount: tensors.filter((t: any) => t?.within_tolerance === false).length,
      bad: tensors.filter((t: any) => t?.within_tolerance === false).slice(0, 32).map((t: any) => ({ call: num(t.call), rank: num(t.rank), maxAbs: num(t.max_abs_diff), mismatched: num(t.mismatched), numel: num(t.numel) })),
    };
  });
  const first = doc.bisect?.first;
  const fps: DeviceFingerprint[] = doc.verdict === 'device-local' && Array.isArray(doc.fingerprint) ? doc.fingerprint.slice(0, 64).filter((d: unknown) => d && typeof d === 'object') : [];
  const devices = fps.map((d) => `device ${Number.isSafeInteger(d.index) ? d.index : '?'} on ${str(doc.host, 64)}: ${describeDevice(d).slice(0, 600)}`);
  return { file, verdict: doc.verdict, reason: str(doc.reason, 1000), devices, bisectFirst: first && typeof first.module === 'string' ? `${first.module.slice(0, 200)} (rank ${Array.isArray(first.ranks) ? first.ranks.join(',') : '?'})` : null, replays };
}

/** The verdict cell of a flush's row. */
export function verdictCell(v: VerdictSummary | undefined): string {
  if (!v) return '';
  const replays = v.replays.map((r) => {
    const bad = r.bad.map((b) => `<li>call ${b.call} rank ${b.rank}: max|diff| ${b.maxAbs.toPrecision(3)}, ${b.mismatched}/${b.numel} out of tolerance</li>`).join('');
    const what = r.ok ? `${r.compared - r.badCount}/${r.compared} outputs reproduce (${r.bitExact} bit-exact)${r.badCount > r.bad.length ? `; the first ${r.bad.length} out of tolerance:` : ''}` : `not run: ${esc(r.error)}`;
    return `<li class="verdict-replay" data-role="${esc(r.role)}">${esc(r.role)} on ${esc(r.host)} devices ${r.devices.join(',')}${r.ran && r.ran !== 'here' ? ` (${esc(r.ran)})` : ''}: ${what}${bad ? `<ul>${bad}</ul>` : ''}</li>`;
  }).join('');
  return `<div class="verdict" data-verdict="${esc(v.verdict)}"><b>${esc(v.verdict)}</b>: ${esc(v.reason)}${v.bisectFirst ? `<br>bisect: <code>${esc(v.bisectFirst)}</code>` : ''}${v.devices.map((d) => `<br><span class="verdict-device">${esc(d)}</span>`).join('')}<ul>${replays}</ul></div>`;
}
