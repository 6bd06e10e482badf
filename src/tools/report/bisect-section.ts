// The Bisect section: `wavebus bisect A B --out <tree>/bisect/<name>.json` results saved in the
// tree (docs/bisect.md). Each file is what `--json` prints; it comes from the tree, so every field
// is checked before use (a file that fails is named as a verification failure, never a crash) and
// every string is escaped.
import * as path from 'path';
import { bisectNumber as num, bisectWhat as what } from '../bisect';
import type { ModuleResult } from '../bisect-compare';
import type { ReportTree } from './collect';
import { esc, fileLink } from './html';

/** At most this many results per page, each file at most this big (a few KiB per module). */
export const MAX_BISECT_FILES = 64;
export const MAX_BISECT_BYTES = 8 << 20;
/** Rows of the per-module table drawn per result (the first module out of tolerance always is). */
const MAX_ROWS = 200;

interface TreeView {
  root: string;
  call_index: number;
  tp_size: number;
  pp_size: number;
  ranks: number[];
}

/** A module's row as `--json` writes it (bisect-compare.ts); dtypes are read as the strings they are in the file. */
type ModuleView = Omit<ModuleResult, 'per_rank' | 'dtype_a' | 'dtype_b'> & { dtype_a: string; dtype_b: string };

interface NanView {
  module: string;
  key: string;
  rank: number;
  tp_rank: number;
  pp_rank: number;
  index: number[];
  value: number;
}

export interface BisectDoc {
  /** Relative to the tree, '/' separated. */
  file: string;
  a: TreeView;
  b: TreeView;
  first: ModuleView | null;
  /** The first module's row in `modules` (-1 when none is out). */
  firstIndex: number;
  nan: { a: NanView | null; b: NanView | null };
  modules: ModuleView[];
  ok: boolean;
}

/** A field that does not hold what `bisect --json` writes; the message names it. */
class Bad extends Error {}

type Obj = Record<string, unknown>;

function obj(v: unknown, at: string): Obj {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new Bad(`${at} is not an object`);
  return v as Obj;
}
function str(o: Obj, k: string, at: string): string {
  if (typeof o[k] !== 'string') throw new Bad(`${at}.${k} is not a string`);
  return o[k] as string;
}
function int(o: Obj, k: string, at: string): number {
  if (!Number.isSafeInteger(o[k]) || (o[k] as number) < 0) throw new Bad(`${at}.${k} is not a count`);
  return o[k] as number;
}
function bool(o: Obj, k: string, at: string): boolean {
  if (typeof o[k] !== 'boolean') throw new Bad(`${at}.${k} is not true or false`);
  return o[k] as boolean;
}
/** A number as `--json` writes it: finite, or "inf", "-inf", "nan". */
function real(o: Obj, k: string, at: string): number {
  const v = o[k];
  if (typeof v === 'number' && Number.isFinite(v)) return v;
  if (v === 'inf') return Infinity;
  if (v === '-inf') return -Infinity;
  if (v === 'nan') return NaN;
  throw new Bad(`${at}.${k} is not a number`);
}
function ints(o: Obj, k: string, at: string, max = 64): number[] {
  const v = o[k];
  if (!Array.isArray(v) || v.length > max || !v.every((x) => Number.isSafeInteger(x) && x >= 0)) throw new Bad(`${at}.${k} is not a list of at most ${max} counts`);
  return v as number[];
}

function treeOf(v: unknown, at: string): TreeView {
  const o = obj(v, at);
  return { root: str(o, 'root', at), call_index: int(o, 'call_index', at), tp_size: int(o, 'tp_size', at), pp_size: int(o, 'pp_size', at), ranks: ints(o, 'ranks', at, 1 << 16) };
}

