// What `wavebus report` and `wavebus trace` read from a tree (an aggregated tree, one host's
// runtime dir, the demo's output): incident reports, the runtime config, the ranks' wave
// timelines, and every bundle with `inspect --verify`'s checks. Nothing is followed through a
// link and every JSON file is size-capped: the tree may come from anywhere.
import * as fs from 'fs';
import * as path from 'path';
import { inspectTree, type BundleReport, type InspectResult } from '../inspect';
import { readLayoutJson } from '../../paths';
import type { WorldLayout } from '../../layout';
import { ConfigError } from '../../errors';
import { MAX_ARTIFACT_JSON_BYTES, readArtifactJson } from '../../artifacts/json-file';
import { bisectOf, MAX_BISECT_BYTES, MAX_BISECT_FILES, type BisectDoc } from './bisect-section';
import { addRecorderFile, type RecorderFlush } from './recorder-section';

/** A tree deeper than this is not one wavebus wrote. */
const MAX_DEPTH = 16;

export interface Incident {
  /** Relative to the tree, '/' separated. */
  file: string;
  type: string;
  report: Record<string, unknown>;
  /** The dump wave bundle this incident's dump went to, when the tree has it. */
  dump?: BundleReport;
}

export interface TimelineDoc {
  file: string;
  rank: number;
  host?: string;
  dpRank?: number;
  kinds: string[];
  entries: number[][];
  overwritten: number;
}

export interface ReportTree {
  root: string;
  inspect: InspectResult;
  incidents: Incident[];
  /** Runtime config files found (path relative to the tree → its parsed content). */
  configs: { file: string; value: unknown }[];
  timelines: TimelineDoc[];
  /** The coordinator's config history: [replica, wave, config_version, sent_ms]. */
  configHistory: number[][];
  layout?: WorldLayout;
  /** `wavebus bisect --out` results saved as bisect/<name>.json, by name; those past the cap are counted. */
  bisects: BisectDoc[];
  bisectsLeftOut: number;
  /** Flight recorder flushes (recorder/<name>/ folders); those past the cap are counted. */
  recorderFlushes: RecorderFlush[];
  recorderFlushesLeftOut: number;
  /** Files the tree has that could not be read as what their name says. */
  unreadable: string[];
}

/** Parse a JSON file, refusing links, non-files, anything over the cap and deep nesting (json-file.ts). */
export function readJsonFile(file: string, maxBytes = MAX_ARTIFACT_JSON_BYTES): unknown {
  return readArtifactJson(file, maxBytes);
}

const rel = (root: string, p: string) => path.relative(root, p).split(path.sep).join('/');

/** Every regular file under root (links skipped), relative paths. */
function walkFiles(root: string): string[] {
  const out: string[] = [];
  const walk = (dir: string, depth: number): void => {
    if (depth > MAX_DEPTH) return;
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      if (e.name.startsWith('.')) continue;
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p, depth + 1);
      else if (e.isFile()) out.push(rel(root, p));
    }
  };
  walk(root, 0);
  return out.sort();
}

const REPORT_FILE = /^report_[^/]*\.json$/;

function timelineOf(file: string, doc: any): TimelineDoc | string {
  if (doc?.kind !== 'wavebus_timeline') return 'not a wavebus_timeline';
  if (!Number.isSafeInteger(doc.global_rank) || doc.global_rank < 0) return 'global_rank is not a rank';
  if (!Array.isArray(doc.kinds) || !Array.isArray(doc.entries)) return 'kinds or entries is not a list';
  const entries = (doc.entries as unknown[]).filter((e): e is number[] => Array.isArray(e) && e.length >= 5 && e.every((x) => typeof x === 'number' && Number.isFinite(x)));
  return {
    file,
    rank: doc.global_rank,
    host: typeof doc.identity?.host === 'string' ? doc.identity.host : undefined,
    dpRank: Number.isSafeInteger(doc.identity?.dp_rank) ? doc.identity.dp_rank : undefined,
    kinds: doc.kinds.map(String),
    entries,
    overwritten: Number(doc.overwritten) || 0,
  };
}

/** The same dump in a report (absolute dump_dir, incident, request, wave) and in the tree. */
function dumpFor(report: Record<string, unknown>, waves: BundleReport[]): BundleReport | undefined {
  const wave = Number(report.dump_arm_wave);
  if (!Number.isSafeInteger(wave)) return undefined;
  return waves.find((w) => w.info.incident_type === report.incident_type && w.info.req_id === report.req_id && Number(w.info.arm_wave) === wave);
}

