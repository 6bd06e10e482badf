// Serves this rank's finished bundles to the coordinator for `wavebus aggregate`: file lists and
// checksummed chunks. Only complete bundles are listed (temporary names start with '.'), and
// no request can read outside the served roots.
import * as fs from 'fs';
import * as path from 'path';
import type { CoordinatorMsg } from '../bus/frames';
import { crc32c, crc32cOfFile } from '../checksum';
import type { Logger } from '../log';
import type { FileEntry } from '../messages';

export const MAX_CHUNK_BYTES = 4 * 2 ** 20;

export type ServeRoots = { dumps?: string; snapshots?: string };

/** Checksums recorded in a bundle's JSON (dump.json / meta.json), keyed by file name. */
function recordedChecksums(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const name of ['dump.json', 'meta.json']) {
    const p = path.join(dir, name);
    if (!fs.existsSync(p)) continue;
    try {
      const doc = JSON.parse(fs.readFileSync(p, 'utf8'));
      for (const f of doc.files ?? []) {
        const n = f.path ?? f.name;
        if (typeof n === 'string' && typeof f.checksum === 'string') out.set(path.basename(n), f.checksum);
      }
    } catch {
      /* unreadable JSON: checksums get computed */
    }
  }
  return out;
}

/** Lists complete files under `root/prefix` (relative paths, '/' separated). Skips temp names. */
export function listBundleFiles(root: string, prefix: string): FileEntry[] {
  const base = resolveInside(root, prefix);
  const out: FileEntry[] = [];
  if (!fs.existsSync(base)) return out;
  const walk = (dir: string): void => {
    const sums = recordedChecksums(dir);
    for (const ent of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      if (ent.name.startsWith('.')) continue; // a bundle still being written, or a temp file
      const p = path.join(dir, ent.name);
      if (ent.isDirectory()) walk(p);
      else if (ent.isFile()) {
        const st = fs.statSync(p);
        out.push({
          path: path.relative(root, p).split(path.sep).join('/'),
          bytes: st.size,
          checksum: sums.get(ent.name) ?? crc32cOfFile(p).toString(),
        });
      }
    }
  };
  if (fs.statSync(base).isDirectory()) walk(base);
  return out;
}

/** Resolve `rel` under `root`, refusing anything that would leave it. */
export function resolveInside(root: string, rel: string): string {
  if (rel.includes('\0')) throw new Error(`path '${rel.replace(/\0/g, '\\0')}' contains NUL`);
  const r = path.resolve(root);
  const p = path.resolve(r, rel);
  if (p !== r && !p.startsWith(r + path.sep)) throw new Error(`path '${rel}' is outside the served root`);
  return p;
}

export class FileServer {
  constructor(
    private readonly globalRank: number,
    /** Read on every request: the dump root can move with a hot-reloaded config. */
    private readonly roots: () => ServeRoots,
    private readonly log: Logger,
  ) {}

  private root(name: string): string {
    const roots = this.roots();
    const r = name === 'dumps' ? roots.dumps : name === 'snapshots' ? roots.snapshots : undefined;
    if (!r) throw new Error(`root '${name}' is not served by rank ${this.globalRank}`);
    return r;
  }

  /** Answers a CoordinatorMessage (fileList / fileChunk) with an AgentMessage body. */
  async handle(req: CoordinatorMsg): Promise<Record<string, unknown>> {
    if (req.body === 'fileList') {
      const { root, prefix } = req.fileList as { root: string; prefix: string };
      try {
        return { fileList: { globalRank: this.globalRank, files: listBundleFiles(this.root(root), prefix) } };
      } catch (e) {
        return { fileList: { globalRank: this.globalRank, files: [], error: (e as Error).message } };
      }
    }
    if (req.body === 'fileChunk') {
      const { root, path: rel, offset, length } = req.fileChunk as { root: string; path: string; offset: number; length: number };
      try {
        const p = resolveInside(this.root(root), rel);
        const want = Math.min(Math.max(0, length), MAX_CHUNK_BYTES);
        const fd = fs.openSync(p, 'r');
        try {
          const size = fs.fstatSync(fd).size;
          const buf = Buffer.allocUnsafe(Math.max(0, Math.min(want, size - offset)));
          const n = buf.length > 0 ? fs.readSync(fd, buf, 0, buf.length, offset) : 0;
          const data = buf.subarray(0, n);
          return { fileChunk: { globalRank: this.globalRank, root, path: rel, offset, data, crc32c: crc32c(data), eof: offset + n >= size } };
        } finally {
          fs.closeSync(fd);
        }
      } catch (e) {
        this.log.warn({ err: e, path: rel }, 'file chunk request refused');
        return { fileChunk: { globalRank: this.globalRank, root, path: rel, offset, error: (e as Error).message } };
      }
    }
    return {};
  }
}
