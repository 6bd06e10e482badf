// `wavebus report DIR`: one self-contained HTML page of a tree (docs/report.md). Sections are
// made by their own modules; this one reads the tree once and puts them together.
import { writeFileAtomic } from '../../artifacts/atomic-write';
import { DEFAULT_FILE_MODE, SENSITIVE_FILE_MODE } from '../../artifacts/artifact-mode';
import * as path from 'path';
import { bisectSection } from './bisect-section';
import { collectTree } from './collect';
import { page } from './html';
import { hasTokenIds, incidentsSection } from './incidents';
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

export function buildReport(dir: string, opts: ReportOptions): { html: string; failures: string[]; incidents: number; sensitive: boolean } {
  const tree = collectTree(dir, { verify: true });
  const v = verification(tree);
  const pageDir = path.dirname(path.resolve(opts.out));
  const html = page(`wavebus report: ${path.basename(tree.root)}`, banner(v), [
    jobSection(tree, pageDir),
    timelineSection(tree),
    gridSection(tree),
    incidentsSection(tree, { pageDir, vocab: opts.vocab, heatmapBudget: HEATMAP_BUDGET }),
    bisectSection(tree, { pageDir }),
    verificationSection(v),
  ]);
  // Token ids (save_sensitive_info) make the page as sensitive as the reports that hold them.
  const sensitive = tree.incidents.some((i) => hasTokenIds(i.report));
  return { html, failures: v.failures, incidents: tree.incidents.length, sensitive };
}

/** Build and write the page: replaced whole, 0640, or 0600 when it shows token ids (like the reports). */
export function writeReport(dir: string, opts: ReportOptions): { file: string; bytes: number; failures: string[]; incidents: number } {
  const r = buildReport(dir, opts);
  writeFileAtomic(path.resolve(opts.out), r.html, { mode: r.sensitive ? SENSITIVE_FILE_MODE : DEFAULT_FILE_MODE });
  return { file: path.resolve(opts.out), bytes: Buffer.byteLength(r.html), failures: r.failures, incidents: r.incidents };
}