/** Read a tree; `verify` recomputes every file's checksum (what `inspect --verify` does). */
export function collectTree(root: string, opts: { verify?: boolean } = {}): ReportTree {
  const abs = path.resolve(root);
  let st: fs.Stats;
  try {
    st = fs.statSync(abs);
  } catch (e) {
    throw new ConfigError(`${root}: ${(e as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such directory' : (e as Error).message}`);
  }
  if (!st.isDirectory()) throw new ConfigError(`${root}: not a directory`);
  const inspect = inspectTree(abs, { verify: opts.verify ?? true });
  const tree: ReportTree = { root: abs, inspect, incidents: [], configs: [], timelines: [], configHistory: [], bisects: [], bisectsLeftOut: 0, recorderFlushes: [], recorderFlushesLeftOut: 0, unreadable: [] };
  const waves = inspect.bundles.filter((b) => b.kind === 'dump_wave');
  enrich(abs, inspect.bundles);
  for (const f of walkFiles(abs)) {
    const parts = f.split('/');
    const base = parts[parts.length - 1];
    const read = (maxBytes?: number): any => {
      try {
        return readJsonFile(path.join(abs, f), maxBytes);
      } catch (e) {
        tree.unreadable.push(`${f}: ${(e as Error).message}`);
        return undefined;
      }
    };
    if (addRecorderFile(tree, parts, read)) continue;
    if (REPORT_FILE.test(base) && parts.length >= 2 && parts[parts.length - 2] !== 'kv_cache') {
      const doc = read();
      if (doc && typeof doc === 'object' && typeof doc.incident_type === 'string') {
        tree.incidents.push({ file: f, type: doc.incident_type, report: doc, dump: dumpFor(doc, waves) });
      } else if (doc !== undefined) tree.unreadable.push(`${f}: not an incident report (no incident_type)`);
    } else if (base === 'runtime_config.json' && parts[parts.length - 2] === 'config') {
      const doc = read();
      if (doc !== undefined) tree.configs.push({ file: f, value: doc });
    } else if (base === 'coordinator.json' && parts[parts.length - 2] === 'timeline') {
      const doc = read();
      if (doc?.kind === 'wavebus_config_history' && Array.isArray(doc.entries)) {
        tree.configHistory.push(...(doc.entries as unknown[]).filter((e): e is number[] => Array.isArray(e) && e.length >= 4 && e.every((x) => Number.isFinite(x))));
      } else if (doc !== undefined) tree.unreadable.push(`${f}: not a wavebus_config_history`);
    } else if (parts.length === 2 && parts[0] === 'bisect' && base.endsWith('.json')) {
      if (tree.bisects.length >= MAX_BISECT_FILES) {
        tree.bisectsLeftOut++;
        continue;
      }
      const doc = read(MAX_BISECT_BYTES);
      const b = doc === undefined ? undefined : bisectOf(f, doc);
      if (typeof b === 'string') tree.unreadable.push(`${f}: not a wavebus bisect result (${b})`);
      else if (b) tree.bisects.push(b);
    } else if (/^rank\d+\.json$/.test(base) && parts[parts.length - 2] === 'timeline') {
      const doc = read();
      const t = doc === undefined ? undefined : timelineOf(f, doc);
      if (typeof t === 'string') tree.unreadable.push(`${f}: ${t}`);
      else if (t) tree.timelines.push(t);
    }
  }
  tree.incidents.sort((a, b) => Number(a.report.detect_wave ?? 0) - Number(b.report.detect_wave ?? 0) || a.file.localeCompare(b.file));
  tree.timelines.sort((a, b) => a.rank - b.rank);
  tree.layout = layoutOf(abs, waves);
  return tree;
}

/** What the page shows beyond inspect's info: a capture's replica and engine step, a dump's replica. */
function enrich(root: string, bundles: BundleReport[]): void {
  for (const b of bundles) {
    const name = b.kind === 'snapshot' ? 'meta.json' : b.kind === 'dump_wave' ? 'request_info.json' : undefined;
    if (!name) continue;
    try {
      const doc = readJsonFile(path.join(root, b.dir, name)) as any;
      b.info.dp_rank = Number.isSafeInteger(doc?.dp_rank) ? doc.dp_rank : 0;
      if (b.kind === 'snapshot' && Number.isSafeInteger(doc?.global_step)) b.info.global_step = doc.global_step;
    } catch {
      // inspect's problems name an unreadable record
    }
  }
}

/** The job's layout: the first dump record that names one. */
function layoutOf(root: string, waves: BundleReport[]): WorldLayout | undefined {
  for (const w of waves) {
    for (const name of ['manifest.json', 'request_info.json']) {
      try {
        const doc = readJsonFile(path.join(root, w.dir, name)) as any;
        if (doc?.layout === undefined) continue;
        const r = readLayoutJson(doc.layout);
        if ('layout' in r) return r.layout;
      } catch {
        // absent or unreadable: inspect's problems say so
      }
    }
  }
  return undefined;
}

