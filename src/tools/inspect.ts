// Finds the bundles under a directory (KV dump rank dirs: the seed's dp*_tp*_pp*_cp*/, or rank<g>/
// of wavebus before it; snapshot call dirs, a dump's wave dir
// with its request_info.json and manifest, an aggregate's manifest) and checks them: every listed
// file present with its size (and checksum with verify), nothing unlisted beside them, every
// expected rank present. Used by `wavebus inspect`, the demo, aggregate.
import * as fs from 'fs';
import * as path from 'path';
import { crc32cOfFile } from '../artifacts/checksum';
import { resolveDtype, tensorFileOf } from '../artifacts/tensor-files';
import { isTensorFormat, tensorFileExtension } from '../artifacts/tensor-format';
import type { WorldLayout } from '../layout';
import { readArtifactJson } from '../artifacts/json-file';
import { checkKvDirIdentity, kvRankDirFor, kvRankOfDir, readLayoutJson, readKvRankDirName, type KvRankDir } from '../paths';

export type BundleKind = 'kv_dump' | 'snapshot' | 'dump_wave' | 'aggregate';

export interface TensorInfo {
  file: string;
  name: string;
  dtype: string;
  shape: number[];
}

export interface BundleReport {
  kind: BundleKind;
  /** Relative to the inspected root, '/' separated. */
  dir: string;
  ranks: number[];
  bytes: number;
  files: { name: string; bytes: number; checksum: string; verified?: boolean }[];
  tensors: TensorInfo[];
  /** The distinct dtypes of its tensors (bf16 / fp8 resolved from the bundle JSON for .npy). */
  dtypes: string[];
  problems: string[];
  info: Record<string, unknown>;
}

export interface InspectResult {
  root: string;
  bundles: BundleReport[];
  /** Temporary bundle dirs left by an interrupted writer (never under a final name). */
  incomplete: string[];
  problems: string[];
}

const relJoin = (a: string, b: string) => (a === '.' || a === '' ? b : `${a}/${b}`);

function readJson(p: string, rel: string, problems: string[]): any | undefined {
  try {
    return readArtifactJson(p);
  } catch (e) {
    problems.push(`${rel}: unreadable JSON (${(e as Error).message})`);
    return undefined;
  }
}

/** `dtypeOf(fileName)` resolves what a .npy header cannot say (|V2 is bf16, |V1 one of the fp8s). */
function tensorsOf(file: string, rel: string, dtypeOf: (name: string) => string | undefined): TensorInfo[] {
  const format = tensorFileOf(file);
  if (!format) return [];
  const base = path.basename(rel);
  const { tensors, lone } = format.read(file);
  return tensors.map((t, i) => ({ file: rel, name: t.name ?? (lone ? base : `tensor${i}`), dtype: resolveDtype(t, dtypeOf(base)) ?? t.code, shape: t.shape }));
}

/** One listed file: present, its size, its checksum (verify). Messages are the same for every caller, so duplicates collapse. */
function checkOne(p: string, rel: string, bytes: number, checksum: string, verify: boolean, problems: string[]): { present: boolean; size: number; verified?: boolean } {
  let st: fs.Stats;
  try {
    st = fs.lstatSync(p);
  } catch {
    problems.push(`${rel}: missing`);
    return { present: false, size: 0 };
  }
  // A listed name may be a directory or a link in a tree from anywhere: never read through it.
  if (!st.isFile()) {
    problems.push(`${rel}: not a regular file`);
    return { present: false, size: 0 };
  }
  const size = st.size;
  if (size !== bytes) problems.push(`${rel}: ${size} bytes, recorded ${bytes}`);
  let verified: boolean | undefined;
  if (verify) {
    const got = crc32cOfFile(p).toString();
    verified = got === checksum;
    if (!verified) problems.push(`${rel}: checksum ${got} != recorded ${checksum}`);
  }
  return { present: true, size, verified };
}

