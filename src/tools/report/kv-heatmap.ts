// A KV dump rank dir at a glance: one row per tensor (layer × k/v), one column per KV head, the
// colour the largest |value| in that head (magenta: a NaN or infinity there). Inline SVG.
import { loadCapture } from '../assemble';
import { decodeElements, isFloatDType } from '../compare';
import { colour } from '../heatmap';
import { esc } from './html';

export interface KvHeatmap {
  rows: string[];
  cols: number;
  /** cells[r][c]: max |x| of head c; NaN when the head holds a NaN or an infinity. */
  cells: number[][];
  max: number;
}

/** Per-head max |x| of every floating tensor in `dir`; heads are the second-last dim (the KV layout). */
export function kvHeatmap(dir: string): KvHeatmap {
  const rows: string[] = [];
  const cells: number[][] = [];
  let cols = 1;
  let max = 0;
  for (const t of loadCapture(dir)) {
    if (!isFloatDType(t.dtype)) continue;
    const v = decodeElements(t.dtype, t.data);
    const heads = t.shape.length >= 3 ? t.shape[t.shape.length - 2] : 1;
    const inner = t.shape.length >= 3 ? t.shape[t.shape.length - 1] : v.length;
    const row = new Array<number>(heads).fill(0);
    for (let i = 0; i < v.length; i++) {
      const h = Math.floor(i / inner) % heads;
      const a = Math.abs(v[i]);
      if (!Number.isFinite(a)) row[h] = NaN;
      else if (!Number.isNaN(row[h]) && a > row[h]) row[h] = a;
    }
    for (const x of row) if (Number.isFinite(x) && x > max) max = x;
    rows.push(t.key);
    cells.push(row);
    cols = Math.max(cols, heads);
  }
  return { rows, cols, cells, max };
}

export function heatmapSvg(h: KvHeatmap, rank: number): string {
  const c = 11;
  const labelW = 170;
  const w = labelW + h.cols * c + 2;
  const ht = h.rows.length * c + 2;
  const parts: string[] = [];
  h.rows.forEach((name, r) => {
    parts.push(`<text x="0" y="${r * c + 9}" font-size="9">${esc(name.length > 32 ? `…${name.slice(-31)}` : name)}</text>`);
    h.cells[r].forEach((v, k) => {
      const [R, G, B] = colour(v, h.max);
      const shown = Number.isNaN(v) ? 'NaN or inf' : v.toPrecision(3);
      parts.push(`<rect x="${labelW + k * c}" y="${r * c}" width="${c - 1}" height="${c - 1}" fill="rgb(${R},${G},${B})"><title>${esc(`rank ${rank} ${name} head ${k}: max |x| ${shown}`)}</title></rect>`);
    });
  });
  return `<svg class="kvmap" width="${w}" height="${ht}" viewBox="0 0 ${w} ${ht}">${parts.join('')}</svg>`;
}
