// Serves this rank's finished bundles to the coordinator for `wavebus aggregate`: file lists and
// checksummed chunks (a chunk's bytes travel as the reply's own ZeroMQ frame, see payload.ts).
// Only complete bundles are listed (temporary names start with '.'), and no request can read
// outside the served roots: paths are opened a component at a time without following links, and
// only regular files and directories are served (src/artifacts/safe-fs.ts). Only what this
// process's user wrote is listed or served: a file or directory another user put in a shared root
// is not ours to offer (docs/security.md).
import * as fs from 'fs';
import * as path from 'path';
import type { CoordinatorMsg } from '../bus/frames';
import { withPayload } from '../bus/payload';
import { MAX_LISTING_FILES } from '../bus/wire-census';
import { crc32c, crc32cOfFd } from '../artifacts/checksum';
import type { Logger } from '../log';
import type { FileEntry } from '../messages';
import { ownerName } from '../artifacts/safe-mkdir';
import { parseArtifactJson } from '../artifacts/json-file';
import { fdPath, openBeneath, openBeneathSync, openChildSync, splitRelative, type OpenedSync } from '../artifacts/safe-fs';

export const MAX_CHUNK_BYTES = 4 * 2 ** 20;
/** Chunk buffers kept for reuse per agent, in all; beyond that a chunk gets a fresh buffer. */
const POOL_MAX_BYTES = 32 * 2 ** 20;
/** Smaller chunks get a fresh buffer (not worth keeping). */
const POOL_MIN_BYTES = 64 * 1024;
/** An answer not acknowledged this long (lost, or the coordinator went away): its buffer is forgotten, never reused. */
const LEND_TIMEOUT_MS = 30000;
/** After this long without a chunk request every kept buffer is let go. */
const POOL_IDLE_MS = 5000;

/**
 * Which entries of a served tree are served (the coordinator serves only the files it writes):
 * called with the path's components and whether it names a directory or a file. Default: all.
 */
export type ServedEntries = (parts: string[], kind: 'dir' | 'file') => boolean;

/** A served root: a directory, or a directory and the part of it that is served. */
export type ServedTree = string | { dir: string; include: ServedEntries };

/** Served roots by name ("dumps", "snapshots" for an agent; the coordinator's own names, coordinator-files.ts). */
export type ServeRoots = Partial<Record<string, ServedTree>>;

const treeDir = (t: ServedTree): string => (typeof t === 'string' ? t : t.dir);
const treeInclude = (t: ServedTree): ServedEntries | undefined => (typeof t === 'string' ? undefined : t.include);

/** Whether `parts` (a file, or a directory when `kind` is 'dir') and each directory above it are served. */
function served(include: ServedEntries | undefined, parts: string[], kind: 'dir' | 'file'): boolean {
  if (!include) return true;
  for (let i = 1; i < parts.length; i++) if (!include(parts.slice(0, i), 'dir')) return false;
  return parts.length === 0 || include(parts, kind);
}

/** Bundle JSON read for its recorded checksums: larger ones are ignored (checksums get computed). */
const MAX_BUNDLE_JSON_BYTES = 16 * 2 ** 20;

/** Checksums recorded in a bundle's JSON (dump.json / meta.json) in the directory open as `dirFd`, keyed by file name. */
function recordedChecksums(dirFd: number): Map<string, string> {
  const out = new Map<string, string>();
  for (const name of ['dump.json', 'meta.json']) {
    let f: OpenedSync;
    try {
      f = openChildSync(dirFd, name, 'file'); // a link or fifo planted under that name is not read
    } catch {
      continue;
    }
    try {
      if (f.stat.size > MAX_BUNDLE_JSON_BYTES || !ours(f.stat)) continue; // another user's JSON feeds no checksum
      const doc = parseArtifactJson(fs.readFileSync(f.fd, 'utf8')) as any;
      for (const e of doc.files ?? []) {
        const n = e.path ?? e.name;
        if (typeof n === 'string' && typeof e.checksum === 'string') out.set(path.posix.basename(n), e.checksum);
      }
    } catch {
      /* unreadable JSON: checksums get computed */
    } finally {
      fs.closeSync(f.fd);
    }
  }
  return out;
}

/** Written by us: the owner is this process's effective uid. */
function ours(st: fs.Stats): boolean {
  return st.uid === (process.geteuid?.() ?? st.uid);
}

/**
 * Lists complete files under `root/prefix` (relative paths, '/' separated). Skips temp names,
 * links and anything that is not a regular file or directory; never descends into a link. Each
 * entry is opened (without following links) and its size and checksum come from that descriptor.
 * Throws when there are more than `maxFiles` (what one reply frame may carry).
 */
