// The coordinator's own files for `wavebus aggregate`: the incident reports and the dump records
// (request_info.json, manifest.json, dump_skipped.json of each wave dir) that the runtime guard
// writes on the coordinator's host. A tool asks for them with a RelayRequest naming one of the
// roots below; the coordinator answers it itself, with the same file server (listing, chunks,
// checksums, no links followed) the agents use for their bundles. Only the files the coordinator
// writes are served: never a rank's bundle, nothing else under those directories.
import { FileServer, type ServedEntries, type ServeRoots } from '../agent/file-server';
import { createLogger, type Logger } from '../log';
import { isKvRankDirName } from '../paths';

const SILENT = createLogger('coordinator-files', 'silent');
import { payloadOf } from './payload';
import type { AgentMsg } from './frames';
import type { RouteSender } from './agent-requests';
import { PROTOCOL_VERSION } from './protocol-version';

/** Wire root names answered by the coordinator (an agent refuses them: an older coordinator that forwards them fails loudly). */
export const COORDINATOR_ROOTS = ['reports', 'dump_records'] as const;
export type CoordinatorRoot = (typeof COORDINATOR_ROOTS)[number];

/** Where the coordinator's files are, read on every request (a hot-reloaded dump_dir moves the dump root). */
export interface CoordinatorFileRoots {
  /** The guard's report_dir: <incident_type>/report_*.json. */
  reports?: string;
  /** The guard's dump root: <incident_type>/<req_id>/wave_<N>/{request_info,manifest,dump_skipped}.json. */
  dumps?: string;
}

/** The JSON files the coordinator writes in a dump wave dir (src/guard/dump-ledger.ts). */
export const DUMP_RECORD_FILES = new Set(['request_info.json', 'manifest.json', 'dump_skipped.json']);

/** Reports: one level of incident-type folders holding report_*.json (the kv_cache below report_dir is not a report). */
const reportEntries: ServedEntries = (parts, kind) =>
  kind === 'dir' ? parts.length === 1 : parts.length === 2 && /^report_.*\.json$/.test(parts[1]);

/** Dump records: every folder except the ranks' bundles (the seed's dp<d>_tp<t>_pp<p>_cp<c>, or rank<g> of older dumps), and only the coordinator's JSON files. */
const recordEntries: ServedEntries = (parts, kind) =>
  kind === 'dir' ? !isKvRankDirName(parts[parts.length - 1]) : DUMP_RECORD_FILES.has(parts[parts.length - 1]);

export function isCoordinatorRoot(root: unknown): root is CoordinatorRoot {
  return typeof root === 'string' && (COORDINATOR_ROOTS as readonly string[]).includes(root);
}

export class CoordinatorFiles {
  /** A coordinator without the runtime guard (a library user's): no reports or dump records, an empty listing. */
  static readonly none = new CoordinatorFiles(() => ({}), 0, undefined);
  private readonly server: FileServer;
  private readonly served: () => ServeRoots;

  constructor(
    roots: () => CoordinatorFileRoots,
    private readonly rank: number,
    log: Logger | undefined,
  ) {
    this.served = (): ServeRoots => {
      const r = roots();
      return {
        ...(r.reports ? { reports: { dir: r.reports, include: reportEntries } } : {}),
        ...(r.dumps ? { dump_records: { dir: r.dumps, include: recordEntries } } : {}),
      };
    };
    // The answer goes straight to the tool: nobody tells us when ZeroMQ is done with a buffer.
    this.server = new FileServer(rank, this.served, log ?? SILENT, false, 'the coordinator');
  }

  /** Whether a relay request names one of the coordinator's roots (then answer() handles it). */
  static wants(msg: AgentMsg): boolean {
    const relay = (msg.relay ?? {}) as Record<string, any>;
    const kind = relay.request as string | undefined;
    return (kind === 'fileList' || kind === 'fileChunk') && isCoordinatorRoot(relay[kind]?.root);
  }

  /** Answer a relay request for one of the coordinator's roots, in the shape an agent's relayed answer has. */
  async answer(routingId: Buffer, msg: AgentMsg, epoch: number, send: RouteSender): Promise<void> {
    const relay = (msg.relay ?? {}) as Record<string, any>;
    const kind = relay.request as 'fileList' | 'fileChunk';
    const rank = Number(relay.rank ?? 0);
    const root = String(relay[kind]?.root);
    // A root this coordinator does not have (no guard): nothing there to list; a chunk of it is an error.
    const reply =
      kind === 'fileList' && !(this.served()[root])
        ? { fileList: { globalRank: this.rank, files: [] } }
        : await this.server.handle({ body: kind, [kind]: relay[kind], epoch, requestId: msg.requestId } as never);
    send(routingId, { requestId: msg.requestId, relay: { rank, protocolVersion: PROTOCOL_VERSION, [kind]: reply[kind] } }, payloadOf(reply));
  }
}
