// Finds the bundles under a directory (KV dump rank dirs, snapshot call dirs, a dump's wave dir
// with its request_info.json and manifest) and checks them: every listed file present with its
// size and checksum, every expected rank present. Used by `wavebus inspect`, the demo, aggregate.
import * as fs from 'fs';
import * as path from 'path';
import { Crc32c, formatChecksum } from './checksum';
import { readNpyHeader, readPt, readSafetensorsHeader } from './readers';

export type BundleKind = 'kv_dump' | 'snapshot' | 'dump_wave';

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

export function fileCrc32c(p: string): string {
  const fd = fs.openSync(p, 'r');
  try {
    const h = new Crc32c();
    const buf = Buffer.allocUnsafe(4 << 20);
    for (;;) {
      const n = fs.readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      h.update(buf.subarray(0, n));
    }
    return formatChecksum(h.digest());
  } finally {
    fs.closeSync(fd);
  }
}

function readJson(p: string, problems: string[]): any | undefined {
  try {
    return JSON.parse(fs.readFileSync(p, 'utf8'));
  } catch (e) {
    problems.push(`${p}: unreadable JSON (${(e as Error).message})`);
    return undefined;
  }
}

function tensorsOf(file: string, rel: string): TensorInfo[] {
  if (file.endsWith('.npy')) {
    const h = readNpyHeader(file);
    return [{ file: rel, name: path.basename(rel), dtype: h.dtype ?? h.descr, shape: h.shape }];
  }
  if (file.endsWith('.safetensors')) {
    const h = readSafetensorsHeader(file);
    return h.tensors.map((e) => ({ file: rel, name: e.name, dtype: e.dtype ?? e.code, shape: e.shape }));
  }
  if (file.endsWith('.pt')) {
    const c = readPt(file);
    const names = c.value instanceof Map ? [...c.value.entries()].filter(([, v]) => v && (v as any).kind === 'tensor').map(([k]) => String(k)) : [path.basename(rel)];
    return c.tensors.map((t, i) => ({ file: rel, name: names[i] ?? `tensor${i}`, dtype: t.dtype, shape: t.shape }));
  }
  return [];
}

/** Check the files a bundle JSON lists (name or path, bytes, checksum). */
function checkFiles(dir: string, listed: any[], verify: boolean, report: BundleReport): void {
  for (const f of listed) {
    const name = path.basename(String(f.path ?? f.name ?? ''));
    const p = path.join(dir, name);
    const entry: BundleReport['files'][number] = { name, bytes: Number(f.bytes ?? 0), checksum: String(f.checksum ?? '') };
    report.files.push(entry);
    if (!fs.existsSync(p)) {
      report.problems.push(`${report.dir}/${name}: missing`);
      continue;
    }
    const size = fs.statSync(p).size;
    report.bytes += size;
    if (size !== entry.bytes) report.problems.push(`${report.dir}/${name}: ${size} bytes, bundle JSON says ${entry.bytes}`);
    if (verify) {
      const got = fileCrc32c(p);
      entry.verified = got === entry.checksum;
      if (!entry.verified) report.problems.push(`${report.dir}/${name}: checksum ${got} != recorded ${entry.checksum}`);
    }
    try {
      report.tensors.push(...tensorsOf(p, `${report.dir}/${name}`));
    } catch (e) {
      report.problems.push(`${report.dir}/${name}: unreadable (${(e as Error).message})`);
    }
  }
}

function newReport(kind: BundleKind, rel: string): BundleReport {
  return { kind, dir: rel, ranks: [], bytes: 0, files: [], tensors: [], problems: [], info: {} };
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
      const r = newReport('kv_dump', rel);
      const doc = readJson(path.join(dir, 'dump.json'), r.problems);
      if (doc) {
        r.ranks = [Number(doc.identity?.global_rank)];
        r.info = { req_id: doc.req_id, incident_type: doc.incident_type, arm_wave: doc.arm_wave, format: doc.format, tp_rank: doc.identity?.tp_rank };
        checkFiles(dir, doc.files ?? [], verify, r);
      }
      result.bundles.push(r);
      return;
    }
    if (names.includes('meta.json') && names.some((n) => n.startsWith('tensor'))) {
      const r = newReport('snapshot', rel);
      const meta = readJson(path.join(dir, 'meta.json'), r.problems);
      if (meta) {
        r.ranks = [Number(meta.global_rank)];
        r.info = { hash: meta.hash, call_index: meta.call_index, selected_by: meta.selected_by, format: meta.format, tp_rank: meta.tp_rank };
        const files = meta.files ?? (meta.inputs ?? []).map((i: any) => ({ name: `tensor${i.index}.${meta.format}` }));
        checkFiles(dir, files, verify && Array.isArray(meta.files), r);
        if (Array.isArray(meta.inputs) && r.files.length !== meta.inputs.length) {
          r.problems.push(`${rel}: meta.json lists ${meta.inputs.length} inputs but ${r.files.length} files`);
        }
      }
      result.bundles.push(r);
      return;
    }
    if (names.includes('request_info.json')) {
      const r = newReport('dump_wave', rel);
      const info = readJson(path.join(dir, 'request_info.json'), r.problems) ?? {};
      const manifest = names.includes('manifest.json') ? readJson(path.join(dir, 'manifest.json'), r.problems) : undefined;
      const present = names.filter((n) => /^rank\d+$/.test(n) && fs.existsSync(path.join(dir, n, 'dump.json'))).map((n) => Number(n.slice(4)));
      const skipped = names.filter((n) => /^rank\d+$/.test(n) && fs.existsSync(path.join(dir, n, 'dump_skipped.json'))).map((n) => Number(n.slice(4)));
      const expected: number[] = (manifest?.expected_ranks ?? info.expected_ranks ?? []).map(Number);
      r.ranks = present.sort((a, b) => a - b);
      r.info = { req_id: info.req_id, incident_type: info.incident_type, expected_ranks: expected, skipped_ranks: skipped, manifest_missing: manifest?.missing_ranks ?? null };
      for (const e of expected) {
        if (!present.includes(e)) r.problems.push(`${rel}: rank ${e} missing${skipped.includes(e) ? ' (dump_skipped.json present)' : ''}`);
      }
      result.bundles.push(r);
    }
    for (const n of names.sort()) {
      const p = path.join(dir, n);
      if (!fs.statSync(p).isDirectory()) continue;
      if (n.startsWith('.') && n.includes('.tmp-')) {
        result.incomplete.push(path.relative(root, p));
        continue;
      }
      walk(p);
    }
  };
  walk(root);
  for (const b of result.bundles) result.problems.push(...b.problems);
  return result;
}
