// `wavebus report --compare A B`: `wavebus compare`'s per-tensor difference table and its heatmap
// (rows: tensors, columns: heads; colour: max |a - b|) on one self-contained page.
import * as path from 'path';
import { writeFileAtomic } from '../../artifacts/atomic-write';
import { DEFAULT_FILE_MODE } from '../../artifacts/artifact-mode';
import { ConfigError } from '../../errors';
import { compareCaptures, type CompareOptions, type TensorComparison } from '../compare';
import { colour, heatmapGrid } from '../heatmap';
import { esc, page } from './html';

const num = (v: number | undefined) => (v === undefined ? '' : Number.isNaN(v) ? 'NaN' : !Number.isFinite(v) ? 'inf' : v === 0 ? '0' : v.toPrecision(4));

function row(t: TensorComparison, cells: (number | null)[], max: number): string {
  const bad = t.status !== 'equal' && t.status !== 'within_tolerance';
  const heat = cells
    .map((v, k) => {
      const [R, G, B] = colour(v, max);
      const shown = v === null ? '' : v === -1 ? 'n/a' : num(v);
      return `<td class="heat" style="background:rgb(${R},${G},${B})" title="${esc(`${t.key} head ${k}: ${shown}`)}"></td>`;
    })
    .join('');
  const shape = t.shape_a && t.shape_b && t.shape_a.join() !== t.shape_b.join() ? `[${t.shape_a}] vs [${t.shape_b}]` : `[${t.shape_a ?? t.shape_b ?? ''}]`;
  return `<tr class="tensor ${esc(t.status)}"><th class="mono">${esc(t.key)}</th><td class="${bad ? 'fail' : 'okc'}">${esc(t.status)}</td><td>${esc(t.dtype_a ?? '')}${t.dtype_b && t.dtype_b !== t.dtype_a ? `/${esc(t.dtype_b)}` : ''}</td><td>${esc(shape)}</td><td>${num(t.max_abs_diff)}</td><td>${num(t.max_rel_diff)}</td><td>${t.mismatched ?? ''}${t.numel ? `/${t.numel}` : ''}</td><td>${t.first_diff_index ? esc(`[${t.first_diff_index.join(', ')}]: ${num(t.first_diff_values?.[0])} vs ${num(t.first_diff_values?.[1])}`) : ''}</td>${heat}</tr>`;
}

export function comparePage(a: string, b: string, opts: CompareOptions = {}): { html: string; ok: boolean } {
  const r = compareCaptures(a, b, opts);
  if (r.tensors.length === 0) throw new ConfigError(`no tensors found in ${r.a} or ${r.b}`);
  const grid = heatmapGrid(r);
  const s = r.summary;
  const summary = `${r.tensors.length} tensor(s): ${s.equal} equal, ${s.within_tolerance} within tolerance, ${s.differs} differ, ${s.shape_mismatch} shape mismatch, ${s.only_in_a} only in A, ${s.only_in_b} only in B`;
  const banner = r.ok ? `<div class="banner ok" id="verify-banner">${esc(summary)}</div>` : `<div class="banner bad" id="verify-banner">Differences: ${esc(summary)}</div>`;
  const heads = Array.from({ length: grid.cols }, (_, k) => `<th>${grid.cols > 1 ? `h${k}` : 'max'}</th>`).join('');
  const body = r.tensors.map((t, i) => row(t, grid.cells[i], grid.max)).join('\n');
  const section = `<section id="compare"><h2>Per-tensor differences</h2>
<p>A: <code>${esc(r.a)}</code><br>B: <code>${esc(r.b)}</code><br>atol ${r.atol}, rtol ${r.rtol}${r.assemble_tp ? ', TP shards assembled' : ''}. Heatmap: max |a − b| per head (largest ${num(grid.max)}); grey: not comparable; magenta: NaN against a number.</p>
<table id="compare-table"><tr><th>tensor</th><th>status</th><th>dtype</th><th>shape</th><th>max |a−b|</th><th>max rel</th><th>mismatched</th><th>first difference</th>${heads}</tr>
${body}
</table></section>`;
  return { html: page('wavebus report --compare', banner, [section]).replace('</style>', 'td.heat{width:14px;padding:0}</style>'), ok: r.ok };
}

export function writeComparePage(a: string, b: string, out: string, opts: CompareOptions = {}): { file: string; ok: boolean; bytes: number } {
  const p = comparePage(a, b, opts);
  writeFileAtomic(path.resolve(out), p.html, { mode: DEFAULT_FILE_MODE });
  return { file: out, ok: p.ok, bytes: Buffer.byteLength(p.html) };
}