export function listBundleFiles(root: string, prefix: string, include?: ServedEntries, maxFiles = MAX_LISTING_FILES): FileEntry[] {
  const out: FileEntry[] = [];
  const prefixParts = splitRelative(prefix.replace(/\/+$/, ''), 'prefix');
  if (include && prefixParts.length > 0 && !served(include, prefixParts, 'dir') && !served(include, prefixParts, 'file')) return out;
  let base: OpenedSync;
  try {
    base = openBeneathSync(root, prefix.replace(/\/+$/, ''), 'any');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return out;
    throw e;
  }
  const walk = (dirFd: number, rel: string): void => {
    const sums = recordedChecksums(dirFd);
    const ents = fs.readdirSync(fdPath(dirFd), { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name));
    for (const ent of ents) {
      if (ent.name.startsWith('.')) continue; // a bundle still being written, or a temp file
      if (!ent.isFile() && !ent.isDirectory()) continue; // links, fifos, sockets, devices: never listed
      if (out.length >= maxFiles) throw new Error(`more than ${maxFiles} files under ${JSON.stringify(prefix || '.')}: over what one listing carries (one frame's limit); list less at a time (aggregate --prefix)`);
      const childRel = rel ? `${rel}/${ent.name}` : ent.name;
      if (include && !include(childRel.split('/'), ent.isDirectory() ? 'dir' : 'file')) continue;
      let child: OpenedSync;
      try {
        child = openChildSync(dirFd, ent.name, 'any'); // refuses a link swapped in since readdir
      } catch {
        continue;
      }
      try {
        if (!ours(child.stat)) continue; // planted by another user: never offered
        if (child.stat.isDirectory()) walk(child.fd, childRel);
        else out.push({ path: childRel, bytes: child.stat.size, checksum: sums.get(ent.name) ?? crc32cOfFd(child.fd).toString() });
      } finally {
        fs.closeSync(child.fd);
      }
    }
  };
  try {
    if (!ours(base.stat) && prefixParts.length > 0) return out;
    if (base.stat.isDirectory()) walk(base.fd, prefixParts.join('/'));
    else if (prefixParts.length > 0 && served(include, prefixParts, 'file')) {
      out.push({ path: prefixParts.join('/'), bytes: base.stat.size, checksum: crc32cOfFd(base.fd).toString() });
    }
  } finally {
    fs.closeSync(base.fd);
  }
  return out;
}

/** The pooled size for a chunk of `n` bytes: a power of two from 64 KiB to 4 MiB, or 0 (not pooled). */
function capacityFor(n: number): number {
  if (n < POOL_MIN_BYTES || n > MAX_CHUNK_BYTES) return 0;
  let c = POOL_MIN_BYTES;
  while (c < n) c *= 2;
  return c;
}

/**
 * Read buffers for chunks, reused. Reading into fresh memory costs a page fault per 4 KiB (the
 * largest cost of serving a chunk on a VM), so a busy agent reads into the same few buffers.
 * A chunk's buffer goes out as its answer's data frame without a copy, and ZeroMQ reads it after
 * handle() returns: it is refilled only once the coordinator says it received that answer whole
 * (FileChunkRequest.received), which it cannot before ZeroMQ here has written its last byte.
 */
export class ChunkBuffers {
  private readonly free = new Map<number, Buffer[]>();
  /** By `${epoch}:${requestId}` of the answer that carries it. */
  private readonly lent = new Map<string, { buf: Buffer; at: number }>();
  private pooledBytes = 0;
  private idle?: NodeJS.Timeout;

  /** A buffer of at least `n` bytes; `pooled` ones go back through lend() or giveBack(). */
  take(n: number): { buf: Buffer; pooled: boolean } {
    this.busy();
    const cap = capacityFor(n);
    if (cap === 0) return { buf: Buffer.allocUnsafe(n), pooled: false };
    const list = this.free.get(cap);
    if (list && list.length > 0) return { buf: list.pop()!, pooled: true };
    if (this.pooledBytes + cap > POOL_MAX_BYTES) this.expire(Date.now() - LEND_TIMEOUT_MS);
    if (this.pooledBytes + cap > POOL_MAX_BYTES) return { buf: Buffer.allocUnsafe(n), pooled: false };
    this.pooledBytes += cap;
    return { buf: Buffer.allocUnsafeSlow(cap), pooled: true };
  }

  /** `buf` went out in the answer to `key`: kept until that answer is acknowledged. */
  lend(key: string, buf: Buffer): void {
    if (this.lent.has(key)) this.forget(buf); // a repeated request id: never risk reusing either
    else this.lent.set(key, { buf, at: Date.now() });
  }

  /** `buf` was not sent: free at once. */
  giveBack(buf: Buffer): void {
    const list = this.free.get(buf.length) ?? [];
    list.push(buf);
    this.free.set(buf.length, list);
  }

