// `wavebus aggregate`: collect the bundles of a job from the agents on every host into one tree,
// reaching them only through the coordinator (RelayRequest over its ROUTER). Files stream in
// checksummed chunks (a window per file); a chunk's bytes travel as their own ZeroMQ frame from
// the agent through the coordinator to here (payload.ts), untouched. Each chunk's crc32c is
// checked once and folded into the running whole-file checksum (crc32cCombine); chunks are
// written in order under a '.part' temp name while the next ones are in flight, checked against
// the listing's whole-file checksum, fsynced once and renamed. Paths from agents are untrusted:
// anything that would leave the output tree is refused and counted, never written.
import * as fs from 'fs';
import * as path from 'path';
import { Dealer } from 'zeromq';
import { DEFAULT_MAX_FRAME_BYTES } from './bus/coordinator';
import { socketIpOptions, tcpEndpoint, type HostPort } from './bus/endpoints';
import { DropCounter, decodeCoordinatorMessage, encodeAgentMessage, type CoordinatorMsg } from './bus/frames';
import { payloadOf, withPayload } from './bus/payload';
import { crc32c, formatChecksum, parseChecksum, crc32cOfFile } from './checksum';
import { ConfigError, WavebusError } from './errors';
import { fsyncDir } from './freespace';
import {
  checkListedChecksum,
  checkListedSize,
  freeBytesAt,
  localPathFor,
  MAX_LISTED_FILES,
  partName,
  PART_SUFFIX,
  shownPath,
  type AggregateRoot,
} from './aggregate-listing';

export type { AggregateRoot } from './aggregate-listing';
export { localPathFor } from './aggregate-listing';
export const AGGREGATE_MANIFEST = 'manifest.json';
export const AGGREGATE_KIND = 'wavebus_aggregate';
/** Agents serve at most this much per chunk (src/agent/file-server.ts MAX_CHUNK_BYTES). */
export const MAX_CHUNK_MB = 4;
/**
 * Defaults: 2 MiB chunks, 4 in flight per file, 2 files at a time (at most 2 × (4 + 1) × 2 MiB
 * held). Larger chunks only add memory: per-chunk costs are small next to per-byte ones, and
 * every relay hop gets the next chunk while it still handles this one.
 */
export const DEFAULT_CHUNK_MB = 2;
export const DEFAULT_WINDOW = 4;
export const DEFAULT_PARALLEL_FILES = 2;
/** Per relayed request; the relay's own timer adds 5 s, and a Node timer holds at most 2^31-1 ms. */
export const MAX_REQUEST_TIMEOUT_MS = 2 ** 31 - 1 - 5000;

export class AggregateError extends WavebusError {
  constructor(message: string, code = 'ERR_AGGREGATE') {
    super(code, message);
  }
}

export interface AggregateProgress {
  doneBytes: number;
  totalBytes: number;
  doneFiles: number;
  totalFiles: number;
}

export interface AggregateOptions {
  coordinator: HostPort;
  out: string;
  what?: 'all' | AggregateRoot;
  /** Relative path prefix under each root ("" = everything). */
  prefix?: string;
  /** Keep only files under a `call<N>` directory (one snapshot call). */
  call?: number;
  chunkBytes?: number;
  /** Chunks in flight per file. */
  window?: number;
  /** Files fetched at the same time. */
  parallelFiles?: number;
  /** Per relayed request. */
  requestTimeoutMs?: number;
  progress?: (p: AggregateProgress) => void;
  /** Test hook (fault injection): throw once this many bytes were written in this run. */
  failAfterBytes?: number;
}

export type FileStatus = 'fetched' | 'resumed' | 'present' | 'failed';

export interface AggregatedFile {
  root: AggregateRoot;
  path: string;
  bytes: number;
  checksum: string;
  /** The rank it was fetched from (first lister that answered). */
  rank: number;
  listedBy: number[];
  status: FileStatus;
  verified: boolean;
  error?: string;
}

export interface RefusedPath {
  rank: number;
  root: AggregateRoot;
  path: string;
  reason: string;
}

export interface RankListing {
  answered: boolean;
  files: number;
  bytes: number;
  errors: string[];
}

