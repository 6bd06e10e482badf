// `wavebus status` as a table a person reads (docs/control.md): the layout, each replica's wave and
// waves per second, each rank's liveness, late/missed vectors and protocol version, the config in
// force, incidents, dumps, captures and the recorder. No line is wider than WIDTH columns (a TP=8
// job's fits whole; longer lists are cut with "...").
import { rankCoordinates, type WorldLayout } from '../layout';
import { readLayoutJson } from '../paths';

export const WIDTH = 100;

type Doc = Record<string, any>;

const clip = (line: string): string => (line.length <= WIDTH ? line : `${line.slice(0, WIDTH - 3)}...`);
const pad = (v: unknown, n: number): string => String(v ?? '-').slice(0, n).padEnd(n);
const num = (v: unknown): string => (typeof v === 'number' ? String(v) : '-');
// The document comes from whatever answered on the port: a field of the wrong type reads as absent.
const obj = (v: unknown): Doc => (v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Doc) : {});
const arr = (v: unknown): any[] => (Array.isArray(v) ? v : []);

/** Consecutive ranks as ranges: 0-3,6. */
export function rankRanges(ranks: number[]): string {
  const s = [...ranks].sort((a, b) => a - b);
  const out: string[] = [];
  for (let i = 0; i < s.length; i++) {
    let j = i;
    while (j + 1 < s.length && s[j + 1] === s[j] + 1) j++;
    out.push(j > i ? `${s[i]}-${s[j]}` : String(s[i]));
    i = j;
  }
  return out.join(',') || '-';
}

