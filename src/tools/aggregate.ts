// `wavebus aggregate`: collect the bundles of a job from the agents on every host into one tree,
// reaching them only through the coordinator (RelayRequest over its ROUTER). Files stream in
// checksummed chunks (a window per file); a chunk's bytes travel as their own ZeroMQ frame from
// the agent through the coordinator to here (payload.ts), untouched. Each chunk's crc32c is
// checked once and folded into the running whole-file checksum (crc32cCombine); chunks are
// written in order under a '.part' temp name while the next ones are in flight, checked against
// the listing's whole-file checksum, fsynced once and renamed. Paths from agents are untrusted:
// anything that would leave the output tree, or exceeds a local limit, is refused and counted,
// never written (aggregate-listing.ts). Fetching one file: aggregate-fetch.ts. With CURVE, each
// rank's chunks come from the rank's own file socket instead, one CURVE hop, falling back to the
// relay for a rank whose socket does not answer (aggregate-direct.ts).
import * as fs from 'fs';
import * as path from 'path';
import { DEFAULT_MAX_FRAME_BYTES } from '../bus/constants';
import { fetchOne, type ChunkSource, type Planned } from './aggregate-fetch';
import { DEFAULT_DIRECT_TIMEOUT_MS, interleaveByRank, openRankSource, type RankSource } from './aggregate-direct';
import { AGGREGATE_KIND, AGGREGATE_MANIFEST, type AggregatedFile, type AggregateManifest, type AggregateOptions, type AggregateProgress, type FileStatus, type RankListing, type RefusedPath } from './aggregate-types';
import { RelayClient } from '../bus/relay-client';
import { ConfigError, WavebusError, AggregateError } from '../errors';
import { fsyncDir, writeJsonAtomic } from '../artifacts/atomic-write';
import { inKvRankDirOf } from '../paths';
import { DEFAULT_ARTIFACT_MODES } from '../artifacts/artifact-mode';
import { mkdirTrustedSync } from '../artifacts/safe-mkdir';
import { missingDumpFiles } from './aggregate-expected';
import {
  checkListedChecksum,
  checkListedSize,
  freeBytesAt,
  localPathFor,
  COORDINATOR_SOURCE,
  MAX_LISTED_FILES,
  nestedUnderFiles,
  shownPath,
  type AggregateRoot,
} from './aggregate-listing';

export type { AggregateRoot } from './aggregate-listing';
export { COORDINATOR_SOURCE } from './aggregate-listing';
export { localPathFor } from './aggregate-listing';
export { AGGREGATE_KIND, AGGREGATE_MANIFEST } from './aggregate-types';
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