export interface AggregateManifest {
  kind: typeof AGGREGATE_KIND;
  schema: 1;
  coordinator: string;
  what: 'all' | AggregateRoot;
  prefix: string;
  call: number | null;
  created_unix_ms: number;
  expected_ranks: number[];
  live_ranks: number[];
  present_ranks: number[];
  missing_ranks: number[];
  ranks: Record<string, RankListing>;
  files: AggregatedFile[];
  refused: RefusedPath[];
  conflicts: { root: AggregateRoot; path: string; detail: string }[];
  totals: { files: number; bytes: number; fetched_files: number; fetched_bytes: number; present_files: number; failed_files: number; refused: number };
  /** Messages from the coordinator that were not well-formed replies, dropped, by reason. */
  dropped: Record<string, number>;
  /** Nothing missing, nothing failed, nothing refused, every file verified. */
  complete: boolean;
}

// ---------------------------------------------------------------- the relay client

/** A DEALER on the coordinator's ROUTER; requests correlated by request id. */
export class RelayClient {
  private readonly dealer: Dealer;
  private readonly pending = new Map<number, { resolve: (m: CoordinatorMsg) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }>();
  private nextId = 1;
  private sendQueue: Array<{ buf: Buffer; failed: (e: unknown) => void }> = [];
  private sending: Promise<void> | undefined;
  private loop: Promise<void>;
  private closed = false;
  readonly endpoint: string;
  /** What came from the coordinator and was not a well-formed reply, by reason. */
  private readonly drops = new DropCounter(undefined, 'aggregate DEALER');

  constructor(coordinator: HostPort, private readonly maxFrameBytes = DEFAULT_MAX_FRAME_BYTES) {
    this.endpoint = tcpEndpoint(coordinator.host, coordinator.port + 1);
    this.dealer = new Dealer({ linger: 0, maxMessageSize: 2 * maxFrameBytes, ...socketIpOptions(coordinator.host) });
    this.dealer.connect(this.endpoint);
    this.loop = this.receive();
  }

  private async receive(): Promise<void> {
    while (!this.dealer.closed) {
      let parts: Buffer[];
      try {
        parts = await this.dealer.receive();
      } catch {
        if (this.dealer.closed || this.closed) break;
        continue;
      }
      // [CoordinatorMessage] or [CoordinatorMessage carrying a chunk, the chunk's data].
      if (parts.length !== 1 && parts.length !== 2) {
        this.drops.drop('frame_count', `${parts.length} frames from the coordinator`);
        continue;
      }
      const d = decodeCoordinatorMessage(parts[0], this.maxFrameBytes);
      if (!d.ok) {
        this.drops.drop(d.reason, d.detail);
        continue;
      }
      const p = this.pending.get(d.value.requestId);
      if (!p) continue; // a heartbeat, or an answer that came after its timeout
      this.pending.delete(d.value.requestId);
      clearTimeout(p.timer);
      p.resolve(parts.length === 2 ? withPayload(d.value, parts[1]) : d.value);
    }
  }

