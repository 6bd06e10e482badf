// The Incidents section: per incident its report fields and detector detail, the token stream
// around it (ids; text only with a vocabulary and only where save_sensitive_info let the report
// keep ids), its KV dump per rank (shape, dtype, checksum status, a per-layer heatmap) and links.
import * as path from 'path';
import type { BundleReport } from '../inspect';
import type { Incident, ReportTree } from './collect';
import { esc, fileLink, kvTable, typeColour } from './html';
import { heatmapSvg, kvHeatmap } from './kv-heatmap';
import { fingerprintHtml } from './fingerprint-section';
import type { Vocabulary } from './vocab';

export interface IncidentOptions {
  /** The page's folder: links are relative to it. */
  pageDir: string;
  vocab?: Vocabulary;
  /** Tensor bytes the page may read for heatmaps, and how many it draws, in all (the rest say so). */
  heatmapBudget: { bytes: number; maps: number };
}

const TOKEN_KEYS = ['recent_token_ids', 'output_token_ids', 'prompt_token_ids'] as const;
/** Ids shown per list: the end of the stream is where the incident is. */
const MAX_TOKENS_SHOWN = 256;

/** save_sensitive_info of the config in force (false when no config says). */
export function sensitiveAllowed(tree: ReportTree): boolean {
  return tree.configs.some((c) => (c.value as any)?.report?.save_sensitive_info === true);
}

/** Token id lists of a report: at its top level or in the detector's detail (where the guard puts them). */
function tokenLists(r: Record<string, unknown>): [string, unknown[]][] {
  const detail = (r.detail && typeof r.detail === 'object' ? r.detail : {}) as Record<string, unknown>;
  return TOKEN_KEYS.flatMap((k) => (Array.isArray(r[k]) ? [[k, r[k]]] : Array.isArray(detail[k]) ? [[k, detail[k]]] : []) as [string, unknown[]][]);
}

export const hasTokenIds = (r: Record<string, unknown>): boolean => tokenLists(r).length > 0;

function tokensHtml(inc: Incident, vocab: Vocabulary | undefined, sensitive: boolean): string {
  const lists = tokenLists(inc.report);
  if (lists.length === 0) return '<p>No token ids in the report (they are kept only with <code>report.save_sensitive_info</code>).</p>';
  const text = vocab !== undefined && sensitive;
  const note = vocab === undefined ? 'ids only (give <code>--vocab FILE</code> for text)' : sensitive ? `text from ${esc(vocab.source)}` : 'ids only: the config in force does not set report.save_sensitive_info, so no text is shown';
  return lists
    .map(([k, raw]) => {
      // "hashed" reports hold keyed hashes (strings): shown as they are, never looked up as text.
      const ids = raw.map((x) => (typeof x === 'string' ? x : Number(x)));
      const shown = ids.slice(-MAX_TOKENS_SHOWN);
      const spans = shown.map((id, i) => {
        const last = i === shown.length - 1 && k !== 'prompt_token_ids';
        const label = text && typeof id === 'number' ? vocab!.text(id) : String(id);
        return `<span${last ? ' class="hit"' : ''} title="${esc(`id ${id}`)}">${esc(label)}</span>`;
      });
      return `<h4>${esc(k)} (${ids.length}${ids.length > shown.length ? `, last ${shown.length} shown` : ''}; ${note})</h4><div class="tokens">${spans.join('')}</div>`;
    })
    .join('');
}

