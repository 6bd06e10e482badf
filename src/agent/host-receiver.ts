// One receiver per host (docs/bus.md, "One receiver per host"): one agent
// of each replica on a host follows the replica's whole wave stream and writes every vector once
// into the mailboxes of all the replica's ranks on the host; the other agents follow only the waves
// with work (their config and dump lanes) and never wake on a plain wave. The role is an exclusive
// flock on a file in the run dir: whoever holds it is the receiver, the kernel drops it when its
// holder dies however it dies, and the next agent that asks takes it over, so two processes never
// write one mailbox's slots.
import * as fs from 'fs';
import * as path from 'path';
import type { RankIdentity } from '../layout';
import { replicaOf } from '../layout';
import type { Logger } from '../log';
import { MailboxWriter } from '../client/mailbox';
import { mailboxPath } from '../paths';

/** The lock file of `replica`'s receiver role in a run dir. */
export function receiverLockPath(runDir: string, replica: number): string {
  return path.join(runDir, `wave-receiver.r${replica}.lock`);
}

/**
 * The receiver's writes into its peers' mailboxes. Each local mailbox names the global rank of the
 * agent that created it (its header's owner), so the receiver writes exactly those of its own
 * replica, whatever the placement of ranks on hosts (block, cyclic or any other). A peer's mailbox
 * is attached once its agent has created it (retried on every write until then: a peer that
 * starts later is picked up); a peer whose agent restarts re-creates its file in place, so the
 * mapping stays valid.
 */
export class HostFanout {
  private readonly writers = new Map<number, MailboxWriter>();
  /** The lock's fd while this agent is the receiver, else -1. */
  private lockFd = -1;
  private lastEpoch = 0;
  /** Peer mailboxes not attached yet, by local rank (logged once each). */
  private readonly missing = new Set<number>();
  /** Local ranks whose mailbox belongs to another replica: its own receiver writes them. */
  private readonly foreign = new Set<number>();
  private readonly peers: number[];

  constructor(
    private readonly runDir: string,
    private readonly identity: RankIdentity,
    private readonly log: Logger,
  ) {
    this.peers = [];
    for (let l = 0; l < identity.localWorldSize; l++) if (l !== identity.localRank) this.peers.push(l);
  }

  /** Whether this agent is the receiver now (it holds the lock). */
  get isReceiver(): boolean {
    return this.lockFd >= 0;
  }

  /** Peers whose mailbox is written now. */
  get attached(): number {
    return this.writers.size;
  }

  /** Try to take the receiver role (held until close(), or this process ends). */
  tryTake(): boolean {
    if (this.lockFd < 0) this.lockFd = MailboxWriter.holdLock(receiverLockPath(this.runDir, this.identity.dpRank));
    return this.lockFd >= 0;
  }

  private each(fn: (w: MailboxWriter) => void): void {
    if (this.lockFd < 0) return;
    for (const l of this.peers) {
      const w = this.writers.get(l) ?? this.attach(l);
      if (w) fn(w);
    }
  }

  /** Local rank l's mailbox when it is there and of this replica; undefined (retried later) or foreign. */
  private attach(l: number): MailboxWriter | undefined {
    if (this.foreign.has(l)) return undefined;
    let w: MailboxWriter;
    try {
      w = MailboxWriter.attach(mailboxPath(this.runDir, l));
    } catch (e) {
      return this.notYet(l, (e as Error).message);
    }
    const owner = w.ownerRank;
    if (owner === undefined || owner >= this.identity.worldSize) {
      w.close();
      return this.notYet(l, owner === undefined ? 'its header names no owner rank' : `its owner rank ${owner} is outside the world of ${this.identity.worldSize}`);
    }
    if (replicaOf(owner, this.identity) !== this.identity.dpRank) {
      w.close();
      this.foreign.add(l);
      this.log.info({ localRank: l, rank: owner, replica: replicaOf(owner, this.identity) }, 'host receiver: this local mailbox is another replica\'s; its own receiver writes it');
      return undefined;
    }
    this.missing.delete(l);
    this.writers.set(l, w);
    if (this.lastEpoch > 0) w.setEpoch(this.lastEpoch);
    return w;
  }

  private notYet(l: number, why: string): undefined {
    if (!this.missing.has(l)) this.log.info({ localRank: l, err: why }, 'host receiver: a peer mailbox is not there yet; retried on every wave');
    this.missing.add(l);
    return undefined;
  }

  /**
   * Every peer's slot first, then the wakes: a peer's vector is readable without waiting for the
   * system calls of the wakes before it (the engines seldom sleep: the vector comes a wave ahead).
   */
  publish(v: { wave: number; configDue: boolean; dumpDue: boolean; snapshotDue: boolean }, floor?: number): void {
    this.each((w) => w.publish(v, floor, false));
    for (const w of this.writers.values()) w.announce();
  }

  setFloor(floor: number): void {
    this.each((w) => w.setFloor(floor));
  }

  setEpoch(epoch: number): void {
    this.lastEpoch = epoch;
    this.each((w) => w.setEpoch(epoch));
  }

  /** Stop writing and give the role up (another local agent takes it at its next try). */
  close(): void {
    for (const w of this.writers.values()) w.close();
    this.writers.clear();
    if (this.lockFd >= 0) fs.closeSync(this.lockFd);
    this.lockFd = -1;
  }
}