  /** Send an AgentMessage body (`{ status: {} }`, `{ relay: {...} }`) and resolve with the reply. */
  request(body: Record<string, unknown>, timeoutMs: number): Promise<CoordinatorMsg> {
    if (this.closed) return Promise.reject(new AggregateError('relay client is closed'));
    const requestId = this.nextId++;
    const buf = encodeAgentMessage({ requestId, ...body });
    return new Promise<CoordinatorMsg>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(requestId);
        reject(new AggregateError(`no answer from the coordinator at ${this.endpoint} within ${timeoutMs} ms`, 'ERR_TIMEOUT'));
      }, timeoutMs);
      this.pending.set(requestId, { resolve, reject, timer });
      this.sendQueue.push({
        buf,
        failed: (e) => {
          const p = this.pending.get(requestId);
          if (!p) return;
          this.pending.delete(requestId);
          clearTimeout(p.timer);
          p.reject(new AggregateError(`cannot send to ${this.endpoint}: ${String((e as Error)?.message ?? e)}`));
        },
      });
      if (!this.sending) this.sending = this.drainSends();
    });
  }

  // zeromq allows one send in flight per socket. The first send happens right here, not a tick
  // later: a request issued before a chunk is written is on its way while the write runs.
  private async drainSends(): Promise<void> {
    try {
      while (this.sendQueue.length > 0) {
        const { buf, failed } = this.sendQueue.shift()!;
        try {
          await this.dealer.send(buf);
        } catch (e) {
          failed(e);
        }
      }
    } finally {
      this.sending = undefined;
    }
  }

  get dropped(): Record<string, number> {
    return this.drops.counts;
  }

  /**
   * Relay a fileList / fileChunk request to `rank`; throws on a relay or agent error. A chunk's
   * data frame, when the reply has one, is attached to the result (payloadOf).
   */
  async relay(rank: number, kind: 'fileList' | 'fileChunk', req: Record<string, unknown>, timeoutMs: number): Promise<Record<string, any>> {
    const m = await this.request({ relay: { rank, [kind]: req, timeoutMs } }, timeoutMs + 5000);
    if (m.body !== 'relay') throw new AggregateError(`coordinator answered ${m.body} to a relay request`);
    const r = m.relay as Record<string, any>;
    if (r.error) throw new AggregateError(r.error, 'ERR_RELAY');
    if (r.reply !== kind) throw new AggregateError(`rank ${rank}: relay reply carries ${r.reply ?? 'nothing'}, expected ${kind}`);
    const inner = r[kind] as Record<string, any>;
    if (inner.error) throw new AggregateError(`rank ${rank}: ${inner.error}`, 'ERR_AGENT');
    const data = payloadOf(m);
    return data ? withPayload(inner, data) : inner;
  }

  async status(timeoutMs: number): Promise<{ liveRanks: number[]; expectedRanks: number[] }> {
    const m = await this.request({ status: {} }, timeoutMs);
    if (m.body !== 'status') throw new AggregateError(`coordinator answered ${m.body} to a status request`);
    return { liveRanks: (m.status.liveRanks ?? []).map(Number), expectedRanks: (m.status.expectedRanks ?? []).map(Number) };
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const [, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new AggregateError('relay client closed'));
    }
    this.pending.clear();
    await this.sending;
    this.dealer.close();
    await this.loop;
  }
}

// ---------------------------------------------------------------- the plan

interface Planned {
  root: AggregateRoot;
  path: string;
  local: string;
  bytes: number;
  checksum: string;
  crc: number;
  listedBy: number[];
}

// ---------------------------------------------------------------- the aggregation

