// Fetching one planned file for `wavebus aggregate`: chunks in a window, each chunk's crc32c
// checked as it is written in order under a '.part' name, the whole-file checksum continued with
// crc32cCombine, fsync, rename. A bad file is reported, never thrown (except injected faults).
import * as fs from 'fs';
import * as path from 'path';
import type { AggregatedFile, AggregateProgress } from './aggregate';
import { COORDINATOR_SOURCE, partName, type AggregateRoot } from './aggregate-listing';
import { payloadOf } from '../bus/payload';
import { crc32c, crc32cCombine, crc32cOfFd, formatChecksum } from '../artifacts/checksum';
import type { WavebusError } from '../errors';
import { AggregateError } from '../errors';
import { DEFAULT_ARTIFACT_MODES } from '../artifacts/artifact-mode';
import { mkdirTrustedSync } from '../artifacts/safe-mkdir';

/** A file request as a chunk source takes it (FileChunkRequest without the buffer acks). */
export type ChunkRequest = {
  root: string;
  path: string;
  offset: number;
  length: number;
};

/**
 * Where a rank's chunks come from: the coordinator's relay (RelayClient) or the rank's own file
 * socket (aggregate-direct.ts). Resolves with the agent's FileChunk, its bytes attached as the
 * payload (payloadOf); throws AggregateError on a transport or agent error.
 */
export interface ChunkSource {
  fileChunk(rank: number, req: ChunkRequest, timeoutMs: number): Promise<Record<string, any>>;
}

/** A file to fetch: where it goes, what the listing says it is, who listed it. */
export interface Planned {
  /** Where it goes in the output tree. */
  root: AggregateRoot;
  /** The root to ask for: the local one for a rank's file, 'reports' / 'dump_records' for the coordinator's. */
  wireRoot: string;
  path: string;
  local: string;
  bytes: number;
  checksum: string;
  crc: number;
  listedBy: number[];
}

export interface FetchCtx {
  chunkBytes: number;
  window: number;
  timeoutMs: number;
  onWrite: (n: number) => void;
  progress: AggregateProgress;
}

/** Fetch one file from the first of its listers that serves it whole. Never throws for a bad file. */
export async function fetchOne(sourceOf: (rank: number) => ChunkSource, f: Planned, ctx: FetchCtx): Promise<AggregatedFile> {
  const base = { root: f.root, path: f.path, bytes: f.bytes, checksum: f.checksum, listedBy: f.listedBy };
  // Already here and whole (a previous run): skip without asking anyone.
  const have = openExisting(f.local, false);
  if (have) {
    let whole = false;
    try {
      whole = have.size === f.bytes && crc32cOfFd(have.fd).digest() === f.crc;
    } finally {
      fs.closeSync(have.fd);
    }
    if (whole) {
      ctx.progress.doneBytes += f.bytes;
      return { ...base, rank: f.listedBy[0], status: 'present', verified: true };
    }
  }
  const errors: string[] = [];
  try {
    mkdirTrustedSync(path.dirname(f.local), DEFAULT_ARTIFACT_MODES.dir, '--out');
  } catch (e) {
    return { ...base, rank: f.listedBy[0], status: 'failed', verified: false, error: `cannot create ${path.dirname(f.local)}: ${(e as Error).message}` };
  }
  for (const rank of f.listedBy) {
    // A resumed .part whose whole-file check fails is refetched from scratch once.
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        const resumed = await fetchFile(sourceOf(rank), rank, f, ctx, attempt === 0);
        return { ...base, rank, status: resumed ? 'resumed' : 'fetched', verified: true };
      } catch (e) {
        if ((e as WavebusError).code === 'ERR_INJECTED') throw e;
        const err = e as AggregateError;
        errors.push(`${rank === COORDINATOR_SOURCE ? 'the coordinator' : `rank ${rank}`}: ${err.message}`);
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
async function fetchFile(client: ChunkSource, rank: number, f: Planned, ctx: FetchCtx, allowResume: boolean): Promise<boolean> {
  const part = partName(f.local);
  let start = 0;
  // The running whole-file checksum; a resumed .part contributes what is already on disk.
  let crc = 0;
  let old = allowResume ? openExisting(part, true) : undefined;
  if (old && (old.size === 0 || old.size > f.bytes)) {
    fs.closeSync(old.fd);
    old = undefined;
  }
  if (old) {
    start = old.size;
    crc = crc32cOfFd(old.fd, start).digest();
    ctx.progress.doneBytes += start;
  }
  const resumed = start > 0;
  const fd = old ? old.fd : createFresh(part);
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
  try {
    fs.renameSync(part, f.local);
  } catch (e) {
    // Something else holds the name (a directory, from another entry or an earlier run): no .part is left behind.
    fs.rmSync(part, { force: true });
    throw new AggregateError(`${f.root}/${f.path}: cannot rename ${part} to ${f.local}: ${(e as Error).message}`, 'ERR_WRITE');
  }
  return resumed;
}

/**
 * One chunk, its offset and length checked (its crc32c is checked as it is written). A short or
 * misplaced answer is asked for again; a short read whose bytes match their crc (the file shrank
 * since it was listed) will not heal and fails at once.
 */
async function fetchChunk(client: ChunkSource, rank: number, f: Planned, offset: number, length: number, timeoutMs: number): Promise<Chunk> {
  let last = '';
  for (let attempt = 0; attempt < CHUNK_ATTEMPTS; attempt++) {
    // The coordinator answers its own roots whatever the rank field says (coordinator-files.ts).
    const c = await client.fileChunk(rank === COORDINATOR_SOURCE ? 0 : rank, { root: f.wireRoot, path: f.path, offset, length }, timeoutMs);
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

/**
 * Local files are created O_EXCL|O_NOFOLLOW (a stale one is removed first: rm removes a link, never
 * its target) and reopened O_NOFOLLOW, so a link planted in the output tree is never written
 * through or read.
 */
const { O_RDWR, O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;
export function createFresh(file: string): number {
  fs.rmSync(file, { force: true });
  return fs.openSync(file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o666);
}

/** An existing regular file opened without following a link (read-write when `write`); undefined when absent or not a regular file. */
export function openExisting(file: string, write: boolean): { fd: number; size: number } | undefined {
  let fd: number;
  try {
    fd = fs.openSync(file, (write ? O_RDWR : fs.constants.O_RDONLY) | O_NOFOLLOW | fs.constants.O_NONBLOCK);
  } catch {
    return undefined;
  }
  const st = fs.fstatSync(fd);
  if (st.isFile()) return { fd, size: st.size };
  fs.closeSync(fd);
  return undefined;
}