function moduleOf(v: unknown, at: string): ModuleView {
  const o = obj(v, at);
  const io = str(o, 'io', at);
  if (io !== 'input' && io !== 'output') throw new Bad(`${at}.io is not input or output`);
  const m: ModuleView = {
    key: str(o, 'key', at), module: str(o, 'module', at), call: int(o, 'call', at), io, arg: int(o, 'arg', at), split: str(o, 'split', at),
    dtype_a: str(o, 'dtype_a', at), dtype_b: str(o, 'dtype_b', at), shape: ints(o, 'shape', at, 32), atol: real(o, 'atol', at), rtol: real(o, 'rtol', at),
    max_abs_diff: real(o, 'max_abs_diff', at), rel_err: real(o, 'rel_err', at), mismatched: int(o, 'mismatched', at), numel: int(o, 'numel', at),
    out_of_tolerance: bool(o, 'out_of_tolerance', at), ranks: ints(o, 'ranks', at, 1 << 16),
  };
  if (o.worst !== undefined) {
    const w = obj(o.worst, `${at}.worst`);
    m.worst = { index: ints(w, 'index', `${at}.worst`, 32), rank: int(w, 'rank', `${at}.worst`), shard_index: ints(w, 'shard_index', `${at}.worst`, 32), a: real(w, 'a', `${at}.worst`), b: real(w, 'b', `${at}.worst`) };
  }
  return m;
}

function nanOf(v: unknown, at: string): NanView | null {
  if (v === null) return null;
  const o = obj(v, at);
  return { module: str(o, 'module', at), key: str(o, 'key', at), rank: int(o, 'rank', at), tp_rank: int(o, 'tp_rank', at), pp_rank: int(o, 'pp_rank', at), index: ints(o, 'index', at, 32), value: real(o, 'value', at) };
}

/** A `bisect --json` document read from `file`, or why it is not one. */
export function bisectOf(file: string, doc: unknown): BisectDoc | string {
  try {
    const o = obj(doc, 'the document');
    if (!Array.isArray(o.modules)) throw new Bad('modules is not a list');
    const modules = o.modules.map((m, i) => moduleOf(m, `modules[${i}]`));
    const first = o.first === null ? null : moduleOf(o.first, 'first');
    const ok = bool(o, 'ok', 'the document');
    if (ok !== (first === null)) throw new Bad(`ok is ${ok} but first is ${first === null ? 'null' : 'a module'}`);
    const firstIndex = first ? modules.findIndex((m) => m.key === first.key) : -1;
    if (first && firstIndex < 0) throw new Bad(`first (${first.key}) is not in modules`);
    const nan = obj(o.nan, 'nan');
    return { file, a: treeOf(o.a, 'a'), b: treeOf(o.b, 'b'), first, firstIndex, nan: { a: nanOf(nan.a, 'nan.a'), b: nanOf(nan.b, 'nan.b') }, modules, ok };
  } catch (e) {
    if (e instanceof Bad) return e.message;
    throw e;
  }
}

const treeText = (t: TreeView) => `${t.root} (tp=${t.tp_size}${t.pp_size > 1 ? ` pp=${t.pp_size}` : ''}, ranks ${t.ranks.join(',')}, call ${t.call_index})`;
const pos = (ix: number[]) => `[${ix.join(', ')}]`;

function nanText(n: NanView | null): string {
  return n ? `${n.module}${n.key.includes(':in') ? ' (input)' : ''} on rank ${n.rank} (tp_rank ${n.tp_rank}, pp_rank ${n.pp_rank}) at ${pos(n.index)} = ${num(n.value)}` : 'none';
}

const row = (k: string, v: string, cls = '') => `<tr><th>${esc(k)}</th><td${cls ? ` class="${cls}"` : ''}>${v}</td></tr>`;