export async function aggregate(opts: AggregateOptions): Promise<AggregateManifest> {
  const out = path.resolve(opts.out);
  const what = opts.what ?? 'all';
  if (!['all', 'dumps', 'snapshots'].includes(what)) throw new ConfigError(`--what: expected all, snapshots or dumps, got ${JSON.stringify(what)}`);
  const chunkBytes = opts.chunkBytes ?? DEFAULT_CHUNK_MB * 2 ** 20;
  if (!Number.isSafeInteger(chunkBytes) || chunkBytes < 1 || chunkBytes > MAX_CHUNK_MB * 2 ** 20) {
    throw new ConfigError(`--chunk-mb: expected more than 0 and at most ${MAX_CHUNK_MB} (agents serve at most ${MAX_CHUNK_MB} MiB per chunk), got ${chunkBytes / 2 ** 20}`);
  }
  const window = opts.window ?? DEFAULT_WINDOW;
  const parallelFiles = opts.parallelFiles ?? DEFAULT_PARALLEL_FILES;
  const timeoutMs = opts.requestTimeoutMs ?? 30000;
  if (!Number.isSafeInteger(window) || window < 1 || window > 64) throw new ConfigError(`--window: expected an integer in 1..64, got ${window}`);
  if (!Number.isSafeInteger(timeoutMs) || timeoutMs < 1 || timeoutMs > MAX_REQUEST_TIMEOUT_MS) {
    throw new ConfigError(`--timeout-ms: expected an integer in 1..${MAX_REQUEST_TIMEOUT_MS}, got ${timeoutMs}`);
  }
  const prefix = opts.prefix ?? '';
  const roots: AggregateRoot[] = what === 'all' ? ['dumps', 'snapshots'] : [what];
  fs.mkdirSync(out, { recursive: true });

  const client = new RelayClient(opts.coordinator);
  try {
    const st = await client.status(Math.min(timeoutMs, 10000));
    const ranks = [...new Set([...st.expectedRanks, ...st.liveRanks])].sort((a, b) => a - b);
    const listings: Record<string, RankListing> = {};
    const refused: RefusedPath[] = [];
    const conflicts: AggregateManifest['conflicts'] = [];
    const planned = new Map<string, Planned>();
    let freeBudget = freeBytesAt(out);

    // 1. Ask every rank what it has (ranks on one host share a filesystem and list the same files).
    for (const rank of ranks) {
      const l: RankListing = { answered: false, files: 0, bytes: 0, errors: [] };
      listings[String(rank)] = l;
      if (!st.liveRanks.includes(rank)) {
        l.errors.push('not live on the bus');
        continue;
      }
      for (const root of roots) {
        let reply: Record<string, any>;
        try {
          reply = await client.relay(rank, 'fileList', { root, prefix }, timeoutMs);
        } catch (e) {
          l.errors.push(`${root}: ${(e as Error).message}`);
          continue;
        }
        l.answered = true;
        const files: unknown[] = Array.isArray(reply.files) ? reply.files : [];
        if (files.length > MAX_LISTED_FILES) {
          refused.push({ rank, root, path: '', reason: `listing of ${files.length} entries is over the limit of ${MAX_LISTED_FILES} (MAX_LISTED_FILES); the rest is not fetched` });
        }
        for (const entry of files.slice(0, MAX_LISTED_FILES)) {
          const f = (entry ?? {}) as Record<string, unknown>;
          const where = localPathFor(out, root, f.path);
          if ('reason' in where) {
            refused.push({ rank, root, path: shownPath(f.path), reason: where.reason });
            continue;
          }
          const rel = f.path as string;
          if (opts.call !== undefined && !rel.split('/').includes(`call${opts.call}`)) continue;
          const sum = checkListedChecksum(f.checksum);
          if ('reason' in sum) {
            refused.push({ rank, root, path: rel, reason: sum.reason });
            continue;
          }
          const size = checkListedSize(f.bytes, freeBudget);
          if ('reason' in size) {
            refused.push({ rank, root, path: rel, reason: size.reason });
            continue;
          }
          const { crc } = sum;
          const { bytes } = size;
          l.files++;
          l.bytes += bytes;
          const key = `${root}/${rel}`;
          const prev = planned.get(key);
          if (!prev) {
            freeBudget -= bytes; // planned files share the free space
            planned.set(key, { root, path: rel, local: where.path, bytes, checksum: String(f.checksum), crc, listedBy: [rank] });
          } else if (prev.bytes === bytes && prev.crc === crc) {
            prev.listedBy.push(rank);
          } else {
            conflicts.push({ root, path: rel, detail: `rank ${rank} lists ${bytes} bytes ${f.checksum}, rank ${prev.listedBy[0]} lists ${prev.bytes} bytes ${prev.checksum}` });
            // The rank whose own rank<g>/ dir holds the file is its writer: prefer its version.
            if (rel.split('/').includes(`rank${rank}`)) {
              planned.set(key, { root, path: rel, local: where.path, bytes, checksum: String(f.checksum), crc, listedBy: [rank, ...prev.listedBy] });
            }
          }
        }
      }
    }

    // 2. Fetch, a few files at a time; each file resumes from its .part or is skipped when whole.
    const plan = [...planned.values()].sort((a, b) => (a.root + a.path).localeCompare(b.root + b.path));
    const progress: AggregateProgress = { doneBytes: 0, totalBytes: plan.reduce((n, f) => n + f.bytes, 0), doneFiles: 0, totalFiles: plan.length };
    const results: AggregatedFile[] = [];
    const dirs = new Set<string>();
    let writtenThisRun = 0;
    const onWrite = (n: number) => {
      progress.doneBytes += n;
      writtenThisRun += n;
      if (opts.failAfterBytes !== undefined && writtenThisRun >= opts.failAfterBytes) {
        throw new AggregateError(`injected failure after ${writtenThisRun} bytes`, 'ERR_INJECTED');
      }
      opts.progress?.(progress);
    };
    let next = 0;
    let fatal: Error | undefined;
    const worker = async () => {
      while (next < plan.length && !fatal) {
        const f = plan[next++];
        let r: AggregatedFile;
        try {
          r = await fetchOne(client, f, { chunkBytes, window, timeoutMs, onWrite, progress });
        } catch (e) {
          if ((e as WavebusError).code === 'ERR_INJECTED') {
            fatal = e as Error;
            return;
          }
          // Whatever else went wrong is this file's failure, in the manifest; the run goes on.
          r = { root: f.root, path: f.path, bytes: f.bytes, checksum: f.checksum, listedBy: f.listedBy, rank: f.listedBy[0], status: 'failed', verified: false, error: String((e as Error)?.message ?? e) };
        }
        results.push(r);
        if (r.status !== 'failed') dirs.add(path.dirname(f.local));
        progress.doneFiles++;
        opts.progress?.(progress);
      }
    };
    await Promise.all(Array.from({ length: Math.max(1, parallelFiles) }, worker));
    if (fatal) throw fatal;
    for (const d of dirs) fsyncDir(d);

    // 3. The manifest.
    results.sort((a, b) => (a.root + a.path).localeCompare(b.root + b.path));
    const present = ranks.filter((r) => listings[String(r)].answered && listings[String(r)].files > 0);
    const missing = st.expectedRanks.filter((r) => !present.includes(r)).sort((a, b) => a - b);
    const failed = results.filter((r) => r.status === 'failed');
    const manifest: AggregateManifest = {
      kind: AGGREGATE_KIND,
      schema: 1,
      coordinator: `${opts.coordinator.host}:${opts.coordinator.port}`,
      what,
      prefix,
      call: opts.call ?? null,
      created_unix_ms: Date.now(),
      expected_ranks: [...st.expectedRanks].sort((a, b) => a - b),
      live_ranks: [...st.liveRanks].sort((a, b) => a - b),
      present_ranks: present,
      missing_ranks: missing,
      ranks: listings,
      files: results,
      refused,
      conflicts,
      totals: {
        files: results.length,
        bytes: results.reduce((n, r) => n + r.bytes, 0),
        fetched_files: results.filter((r) => r.status === 'fetched' || r.status === 'resumed').length,
        fetched_bytes: results.filter((r) => r.status === 'fetched' || r.status === 'resumed').reduce((n, r) => n + r.bytes, 0),
        present_files: results.filter((r) => r.status === 'present').length,
        failed_files: failed.length,
        refused: refused.length,
      },
      dropped: { ...client.dropped },
      complete: missing.length === 0 && failed.length === 0 && refused.length === 0 && results.every((r) => r.verified),
    };
    writeManifest(out, manifest);
    return manifest;
  } finally {
    await client.close();
  }
}

