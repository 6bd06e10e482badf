// What `wavebus aggregate` takes and writes: its options, and the manifest of the tree it collects
// (per rank: listing, files and their fate, refused paths). The one definition the tool, the CLI and
// the tests read.
import type { HostPort } from '../bus/endpoints';
import type { BusToken } from '../bus/auth';
import type { CurveClientKeys } from '../bus/curve';
import type { RankTransport } from './aggregate-direct';
import type { AggregateRoot } from './aggregate-listing';
import type { MissingFile } from './aggregate-expected';

export const AGGREGATE_MANIFEST = 'manifest.json';
export const AGGREGATE_KIND = 'wavebus_aggregate';

export interface AggregateProgress {
  doneBytes: number;
  totalBytes: number;
  doneFiles: number;
  totalFiles: number;
}

export interface AggregateOptions {
  coordinator: HostPort;
  /** The job's bus token, when its coordinator has one (a one-host `wavebus launch` without CURVE). */
  busToken?: BusToken;
  /** CURVE client keys, for a coordinator that runs with CURVE (--curve-dir, docs/security.md). */
  curve?: CurveClientKeys;
  out: string;
  what?: 'all' | 'dumps' | 'snapshots';
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
  /**
   * With `curve`: fetch each rank's chunks from its own file socket (aggregate-direct.ts); false
   * (--relay) sends every chunk through the coordinator. Default true.
   */
  direct?: boolean;
  /** How long a rank's file socket has to answer before its chunks go through the relay. */
  directTimeoutMs?: number;
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
  /** How its chunks travelled (present for a rank something was fetched from, with CURVE). */
  transport?: RankTransport['transport'];
  direct_error?: string;
  endpoint?: string;
}

export interface AggregateManifest {
  kind: typeof AGGREGATE_KIND;
  schema: 1;
  coordinator: string;
  what: 'all' | 'dumps' | 'snapshots';
  prefix: string;
  call: number | null;
  created_unix_ms: number;
  expected_ranks: number[];
  live_ranks: number[];
  present_ranks: number[];
  missing_ranks: number[];
  ranks: Record<string, RankListing>;
  /**
   * The coordinator's own listing (reports, dump records; not asked with --what snapshots). Its
   * files carry rank -1 (COORDINATOR_SOURCE).
   */
  coordinator_files: RankListing & { asked: boolean };
  files: AggregatedFile[];
  /** Files a fetched dump manifest.json says a completed rank wrote, not fetched whole here (aggregate-expected.ts). */
  missing_files: MissingFile[];
  refused: RefusedPath[];
  conflicts: { root: AggregateRoot; path: string; detail: string }[];
  totals: { files: number; bytes: number; fetched_files: number; fetched_bytes: number; present_files: number; failed_files: number; refused: number; missing_files: number };
  /**
   * Direct fetch (docs/aggregate.md): asked (CURVE on and not --relay), the ranks fetched from
   * their own file sockets, and those fetched through the coordinator instead (why: ranks[r].direct_error).
   */
  direct: { asked: boolean; ranks: number[]; relayed: number[] };
  /** Messages from the coordinator that were not well-formed replies, dropped, by reason. */
  dropped: Record<string, number>;
  /** Nothing missing (ranks or dump files), nothing failed, nothing refused, every file verified, the coordinator's files listed. */
  complete: boolean;
}

// ---------------------------------------------------------------- the aggregation
