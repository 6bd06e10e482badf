// The coordinator's ROUTER dispatch: each message from an agent or a tool, once opened and admitted
// (router-inbox.ts: frames, MAC, a rank of the layout, the protocol version), handed to the part of
// the coordinator that owns it (the rank table, the ledger, the streams, control, the relay).
// Apart from coordinator.ts so the coordinator's own file is its sockets, streams and lifecycle.
import { rankCoordinates, replicaHead } from '../layout';
import type { DumpResult } from '../messages';
import { ColumnScratch } from '../client/telemetry';
import type { AgentMsg, DropCounter } from './frames';
import { admitRouterMessage, openRouterMessage, type Admission } from './router-inbox';
import { VersionGate } from './protocol-version';
import { snapshotReply } from './coordinator-replies';
import { CoordinatorFiles } from './coordinator-files';
import type { AgentRequests } from './agent-requests';
import type { Coordinator } from './coordinator';

/** What the dispatch needs of the coordinator that is not public. */
export interface DispatchParts {
  drops: DropCounter;
  agentRequests: AgentRequests;
  ownFiles?: CoordinatorFiles;
  /** `payload`: a frame forwarded as it arrived after the message (payload.ts). */
  reply(routingId: Buffer, msg: Record<string, unknown>, payload?: Buffer): void;
  /** One rank's dump ack, counted in the ledger once (coordinator-dumps.ts). */
  onDumpResult(result: DumpResult): void;
  /** Publish a heartbeat soon (coalesced): a new subscriber waits for its first frame. */
  heartbeatSoon(): void;
  /** Emit `ready` once every expected rank is subscribed and live. */
  checkReady(): void;
}

export class RouterDispatch {
  private readonly versions = new VersionGate();
  private readonly admission: Admission;
  /** Telemetry columns of the wave head being handled (consumed before the next message is decoded). */
  private readonly columnScratch = new ColumnScratch();

  constructor(private readonly c: Coordinator, private readonly p: DispatchParts) {
    this.admission = { drops: p.drops, versions: this.versions, worldSize: c.layout.worldSize, reply: (route, m) => p.reply(route, m) };
  }

  onMessage(parts: Buffer[]): void {
    const { c, p } = this;
    c.stats.received++;
    const opened = openRouterMessage(parts, c.maxFrameBytes, c.opts.busToken, this.columnScratch, p.drops);
    if (!opened) return;
    const rank = admitRouterMessage(opened, this.admission);
    if (rank === undefined) return;
    const { routingId, msg, data } = opened;
    if (msg.epochSeen && msg.epochSeen !== c.epoch) c.stats.wrongEpochSeen++;
    switch (msg.body) {
      case 'hello': {
        const id = msg.hello.identity ?? {};
        const r = id.globalRank ?? rank;
        c.rankTable.hello(r, routingId, id);
        c.control.hello(r, msg.hello.protocolVersion);
        c.policy?.onAgentHello?.(r, { recorderForwards: Number(msg.hello.recorderForwards ?? 0) });
        // Readiness handshake: the agent waits for any frame on its SUB before asking for a snapshot.
        p.heartbeatSoon();
        return;
      }
      case 'snapshot': {
        const r = msg.snapshot.globalRank ?? rank;
        const s = c.rankTable.touch(r, routingId);
        if (!s) return;
        if (s.hello) s.subscribed = true;
        // The replica comes from the rank's place in the layout, never from what the agent claims.
        p.reply(routingId, { requestId: msg.requestId, snapshot: snapshotReply(c, rankCoordinates(r, c.layout).dpRank) });
        p.checkReady();
        return;
      }
      case 'fingerprint': // only from the connection the rank said Hello on; the book cuts it to local limits
        if (c.rankTable.touch(rank, routingId)) c.fingerprints.set(rank, msg.fingerprint);
        return;
      case 'heartbeat': {
        const s = c.rankTable.touch(rank, routingId);
        if (!s) return;
        s.wave = msg.heartbeat.wave;
        s.lastSeq = msg.heartbeat.lastSeq;
        s.epochSeen = msg.heartbeat.epochSeen;
        s.engineClients = Number(msg.heartbeat.engineClients ?? 0) >>> 0;
        c.vectors.note(rank, msg.heartbeat);
        p.checkReady();
        return;
      }
      case 'dumpResult':
        if (!c.rankTable.touch(rank, routingId)) return;
        p.onDumpResult({ ...msg.dumpResult, globalRank: msg.dumpResult.globalRank || rank });
        return;
      case 'waveHead': {
        if (!c.rankTable.touch(rank, routingId)) return;
        const replica = rankCoordinates(rank, c.layout).dpRank;
        if (rank !== replicaHead(c.layout, replica)) return p.drops.drop('not_head', `a wave head from rank ${rank}; replica ${replica} is headed by rank ${replicaHead(c.layout, replica)}`);
        c.beginWave(msg.waveHead.wave, msg.waveHead.telemetry ?? null, replica);
        return;
      }
      case 'decided':
        if (!c.rankTable.touch(rank, routingId)) return;
        c.policy?.onRankDecisions?.(rank, (msg.decided.decisions ?? []).map((d: Record<string, unknown>) => ({ ...d, wave: Number(d.wave ?? 0) })), (r, wave, inputs) => this.askColumn(r, wave, inputs));
        return;
      case 'engineCrash':
        if (c.rankTable.touch(rank, routingId)) c.crashes.record(rank, msg.engineCrash);
        return;
      case 'status':
      case 'challenge':
      case 'control':
      case 'captureResult':
        return c.control.onMessage(routingId, rank, msg);
      case 'relay':
        c.emit('relay');
        if (CoordinatorFiles.wants(msg)) this.answerOwnFiles(routingId, msg);
        else p.agentRequests.relay(routingId, msg);
        return;
      case 'fileList':
      case 'fileChunk':
      case 'fileServe':
      case 'replay':
      case 'decidedColumn': {
        p.agentRequests.onAnswer(msg, rank, routingId, data);
        return;
      }
      default:
        p.drops.drop('undecodable', `unexpected body ${msg.body}`);
    }
  }

  /**
   * rank_divergence: one rank's token column of `wave` (inputs: its per-row digests of the forward's
   * inputs), asked of its agent after a mismatch.
   */
  private async askColumn(rank: number, wave: number, inputs = false): Promise<{ column: Buffer | null; error?: string }> {
    const m = await this.p.agentRequests.request(rank, { decidedColumn: { wave, inputs } }, 2000);
    const col = (m.body === 'decidedColumn' ? m.decidedColumn : {}) as { found?: boolean; column?: Uint8Array; error?: string };
    if (!col.found || !col.column) return { column: null, error: col.error || `rank ${rank} answered ${m.body}` };
    return { column: Buffer.from(col.column.buffer, col.column.byteOffset, col.column.byteLength) };
  }

  /** A tool asks for the coordinator's own reports and dump records (coordinator-files.ts). */
  private answerOwnFiles(routingId: Buffer, msg: AgentMsg): void {
    const { c, p } = this;
    const send = (route: Buffer, m: Record<string, unknown>, payload?: Buffer) => p.reply(route, m, payload);
    (p.ownFiles ?? CoordinatorFiles.none).answer(routingId, msg, c.epoch, send).catch((e) => c.log.warn({ err: String(e) }, "answering a request for the coordinator's own files failed"));
  }
}