function facts(d: BisectDoc, link: string): string {
  const rows = [row('file', link), row('A (under test)', esc(treeText(d.a)), 'mono'), row('B (reference)', esc(treeText(d.b)), 'mono'), row('modules compared', esc(d.modules.length))];
  const f = d.first;
  if (f) {
    rows.push(row('result', 'a module left tolerance', 'fail'));
    rows.push(row('first out of tolerance', `<span class="bisect-first mono">${esc(what(f))}</span>`));
    rows.push(row('rank(s)', `<span class="bisect-ranks">${esc(f.ranks.join(', '))}</span>`));
    rows.push(row('max |diff|', esc(num(f.max_abs_diff))));
    rows.push(row('relative error', esc(num(f.rel_err))));
    rows.push(row('elements out', esc(`${f.mismatched} of ${f.numel} beyond atol ${f.atol} + rtol ${f.rtol}·|b|`)));
    if (f.worst) rows.push(row('largest difference at', esc(`${pos(f.worst.index)} (rank ${f.worst.rank} at ${pos(f.worst.shard_index)}): A ${num(f.worst.a)}, B ${num(f.worst.b)}`), 'mono'));
  } else {
    rows.push(row('result', 'no module out of tolerance', 'okc'));
  }
  rows.push(row('first non-finite value in A', esc(nanText(d.nan.a)), d.nan.a ? 'fail' : ''));
  rows.push(row('first non-finite value in B', esc(nanText(d.nan.b)), d.nan.b ? 'fail' : ''));
  return `<table class="kv">${rows.join('')}</table>`;
}

/** Every module's error in execution order (so its growth shows), up to MAX_ROWS, the first out always. */
function moduleTable(d: BisectDoc): string {
  const shown = d.modules.map((m, i) => ({ m, i })).filter(({ i }) => i < MAX_ROWS || i === d.firstIndex);
  const rows = shown.map(({ m, i }) => {
    const cls = i === d.firstIndex ? 'first fail' : m.out_of_tolerance ? 'out fail' : 'ok';
    const dt = `${m.dtype_a}${m.dtype_a !== m.dtype_b ? `/${m.dtype_b}` : ''}[${m.shape.join(',')}]`;
    const status = m.out_of_tolerance ? `OUT rank ${m.ranks.join(',')}` : 'ok';
    return `<tr class="bmod ${cls}"><td>${i}</td><td class="mono">${esc(what(m))}</td><td>${esc(m.split)}</td><td class="mono">${esc(dt)}</td><td>${esc(num(m.max_abs_diff))}</td><td>${esc(num(m.rel_err))}</td><td>${esc(status)}</td></tr>`;
  });
  const more = d.modules.length - shown.length;
  return `<details${d.modules.length <= 40 ? ' open' : ''}><summary>per-module error (${d.modules.length})</summary>
<table class="bisect-table"><tr><th>#</th><th>module</th><th>split</th><th>dtype[shape]</th><th>max |diff|</th><th>rel err</th><th>status</th></tr>${rows.join('')}</table>
${more > 0 ? `<p>${more} more module(s) not drawn: the file has them all.</p>` : ''}</details>`;
}

export function bisectSection(tree: ReportTree, opts: { pageDir: string }): string {
  const problems = tree.unreadable.filter((u) => u.startsWith('bisect/'));
  const failed = problems.length ? `<ul class="bisect-failures">${problems.map((p) => `<li class="fail">${esc(p)}</li>`).join('')}</ul>` : '';
  const leftOut = tree.bisectsLeftOut ? `<p>${tree.bisectsLeftOut} more result file(s) in <code>bisect/</code> not shown (at most ${MAX_BISECT_FILES} per page).</p>` : '';
  if (!tree.bisects.length) {
    return `<section id="bisect"><h2>Bisect</h2><p id="bisect-none">${problems.length ? 'no readable bisect result' : 'no bisect results'} in this tree (see docs/bisect.md)</p>${failed}</section>`;
  }
  const blocks = tree.bisects.map((d) => {
    const link = fileLink(path.relative(opts.pageDir, path.join(tree.root, d.file)).split(path.sep).join('/'), d.file);
    const head = d.first ? `<span class="fail">first out of tolerance: ${esc(what(d.first))}, rank(s) ${esc(d.first.ranks.join(', '))}</span>` : '<span class="okc">no module out of tolerance</span>';
    return `<details class="bisect" open data-file="${esc(d.file)}"><summary>${esc(d.file)}: ${head}</summary>
${facts(d, link)}
${moduleTable(d)}</details>`;
  });
  return `<section id="bisect"><h2>Bisect</h2>
<p><span id="bisect-count">${tree.bisects.length}</span> result(s) of <code>wavebus bisect A B --out DIR/bisect/NAME.json</code> (docs/bisect.md): the first module where A leaves the reference B.</p>
${failed}${leftOut}${blocks.join('\n')}</section>`;
}