export function renderStatus(doc: unknown, endpoint: string): string {
  const d = obj(doc);
  const lines: string[] = [];
  const parsed = readLayoutJson(d.layout);
  const layout: WorldLayout | undefined = 'layout' in parsed ? parsed.layout : undefined;
  const ranks: Record<string, Doc> = Object.fromEntries(Object.entries(obj(d.ranks)).map(([r, st]) => [r, obj(st)]));
  const shape = layout ? `DP${layout.dp} x PP${layout.pp} x TP${layout.tp}${layout.cp > 1 ? ` x CP${layout.cp}` : ''} (${layout.worldSize} ranks)` : 'unknown layout';
  lines.push(`coordinator ${endpoint}  protocol ${num(d.protocol_version)}  epoch ${num(d.epoch)}  ready ${d.ready ? 'yes' : 'no'}`);
  lines.push(`layout ${shape}  decide_ahead ${num(d.decide_ahead)}`);
  const hosts = new Map<string, number[]>();
  for (const [r, st] of Object.entries(ranks)) {
    const h = String(st.host || '?');
    if (!hosts.has(h)) hosts.set(h, []);
    hosts.get(h)!.push(Number(r));
  }
  lines.push(`hosts ${[...hosts].map(([h, rs]) => `${h} (${rankRanges(rs)})`).join(', ') || '-'}`);
  lines.push('');
  lines.push('replica  wave        waves/s  config  dumps pending');
  for (const [r, rep] of Object.entries(obj(d.replicas)).map(([r, v]) => [r, obj(v)] as const)) {
    lines.push(`${pad(r, 8)} ${pad(rep.wave, 11)} ${pad(rep.waves_per_s, 8)} ${pad(`v${rep.config_version ?? '-'}`, 7)} ${arr(rep.pending_dumps).length}`);
  }
  lines.push('');
  lines.push('rank  dp  pp  tp  live  wave        late      missed    proto  host');
  for (const [r, st] of Object.entries(ranks)) {
    const c = layout ? safeCoords(Number(r), layout) : undefined;
    const live = st.live ? 'yes' : 'NO';
    lines.push(`${pad(r, 5)} ${pad(c?.dpRank, 3)} ${pad(c?.ppRank, 3)} ${pad(c?.tpRank, 3)} ${pad(live, 5)} ${pad(st.wave, 11)} ${pad(obj(d.late_vectors)[r] ?? 0, 9)} ${pad(obj(d.missed_vectors)[r] ?? 0, 9)} ${pad(st.protocol_version, 6)} ${String(st.host ?? '').slice(0, 24)}`);
  }
  const missing = arr(d.expected_ranks).filter((r) => typeof r === 'number' && !(String(r) in ranks));
  if (missing.length > 0) lines.push(`never joined: ranks ${rankRanges(missing)}`);
  lines.push('');
  if (d.config_path !== undefined) {
    lines.push(`config v${num(d.config_version)} from ${d.config_path} (hot reload ${d.hot_reload ? 'on' : 'off'})`);
    const startup = arr(d.startup_config_errors).map(obj);
    lines.push(`last config error: ${d.config_error ? String(d.config_error) : startup.length > 0 ? `at startup: ${startup.map((i) => `${i.source}: ${i.error}`).join('; ')}` : 'none'}`);
    const inc = Object.entries(obj(d.incidents)).map(([t, a]) => `${t} ${Object.entries(obj(a)).map(([k, n]) => `${k}=${n}`).join(' ')}`);
    lines.push(`incidents: ${inc.join('; ') || 'none'}`);
  } else {
    lines.push('config: no runtime guard on this coordinator');
  }
  lines.push(...rankDigestLines(obj(d.rank_divergence)));
  const du = obj(d.dumps);
  lines.push(`dumps: armed ${num(du.armed)}, complete ${num(du.completed)}, incomplete ${num(du.incomplete)}, in flight ${num(du.pending)}${arr(d.pending_dumps).length ? ` (${arr(d.pending_dumps).join(' ')})` : ''}, asked and waiting ${num(d.manual_dumps_waiting)}`);
  const caps = arr(d.captures).map(obj);
  if (caps.length === 0) lines.push('captures: none armed');
  for (const c of caps) {
    lines.push(`capture ${c.id} replica ${c.replica}: ${c.state}, waves ${c.wave}..${c.until_wave}, ranks ${rankRanges(arr(c.ranks))}, done ${arr(c.done_ranks).length}/${arr(c.ranks).length}, bundles ${c.bundles}, errors ${c.errors}`);
  }
  lines.push(`recorder: ${d.recorder ?? 'not available'}`);
  // Incidents' verdicts (docs/verdict.md): the counts, then the newest three.
  const vd = obj(d.verdicts);
  const vc = Object.entries(obj(vd.counts)).filter(([, n]) => Number(n) > 0);
  lines.push(`verdicts: ${vc.map(([k, n]) => `${k} ${n}`).join(', ') || 'none reported'}`);
  for (const v of arr(vd.latest).map(obj).slice(-3)) {
    lines.push(`  ${v.incident} ${String(v.verdict).toUpperCase()} host ${v.host}${arr(v.devices).length ? ` devices ${arr(v.devices).join(',')}` : ''}: ${v.reason}`);
    if (v.fingerprint) lines.push(`    ${v.fingerprint}`);
  }
  return `${lines.map(clip).join('\n')}\n`;
}

/**
 * rank_divergence's comparisons per replica (docs/runtime-guard.md): a rank without a digest for a
 * wave is "unknown" there, shown apart from the divergences. Nothing when no wave was compared.
 */
function rankDigestLines(rd: Doc): string[] {
  const out: string[] = [];
  for (const [r, v] of Object.entries(rd).map(([r, v]) => [r, obj(v)] as const)) {
    const settled = ['agreed', 'diverged', 'partial', 'unknown'].reduce((n, k) => n + (typeof v[k] === 'number' ? v[k] : 0), 0);
    if (settled === 0) continue;
    // Per rank: the waves it was unknown in.
    const byRank = Object.entries(obj(v.unknown_by_rank)).map(([k, n]) => `rank ${k}: ${n}`).join(', ');
    out.push(`rank digests replica ${r}: waves agreed ${num(v.agreed)}, diverged ${num(v.diverged)}, with an unknown rank ${num(v.waves_with_unknown)}${byRank ? ` (${byRank})` : ''}`);
  }
  return out;
}

function safeCoords(rank: number, layout: WorldLayout): ReturnType<typeof rankCoordinates> | undefined {
  try {
    return rankCoordinates(rank, layout);
  } catch {
    return undefined;
  }
}