function dumpHtml(tree: ReportTree, inc: Incident, opts: IncidentOptions, budget: { bytes: number; maps: number }, byDir: Map<string, BundleReport>): string {
  const r = inc.report;
  if (r.dump_skipped_reason) return `<p class="fail">KV dump skipped: ${esc(r.dump_skipped_reason)}</p>`;
  if (!inc.dump) return r.dump_attempted ? `<p>The dump dir (${esc(r.dump_dir)}) is not in this tree.</p>` : '<p>No KV dump was asked for (dump_kv not in on_trigger).</p>';
  const w: BundleReport = inc.dump;
  const link = (rel: string, text?: string) => fileLink(path.relative(opts.pageDir, path.join(tree.root, rel)).split(path.sep).join('/'), text);
  const dirs = (w.info.rank_dirs ?? {}) as Record<string, string>;
  const rows = Object.entries(dirs)
    .sort((a, b) => Number(a[0]) - Number(b[0]))
    .map(([g, name]) => {
      const dir = `${w.dir}/${name}`;
      const rb = byDir.get(dir);
      if (!rb) return `<tr><td>${esc(g)}</td><td>${link(dir, name)}</td><td colspan="3" class="fail">no dump.json</td></tr>`;
      const shapes = [...new Set(rb.tensors.map((t) => `[${t.shape.join(', ')}]`))].join(' ');
      const failed = rb.files.filter((f) => f.verified === false).length;
      const checked = rb.files.filter((f) => f.verified !== undefined).length;
      const status = rb.problems.length ? `<span class="fail">${esc(rb.problems.join('; '))}</span>` : checked ? `<span class="okc">${checked - failed}/${rb.files.length} verified</span>` : 'not verified';
      let map = '';
      if (rb.problems.length === 0 && budget.bytes >= rb.bytes && budget.maps > 0) {
        budget.bytes -= rb.bytes;
        budget.maps--;
        try {
          map = heatmapSvg(kvHeatmap(path.join(tree.root, dir)), Number(g));
        } catch (e) {
          map = `<span class="fail">${esc((e as Error).message)}</span>`;
        }
      } else map = rb.problems.length ? 'not drawn (the files fail their checks)' : 'not drawn (over the page’s read budget; see <code>wavebus compare</code>)';
      // Every file linked while the table is small; a wide job's rows link their dir (the page stays small).
      const files = Object.keys(dirs).length <= 16 ? rb.files.map((f) => link(`${dir}/${f.name}`, f.name)).join(' ') : `${rb.files.length} file(s)`;
      return `<tr><td>${esc(g)}</td><td>${link(dir, name)}<br><small>${files}</small></td><td>${esc(rb.tensors.length)} tensor(s) ${esc(shapes)} ${esc(rb.dtypes.join(','))}</td><td>${status}</td><td>${map}</td></tr>`;
    });
  const records = ['request_info.json', 'manifest.json'].map((n) => link(`${w.dir}/${n}`, n)).join(' ');
  const probs = w.problems.length ? `<ul class="fail">${w.problems.map((p) => `<li>${esc(p)}</li>`).join('')}</ul>` : '';
  return `<p>KV dump ${link(w.dir)} (${records}): ${w.ranks.length} of ${((w.info.expected_ranks as number[]) ?? []).length} expected rank(s).</p>${probs}
<table><tr><th>rank</th><th>dir and files</th><th>tensors</th><th>checksums</th><th>max |x| per layer × head</th></tr>${rows.join('')}</table>`;
}

export function incidentsSection(tree: ReportTree, opts: IncidentOptions): string {
  if (tree.incidents.length === 0) return `<section id="incidents"><h2>Incidents (<span id="incident-count">0</span>)</h2><p>No incident reports in the tree.</p></section>`;
  const sensitive = sensitiveAllowed(tree);
  const budget = { ...opts.heatmapBudget };
  const byDir = new Map(tree.inspect.bundles.filter((b) => b.kind === 'kv_dump').map((b) => [b.dir, b]));
  const types = [...new Set(tree.incidents.map((i) => i.type))].sort();
  const body = tree.incidents.map((inc, n) => {
    const r = inc.report;
    const { detail, block_ids: blocks, fingerprint_diff: _fp, ...fields } = r as Record<string, unknown>;
    if (Array.isArray(blocks)) fields.block_ids = blocks.length > 32 ? `${blocks.slice(0, 32).join(',')} … (${blocks.length})` : blocks.join(',');
    for (const k of TOKEN_KEYS) if (Array.isArray(fields[k])) fields[k] = `${(fields[k] as unknown[]).length} ids (below)`;
    const shownDetail = detail && typeof detail === 'object' ? { ...(detail as Record<string, unknown>) } : detail;
    if (shownDetail && typeof shownDetail === 'object') for (const k of TOKEN_KEYS) if (Array.isArray((shownDetail as any)[k])) (shownDetail as any)[k] = `${(shownDetail as any)[k].length} ids (below)`;
    const reportLink = fileLink(path.relative(opts.pageDir, path.join(tree.root, inc.file)).split(path.sep).join('/'), inc.file);
    return `<details class="incident" data-type="${esc(inc.type)}" id="incident-${n}"${n < 20 ? ' open' : ''}>
<summary><span style="color:${typeColour(inc.type)}">●</span> ${esc(inc.type)} · ${esc(r.req_id)} · wave ${esc(r.detect_wave)} · replica dp${esc(r.dp_rank ?? 0)}</summary>
<p>Report: ${reportLink}</p>
<div class="flex"><div><h4>Report fields</h4>${kvTable(fields)}</div><div><h4>Detector detail</h4>${shownDetail && typeof shownDetail === 'object' ? kvTable(shownDetail as Record<string, unknown>) : '<p>none</p>'}</div></div>
<h4>Token stream</h4>${tokensHtml(inc, opts.vocab, sensitive)}
<h4>Fingerprint differences</h4>${fingerprintHtml(r as Record<string, unknown>)}
<h4>KV dump</h4>${dumpHtml(tree, inc, opts, budget, byDir)}
</details>`;
  });
  const filter = `<label hidden>type <select id="type-filter"><option value="">all</option>${types.map((t) => `<option value="${esc(t)}">${esc(t)}</option>`).join('')}</select></label> showing <span id="type-count">${tree.incidents.length}</span>`;
  return `<section id="incidents"><h2>Incidents (<span id="incident-count">${tree.incidents.length}</span>)</h2>
<p>${filter}</p>
${body.join('\n')}
</section>`;
}
