// The two rings an agent shares with its engine client beside the mailbox: the telemetry ring of
// the tensor hot path (wave heads as columns, ring-heads.ts) and rank_divergence's decision ring
// (each wave's digests, rank-digests.ts). Here: when each is made (the decision ring at start, a
// telemetry ring at a hello of the head rank's client that asks for one), how heads from the ring
// and from the client's socket reach the coordinator, what a hello's answer names, the close.
// When the digests are polled is the agent's decision (its config view): setDigestsOn.
import type { AgentBus } from '../bus/agent-bus';
import type { RankIdentity } from '../layout';
import type { Logger } from '../log';
import { telemetryRingPath } from '../paths';
import { RankDigests } from './rank-digests';
import { newRingStats, RingHeads, type RingStats } from './ring-heads';
import { checkRingAsk } from './telemetry-ring';

export interface EngineRingsHost {
  runDir: string;
  identity: RankIdentity;
  log: Logger;
  /** The bus (the digests go on it). */
  bus: () => AgentBus | undefined;
  /** The bus while this agent relays its engine's heads (it heads its replica's stream), else undefined. */
  relayBus: () => AgentBus | undefined;
  /** The agent's count of heads relayed as the client's bytes. */
  counts: { waveHeadsRelayed: number };
}

export class EngineRings {
  /** Heads relayed from the telemetry ring and the garbage dropped there (ring-heads.ts). */
  readonly stats: RingStats = newRingStats();
  private readonly heads: RingHeads;
  /** rank_divergence: the decision ring and its poll (made at start). */
  private digests?: RankDigests;

  constructor(private readonly host: EngineRingsHost) {
    this.heads = new RingHeads(telemetryRingPath(host.runDir, host.identity.localRank), this.stats, host.log, (head) => {
      const bus = host.relayBus();
      if (bus) {
        bus.relayWaveHead(head);
        host.counts.waveHeadsRelayed++;
      }
    });
  }

  /** Creates the decision ring (at agent start: its path goes in every hello's answer). */
  openDigests(): void {
    this.digests = new RankDigests(this.host.runDir, this.host.identity, this.host.log, this.host.bus);
    this.digests.open();
  }

  /** rank_divergence is on for this rank (poll the decision ring) or off. */
  setDigestsOn(on: boolean): void {
    this.digests?.setOn(on);
  }

  /** The coordinator's ask for one wave's token column, or its inputs' per-row digests (after a mismatch). */
  decidedColumn(wave: number, inputs = false): Record<string, unknown> {
    return this.digests!.column(wave, inputs);
  }

  /** A wave head from the client's socket, as its bytes: the ring slot it names put in, then relayed. */
  clientHead(raw: Uint8Array): void {
    const bus = this.host.relayBus();
    if (!bus) return;
    bus.relayWaveHead(this.heads.active ? this.heads.fill(raw) : raw);
    this.host.counts.waveHeadsRelayed++;
  }

  /**
   * The rings a hello's answer names: the decision ring (when made), and on the head rank a fresh
   * telemetry ring of the sizes the hello asks for (none asked: none).
   */
  helloPaths(hello: Parameters<typeof checkRingAsk>[0], isHead: boolean): { decisionPath: string; ringPath: string } {
    return {
      decisionPath: this.digests?.path ?? '',
      ringPath: isHead && hello.ringRows ? this.heads.open(checkRingAsk(hello)) : '',
    };
  }

  close(): void {
    this.digests?.close();
    this.heads.close();
  }
}