  /** The coordinator has the answers to `keys` whole: their buffers may be refilled. */
  acknowledged(keys: string[]): void {
    for (const k of keys) {
      const l = this.lent.get(k);
      if (!l) continue;
      this.lent.delete(k);
      this.giveBack(l.buf);
    }
  }

  /** Bytes in kept buffers, free or lent. */
  get bytes(): number {
    return this.pooledBytes;
  }

  /** No longer kept: the GC frees it once ZeroMQ has let go of it too. */
  private forget(buf: Buffer): void {
    this.pooledBytes -= buf.length;
  }

  private expire(lentBefore: number): void {
    for (const [k, l] of this.lent) {
      if (l.at > lentBefore) continue;
      this.lent.delete(k);
      this.forget(l.buf);
    }
  }

  private busy(): void {
    if (this.idle) {
      this.idle.refresh();
      return;
    }
    this.idle = setTimeout(() => {
      this.idle = undefined;
      for (const list of this.free.values()) for (const b of list) this.forget(b);
      this.free.clear();
      this.expire(Infinity);
    }, POOL_IDLE_MS);
    this.idle.unref();
  }
}

export class FileServer {
  private readonly buffers = new ChunkBuffers();

  constructor(
    private readonly globalRank: number,
    /** Read on every request: the dump root can move with a hot-reloaded config. */
    private readonly roots: () => ServeRoots,
    private readonly log: Logger,
    /**
     * Reuse chunk buffers (an agent: the coordinator says when an answer arrived whole). A server
     * that answers a tool directly never learns that, so it reads each chunk into fresh memory.
     */
    private readonly reuseBuffers = true,
    /** Who answers, in errors: "rank 3", "the coordinator". */
    private readonly who = `rank ${globalRank}`,
  ) {}

  private root(name: string): ServedTree {
    const r = Object.prototype.hasOwnProperty.call(this.roots(), name) ? this.roots()[name] : undefined;
    if (!r) throw new Error(`root '${name}' is not served by ${this.who}`);
    return r;
  }

  /** Answers a CoordinatorMessage (fileList / fileChunk) with an AgentMessage body. */
  async handle(req: CoordinatorMsg): Promise<Record<string, unknown>> {
    if (req.body === 'fileList') {
      const { root, prefix } = req.fileList as { root: string; prefix: string };
      try {
        const tree = this.root(root);
        return { fileList: { globalRank: this.globalRank, files: listBundleFiles(treeDir(tree), prefix, treeInclude(tree)) } };
      } catch (e) {
        return { fileList: { globalRank: this.globalRank, files: [], error: (e as Error).message } };
      }
    }
    if (req.body === 'fileChunk') {
      const { root, path: rel, offset, length, received } = req.fileChunk as { root: string; path: string; offset: number; length: number; received?: number[] };
      if (received?.length) this.buffers.acknowledged(received.map((id) => `${req.epoch}:${Number(id)}`));
      try {
        const want = Math.min(Math.max(0, length), MAX_CHUNK_BYTES);
        // Every component opened without following links (safe-fs.ts), on the libuv pool: the
        // agent's event loop keeps serving its engine and the bus meanwhile.
        const tree = this.root(root);
        if (!served(treeInclude(tree), splitRelative(rel, 'path'), 'file')) throw new Error(`'${rel}' is not served by ${this.who} under root '${root}'`);
        const { fh, stat } = await openBeneath(treeDir(tree), rel, 'file');
        let data: Buffer;
        let size: number;
        try {
          if (!ours(stat)) throw new Error(`'${rel}' is owned by ${ownerName(stat.uid)}, not written by ${this.who}; not served`);
          size = stat.size;
          const count = Math.max(0, Math.min(want, size - offset));
          const { buf, pooled } = this.reuseBuffers ? this.buffers.take(count) : { buf: Buffer.allocUnsafe(count), pooled: false };
          let n = 0;
          try {
            while (n < count) {
              const r = await fh.read(buf, n, count - n, offset + n);
              if (r.bytesRead === 0) break;
              n += r.bytesRead;
            }
          } catch (e) {
            if (pooled) this.buffers.giveBack(buf);
            throw e;
          }
          data = buf.subarray(0, n);
          if (pooled) this.buffers.lend(`${req.epoch}:${req.requestId}`, buf);
        } finally {
          await fh.close();
        }
        // The bytes go as the message's own frame (payload.ts), never copied into the protobuf.
        return withPayload({ fileChunk: { globalRank: this.globalRank, root, path: rel, offset, crc32c: crc32c(data), eof: offset + data.length >= size } }, data);
      } catch (e) {
        this.log.warn({ err: e, path: rel }, 'file chunk request refused');
        return { fileChunk: { globalRank: this.globalRank, root, path: rel, offset, error: (e as Error).message } };
      }
    }
    return {};
  }
}
