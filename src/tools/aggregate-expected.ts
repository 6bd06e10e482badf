// What each dump should hold, from its manifest.json: an aggregation is complete only when every
// file a completed rank acked was fetched whole. Listings alone cannot tell: a dump written
// somewhere else (through a link another user planted, say) is simply absent from them, and
// the ranks that listed something else still look present.
import * as fs from 'fs';
import * as path from 'path';
import type { AggregatedFile } from './aggregate-types';
import { parseArtifactJson } from '../artifacts/json-file';

/** A dump manifest is a few KiB per rank; a bigger one is not read. */
const MAX_DUMP_MANIFEST_BYTES = 16 * 2 ** 20;

export interface MissingFile {
  /** The dump (wave dir) whose manifest lists it, relative to the dumps root. */
  dump: string;
  /** The file, relative to the dumps root. */
  path: string;
  /** The rank that acked it. */
  rank: number;
  reason: string;
}

function readManifest(local: string): Record<string, unknown> | string {
  let text: string;
  try {
    const st = fs.statSync(local);
    if (st.size > MAX_DUMP_MANIFEST_BYTES) return `over ${MAX_DUMP_MANIFEST_BYTES} bytes; not read`;
    text = fs.readFileSync(local, 'utf8');
  } catch (e) {
    return `cannot read it: ${(e as Error).message}`;
  }
  try {
    const v = parseArtifactJson(text);
    return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : 'not a JSON object';
  } catch (e) {
    return `not JSON: ${(e as Error).message}`;
  }
}

/**
 * The files the fetched dump manifests list (each completed rank's acked files)
 * that this aggregation does not hold whole. `localOf` gives where a fetched file lies locally.
 * A manifest that cannot be read is one entry naming it.
 */
export function missingDumpFiles(results: readonly AggregatedFile[], localOf: (root: string, rel: string) => string | undefined): MissingFile[] {
  const byPath = new Map(results.filter((r) => r.root === 'dumps').map((r) => [r.path, r]));
  const missing: MissingFile[] = [];
  for (const r of byPath.values()) {
    if (path.posix.basename(r.path) !== 'manifest.json' || r.status === 'failed') continue;
    const dump = path.posix.dirname(r.path);
    const local = localOf('dumps', r.path);
    const m = local === undefined ? 'not fetched' : readManifest(local);
    if (typeof m === 'string') {
      missing.push({ dump, path: r.path, rank: r.rank, reason: `the dump manifest: ${m}` });
      continue;
    }
    const completed = Array.isArray(m.completed_ranks) ? m.completed_ranks.filter((g): g is number => Number.isSafeInteger(g) && g >= 0) : [];
    const files = (typeof m.files === 'object' && m.files !== null ? m.files : {}) as Record<string, unknown>;
    for (const g of completed) {
      const acked = Array.isArray(files[g]) ? (files[g] as unknown[]) : [];
      for (const e of acked) {
        const entry = (e ?? {}) as { path?: unknown; bytes?: unknown };
        if (typeof entry.path !== 'string') continue;
        // Acked paths are relative to the dump dir: <rank dir>/<file> (agent/dump-executor.ts).
        const rel = `${dump}/${entry.path}`;
        const got = byPath.get(rel);
        const reason = !got
          ? 'listed by no rank (written elsewhere, removed, or not ours to serve)'
          : got.status === 'failed' || !got.verified
            ? `not fetched whole${got.error ? `: ${got.error}` : ''}`
            : typeof entry.bytes === 'number' && got.bytes !== entry.bytes
              ? `${got.bytes} bytes listed, ${entry.bytes} bytes acked`
              : null;
        if (reason !== null) missing.push({ dump, path: rel, rank: g, reason });
      }
    }
  }
  return missing.sort((a, b) => a.path.localeCompare(b.path));
}