/** Check the files a bundle JSON lists (name or path, bytes, checksum), and that nothing else is there. */
function checkFiles(dir: string, listed: any[], verify: boolean, report: BundleReport, jsonName: string, dtypeOf: (name: string) => string | undefined): void {
  const names = new Set<string>();
  if (!Array.isArray(listed) || !listed.every((f) => f !== null && typeof f === 'object')) {
    report.problems.push(`${relJoin(report.dir, jsonName)}: files is not a list of objects`);
    listed = [];
  }
  for (const f of listed) {
    const name = path.basename(String(f.path ?? f.name ?? ''));
    names.add(name);
    const p = path.join(dir, name);
    const entry: BundleReport['files'][number] = { name, bytes: Number(f.bytes ?? 0), checksum: String(f.checksum ?? '') };
    report.files.push(entry);
    const rel = relJoin(report.dir, name);
    const c = checkOne(p, rel, entry.bytes, entry.checksum, verify, report.problems);
    if (!c.present) continue;
    report.bytes += c.size;
    if (c.verified !== undefined) entry.verified = c.verified;
    try {
      report.tensors.push(...tensorsOf(p, rel, dtypeOf));
    } catch (e) {
      report.problems.push(`${rel}: unreadable (${(e as Error).message})`);
    }
  }
  for (const n of fs.readdirSync(dir)) {
    if (n === jsonName || n.startsWith('.') || names.has(n)) continue;
    report.problems.push(`${relJoin(report.dir, n)}: not listed in ${jsonName}`);
  }
  report.dtypes = [...new Set(report.tensors.map((t) => t.dtype))];
}

function newReport(kind: BundleKind, rel: string): BundleReport {
  return { kind, dir: rel, ranks: [], bytes: 0, files: [], tensors: [], dtypes: [], problems: [], info: {} };
}

function inspectKvDump(dir: string, rel: string, verify: boolean): BundleReport {
  const r = newReport('kv_dump', rel);
  const doc = readJson(path.join(dir, 'dump.json'), relJoin(rel, 'dump.json'), r.problems);
  if (doc) {
    r.ranks = [Number(doc.identity?.global_rank)];
    r.info = { req_id: doc.req_id, incident_type: doc.incident_type, arm_wave: doc.arm_wave, format: doc.format, tp_rank: doc.identity?.tp_rank, tp_size: doc.identity?.tp_size, block_ids: doc.block_ids };
    const layers: { layer: string; dtype: string }[] = Array.isArray(doc.layers) ? doc.layers : [];
    const dtypeOf = (name: string) => layers.find((l) => typeof l.layer === 'string' && name.startsWith(`${l.layer}.`))?.dtype;
    checkFiles(dir, doc.files ?? [], verify, r, 'dump.json', dtypeOf);
  }
  return r;
}

function inspectSnapshot(dir: string, rel: string, verify: boolean): BundleReport {
  const r = newReport('snapshot', rel);
  const meta = readJson(path.join(dir, 'meta.json'), relJoin(rel, 'meta.json'), r.problems);
  if (meta) {
    r.ranks = [Number(meta.global_rank)];
    r.info = { hash: meta.hash, call_index: meta.call_index, selected_by: meta.selected_by, format: meta.format, tp_rank: meta.tp_rank };
    const inputs: { index: number; dtype: string }[] = Array.isArray(meta.inputs) ? meta.inputs : [];
    const ext = isTensorFormat(meta.format) ? tensorFileExtension(meta.format) : `.${String(meta.format)}`;
    const files = meta.files ?? inputs.map((i) => ({ name: `tensor${i.index}${ext}` }));
    // By index, whatever the file's extension: a bundle may mix formats (an npy for a dtype .pt cannot hold).
    const dtypeOf = (name: string) => inputs.find((i) => path.parse(name).name === `tensor${i.index}`)?.dtype;
    checkFiles(dir, files, verify && Array.isArray(meta.files), r, 'meta.json', dtypeOf);
    // Inputs withheld by the recorder (save_sensitive_info false) have no file, by design.
    const withheld = Array.isArray(meta.withheld) ? meta.withheld.length : 0;
    if (Array.isArray(meta.inputs) && r.files.length !== meta.inputs.length - withheld) {
      r.problems.push(`${rel}: meta.json lists ${meta.inputs.length} inputs${withheld ? ` (${withheld} withheld)` : ''} but ${r.files.length} files`);
    }
  }
  return r;
}

