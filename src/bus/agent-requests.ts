// Requests from the coordinator to one rank's agent (file lists and chunks), and the relay that
// forwards a tool's request (`wavebus aggregate`'s files, `wavebus verdict`'s replay) to that rank
// and its answer back. Replies are
// correlated by request id (request-map.ts) and only count from the rank that was asked.
import { WavebusError } from '../errors';
import type { AgentMsg, DropCounter } from './frames';
import { payloadOf, withPayload } from './payload';
import { RequestMap } from './request-map';
import { PROTOCOL_VERSION } from './protocol-version';
import type { RankTable } from './rank-table';

/** Sends a CoordinatorMessage body (with its optional data frame) on one ROUTER route. */
export type RouteSender = (routingId: Buffer, msg: Record<string, unknown>, payload?: Buffer) => void;

/**
 * Relayed requests one rank may have waiting at once. A tool that floods the relay gets each one
 * past this answered at once with a refusal, counted, instead of a queue toward the agent that
 * ZeroMQ would overflow silently (`wavebus aggregate` keeps a window far below it).
 */
export const MAX_RELAYS_IN_FLIGHT = 64;

export class AgentRequests {
  private readonly requests = new RequestMap<AgentMsg, number>(
    (id, rank, timeoutMs) => new WavebusError('ERR_TIMEOUT', `rank ${rank} did not answer request ${id} within ${timeoutMs} ms`),
  );
  /** Per rank: ids of chunk answers received whole since that rank was last asked for a chunk. */
  private readonly chunkAcks = new Map<number, number[]>();
  /** Per rank: relayed requests sent and not answered yet. */
  private readonly relaysInFlight = new Map<number, number>();

  constructor(
    private readonly ranks: RankTable,
    private readonly send: RouteSender,
    private readonly drops: DropCounter,
    private readonly running: () => boolean,
    /** With CURVE: the client keys the coordinator admits, handed to an agent asked to serve files directly. */
    private readonly allowKeys: () => string[] | undefined = () => undefined,
    /** A relay was refused because its rank had MAX_RELAYS_IN_FLIGHT waiting. */
    private readonly onBusy: () => void = () => {},
  ) {}

  /**
   * Send a request (a CoordinatorMessage body such as `{ fileList: {...} }`) to one rank's agent
   * and resolve with its reply, correlated by request id.
   */
  request(rank: number, body: Record<string, unknown>, timeoutMs = 10000): Promise<AgentMsg> {
    const st = this.ranks.get(rank);
    if (!this.running()) return Promise.reject(new WavebusError('ERR_NOT_RUNNING', 'coordinator is not running'));
    if (!st) return Promise.reject(new WavebusError('ERR_UNKNOWN_RANK', `rank ${rank} has not joined the bus`));
    const route = st.routingId;
    if (!route) return Promise.reject(new WavebusError('ERR_UNKNOWN_RANK', `rank ${rank} has not said Hello on this bus (no route to it)`));
    const { id, reply } = this.requests.open(timeoutMs, rank);
    this.send(route, { ...body, requestId: id });
    return reply;
  }

  /**
   * A fileList / fileChunk / fileServe / replay answer from `rank`. Only an answer to a request this coordinator sent
   * that rank counts (and only then does it refresh the rank's route): a stray reply must not
   * take over a rank's routing id.
   */
  onAnswer(msg: AgentMsg, rank: number, routingId: Buffer, data: Buffer | undefined): void {
    if (this.requests.meta(msg.requestId) !== rank) {
      this.drops.drop('unknown_request', `request ${msg.requestId} from rank ${rank}`);
      return;
    }
    if (!this.ranks.touch(rank, routingId)) return;
    if (data) {
      // The agent's buffer behind this frame is free once we have it whole: say so next time.
      const acks = this.chunkAcks.get(rank) ?? [];
      if (acks.length < 4096) acks.push(msg.requestId);
      this.chunkAcks.set(rank, acks);
    }
    this.requests.resolve(msg.requestId, data ? withPayload(msg, data) : msg);
  }

  /**
   * `wavebus aggregate` reaches every agent through the coordinator alone: forward the tool's
   * file request to one rank and answer with the agent's reply, or an error when the rank is not
   * live or does not answer. The tool is not an agent: no rank state. A chunk's data frame is
   * forwarded as it arrived (never decoded, never copied).
   */
  relay(routingId: Buffer, msg: AgentMsg): void {
    const relay = (msg.relay ?? {}) as Record<string, any>;
    const rank = Number(relay.rank ?? 0);
    const kind = relay.request as string | undefined;
    const answer = (body: Record<string, unknown>, data?: Buffer) => this.send(routingId, { requestId: msg.requestId, relay: { rank, protocolVersion: PROTOCOL_VERSION, ...body } }, data);
    if (kind !== 'fileList' && kind !== 'fileChunk' && kind !== 'fileServe' && kind !== 'replay') {
      answer({ error: 'relay request carries none of file_list, file_chunk, file_serve, replay' });
      return;
    }
    const allow = this.allowKeys();
    if (kind === 'fileServe' && !allow) {
      // Without CURVE nothing could authenticate a tool on the agent's own socket: the relay it is.
      answer({ error: 'direct file serving needs CURVE (this coordinator runs without it); use the relay' });
      return;
    }
    const st = this.ranks.get(rank);
    if (!st || !st.live) {
      answer({ error: `rank ${rank} is not live on this bus` });
      return;
    }
    const inFlight = this.relaysInFlight.get(rank) ?? 0;
    if (inFlight >= MAX_RELAYS_IN_FLIGHT) {
      this.onBusy();
      answer({ error: `rank ${rank} already has ${inFlight} relayed requests waiting (at most ${MAX_RELAYS_IN_FLIGHT}); retry after an answer` });
      return;
    }
    const timeoutMs = relay.timeoutMs > 0 ? Math.min(Number(relay.timeoutMs), 600000) : 30000;
    let request = relay[kind] as Record<string, unknown>;
    if (kind === 'fileChunk') {
      // Which chunk buffers the agent may reuse is for the coordinator to say, never the tool.
      request = { ...request, received: this.chunkAcks.get(rank) ?? [] };
      this.chunkAcks.delete(rank);
    } else if (kind === 'fileServe') {
      // Who may fetch from the agent is the coordinator's allow-list, never what the tool says.
      request = { allowKeys: allow };
    }
    this.relaysInFlight.set(rank, inFlight + 1);
    const settled = () => {
      const n = (this.relaysInFlight.get(rank) ?? 1) - 1;
      if (n > 0) this.relaysInFlight.set(rank, n);
      else this.relaysInFlight.delete(rank);
    };
    this.request(rank, { [kind]: request }, timeoutMs).then(
      (m) => {
        settled();
        if (m.body === kind) answer({ [kind]: m[kind] }, payloadOf(m));
        else answer({ error: `rank ${rank} answered ${m.body} to ${kind}` });
      },
      (e) => {
        settled();
        answer({ error: String((e as Error)?.message ?? e) });
      },
    );
  }

  /** The coordinator stops: every waiting request fails. */
  stop(): void {
    this.requests.rejectAll((id, rank) => new WavebusError('ERR_STOPPED', `coordinator stopped before rank ${rank} answered request ${id}`));
    this.chunkAcks.clear();
    this.relaysInFlight.clear();
  }
}
