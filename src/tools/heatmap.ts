// A picture of a comparison: one row per tensor (layers × k/v for KV dumps), one column per
// head (KV layout) — colour = max |a - b| in that cell. Written as a PNG (our own encoder:
// IHDR + one zlib IDAT + IEND, CRCs from zlib.crc32) or as a self-contained HTML table.
import * as fs from 'fs';
import * as zlib from 'zlib';
import type { CompareResult, TensorComparison } from './compare';

export interface HeatmapGrid {
  rows: string[];
  cols: number;
  /** cells[r][c]: max abs diff; null = no such head; NaN = NaN mismatch only; -1 = not comparable. */
  cells: (number | null)[][];
  max: number;
}

export function heatmapGrid(result: CompareResult): HeatmapGrid {
  const rows: string[] = [];
  const cells: (number | null)[][] = [];
  let cols = 1;
  let max = 0;
  const cellsOf = (t: TensorComparison): number[] => {
    if (t.status === 'shape_mismatch' || t.status === 'only_in_a' || t.status === 'only_in_b') return [-1];
    const v = t.per_head_max_abs ?? [t.max_abs_diff ?? 0];
    // A NaN against a number has no magnitude: mark the row so it is not drawn as "equal".
    return (t.nan_mismatched ?? 0) > 0 && v.every((x) => x === 0) ? v.map(() => NaN) : v;
  };
  for (const t of result.tensors) {
    const v = cellsOf(t);
    rows.push(t.key);
    cells.push(v);
    cols = Math.max(cols, v.length);
    for (const x of v) if (Number.isFinite(x) && x > max) max = x;
  }
  for (const r of cells) while (r.length < cols) r.push(null);
  return { rows, cols, cells, max };
}

type RGB = [number, number, number];

/** White (equal) → yellow → red → dark red (the largest difference); infinity is dark red too. */
export function colour(v: number | null, max: number): RGB {
  if (v === null) return [255, 255, 255];
  if (v === -1) return [160, 160, 160];
  if (Number.isNaN(v)) return [200, 0, 200];
  if (v === 0) return [247, 247, 247];
  const t = !Number.isFinite(v) || max === 0 ? 1 : Math.min(1, v / max);
  const stops: RGB[] = [
    [255, 237, 160],
    [254, 178, 76],
    [240, 59, 32],
    [128, 0, 38],
  ];
  const x = t * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  return [0, 1, 2].map((k) => Math.round(stops[i][k] + (stops[i + 1][k] - stops[i][k]) * f)) as RGB;
}

function chunk(type: string, data: Buffer): Buffer {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const td = Buffer.concat([Buffer.from(type, 'latin1'), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(zlib.crc32(td) >>> 0);
  return Buffer.concat([len, td, crc]);
}

/** Encode an 8-bit RGB image (rows of width*3 bytes) as PNG. */
export function encodePng(width: number, height: number, rgb: Buffer): Buffer {
  if (rgb.length !== width * height * 3) throw new RangeError(`encodePng: ${rgb.length} bytes for ${width}x${height} RGB`);
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8; // bit depth
  ihdr[9] = 2; // colour type: truecolour
  ihdr[10] = 0; // deflate
  ihdr[11] = 0; // adaptive filtering
  ihdr[12] = 0; // no interlace
  const raw = Buffer.alloc((width * 3 + 1) * height);
  for (let y = 0; y < height; y++) {
    raw[y * (width * 3 + 1)] = 0; // filter: none
    rgb.copy(raw, y * (width * 3 + 1) + 1, y * width * 3, (y + 1) * width * 3);
  }
  const sig = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  return Buffer.concat([sig, chunk('IHDR', ihdr), chunk('IDAT', zlib.deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}

/** The grid as a PNG: `cell` px squares with a 1 px light grid. */
export function heatmapPng(grid: HeatmapGrid, cell = 0): Buffer {
  const rows = Math.max(1, grid.rows.length);
  const c = cell || Math.max(4, Math.min(24, Math.floor(1200 / Math.max(grid.cols, rows))));
  const width = grid.cols * c + 1;
  const height = rows * c + 1;
  const rgb = Buffer.alloc(width * height * 3, 220);
  for (let r = 0; r < grid.rows.length; r++) {
    for (let k = 0; k < grid.cols; k++) {
      const [R, G, B] = colour(grid.cells[r][k], grid.max);
      for (let y = r * c + 1; y < (r + 1) * c; y++) {
        for (let x = k * c + 1; x < (k + 1) * c; x++) {
          const o = (y * width + x) * 3;
          rgb[o] = R;
          rgb[o + 1] = G;
          rgb[o + 2] = B;
        }
      }
    }
  }
  return encodePng(width, height, rgb);
}

const esc = (s: string) => s.replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);
const fmt = (v: number | null) => (v === null ? '' : v === -1 ? 'n/a' : Number.isNaN(v) ? 'NaN' : !Number.isFinite(v) ? 'inf' : v === 0 ? '0' : v.toPrecision(3));

/** A self-contained HTML page: the grid as a table, values in the cells and tooltips. */
export function heatmapHtml(grid: HeatmapGrid, result: CompareResult): string {
  const head = Array.from({ length: grid.cols }, (_, k) => `<th>${grid.cols > 1 ? `head ${k}` : 'max |a-b|'}</th>`).join('');
  const body = grid.rows
    .map((name, r) => {
      const t = result.tensors[r];
      const tds = grid.cells[r]
        .map((v) => {
          const [R, G, B] = colour(v, grid.max);
          const dark = R * 0.299 + G * 0.587 + B * 0.114 < 128;
          return `<td style="background:rgb(${R},${G},${B});color:${dark ? '#fff' : '#000'}" title="${esc(`${name}: ${fmt(v)}`)}">${fmt(v)}</td>`;
        })
        .join('');
      return `<tr><th class="k" title="${esc(t.status)}">${esc(name)}</th><td class="s">${esc(t.status)}</td>${tds}</tr>`;
    })
    .join('\n');
  return `<!doctype html>
<html><head><meta charset="utf-8"><title>wavebus compare</title>
<style>body{font:13px sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th.k{text-align:left;font-family:monospace}td.s{text-align:left}</style>
</head><body>
<h3>wavebus compare</h3>
<p>A: <code>${esc(result.a)}</code><br>B: <code>${esc(result.b)}</code><br>atol ${result.atol}, rtol ${result.rtol}${result.assemble_tp ? ', TP shards assembled' : ''}; colour = max |a &minus; b| (largest: ${fmt(grid.max)}); grey = not comparable; magenta = NaN against a number.</p>
<table><tr><th>tensor</th><th>status</th>${head}</tr>
${body}
</table></body></html>
`;
}

/** Write FILE.png or FILE.html; anything else is a usage error. */
export function writeHeatmap(file: string, result: CompareResult): void {
  const grid = heatmapGrid(result);
  if (file.endsWith('.png')) fs.writeFileSync(file, heatmapPng(grid));
  else if (file.endsWith('.html') || file.endsWith('.htm')) fs.writeFileSync(file, heatmapHtml(grid, result));
  else throw new RangeError(`--heatmap: ${file}: expected a .png or .html file name`);
}
