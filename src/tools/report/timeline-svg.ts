// The Timeline section: one inline SVG, waves along x; per DP replica a row per incident type
// (a dot at the detect wave), a row of KV dumps (a square at the copy wave) and a row of input
// captures (a triangle at the engine step of the captured forward).
import type { BundleReport } from '../inspect';
import type { ReportTree } from './collect';
import { esc, typeColour } from './html';

interface Mark {
  replica: number;
  row: string;
  x: number;
  cls: 'incident' | 'dump' | 'capture';
  colour: string;
  title: string;
  type?: string;
}

const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) ? v : undefined);

/** The captures of the tree: one per (replica, graph, call), with the ranks that wrote it. */
export function captureGroups(bundles: BundleReport[]): { replica: number; hash: string; call: number; step?: number; ranks: number[] }[] {
  const groups = new Map<string, { replica: number; hash: string; call: number; step?: number; ranks: number[] }>();
  for (const b of bundles) {
    if (b.kind !== 'snapshot') continue;
    const replica = num(b.info.dp_rank) ?? 0;
    const key = `${replica}\0${String(b.info.hash)}\0${String(b.info.call_index)}`;
    const g = groups.get(key) ?? { replica, hash: String(b.info.hash), call: Number(b.info.call_index), step: num(b.info.global_step), ranks: [] };
    g.ranks.push(...b.ranks);
    groups.set(key, g);
  }
  return [...groups.values()];
}

export function timelineSection(tree: ReportTree): string {
  const marks: Mark[] = [];
  for (const inc of tree.incidents) {
    const r = inc.report;
    const w = num(r.detect_wave);
    if (w === undefined) continue;
    marks.push({ replica: num(r.dp_rank) ?? 0, row: inc.type, x: w, cls: 'incident', colour: typeColour(inc.type), type: inc.type, title: `${inc.type} ${String(r.req_id)} detected at wave ${w}` });
  }
  for (const b of tree.inspect.bundles) {
    if (b.kind !== 'dump_wave') continue;
    const w = num(b.info.arm_wave);
    if (w === undefined) continue;
    const bad = b.problems.length > 0;
    marks.push({ replica: num(b.info.dp_rank) ?? 0, row: 'KV dumps', x: w, cls: 'dump', colour: bad ? '#c5221f' : '#5f6368', title: `${String(b.info.incident_type)} dump of ${String(b.info.req_id)} copied at the end of wave ${w}: ${b.ranks.length} rank(s)${bad ? `, ${b.problems.length} problem(s)` : ''}` });
  }
  for (const c of captureGroups(tree.inspect.bundles)) {
    if (c.step === undefined) continue;
    marks.push({ replica: c.replica, row: 'captures', x: c.step, cls: 'capture', colour: '#1a73e8', title: `input capture ${c.hash} call ${c.call} at step ${c.step}, ranks ${c.ranks.sort((a, b) => a - b).join(',')}` });
  }
  if (marks.length === 0) return `<section id="timeline"><h2>Timeline</h2><p>Nothing in the tree has a wave.</p></section>`;

  const replicas = [...new Set(marks.map((m) => m.replica))].sort((a, b) => a - b);
  const types = [...new Set(marks.filter((m) => m.cls === 'incident').map((m) => m.row))].sort();
  const rowNames = [...types, 'KV dumps', 'captures'];
  const lo = Math.min(...marks.map((m) => m.x));
  const hi = Math.max(...marks.map((m) => m.x));
  const left = 150;
  const plotW = 900;
  const rowH = 16;
  const xOf = (w: number) => left + (hi === lo ? plotW / 2 : ((w - lo) / (hi - lo)) * plotW);
  const rowsPerReplica = rowNames.length + 1;
  const height = replicas.length * rowsPerReplica * rowH + 30;
  const parts: string[] = [];
  replicas.forEach((rep, ri) => {
    const top = ri * rowsPerReplica * rowH;
    parts.push(`<text x="0" y="${top + 12}" font-weight="600">replica dp${rep}</text>`);
    rowNames.forEach((name, k) => {
      const y = top + (k + 1) * rowH;
      parts.push(`<text x="10" y="${y + 11}" fill="#555">${esc(name)}</text><line x1="${left}" x2="${left + plotW}" y1="${y + 8}" y2="${y + 8}" stroke="#eee"/>`);
    });
    for (const m of marks.filter((x) => x.replica === rep)) {
      const y = top + (rowNames.indexOf(m.row) + 1) * rowH + 8;
      const x = xOf(m.x).toFixed(1);
      const t = `<title>${esc(m.title)}</title>`;
      const data = `class="ev ${m.cls}" data-wave="${m.x}" data-replica="${rep}"${m.type ? ` data-type="${esc(m.type)}"` : ''}`;
      if (m.cls === 'incident') parts.push(`<circle ${data} cx="${x}" cy="${y}" r="5" fill="${m.colour}" fill-opacity="0.8">${t}</circle>`);
      else if (m.cls === 'dump') parts.push(`<rect ${data} x="${Number(x) - 4}" y="${y - 4}" width="8" height="8" fill="${m.colour}">${t}</rect>`);
      else parts.push(`<path ${data} d="M${x} ${y - 5} l5 9 h-10 z" fill="${m.colour}">${t}</path>`);
    }
  });
  const axisY = height - 18;
  const ticks = 6;
  for (let i = 0; i <= ticks; i++) {
    const w = Math.round(lo + ((hi - lo) * i) / ticks);
    parts.push(`<line x1="${xOf(w)}" x2="${xOf(w)}" y1="${axisY - 4}" y2="${axisY}" stroke="#888"/><text x="${xOf(w)}" y="${axisY + 12}" text-anchor="middle">${w}</text>`);
  }
  parts.push(`<line x1="${left}" x2="${left + plotW}" y1="${axisY - 4}" y2="${axisY - 4}" stroke="#888"/>`);
  const legend = types.map((t) => `<span><i style="background:${typeColour(t)};border-radius:5px"></i>${esc(t)}</span>`).join('') + '<span><i style="background:#5f6368"></i>KV dump (red: a problem)</span><span><i style="background:#1a73e8"></i>input capture</span>';
  return `<section id="timeline"><h2>Timeline</h2>
<p>Waves ${lo}–${hi}. Incidents at their detect wave, KV dumps at their copy wave, input captures at the engine step of the captured forward. Hover a mark for details.</p>
<div class="legend">${legend}</div>
<svg id="timeline-svg" width="${left + plotW + 20}" height="${height}" viewBox="0 0 ${left + plotW + 20} ${height}" role="img">${parts.join('')}</svg>
</section>`;
}