function writeManifest(out: string, manifest: AggregateManifest): void {
  const final = path.join(out, AGGREGATE_MANIFEST);
  const tmp = path.join(out, `.${AGGREGATE_MANIFEST}${PART_SUFFIX}`);
  const fd = fs.openSync(tmp, 'w');
  try {
    fs.writeSync(fd, `${JSON.stringify(manifest, null, 2)}\n`);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(tmp, final);
  fsyncDir(out);
}

interface FetchCtx {
  chunkBytes: number;
  window: number;
  timeoutMs: number;
  onWrite: (n: number) => void;
  progress: AggregateProgress;
}

/** Fetch one file from the first of its listers that serves it whole. Never throws for a bad file. */
async function fetchOne(client: RelayClient, f: Planned, ctx: FetchCtx): Promise<AggregatedFile> {
  const base = { root: f.root, path: f.path, bytes: f.bytes, checksum: f.checksum, listedBy: f.listedBy };
  // Already here and whole (a previous run): skip without asking anyone.
  if (fs.existsSync(f.local)) {
    const st = fs.statSync(f.local);
    if (st.isFile() && st.size === f.bytes && crc32cOfFile(f.local).digest() === f.crc) {
      ctx.progress.doneBytes += f.bytes;
      return { ...base, rank: f.listedBy[0], status: 'present', verified: true };
    }
  }
  const errors: string[] = [];
  try {
    fs.mkdirSync(path.dirname(f.local), { recursive: true });
  } catch (e) {
    return { ...base, rank: f.listedBy[0], status: 'failed', verified: false, error: `cannot create ${path.dirname(f.local)}: ${(e as Error).message}` };
  }
  for (const rank of f.listedBy) {
    // A resumed .part whose whole-file check fails is refetched from scratch once.
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        const resumed = await fetchFile(client, rank, f, ctx, attempt === 0);
        return { ...base, rank, status: resumed ? 'resumed' : 'fetched', verified: true };
      } catch (e) {
        if ((e as WavebusError).code === 'ERR_INJECTED') throw e;
        const err = e as AggregateError;
        errors.push(`rank ${rank}: ${err.message}`);
        if (err.code !== 'ERR_RESUMED_MISMATCH') break;
      }
    }
  }
  return { ...base, rank: f.listedBy[0], status: 'failed', verified: false, error: errors.join('; ') };
}