export { RelayClient } from '../bus/relay-client';
export { crc32cCombine } from '../artifacts/checksum';
export type { AggregateProgress, AggregateOptions, FileStatus, AggregatedFile, RefusedPath, RankListing, AggregateManifest } from './aggregate-types';

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
  try {
    mkdirTrustedSync(out, DEFAULT_ARTIFACT_MODES.dir, '--out');
  } catch (e) {
    throw new ConfigError(`--out ${out}: cannot create the output directory: ${(e as Error).message}`);
  }

  const client = new RelayClient(opts.coordinator, DEFAULT_MAX_FRAME_BYTES, opts.busToken, opts.curve);
  try {
    const st = await client.status(Math.min(timeoutMs, 10000));
    const ranks = [...new Set([...st.expectedRanks, ...st.liveRanks])].sort((a, b) => a - b);
    const listings: Record<string, RankListing> = {};
    const refused: RefusedPath[] = [];
    const conflicts: AggregateManifest['conflicts'] = [];
    const planned = new Map<string, Planned>();
    let freeBudget = freeBytesAt(out);

    // Every entry of a listing is checked here before it is planned; `source` is a rank, or
    // COORDINATOR_SOURCE for the coordinator's own reports and dump records.
    const plan1 = (source: number, wireRoot: string, root: AggregateRoot, files: unknown[], l: RankListing) => {
      if (files.length > MAX_LISTED_FILES) {
        refused.push({ rank: source, root, path: '', reason: `listing of ${files.length} entries is over the limit of ${MAX_LISTED_FILES} (MAX_LISTED_FILES); the rest is not fetched` });
      }
      for (const entry of files.slice(0, MAX_LISTED_FILES)) {
        const f = (entry ?? {}) as Record<string, unknown>;
        const where = localPathFor(out, root, f.path);
        if ('reason' in where) {
          refused.push({ rank: source, root, path: shownPath(f.path), reason: where.reason });
          continue;
        }
        const rel = f.path as string;
        if (opts.call !== undefined && !rel.split('/').includes(`call${opts.call}`)) continue;
        const sum = checkListedChecksum(f.checksum);
        if ('reason' in sum) {
          refused.push({ rank: source, root, path: rel, reason: sum.reason });
          continue;
        }
        const size = checkListedSize(f.bytes, freeBudget);
        if ('reason' in size) {
          refused.push({ rank: source, root, path: rel, reason: size.reason });
          continue;
        }
        const { crc } = sum;
        const { bytes } = size;
        l.files++;
        l.bytes += bytes;
        const key = `${root}/${rel}`;
        const prev = planned.get(key);
        const mine = { root, wireRoot, path: rel, local: where.path, bytes, checksum: String(f.checksum), crc };
        if (!prev) {
          freeBudget -= bytes; // planned files share the free space
          planned.set(key, { ...mine, listedBy: [source] });
        } else if (prev.bytes === bytes && prev.crc === crc) {
          // The coordinator's records are listed first; agents sharing its dump root list the same files.
          if (prev.listedBy[0] !== COORDINATOR_SOURCE) prev.listedBy.push(source);
        } else {
          const who = (r: number) => (r === COORDINATOR_SOURCE ? 'the coordinator' : `rank ${r}`);
          conflicts.push({ root, path: rel, detail: `${who(source)} lists ${bytes} bytes ${f.checksum}, ${who(prev.listedBy[0])} lists ${prev.bytes} bytes ${prev.checksum}` });
          // The writer's version wins: the coordinator for its records, else the rank whose own KV
          // dump dir (dp*_tp*_pp*_cp*, or rank<g> of older dumps) holds the file.
          if (prev.listedBy[0] !== COORDINATOR_SOURCE && source !== COORDINATOR_SOURCE && inKvRankDirOf(rel, source, st.layout)) {
            planned.set(key, { ...mine, listedBy: [source, ...prev.listedBy] });
          }
        }
      }
    };

    // 1. The coordinator's own files: reports and the dump records of each wave dir (the
    //    incident's request_info.json and manifest.json live on the coordinator's host).
    const coordinatorListing: RankListing = { answered: false, files: 0, bytes: 0, errors: [] };
    if (what !== 'snapshots') {
      // A --prefix names a dump path (<incident_type>/<req_id>/wave_N): reports are kept by its incident type.
      const reportPrefix = prefix.split('/').filter((p) => p !== '')[0] ?? '';
      for (const [wireRoot, root, p] of [['dump_records', 'dumps', prefix], ['reports', 'reports', reportPrefix]] as const) {
        let reply: Record<string, any>;
        try {
          reply = await client.relay(0, 'fileList', { root: wireRoot, prefix: p }, timeoutMs);
        } catch (e) {
          coordinatorListing.errors.push(`${wireRoot}: ${(e as Error).message}`);
          continue;
        }
        coordinatorListing.answered = true;
        plan1(COORDINATOR_SOURCE, wireRoot, root, Array.isArray(reply.files) ? reply.files : [], coordinatorListing);
      }
    }

    // 2. Ask every rank what it has (ranks on one host share a filesystem and list the same files).
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
        plan1(rank, root, root, Array.isArray(reply.files) ? reply.files : [], l);
      }
    }

    // A file listed under another listed file's name would find a file where its directory goes.
    for (const [key, above] of nestedUnderFiles(planned.values())) {
      const f = planned.get(key)!;
      planned.delete(key);
      freeBudget += f.bytes;
      refused.push({ rank: f.listedBy[0], root: f.root, path: f.path, reason: `nested under ${JSON.stringify(shownPath(above))}, which is listed as a file: a name cannot be both a file and a directory` });
    }

    // 3. Fetch, a few files at a time; each file resumes from its .part or is skipped when whole.
    const plan = [...planned.values()].sort((a, b) => (a.root + a.path).localeCompare(b.root + b.path));
    // With CURVE, each rank that lists something serves its chunks itself (all ranks at once).
    const directAsked = opts.curve !== undefined && opts.direct !== false;
    const sources = new Map<number, RankSource>();
    if (directAsked) {
      const probes = new Map<number, Planned>();
      for (const f of plan) for (const r of f.listedBy) if (r !== COORDINATOR_SOURCE && !probes.has(r)) probes.set(r, f);
      const t = Math.min(timeoutMs, opts.directTimeoutMs ?? DEFAULT_DIRECT_TIMEOUT_MS);
      await Promise.all(
        [...probes].map(async ([r, f]) => {
          const s = await openRankSource(client, r, opts.curve!, { root: f.wireRoot, path: f.path, offset: 0, length: 0 }, t);
          sources.set(r, s);
        }),
      );
    }
    const sourceOf = (rank: number): ChunkSource => sources.get(rank) ?? client;
    // Ranks served directly are fetched side by side: interleave the plan by rank, a worker per rank.
    let workers = parallelFiles;
    const direct = [...sources.values()].filter((s) => s.state.transport === 'direct').length;
    if (direct > 1) {
      workers = Math.max(parallelFiles, direct);
      plan.splice(0, plan.length, ...interleaveByRank(plan));
    }
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
          r = await fetchOne(sourceOf, f, { chunkBytes, window, timeoutMs, onWrite, progress });
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
    try {
      await Promise.all(Array.from({ length: Math.max(1, workers) }, worker));
    } finally {
      for (const [r, s] of sources) Object.assign(listings[String(r)] ?? {}, s.state);
      await Promise.all([...sources.values()].map((s) => s.close()));
    }
    if (fatal) throw fatal;
    for (const d of dirs) fsyncDir(d);

    // 4. The manifest.
    results.sort((a, b) => (a.root + a.path).localeCompare(b.root + b.path));
    const present = ranks.filter((r) => listings[String(r)].answered && listings[String(r)].files > 0);
    const missing = st.expectedRanks.filter((r) => !present.includes(r)).sort((a, b) => a - b);
    const failed = results.filter((r) => r.status === 'failed');
    // Every file the fetched dump manifests say a rank wrote must be here, whole.
    const missingFiles = what === 'snapshots' ? [] : missingDumpFiles(results, (root, rel) => planned.get(`${root}/${rel}`)?.local);
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
      coordinator_files: { asked: what !== 'snapshots', ...coordinatorListing },
      files: results,
      missing_files: missingFiles,
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
        missing_files: missingFiles.length,
      },
      direct: {
        asked: directAsked,
        ranks: [...sources].filter(([, s]) => s.state.transport === 'direct').map(([r]) => r).sort((a, b) => a - b),
        relayed: [...sources].filter(([, s]) => s.state.transport === 'relay').map(([r]) => r).sort((a, b) => a - b),
      },
      dropped: { ...client.dropped },
      complete:
        missing.length === 0 && failed.length === 0 && refused.length === 0 && missingFiles.length === 0 && results.every((r) => r.verified) &&
        (what === 'snapshots' || coordinatorListing.errors.length === 0),
    };
    writeManifest(out, manifest);
    return manifest;
  } finally {
    await client.close();
  }
}

function writeManifest(out: string, manifest: AggregateManifest): void {
  const final = path.join(out, AGGREGATE_MANIFEST);
  writeJsonAtomic(final, manifest, { mode: 0o666 });
}
