// Where an agent writes the wave vectors it learns: its own mailbox (per-rank), or, with
// `--wave-path host`, every local mailbox of its replica while it holds the receiver role
// (host-receiver.ts). A lanes-only agent writes no vector; it asks for the role once per heartbeat
// and, once it has it, follows the whole stream from a fresh snapshot.
import type { AgentBus } from '../bus/agent-bus';
import type { RankIdentity } from '../layout';
import type { Logger } from '../log';
import { MailboxWriter } from '../client/mailbox';
import { mailboxPath } from '../paths';
import { HostFanout } from './host-receiver';

type Vector = { wave: number; configDue: boolean; dumpDue: boolean; snapshotDue: boolean };

export class VectorWrites {
  /** This rank's own mailbox (its engine reads it; the features are this agent's even lanes-only). */
  readonly mailbox: MailboxWriter;
  /** --wave-path host: the receiver role and its writes into the local peers' mailboxes. */
  private fanout?: HostFanout;
  private receiverTimer?: NodeJS.Timeout;

  constructor(
    private readonly runDir: string,
    private readonly identity: RankIdentity,
    private readonly log: Logger,
  ) {
    this.mailbox = MailboxWriter.create(mailboxPath(runDir, identity.localRank));
  }

  /** --wave-path host: ask for the receiver role now (else this agent is lanes-only). */
  hostPath(): void {
    const { globalRank: rank, dpRank: replica } = this.identity;
    this.fanout = new HostFanout(this.runDir, this.identity, this.log);
    if (this.fanout.tryTake()) this.log.info({ rank, replica }, 'host receiver: this agent follows the wave stream and writes every local mailbox of its replica');
    else this.log.info({ rank, replica }, 'lanes-only: another local agent is the host receiver; this one wakes for waves with work');
  }

  /** Lanes-only: another local agent writes this rank's vectors. */
  get lanesOnly(): boolean {
    return this.fanout !== undefined && !this.fanout.isReceiver;
  }

  /** Whether this agent is its host's receiver (--wave-path host), or writes its own mailbox (per-rank). */
  get writesVectors(): boolean {
    return !this.fanout || this.fanout.isReceiver;
  }

  /**
   * Lanes-only (--wave-path host): ask for the receiver role once per heartbeat. The receiver's
   * death drops its lock; whoever takes it follows the whole stream from a fresh snapshot, whose
   * floor ends the waves its engine and the peers' engines waited on (each wait bounded).
   */
  watchReceiver(bus: AgentBus): void {
    if (!this.lanesOnly) return;
    this.receiverTimer = setInterval(() => {
      if (!this.fanout?.tryTake()) return;
      this.stopWatch();
      this.log.warn({ rank: this.identity.globalRank, replica: this.identity.dpRank }, 'host receiver gone: this agent takes over and writes every local mailbox of its replica');
      bus.setLanesOnly(false);
    }, bus.heartbeatMs);
  }

  stopWatch(): void {
    if (this.receiverTimer) clearInterval(this.receiverTimer);
    this.receiverTimer = undefined;
  }

  /** Wave `v.wave`'s vector (and the floor after it, when given); nothing while lanes-only. */
  publish(v: Vector, floor?: number): void {
    if (!this.writesVectors) return;
    // The host receiver stores every slot before any wake (HostFanout.publish).
    this.mailbox.publish(v, floor, !this.fanout);
    this.fanout?.publish(v, floor);
    if (this.fanout) this.mailbox.announce();
  }

  setFloor(floor: number): void {
    if (!this.writesVectors) return;
    this.mailbox.setFloor(floor);
    this.fanout?.setFloor(floor);
  }

  setEpoch(epoch: number): void {
    this.mailbox.setEpoch(epoch);
    this.fanout?.setEpoch(epoch);
  }

  /**
   * The file stays (the launcher owns the run dir): an engine that keeps running keeps a valid
   * mapping, sees everything off, and a successor agent takes the same file over.
   */
  close(): void {
    this.stopWatch();
    this.mailbox.setFeatures(0);
    this.mailbox.close();
    this.fanout?.close();
  }
}