/** The layout request_info.json / manifest.json record, when there is one and it is valid. */
function recordedLayout(doc: any, where: string, problems: string[]): WorldLayout | undefined {
  if (doc?.layout === undefined) return undefined;
  const r = readLayoutJson(doc.layout);
  if ('reason' in r) problems.push(`${where}: ${r.reason}`);
  return 'layout' in r ? r.layout : undefined;
}

/**
 * The global rank of one KV rank dir, from the dump.json inside it: its name must agree with the
 * identity there (the seed's name with the coordinates, rank<g> with the global rank) and with
 * the recorded layout. Undefined, with a problem, when they disagree.
 */
function dumpRankOf(dir: string, rel: string, d: KvRankDir, layout: WorldLayout | undefined, problems: string[]): number | undefined {
  const doc = readJson(path.join(dir, 'dump.json'), relJoin(rel, 'dump.json'), problems);
  if (!doc) return undefined;
  const id = doc.identity ?? {};
  const g = id.global_rank;
  if (!Number.isSafeInteger(g) || g < 0) {
    problems.push(`${relJoin(rel, 'dump.json')}: identity.global_rank is missing`);
    return undefined;
  }
  try {
    checkKvDirIdentity(d, id, 'directory');
  } catch (e) {
    problems.push(`${rel}: ${(e as Error).message}`);
    return undefined;
  }
  try {
    if (layout && kvRankOfDir(d, layout) !== g) {
      problems.push(`${rel}: ${d.name} is global rank ${kvRankOfDir(d, layout)} in the recorded layout, but its dump.json says ${g}`);
      return undefined;
    }
  } catch (e) {
    problems.push(`${rel}: ${(e as Error).message}`);
    return undefined;
  }
  return g;
}

interface WaveRankDirs {
  /** Global rank → dir name, of the dirs holding a dump.json that agrees with the name. */
  present: Map<number, string>;
  skipped: number[];
}

/** The rank dirs of a KV dump wave dir, either layout; any other directory is a problem. */
function waveRankDirs(dir: string, rel: string, names: string[], layout: WorldLayout | undefined, problems: string[]): WaveRankDirs {
  const out: WaveRankDirs = { present: new Map(), skipped: [] };
  for (const n of [...names].sort()) {
    if (n.startsWith('.') || !fs.statSync(path.join(dir, n)).isDirectory()) continue;
    const nrel = relJoin(rel, n);
    let d: KvRankDir;
    try {
      d = readKvRankDirName(n);
    } catch (e) {
      problems.push(`${nrel}: ${(e as Error).message}`);
      continue;
    }
    if (fs.existsSync(path.join(dir, n, 'dump.json'))) {
      const g = dumpRankOf(path.join(dir, n), nrel, d, layout, problems);
      if (g !== undefined) out.present.set(g, n);
    } else if (fs.existsSync(path.join(dir, n, 'dump_skipped.json'))) {
      const skip = readJson(path.join(dir, n, 'dump_skipped.json'), relJoin(nrel, 'dump_skipped.json'), problems);
      let g: number | undefined = 'legacyRank' in d ? d.legacyRank : Number.isSafeInteger(skip?.rank) ? skip.rank : undefined;
      try {
        if (layout) g = kvRankOfDir(d, layout);
      } catch (e) {
        problems.push(`${nrel}: ${(e as Error).message}`);
      }
      if (g !== undefined) out.skipped.push(g);
    }
  }
  return out;
}

/** A list of ranks a wave's JSON records (absent: none); anything else is a problem named by file and field. */
function rankList(v: unknown, file: string, field: string, problems: string[]): number[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v) || !v.every((x) => Number.isSafeInteger(x) && x >= 0)) {
    problems.push(`${file}: ${field} is not a list of ranks`);
    return [];
  }
  return v as number[];
}

