// One receiver per host (docs/bus.md, "One receiver per host"): with `--wave-path host`, one agent
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
import { ConfigError } from '../errors';

/** The wave paths an agent can take: its own SUB and mailbox (per-rank), or one receiver per host. */
export const WAVE_PATHS = ['per-rank', 'host'] as const;
export type WavePath = (typeof WAVE_PATHS)[number];

/** `--wave-path` / $WAVEBUS_WAVE_PATH, checked: the error names where the value came from. */
export function parseWavePath(raw: string | undefined, from: string): WavePath {
  if (raw === undefined || raw === '') return 'per-rank';
  if ((WAVE_PATHS as readonly string[]).includes(raw)) return raw as WavePath;
  throw new ConfigError(`${from} must be one of ${WAVE_PATHS.join(', ')}, got ${JSON.stringify(raw.slice(0, 40))}`);
}

/** The lock file of `replica`'s receiver role in a run dir. */
export function receiverLockPath(runDir: string, replica: number): string {
  return path.join(runDir, `wave-receiver.r${replica}.lock`);
}

/**
 * The local ranks on this host that follow the same replica as `id`, itself excluded. A host's
 * ranks are consecutive global ranks (wavebus launch, torchrun and Slurm's block placement), so
 * local rank l is global rank globalRank - localRank + l.
 */
export function replicaPeers(id: RankIdentity): number[] {
  const base = id.globalRank - id.localRank;
  const peers: number[] = [];
  for (let l = 0; l < id.localWorldSize; l++) {
    const g = base + l;
    if (l === id.localRank || g < 0 || g >= id.worldSize) continue;
    if (replicaOf(g, id) === id.dpRank) peers.push(l);
  }
  return peers;
}

/**
 * The receiver's writes into its peers' mailboxes. A peer's mailbox is attached once its agent has
 * created it (retried on every write until then: a peer that starts later is picked up); a peer
 * whose agent restarts re-creates its file in place, so the mapping stays valid.
 */
export class HostFanout {
  private readonly writers = new Map<number, MailboxWriter>();
  /** The lock's fd while this agent is the receiver, else -1. */
  private lockFd = -1;
  private lastEpoch = 0;
  /** Peer mailboxes that could not be attached, by local rank (logged once each). */
  private readonly missing = new Set<number>();
  private readonly peers: number[];

  constructor(
    private readonly runDir: string,
    private readonly identity: RankIdentity,
    private readonly log: Logger,
  ) {
    this.peers = replicaPeers(identity);
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
      let w = this.writers.get(l);
      if (!w) {
        try {
          w = MailboxWriter.attach(mailboxPath(this.runDir, l));
        } catch (e) {
          if (!this.missing.has(l)) this.log.info({ localRank: l, err: (e as Error).message }, 'host receiver: a peer mailbox is not there yet; retried on every wave');
          this.missing.add(l);
          continue;
        }
        this.missing.delete(l);
        this.writers.set(l, w);
        if (this.lastEpoch > 0) w.setEpoch(this.lastEpoch);
      }
      fn(w);
    }
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
