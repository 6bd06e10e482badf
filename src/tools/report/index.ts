// `wavebus report DIR`: one self-contained HTML page of a tree (docs/report.md). Sections are
// made by their own modules; this one reads the tree once and puts them together.
import * as fs from 'fs';
import * as path from 'path';
import { collectTree } from './collect';
import { page } from './html';
import { incidentsSection } from './incidents';
import { gridSection } from './grid';
import { jobSection } from './job';
import { timelineSection } from './timeline-svg';
import { banner, verification, verificationSection } from './verify';
import type { Vocabulary } from './vocab';

export interface ReportOptions {
  /** Where the page will be written: links to the tree's files are relative to its folder. */
  out: string;
  vocab?: Vocabulary;
}

/** Heatmaps read at most this many tensor bytes and draw at most this many rank dirs per page. */
export const HEATMAP_BUDGET = { bytes: 64 << 20, maps: 256 };

export function buildReport(dir: string, opts: ReportOptions): { html: string; failures: string[]; incidents: number } {
  const tree = collectTree(dir, { verify: true });
  const v = verification(tree);
  const pageDir = path.dirname(path.resolve(opts.out));
  const html = page(`wavebus report: ${path.basename(tree.root)}`, banner(v), [
    jobSection(tree),
    timelineSection(tree),
    gridSection(tree),
    incidentsSection(tree, { pageDir, vocab: opts.vocab, heatmapBudget: HEATMAP_BUDGET }),
    verificationSection(v),
  ]);
  return { html, failures: v.failures, incidents: tree.incidents.length };
}

/** Build and write the page (plain write: the page is a view, not an artifact). */
export function writeReport(dir: string, opts: ReportOptions): { file: string; bytes: number; failures: string[]; incidents: number } {
  const r = buildReport(dir, opts);
  fs.writeFileSync(opts.out, r.html);
  return { file: path.resolve(opts.out), bytes: Buffer.byteLength(r.html), failures: r.failures, incidents: r.incidents };
}
