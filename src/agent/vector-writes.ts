// Where an agent writes the wave vectors it learns: every local mailbox of its replica (its own
// included) while it holds its host's receiver role (host-receiver.ts), else none. A lanes-only
// agent writes no vector; it asks for the role once per heartbeat and, once it has it, follows the
// whole stream from a fresh snapshot.
import type { AgentBus } from '../bus/agent-bus';
import type { RankIdentity } from '../layout';
import type { Logger } from '../log';
import { MailboxReader, MailboxWriter } from '../client/mailbox';
import { mailboxPath } from '../paths';
import { HostFanout } from './host-receiver';

type Vector = { wave: number; configDue: boolean; dumpDue: boolean; snapshotDue: boolean };

export class VectorWrites {
  /** This rank's own mailbox (its engine reads it; the features are this agent's even lanes-only). */
  readonly mailbox: MailboxWriter;
  /** On the bus: the receiver role and its writes into the local peers' mailboxes. */
  private fanout?: HostFanout;
  private receiverTimer?: NodeJS.Timeout;
  /** Lanes-only: this rank's mailbox as its engine reads it (the host receiver writes its vectors). */
  private own?: MailboxReader;

  constructor(
    private readonly runDir: string,
    private readonly identity: RankIdentity,
    private readonly log: Logger,
  ) {
    this.mailbox = MailboxWriter.create(mailboxPath(runDir, identity.localRank), identity.globalRank);
  }

  /** On the bus: ask for the receiver role now (else this agent is lanes-only). */
  hostPath(): void {
    const { globalRank: rank, dpRank: replica } = this.identity;
    this.fanout = new HostFanout(this.runDir, this.identity, this.log);
    if (this.fanout.tryTake()) this.log.info({ rank, replica }, 'host receiver: this agent follows the wave stream and writes every local mailbox of its replica');
    else this.log.info({ rank, replica }, 'lanes-only: another local agent is the host receiver; this one wakes for waves with work');
  }

  /**
   * Lanes-only: whether the host receiver has written `wave`'s vector into this rank's mailbox, in
   * coordinator epoch `epoch`, with nothing due (implied below the mailbox's floor too). The engine
   * reads the same slot, so an answer from here agrees with what it saw. A wave with work is not
   * decided here: its head and lanes come on this agent's own subscription.
   */
  decidedNothingDue(wave: number, epoch: number): boolean {
    if (!this.lanesOnly || epoch === 0) return false;
    try {
      this.own ??= MailboxReader.open(this.mailbox.path);
      if (this.own.epoch() !== epoch) return false;
      const v = this.own.read(wave);
      return v !== undefined && !v.configDue && !v.dumpDue && !v.snapshotDue;
    } catch {
      return false; // closed (the agent stops): only what arrives here counts
    }
  }

  /** Lanes-only: another local agent writes this rank's vectors. */
  get lanesOnly(): boolean {
    return this.fanout !== undefined && !this.fanout.isReceiver;
  }

  /** Whether this agent writes vectors: its host's receiver (or off the bus, where no vector comes). */
  get writesVectors(): boolean {
    return !this.fanout || this.fanout.isReceiver;
  }

  /**
   * Lanes-only: ask for the receiver role once per heartbeat. The receiver's
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
    this.own?.close();
    this.mailbox.setFeatures(0);
    this.mailbox.close();
    this.fanout?.close();
  }
}