/**
 * Bytes per write: each piece's crc32c is taken right before it is written, so the write copies
 * bytes the checksum just pulled into cache (one trip through memory for both; a 2 MiB chunk
 * checked whole and then written whole is read from memory twice).
 */
const PIECE_BYTES = 256 * 1024;

const fsyncAsync = (fd: number) => new Promise<void>((resolve, reject) => fs.fsync(fd, (e) => (e ? reject(e) : resolve())));

/** Write `data` at `pos` a piece at a time; returns crc32c(data). */
function writeChecked(fd: number, data: Buffer, pos: number): number {
  let crc = 0;
  for (let o = 0; o < data.length; o += PIECE_BYTES) {
    const piece = data.subarray(o, Math.min(o + PIECE_BYTES, data.length));
    crc = crc32c(piece, crc);
    for (let w = 0; w < piece.length; ) w += fs.writeSync(fd, piece, w, piece.length - w, pos + o + w);
  }
  return crc;
}

/** A chunk as the agent sent it: its bytes (the reply's data frame) and the agent's crc32c of them. */
interface Chunk {
  data: Buffer;
  crc: number;
}

const CHUNK_ATTEMPTS = 3;

/** Returns whether it resumed a .part. Throws AggregateError; the .part is kept only for resumable failures. */
async function fetchFile(client: RelayClient, rank: number, f: Planned, ctx: FetchCtx, allowResume: boolean): Promise<boolean> {
  const part = partName(f.local);
  let start = 0;
  // The running whole-file checksum; a resumed .part contributes what is already on disk.
  let crc = 0;
  if (allowResume && fs.existsSync(part)) {
    const size = fs.statSync(part).size;
    if (size <= f.bytes) {
      start = size;
      crc = crc32cOfFile(part, size).digest();
      ctx.progress.doneBytes += size;
    }
  }
  const resumed = start > 0;
  const fd = fs.openSync(part, resumed ? 'r+' : 'w');
  let keepPart = true;
  // Offsets are computed as requests go out, never listed up front: memory does not follow the
  // size a listing claims.
  const chunks = Math.ceil((f.bytes - start) / ctx.chunkBytes);
  const offsetOf = (k: number) => start + k * ctx.chunkBytes;
  const lengthAt = (offset: number) => Math.min(ctx.chunkBytes, f.bytes - offset);
  const inflight: Promise<Chunk>[] = [];
  let issued = 0;
  const request = (offset: number) => {
    const p = fetchChunk(client, rank, f, offset, lengthAt(offset), ctx.timeoutMs);
    p.catch(() => undefined); // awaited in order below; a failure is not unhandled meanwhile
    return p;
  };
  const issue = () => inflight.push(request(offsetOf(issued++)));
  try {
    // A window of requests stays in flight while chunks are checked and written, in order, so
    // the .part is always a verified prefix of the file (what a resume relies on).
    while (issued < chunks && inflight.length < ctx.window) issue();
    let pos = start;
    while (inflight.length > 0) {
      let c = await inflight.shift()!;
      if (issued < chunks) issue();
      for (let attempt = 1; ; attempt++) {
        let got: number;
        try {
          got = writeChecked(fd, c.data, pos);
        } catch (e) {
          try {
            fs.ftruncateSync(fd, pos); // keep the .part a verified prefix for the next run
          } catch {
            /* the write error is the one to report */
          }
          throw new AggregateError(`${f.root}/${f.path}: cannot write ${part}: ${(e as Error).message}`, 'ERR_WRITE');
        }
        if (got === c.crc) break;
        // Bad bytes from the network: cut them off the .part and ask for the chunk again.
        fs.ftruncateSync(fd, pos);
        if (attempt === CHUNK_ATTEMPTS) {
          throw new AggregateError(`${f.root}/${f.path} from rank ${rank}: chunk at ${pos}: crc32c mismatch (${CHUNK_ATTEMPTS} attempts)`, 'ERR_CHUNK');
        }
        c = await request(pos);
      }
      crc = crc32cCombine(crc, c.crc, c.data.length);
      pos += c.data.length;
      ctx.onWrite(c.data.length);
    }
    if (crc !== f.crc || pos !== f.bytes) {
      keepPart = false;
      throw new AggregateError(
        `${f.root}/${f.path}: whole-file checksum ${formatChecksum(crc)} (${pos} bytes) does not match the listing's ${f.checksum} (${f.bytes} bytes); not written`,
        resumed ? 'ERR_RESUMED_MISMATCH' : 'ERR_CHECKSUM',
      );
    }
    // Off the event loop: the other files' chunks keep arriving and being written meanwhile.
    await fsyncAsync(fd);
  } catch (e) {
    // Let everything in flight settle so no reply lands after we return.
    await Promise.allSettled(inflight);
    fs.closeSync(fd);
    // A checksum mismatch discards the .part; any other failure keeps it for the next run to resume.
    if (!keepPart) fs.rmSync(part, { force: true });
    throw e;
  }
  fs.closeSync(fd);
  fs.renameSync(part, f.local);
  return resumed;
}

