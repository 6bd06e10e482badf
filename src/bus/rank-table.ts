// The coordinator's table of ranks: which connection said Hello as which rank (the route relayed
// requests take), who is live and subscribed, and each rank's last reported position. What a
// message claims never moves a route: only a Hello registers a connection for a rank.
import type { DropCounter } from './frames';

export interface RankState {
  rank: number;
  /**
   * The route to the rank (relayed requests go there): the latest of the ROUTER connections it
   * said Hello on to send a message. Messages for this rank from a connection that never said
   * Hello as it are dropped ('wrong_connection'), whatever rank they claim. Undefined until a Hello.
   */
  routingId: Buffer | undefined;
  /** Connections (routing ids, hex) that said Hello as this rank; the last few. */
  helloFrom: string[];
  lastSeen: number;
  live: boolean;
  /** Hello seen in this epoch; a SnapshotRequest after it counts the rank as subscribed. */
  hello: boolean;
  subscribed: boolean;
  wave: number;
  lastSeq: number;
  epochSeen: number;
  pid: number;
  host: string;
  /** Engine clients connected to the rank's agent, as its last heartbeat said (0: none yet, or gone). */
  engineClients: number;
}

export interface RankEvents {
  joined(rank: number): void;
  lost(rank: number, silentMs: number): void;
}

export class RankTable {
  private readonly ranks = new Map<number, RankState>();

  constructor(
    private readonly expected: number[],
    private readonly deadAfterMs: number,
    private readonly drops: DropCounter,
    private readonly events: RankEvents,
  ) {}

  get(rank: number): RankState | undefined {
    return this.ranks.get(rank);
  }

  liveRanks(): number[] {
    return [...this.ranks.values()].filter((s) => s.live).map((s) => s.rank).sort((a, b) => a - b);
  }

  /** Every expected rank is live and subscribed. */
  get ready(): boolean {
    return this.expected.every((r) => {
      const s = this.ranks.get(r);
      return s !== undefined && s.live && s.subscribed;
    });
  }

  /** Mark ranks silent for longer than deadAfterMs as lost. */
  expire(now = Date.now()): void {
    for (const s of this.ranks.values()) {
      if (s.live && now - s.lastSeen > this.deadAfterMs) {
        s.live = false;
        this.events.lost(s.rank, now - s.lastSeen);
      }
    }
  }

  /** A Hello from `rank` on `routingId`: its connection from now on; subscribed again only by the snapshot request after it. */
  hello(rank: number, routingId: Buffer, identity: { pid?: number; host?: string }): void {
    const s = this.touch(rank, routingId, true)!;
    s.hello = true;
    s.subscribed = false;
    s.pid = identity.pid ?? 0;
    s.host = identity.host ?? '';
  }

  /**
   * Note a message from `rank` on connection `routingId`. `hello`: it registers that connection
   * for the rank. A message from a connection that never said Hello as the rank is dropped and
   * counted (undefined returned): what a message claims never moves a route.
   */
  touch(rank: number, routingId: Buffer, hello = false): RankState | undefined {
    let s = this.ranks.get(rank);
    const conn = routingId.toString('hex');
    if (!hello && s?.routingId && !s.helloFrom.includes(conn)) {
      this.drops.drop('wrong_connection', `a message claiming rank ${rank} from a connection other than the one it said Hello on`);
      return undefined;
    }
    const now = Date.now();
    if (!s) {
      s = { rank, routingId: undefined, helloFrom: [], lastSeen: now, live: false, hello: false, subscribed: false, wave: 0, lastSeq: 0, epochSeen: 0, pid: 0, host: '', engineClients: 0 };
      this.ranks.set(rank, s);
    }
    if (hello && !s.helloFrom.includes(conn)) {
      s.helloFrom.push(conn);
      if (s.helloFrom.length > 8) s.helloFrom.shift();
    }
    if (s.helloFrom.includes(conn)) s.routingId = routingId;
    s.lastSeen = now;
    if (!s.live) {
      s.live = true;
      this.events.joined(rank);
    }
    return s;
  }

  /** The per-rank part of the status JSON. */
  statusJson(): Record<string, unknown> {
    const ranks: Record<string, unknown> = {};
    for (const s of [...this.ranks.values()].sort((a, b) => a.rank - b.rank)) {
      ranks[String(s.rank)] = { live: s.live, subscribed: s.subscribed, wave: s.wave, last_seq: s.lastSeq, epoch_seen: s.epochSeen, pid: s.pid, host: s.host, engine_clients: s.engineClients };
    }
    return ranks;
  }
}