/**
 * The object entries of a list read from a file: a list that is not one, or an entry that is not an
 * object, is a problem named by its field (a manifest entry of `null` once threw a TypeError).
 */
function objectEntries(v: unknown, where: string, problems: string[]): Record<string, any>[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) {
    problems.push(`${where} is not a list`);
    return [];
  }
  const out: Record<string, any>[] = [];
  v.forEach((x, i) => (x !== null && typeof x === 'object' && !Array.isArray(x) ? out.push(x) : problems.push(`${where}[${i}] is not an object`)));
  return out;
}

function inspectDumpWave(dir: string, rel: string, names: string[], verify: boolean): BundleReport {
  const r = newReport('dump_wave', rel);
  const info = readJson(path.join(dir, 'request_info.json'), relJoin(rel, 'request_info.json'), r.problems) ?? {};
  const manifest = names.includes('manifest.json') ? readJson(path.join(dir, 'manifest.json'), relJoin(rel, 'manifest.json'), r.problems) : undefined;
  // Dumps of wavebus before the seed's names record no layout: their rank<g>/ dirs say the rank.
  const layout = recordedLayout(manifest, relJoin(rel, 'manifest.json'), r.problems) ?? recordedLayout(info, relJoin(rel, 'request_info.json'), r.problems);
  const dirs = waveRankDirs(dir, rel, names, layout, r.problems);
  const present = [...dirs.present.keys()].sort((a, b) => a - b);
  const skipped = dirs.skipped;
  const expected = rankList(manifest?.expected_ranks ?? info.expected_ranks, relJoin(rel, manifest ? 'manifest.json' : 'request_info.json'), 'expected_ranks', r.problems);
  const manifestMissing = rankList(manifest?.missing_ranks, relJoin(rel, 'manifest.json'), 'missing_ranks', r.problems);
  r.ranks = present;
  r.info = { req_id: info.req_id, incident_type: info.incident_type, arm_wave: info.arm_wave, expected_ranks: expected, skipped_ranks: skipped, manifest_missing: manifest ? manifestMissing : null, rank_dirs: Object.fromEntries(dirs.present) };
  for (const e of [...new Set([...expected, ...manifestMissing])].sort((a, b) => a - b)) {
    // The manifest names each rank's dir; a layout alone gives it through the one builder.
    let want: string | undefined = typeof manifest?.dirs?.[e] === 'string' ? manifest.dirs[e] : undefined;
    try {
      want ??= layout ? kvRankDirFor(e, layout) : undefined;
    } catch (err) {
      r.problems.push(`${rel}: expected rank ${e}: ${(err as Error).message}`);
    }
    const got = dirs.present.get(e);
    if (got === undefined) {
      r.problems.push(`${rel}: rank ${e} missing${skipped.includes(e) ? ' (dump_skipped.json present)' : want ? `: no ${want}/dump.json` : ''}`);
    } else if (want !== undefined && got !== want) {
      r.problems.push(`${rel}: rank ${e} is in ${got}/, but the manifest names ${want}/`);
    }
  }
  // Every file the coordinator recorded from the ranks' acks (dump.json included).
  const files = manifest?.files ?? {};
  const filesIsObject = typeof files === 'object' && !Array.isArray(files);
  if (!filesIsObject) r.problems.push(`${relJoin(rel, 'manifest.json')}: files is not an object of lists`);
  for (const [g, list] of filesIsObject ? Object.entries(files) : []) {
    for (const f of objectEntries(list, `${relJoin(rel, 'manifest.json')}: files.${g}`, r.problems)) {
      const fp = String(f.path ?? '');
      if (!fp || fp.split('/').some((c) => c === '..' || c === '')) {
        r.problems.push(`${relJoin(rel, 'manifest.json')}: file path ${JSON.stringify(fp)} is not a path inside the wave dir`);
        continue;
      }
      const c = checkOne(path.join(dir, ...fp.split('/')), relJoin(rel, fp), Number(f.bytes ?? 0), String(f.checksum ?? ''), verify, r.problems);
      if (c.present) r.bytes += c.size;
    }
  }
  return r;
}