/**
 * One chunk, its offset and length checked (its crc32c is checked as it is written). A short or
 * misplaced answer is asked for again; a short read whose bytes match their crc (the file shrank
 * since it was listed) will not heal and fails at once.
 */
async function fetchChunk(client: RelayClient, rank: number, f: Planned, offset: number, length: number, timeoutMs: number): Promise<Chunk> {
  let last = '';
  for (let attempt = 0; attempt < CHUNK_ATTEMPTS; attempt++) {
    const c = await client.relay(rank, 'fileChunk', { root: f.root, path: f.path, offset, length }, timeoutMs);
    // The bytes come as the reply's own frame; an agent that put them in the message is served too.
    const frame = payloadOf(c);
    const inline: Buffer | undefined = c.data?.length ? c.data : undefined;
    const data = frame ?? inline ?? Buffer.alloc(0);
    const agentCrc = Number(c.crc32c) >>> 0;
    if (frame && inline) last = `chunk at ${offset} carries its bytes twice (a data frame and a data field)`;
    else if (Number(c.offset) !== offset) last = `chunk at ${c.offset}, asked for ${offset}`;
    else if (data.length !== length) {
      last = `chunk at ${offset}: ${data.length} bytes, asked for ${length} (the file changed since it was listed?)`;
      if (crc32c(data) === agentCrc) break;
      last = `chunk at ${offset}: crc32c mismatch`;
    } else return { data, crc: agentCrc };
  }
  throw new AggregateError(`${f.root}/${f.path} from rank ${rank}: ${last}`, 'ERR_CHUNK');
}

// ---------------------------------------------------------------- crc32c combine

/** CRC-32C's reflected polynomial. */
const POLY = 0x82f63b78;

/** a(x) · b(x) mod p(x), reflected (zlib's multmodp). */
function multModP(a: number, b: number): number {
  let m = 0x80000000;
  let p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) === 0) break;
    }
    m >>>= 1;
    b = b & 1 ? (b >>> 1) ^ POLY : b >>> 1;
  }
  return p >>> 0;
}

/** X2N[k] = x^(2^k) mod p(x). */
const X2N: number[] = (() => {
  const t = [0x40000000]; // x^1
  for (let k = 1; k < 32; k++) t.push(multModP(t[k - 1], t[k - 1]));
  return t;
})();

/** x^(len·8) mod p(x): the operator that shifts a crc past `len` zero bytes. */
const shiftCache = new Map<number, number>();
function shiftFor(len: number): number {
  let op = shiftCache.get(len);
  if (op !== undefined) return op;
  op = 0x80000000; // x^0
  for (let n = len, k = 3; n > 0; n = Math.floor(n / 2), k++) if (n % 2) op = multModP(X2N[k & 31], op);
  if (shiftCache.size < 64) shiftCache.set(len, op);
  return op;
}

/**
 * crc32c(concat(a, b)) from crc32c(a), crc32c(b) and b's length, without reading any bytes
 * (zlib's crc32_combine for the Castagnoli polynomial): a chunk's checksum, checked once, also
 * continues the whole-file checksum.
 */
export function crc32cCombine(crcA: number, crcB: number, lenB: number): number {
  if (lenB === 0) return crcA >>> 0;
  return (multModP(shiftFor(lenB), crcA >>> 0) ^ crcB) >>> 0;
}
