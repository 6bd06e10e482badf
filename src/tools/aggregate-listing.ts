// What `wavebus aggregate` accepts from an agent's file listing. A listing comes from the
// network: every field is checked against local limits before anything is planned, allocated
// or created, and an entry that fails is refused with its reason (in the manifest), never fetched.
import * as fs from 'fs';
import * as path from 'path';
import { parseChecksum } from '../artifacts/checksum';
import { joinUnder } from '../artifacts/sanitize';
import { MAX_LISTING_FILES } from '../bus/wire-census';

/** Linux PATH_MAX counts the NUL: a usable path is at most 4095 bytes. */
export const MAX_LOCAL_PATH_BYTES = 4095;
/** Linux NAME_MAX, per path component. */
export const NAME_MAX_BYTES = 255;
/** Directory levels in a listed path (bundles are a handful deep). */
export const MAX_PATH_COMPONENTS = 64;
/** The largest single file aggregate will fetch (1 TiB), whatever the listing claims. */
export const MAX_FILE_BYTES = 2 ** 40;
/** Entries read from one rank's listing of one root (what one frame carries); the rest are refused as one entry. */
export const MAX_LISTED_FILES = MAX_LISTING_FILES;
/** A file is written as `.<name>.part` first: its component must fit NAME_MAX with these bytes. */
export const PART_SUFFIX = '.part';
const PART_EXTRA_BYTES = 1 + PART_SUFFIX.length;

/** Folders of the output tree: the ranks' dumps and snapshots, the coordinator's reports (its dump records go into dumps/). */
export type AggregateRoot = 'dumps' | 'snapshots' | 'reports';

/** In a manifest, the rank that lists or served a file of the coordinator's own (reports, dump records). */
export const COORDINATOR_SOURCE = -1;

export function partName(local: string): string {
  return path.join(path.dirname(local), `.${path.basename(local)}${PART_SUFFIX}`);
}

/** A listed path as it can be shown in the manifest: NULs made visible, cut to a readable length. */
export function shownPath(rel: unknown): string {
  const s = String(rel).replace(/\0/g, '\\0');
  return s.length > 300 ? `${s.slice(0, 300)}... (${Buffer.byteLength(s)} bytes)` : s;
}

/**
 * The local path for `rel` listed by an agent under `root`, or the reason it is refused.
 * Refused: non-strings, NUL, absolute paths, empty, '.', '..' or hidden/temporary components,
 * more than MAX_PATH_COMPONENTS levels, a component over NAME_MAX (with the .part name), a
 * local path (its .part included) over PATH_MAX.
 */
export function localPathFor(outRoot: string, root: AggregateRoot, rel: unknown): { path: string } | { reason: string } {
  if (typeof rel !== 'string' || rel.length === 0) return { reason: 'empty or not a string' };
  if (rel.includes('\0')) return { reason: 'contains NUL' };
  if (rel.startsWith('/') || path.isAbsolute(rel)) return { reason: 'absolute path' };
  const relBytes = Buffer.byteLength(rel);
  if (relBytes > MAX_LOCAL_PATH_BYTES) return { reason: `path is ${relBytes} bytes, over PATH_MAX (${MAX_LOCAL_PATH_BYTES} bytes)` };
  const parts = rel.split('/');
  if (parts.length > MAX_PATH_COMPONENTS) return { reason: `${parts.length} path components, over the limit of ${MAX_PATH_COMPONENTS} (MAX_PATH_COMPONENTS)` };
  for (const p of parts) {
    if (p === '' || p === '.' || p === '..') return { reason: `component ${JSON.stringify(p)} is not allowed` };
    if (p.startsWith('.')) return { reason: `hidden or temporary name ${JSON.stringify(shownPath(p))}` };
    const b = Buffer.byteLength(p);
    if (b + PART_EXTRA_BYTES > NAME_MAX_BYTES) {
      return { reason: `component of ${b} bytes is over NAME_MAX (${NAME_MAX_BYTES} bytes, ${NAME_MAX_BYTES - PART_EXTRA_BYTES} with the .part name)` };
    }
  }
  let local: string;
  try {
    local = joinUnder(outRoot, root, ...parts);
  } catch (e) {
    return { reason: (e as Error).message };
  }
  const localBytes = Buffer.byteLength(partName(local));
  if (localBytes > MAX_LOCAL_PATH_BYTES) return { reason: `local path would be ${localBytes} bytes, over PATH_MAX (${MAX_LOCAL_PATH_BYTES} bytes)` };
  return { path: local };
}

/**
 * The listed paths of `root` that lie under another listed path taken as a file ("a" and "a/b"):
 * one name cannot be both a file and a directory of the output tree, so the nested ones are
 * refused (each with the file it is under) and the file is fetched. Sorted input not needed.
 */
export function nestedUnderFiles(paths: Iterable<{ root: string; path: string }>): Map<string, string> {
  const files = new Set<string>();
  const all: { root: string; path: string }[] = [];
  for (const p of paths) {
    files.add(`${p.root}/${p.path}`);
    all.push(p);
  }
  const out = new Map<string, string>(); // key `${root}/${path}` -> the file it is under
  for (const p of all) {
    const parts = p.path.split('/');
    for (let i = 1; i < parts.length; i++) {
      const above = parts.slice(0, i).join('/');
      if (files.has(`${p.root}/${above}`)) {
        out.set(`${p.root}/${p.path}`, above);
        break;
      }
    }
  }
  return out;
}

/** A listed size: a non-negative integer within MAX_FILE_BYTES and the free space left. */
export function checkListedSize(raw: unknown, freeBytes: number): { bytes: number } | { reason: string } {
  const bytes = typeof raw === 'number' || typeof raw === 'bigint' || (typeof raw === 'string' && /^\d+$/.test(raw)) ? Number(raw) : NaN;
  if (!Number.isSafeInteger(bytes) || bytes < 0) return { reason: `size ${shownPath(raw)} is not a byte count` };
  if (bytes > MAX_FILE_BYTES) return { reason: `size ${bytes} is over the local limit of ${MAX_FILE_BYTES} bytes (MAX_FILE_BYTES)` };
  if (bytes > freeBytes) return { reason: `size ${bytes} is more than the ${freeBytes} bytes free for the output` };
  return { bytes };
}

/** A listed checksum: `crc32c:<8 lowercase hex>`. */
export function checkListedChecksum(raw: unknown): { crc: number } | { reason: string } {
  try {
    if (typeof raw !== 'string') throw new RangeError('not a string');
    return { crc: parseChecksum(raw) };
  } catch {
    return { reason: `checksum ${JSON.stringify(shownPath(raw))} is not crc32c:<8 hex>` };
  }
}

/** Bytes free for unprivileged writes on the filesystem holding `dir` (which exists). */
export function freeBytesAt(dir: string): number {
  const st = fs.statfsSync(dir);
  return Number(st.bavail) * Number(st.bsize);
}