function inspectAggregate(dir: string, rel: string, m: any, verify: boolean): BundleReport {
  const r = newReport('aggregate', rel);
  const where = relJoin(rel, 'manifest.json');
  r.ranks = rankList(m.present_ranks, where, 'present_ranks', r.problems);
  r.info = { coordinator: m.coordinator, what: m.what, prefix: m.prefix, expected_ranks: m.expected_ranks, missing_ranks: m.missing_ranks, complete: m.complete, totals: m.totals };
  for (const g of rankList(m.missing_ranks, where, 'missing_ranks', r.problems)) {
    const errs = m.ranks?.[String(g)]?.errors;
    r.problems.push(`${rel}: rank ${g} missing from the aggregate${Array.isArray(errs) && errs.length ? ` (${errs.join('; ')})` : ''}`);
  }
  for (const x of objectEntries(m.missing_files, `${where}: missing_files`, r.problems)) r.problems.push(`${rel}: dumps/${String(x.path)} missing (rank ${String(x.rank)} wrote it, says its dump manifest: ${String(x.reason)})`);
  for (const x of objectEntries(m.refused, `${where}: refused`, r.problems)) r.problems.push(`${rel}: refused ${String(x.root)} path ${JSON.stringify(x.path)} from rank ${String(x.rank)} (${String(x.reason)})`);
  for (const f of objectEntries(m.files, `${where}: files`, r.problems)) {
    const fp = `${f.root}/${f.path}`;
    if (f.status === 'failed') {
      r.problems.push(`${relJoin(rel, fp)}: not aggregated (${f.error})`);
      continue;
    }
    if (String(f.path).split('/').some((c: string) => c === '..' || c === '' || c.startsWith('.'))) continue; // never written
    const c = checkOne(path.join(dir, f.root, ...String(f.path).split('/')), relJoin(rel, fp), Number(f.bytes), String(f.checksum), verify, r.problems);
    if (c.present) r.bytes += c.size;
    r.files.push({ name: fp, bytes: Number(f.bytes), checksum: String(f.checksum), verified: c.verified });
  }
  return r;
}

export function inspectTree(root: string, opts: { verify?: boolean } = {}): InspectResult {
  const verify = opts.verify ?? false;
  const result: InspectResult = { root, bundles: [], incomplete: [], problems: [] };
  if (!fs.existsSync(root) || !fs.statSync(root).isDirectory()) {
    result.problems.push(`${root}: not a directory`);
    return result;
  }
  const walk = (dir: string): void => {
    const rel = path.relative(root, dir).split(path.sep).join('/') || '.';
    const names = fs.readdirSync(dir);
    if (names.includes('dump.json')) {
      result.bundles.push(inspectKvDump(dir, rel, verify));
      return;
    }
    if (names.includes('meta.json') && names.some((n) => n.startsWith('tensor'))) {
      result.bundles.push(inspectSnapshot(dir, rel, verify));
      return;
    }
    if (names.includes('request_info.json')) {
      result.bundles.push(inspectDumpWave(dir, rel, names, verify));
    } else if (names.includes('manifest.json')) {
      const probs: string[] = [];
      const m = readJson(path.join(dir, 'manifest.json'), relJoin(rel, 'manifest.json'), probs);
      if (m?.kind === 'wavebus_aggregate') result.bundles.push(inspectAggregate(dir, rel, m, verify));
    }
    for (const n of names.sort()) {
      const p = path.join(dir, n);
      if (!fs.statSync(p).isDirectory()) {
        if (n.startsWith('.') && (n.endsWith('.part') || n.includes('.tmp-'))) result.incomplete.push(path.relative(root, p));
        continue;
      }
      if (n.startsWith('.') && n.includes('.tmp-')) {
        result.incomplete.push(path.relative(root, p));
        continue;
      }
      walk(p);
    }
  };
  walk(root);
  // A file two bundles both list (a wave manifest and a rank's dump.json) is reported once.
  result.problems = [...new Set(result.bundles.flatMap((b) => b.problems))];
  return result;
}
