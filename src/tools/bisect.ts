// `wavebus bisect A B`: two probe trees (a TP=N replay against TP=1, two builds, two hosts), module
// by module in execution order. The answer is the first module whose output leaves tolerance, the
// A rank(s) whose shard differs and where; the table of every module shows error grow. NaN
// provenance: the first non-finite value in either tree. A module on one side only is bad input.
import { CompareInputError } from '../errors';
import { compareModule, DEFAULT_TOLERANCES, firstNonFinite, type ModuleResult, type NonFinite, type Tolerances } from './bisect-compare';
import { loadProbeTree, type ProbeTree } from './bisect-load';

export interface BisectOptions {
  tolerances?: Partial<Tolerances>;
  /** The call index to compare when a tree holds several. */
  call?: number;
}

export interface TreeSummary {
  root: string;
  call_index: number;
  tp_size: number;
  pp_size: number;
  ranks: number[];
  modules: number;
}

export interface BisectResult {
  a: TreeSummary;
  b: TreeSummary;
  tolerances: Tolerances;
  /** The first module (A's execution order) out of tolerance; null when none is. */
  first: ModuleResult | null;
  nan: { a: NonFinite | null; b: NonFinite | null };
  modules: ModuleResult[];
  ok: boolean;
}

const summary = (t: ProbeTree): TreeSummary => ({ root: t.root, call_index: t.callIndex, tp_size: t.tpSize, pp_size: t.ppSize, ranks: t.ranks, modules: t.modules.length });

export async function bisect(a: string, b: string, opts: BisectOptions = {}): Promise<BisectResult> {
  const tolerances: Tolerances = { ...DEFAULT_TOLERANCES, ...(opts.tolerances ?? {}) };
  const ta = await loadProbeTree(a, 'A', opts.call);
  const tb = await loadProbeTree(b, 'B', opts.call);
  const mb = new Map(tb.modules.map((m) => [m.key, m]));
  const ka = new Set(ta.modules.map((m) => m.key));
  const onlyA = ta.modules.filter((m) => !mb.has(m.key)).map((m) => m.key);
  const onlyB = tb.modules.filter((m) => !ka.has(m.key)).map((m) => m.key);
  if (onlyA.length || onlyB.length) {
    const list = (xs: string[]) => `${xs.slice(0, 5).join(', ')}${xs.length > 5 ? ` and ${xs.length - 5} more` : ''}`;
    const parts = [onlyA.length ? `only in A: ${list(onlyA)}` : '', onlyB.length ? `only in B: ${list(onlyB)}` : ''].filter(Boolean);
    throw new CompareInputError(`modules recorded on one side only (${parts.join('; ')}); record both runs with the same probe filters`);
  }
  const modules = ta.modules.map((m) => compareModule(m, mb.get(m.key)!, tolerances));
  const first = modules.find((m) => m.out_of_tolerance) ?? null;
  return {
    a: summary(ta),
    b: summary(tb),
    tolerances,
    first,
    nan: { a: firstNonFinite(ta.modules, 'a') ?? null, b: firstNonFinite(tb.modules, 'b') ?? null },
    modules,
    ok: first === null,
  };
}

const num = (v: number) => (Number.isNaN(v) ? 'nan' : !Number.isFinite(v) ? (v > 0 ? 'inf' : '-inf') : v === 0 ? '0' : Math.abs(v) < 1e-3 || Math.abs(v) >= 1e6 ? v.toExponential(2) : v.toPrecision(3));
const what = (m: Pick<ModuleResult, 'module' | 'call' | 'io' | 'arg'>) => `${m.module}${m.call > 0 ? ` (call ${m.call})` : ''}${m.io === 'input' ? ` input ${m.arg}` : m.arg > 0 ? ` output ${m.arg}` : ''}`;

function nanLine(n: NonFinite | null, tree: string): string {
  return n ? `${tree}: ${n.module}${n.key.includes(':in') ? ' (input)' : ''} rank ${n.rank} (tp_rank ${n.tp_rank}, pp_rank ${n.pp_rank}) at [${n.index.join(', ')}] = ${num(n.value)}` : `${tree}: none`;
}

/** The text report: the answer first, NaN provenance, then one table row per module. */
export function formatBisect(r: BisectResult): string {
  const out: string[] = [];
  const tree = (t: TreeSummary) => `tp=${t.tp_size}${t.pp_size > 1 ? ` pp=${t.pp_size}` : ''} ranks ${t.ranks.join(',')}`;
  out.push(`A ${r.a.root} (${tree(r.a)}, call ${r.a.call_index})  vs  B ${r.b.root} (${tree(r.b)}, call ${r.b.call_index}): ${r.modules.length} modules`);
  if (r.first) {
    const f = r.first;
    const w = f.worst!;
    out.push(`FIRST OUT OF TOLERANCE: ${what(f)}`);
    out.push(`  rank(s) ${f.ranks.join(', ')}  max|diff| ${num(f.max_abs_diff)}  rel_err ${num(f.rel_err)}  (${f.mismatched}/${f.numel} elements beyond atol ${f.atol} + rtol ${f.rtol}·|b|)`);
    out.push(`  largest at [${w.index.join(', ')}] (rank ${w.rank} [${w.shard_index.join(', ')}]): A ${num(w.a)}  B ${num(w.b)}`);
  } else {
    out.push('no module out of tolerance');
  }
  out.push(`non-finite values (first, in execution order): ${nanLine(r.nan.a, 'A')}; ${nanLine(r.nan.b, 'B')}`);
  const rows = r.modules.map((m, i) => [String(i), what(m), m.split, `${m.dtype_a}${m.dtype_a !== m.dtype_b ? `/${m.dtype_b}` : ''}[${m.shape.join(',')}]`, num(m.max_abs_diff), num(m.rel_err), m.out_of_tolerance ? `OUT rank ${m.ranks.join(',')}` : 'ok']);
  const head = ['#', 'module', 'split', 'dtype[shape]', 'max|diff|', 'rel_err', 'status'];
  const width = head.map((h, c) => Math.max(h.length, ...rows.map((row) => row[c].length)));
  for (const row of [head, ...rows]) out.push(row.map((cell, c) => (c === 0 ? cell.padStart(width[c]) : cell.padEnd(width[c]))).join('  ').trimEnd());
  return `${out.join('\n')}\n`;
}

/** The number and module spellings of the text report, for other views of a result (the report page). */
export { num as bisectNumber, what as bisectWhat };
