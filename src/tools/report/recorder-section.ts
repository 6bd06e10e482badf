// The page's "Recorder flushes" (docs/recorder.md): every `recorder/<flush>/` folder of the tree,
// what kind it is (incident-wave<w>, crash-<run>, flush-<capture>), the forwards each rank wrote
// (from their call<N>/meta.json) and each crash-rank<g>.json's summary. Paths and meta come from
// the tree: bounded, checked, escaped.
import * as path from 'path';
import { esc, fileLink } from './html';
import type { ReportTree } from './collect';
import { readVerdict, verdictCell, type VerdictSummary } from './verdict-section';

/** More flushes than this on one page are counted, not listed. */
export const MAX_FLUSHES = 256;

export interface CrashSummary {
  file: string;
  rank: number;
  exitCode: number | null;
  signal: string | null;
  lastWave: number | null;
  /** The uncaught exception's type (the note up to its first ':'), never its message. */
  exception: string | null;
  leftOut: number[];
  /** When the agent wrote it (ms since the epoch), for `wavebus trace`; null when unreadable. */
  timeMs: number | null;
}

export interface RecorderFlush {
  /** Relative to the tree, '/' separated: .../recorder/<name>. */
  dir: string;
  name: string;
  kind: 'incident' | 'crash' | 'user' | 'other';
  /** Incident flushes: the dump's wave. */
  wave?: number;
  /** Global rank → forward numbers written (sorted). */
  forwards: Map<number, number[]>;
  crashes: CrashSummary[];
  /** Its verdict.json (`wavebus verdict`), when one was written. */
  verdict?: VerdictSummary;
}

const nat = (v: unknown): number | null => (Number.isSafeInteger(v) && (v as number) >= 0 ? (v as number) : null);

function kindOf(name: string): Pick<RecorderFlush, 'kind' | 'wave'> {
  const m = /^incident-wave(\d+)(-dp\d+)?$/.exec(name);
  if (m) return { kind: 'incident', wave: Number(m[1]) };
  if (name.startsWith('crash-')) return { kind: 'crash' };
  if (name.startsWith('flush-')) return { kind: 'user' };
  return { kind: 'other' };
}

/**
 * One file of the tree (`parts`: its path split on '/'): a recorder flush's call meta.json or
 * crash-rank<g>.json is added to `flushes` (keyed by the flush dir). `read` parses it size-capped
 * or returns undefined (it names the file in the tree's unreadable list). Returns whether it was one.
 */
export function addRecorderFile(tree: ReportTree, parts: string[], read: () => any): boolean {
  const at = parts.lastIndexOf('recorder');
  if (at < 0 || parts.length < at + 3) return false;
  const base = parts[parts.length - 1];
  const isCrash = parts.length === at + 3 && /^crash-rank\d+\.json$/.test(base);
  const isVerdict = parts.length === at + 3 && base === 'verdict.json';
  const call = parts.length === at + 6 && base === 'meta.json' ? /^rank(\d+)$/.exec(parts[at + 3]) && /^call(\d+)$/.exec(parts[at + 4]) : null;
  if (!isCrash && !isVerdict && !call) return false;
  const dir = parts.slice(0, at + 2).join('/');
  let f = tree.recorderFlushes.find((x) => x.dir === dir);
  if (!f) {
    if (tree.recorderFlushes.length >= MAX_FLUSHES) {
      tree.recorderFlushesLeftOut++;
      return true;
    }
    const name = parts[at + 1];
    f = { dir, name, ...kindOf(name), forwards: new Map(), crashes: [] };
    tree.recorderFlushes.push(f);
  }
  const doc = read();
  if (doc === undefined) return true;
  const file = parts.join('/');
  if (isVerdict) {
    const v = readVerdict(file, doc);
    if (typeof v === 'string') tree.unreadable.push(`${file}: ${v}`);
    else f.verdict = v;
    return true;
  }
  // What the file's name and folder say must be what it says: else it is listed, not shown.
  const wrong = isCrash ? crashRecordProblem(doc, Number(/\d+/.exec(base)![0])) : callMetaProblem(doc, Number(/^rank(\d+)$/.exec(parts[at + 3])![1]), Number(call![1]));
  if (wrong) {
    tree.unreadable.push(`${file}: ${wrong}`);
    return true;
  }
  if (isCrash) {
    const note = typeof doc.note === 'string' ? doc.note : '';
    const exc = /^(?:uncaught )?([A-Za-z_][\w.]*)(?::|$)/.exec(note.trim());
    f.crashes.push({
      file,
      rank: doc.global_rank,
      exitCode: Number.isSafeInteger(doc.exit_code) ? doc.exit_code : null,
      signal: typeof doc.signal === 'string' ? doc.signal.slice(0, 32) : null,
      lastWave: nat(doc.last_wave),
      exception: exc ? exc[1].slice(0, 128) : null,
      timeMs: typeof doc.time === 'string' && Number.isFinite(Date.parse(doc.time)) ? Date.parse(doc.time) : null,
      leftOut: Array.isArray(doc.left_out) ? doc.left_out.map((t: any) => nat(t?.forward)).filter((n: number | null): n is number => n !== null).slice(0, 4096) : [],
    });
  } else {
    // A call dir counts only when its meta says the recorder wrote it (not any snapshot under a 'recorder' folder).
    const forward = nat(doc.recorder?.forward);
    const rank = Number(/^rank(\d+)$/.exec(parts[at + 3])![1]);
    if (forward === null || !Array.isArray(doc.selected_by) || !doc.selected_by.includes('recorder')) return true;
    const list = f.forwards.get(rank) ?? [];
    if (list.length < 4096) list.push(forward);
    f.forwards.set(rank, list.sort((a, b) => a - b));
  }
  return true;
}

