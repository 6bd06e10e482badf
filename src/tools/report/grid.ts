// The Completeness grid: one row per rank, one column per KV dump and per input-snapshot call;
// each cell complete, missing, skipped, corrupt (or not applicable), the reason in its tooltip.
import type { BundleReport } from '../inspect';
import type { ReportTree } from './collect';
import { esc } from './html';
import { captureGroups } from './timeline-svg';

export type CellState = 'complete' | 'missing' | 'skipped' | 'corrupt' | 'na';

export interface GridColumn {
  label: string;
  kind: 'dump' | 'snapshot';
  cells: Map<number, { state: CellState; reason: string }>;
}

/** Problems of `wave` (and of its rank bundles) that concern the rank dir `dirName`. */
function rankProblems(wave: BundleReport, dirName: string, rankBundle: BundleReport | undefined): string[] {
  const prefix = `${wave.dir}/${dirName}/`;
  const own = wave.problems.filter((p) => p.startsWith(prefix) || p.startsWith(`${wave.dir}/${dirName}:`));
  return [...new Set([...own, ...(rankBundle?.problems ?? [])])];
}

function dumpColumn(wave: BundleReport, byDir: Map<string, BundleReport>, ranks: number[]): GridColumn {
  const expected = new Set<number>([...((wave.info.expected_ranks as number[]) ?? []), ...((wave.info.manifest_missing as number[] | null) ?? [])]);
  const skipped = new Set<number>((wave.info.skipped_ranks as number[]) ?? []);
  const dirs = (wave.info.rank_dirs ?? {}) as Record<string, string>;
  const cells = new Map<number, { state: CellState; reason: string }>();
  for (const g of ranks) {
    const dirName = dirs[String(g)];
    if (dirName !== undefined) {
      const rb = byDir.get(`${wave.dir}/${dirName}`);
      const probs = rankProblems(wave, dirName, rb);
      const verified = rb ? rb.files.filter((f) => f.verified).length : 0;
      cells.set(g, probs.length ? { state: 'corrupt', reason: probs.join('; ') } : { state: 'complete', reason: `${dirName}/: ${rb?.files.length ?? 0} file(s), ${verified} checksum(s) verified` });
    } else if (skipped.has(g)) {
      cells.set(g, { state: 'skipped', reason: `rank ${g} wrote dump_skipped.json` });
    } else if (expected.has(g)) {
      const why = wave.problems.find((p) => p.includes(`rank ${g} missing`)) ?? `rank ${g} expected, no bundle`;
      cells.set(g, { state: 'missing', reason: why });
    } else cells.set(g, { state: 'na', reason: `rank ${g} does not copy this dump` });
  }
  return { label: `w${String(wave.info.arm_wave)} ${String(wave.info.incident_type)} ${String(wave.info.req_id)}`, kind: 'dump', cells };
}

function snapshotColumns(bundles: BundleReport[], ranks: number[]): GridColumn[] {
  const snaps = bundles.filter((b) => b.kind === 'snapshot');
  // A graph's capturing ranks: every rank that wrote any of its calls is expected in each call.
  const byHash = new Map<string, Set<number>>();
  for (const b of snaps) {
    const h = String(b.info.hash);
    const set = byHash.get(h) ?? new Set<number>();
    for (const g of b.ranks) set.add(g);
    byHash.set(h, set);
  }
  const calls = [...new Map(captureGroups(bundles).map((c) => [`${c.hash}\0${c.call}`, c])).values()].sort((a, b) => a.hash.localeCompare(b.hash) || a.call - b.call);
  return calls.map((c) => {
    const cells = new Map<number, { state: CellState; reason: string }>();
    const want = byHash.get(c.hash) ?? new Set<number>();
    for (const g of ranks) {
      const b = snaps.find((s) => s.ranks[0] === g && String(s.info.hash) === c.hash && Number(s.info.call_index) === c.call);
      if (b) cells.set(g, b.problems.length ? { state: 'corrupt', reason: b.problems.join('; ') } : { state: 'complete', reason: `${b.dir}: ${b.files.length} file(s)` });
      else if (want.has(g)) cells.set(g, { state: 'missing', reason: `rank ${g} captured other calls of ${c.hash}, not call ${c.call}` });
      else cells.set(g, { state: 'na', reason: `rank ${g} captured nothing of ${c.hash}` });
    }
    return { label: `call${c.call} ${c.hash}`, kind: 'snapshot' as const, cells };
  });
}

export function gridColumns(tree: ReportTree): { ranks: number[]; columns: GridColumn[] } {
  const bundles = tree.inspect.bundles;
  const seen = bundles.flatMap((b) => b.ranks).concat(bundles.flatMap((b) => ((b.info.expected_ranks as number[]) ?? []).map(Number)));
  const world = tree.layout?.worldSize ?? (seen.length ? Math.max(...seen) + 1 : 0);
  const ranks = Array.from({ length: world }, (_, g) => g);
  const waves = bundles.filter((b) => b.kind === 'dump_wave');
  const byDir = new Map(bundles.filter((b) => b.kind === 'kv_dump').map((b) => [b.dir, b]));
  return { ranks, columns: [...waves.map((w) => dumpColumn(w, byDir, ranks)), ...snapshotColumns(bundles, ranks)] };
}

export function gridSection(tree: ReportTree): string {
  const { ranks, columns } = gridColumns(tree);
  if (columns.length === 0) return `<section id="grid"><h2>Completeness</h2><p>No KV dumps or input snapshots in the tree.</p></section>`;
  const counts: Record<CellState, number> = { complete: 0, missing: 0, skipped: 0, corrupt: 0, na: 0 };
  for (const c of columns) for (const v of c.cells.values()) counts[v.state]++;
  const head = columns.map((c) => `<th class="col" title="${esc(c.label)}">${esc(c.label)}</th>`).join('');
  const body = ranks
    .map((g) => {
      const tds = columns.map((c) => {
        const v = c.cells.get(g)!;
        return `<td class="cell ${v.state}" data-rank="${g}" data-kind="${c.kind}" title="${esc(`rank ${g}, ${c.label}: ${v.state} — ${v.reason}`)}"></td>`;
      });
      return `<tr><th>rank ${g}</th>${tds.join('')}</tr>`;
    })
    .join('\n');
  const legend = (['complete', 'missing', 'skipped', 'corrupt', 'na'] as CellState[]).map((s) => `<span><i class="key ${s}"></i>${s === 'na' ? 'not applicable' : s} (${counts[s]})</span>`).join('');
  return `<section id="grid"><h2>Completeness</h2>
<p>${ranks.length} rank(s) × ${columns.length} column(s): KV dumps (w&lt;copy wave&gt; type request) and input-snapshot calls (call&lt;N&gt; graph). Hover a cell for the reason.</p>
<div class="legend">${legend}</div>
<div style="overflow:auto"><table class="grid"><tr><th></th>${head}</tr>
${body}
</table></div></section>`;
}