const isObject = (v: unknown): v is Record<string, any> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Why crash-rank<g>.json (g: its name's) is not a crash record to show, or '' when it is one. */
function crashRecordProblem(doc: unknown, g: number): string {
  if (!isObject(doc)) return 'not a crash record (a JSON object)';
  if (doc.global_rank !== g) return `global_rank ${JSON.stringify(doc.global_rank)?.slice(0, 32)} does not match its name (rank ${g})`;
  for (const k of ['flushed', 'left_out']) if (doc[k] !== undefined && !Array.isArray(doc[k])) return `${k} is not a list`;
  return '';
}

/** Why a recorder flush's rank<g>/call<n>/meta.json is not one to count, or '' (a meta of another kind is '' and skipped by the caller). */
function callMetaProblem(doc: unknown, g: number, n: number): string {
  if (!isObject(doc)) return 'not a call meta (a JSON object)';
  if (doc.recorder === undefined) return '';
  if (!isObject(doc.recorder) || doc.recorder.forward !== n) return `recorder.forward ${JSON.stringify(isObject(doc.recorder) ? doc.recorder.forward : doc.recorder)?.slice(0, 32)} does not match its folder (call${n})`;
  if (doc.global_rank !== undefined && doc.global_rank !== g) return `global_rank ${JSON.stringify(doc.global_rank)?.slice(0, 32)} does not match its folder (rank${g})`;
  return '';
}

const ranges = (ns: number[]): string => {
  const out: string[] = [];
  for (let i = 0; i < ns.length; ) {
    let j = i;
    while (j + 1 < ns.length && ns[j + 1] === ns[j] + 1) j++;
    out.push(j === i ? `${ns[i]}` : `${ns[i]}-${ns[j]}`);
    i = j + 1;
  }
  return out.join(',');
};

const KIND_TEXT = { incident: 'incident', crash: 'engine crash', user: 'capture --flush-recorder', other: 'other' };

/** The Job section's "Recorder flushes": one row per flush folder. */
export function recorderFlushes(tree: ReportTree, pageDir: string): string {
  const fl = tree.recorderFlushes;
  if (!fl.length) return '<p id="recorder-flushes" data-count="0">none in this tree (no <code>recorder/</code> folder holds a flushed forward or a crash record; the recorder is off unless <code>WAVEBUS_RECORD_FORWARDS</code> is set)</p>';
  const link = (rel: string, text: string) => fileLink(path.relative(pageDir, path.join(tree.root, rel)).split(path.sep).join('/'), text);
  const rows = [...fl].sort((a, b) => a.dir.localeCompare(b.dir)).map((f) => {
    const fw = [...f.forwards].sort((a, b) => a[0] - b[0]).map(([r, ns]) => `rank ${r}: ${ranges(ns)}`).join('; ') || 'none';
    const crashes = f.crashes
      .sort((a, b) => a.rank - b.rank)
      .map((c) => `<li class="recorder-crash" data-rank="${c.rank}">${link(c.file, `crash-rank${c.rank}.json`)}: ${c.signal ? `signal ${esc(c.signal)}` : c.exitCode !== null ? `exit ${c.exitCode}` : 'exit unknown'}, last wave ${c.lastWave ?? '?'}${c.exception ? `, <code>${esc(c.exception)}</code>` : ''}${c.leftOut.length ? `, left out: forward ${ranges([...c.leftOut].sort((a, b) => a - b))}` : ''}</li>`)
      .join('');
    return `<tr class="recorder-flush" data-kind="${f.kind}"><td>${link(f.dir, f.dir)}</td><td>${KIND_TEXT[f.kind]}${f.wave !== undefined ? ` (dump wave ${f.wave})` : ''}</td><td class="forwards">${esc(fw)}</td><td>${crashes ? `<ul>${crashes}</ul>` : ''}</td><td>${verdictCell(f.verdict)}</td></tr>`;
  });
  const more = tree.recorderFlushesLeftOut ? `<p>${tree.recorderFlushesLeftOut} more flushes not listed (over ${MAX_FLUSHES}).</p>` : '';
  return `<p id="recorder-flushes" data-count="${fl.length}">${fl.length} flight recorder flush${fl.length === 1 ? '' : 'es'} (replay any <code>call&lt;N&gt;</code> as a snapshot)</p>
<table id="recorder-table"><tr><th>folder</th><th>why</th><th>forwards written, per rank</th><th>crashes</th><th>verdict (<code>wavebus verdict</code>)</th></tr>${rows.join('')}</table>${more}`;
}
