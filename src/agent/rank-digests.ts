// rank_divergence on the agent (docs/runtime-guard.md): while the detector is on, the agent polls
// its decision ring (one pread of the slot headers per poll) and sends the digests of the waves its
// engine decided since the last poll to the coordinator, one message per poll at most; it answers
// the coordinator's ask for one wave's token column (only after a mismatch). Nothing here waits on
// the engine, and the engine sends nothing: it only writes its ring.
import { decisionPath } from '../paths';
import type { Logger } from '../log';
import type { RankIdentity } from '../layout';
import { DECISION, DecisionRing, type Decision } from './decision-ring';

/** How often the ring is read while the detector is on: well under a forward of a real engine. */
export const DIGEST_POLL_MS = 2;

export interface DigestSink {
  sendDecisions(decisions: Decision[]): void;
}

export class RankDigests {
  private ring?: DecisionRing;
  private timer?: NodeJS.Timeout;
  /** The newest wave sent; an engine that numbers its waves again from below is followed. */
  private lastSent = -1;
  /** Digests sent in all (the agent's stats). */
  sent = 0;

  constructor(
    private readonly runDir: string,
    private readonly identity: RankIdentity,
    private readonly log: Logger,
    private readonly sink: () => DigestSink | undefined,
  ) {}

  /** Create the ring (at agent start; its path goes in the hello). */
  open(): string {
    this.ring = DecisionRing.create(decisionPath(this.runDir, this.identity.localRank));
    return this.ring.path;
  }

  get path(): string {
    return this.ring?.path ?? '';
  }

  /** The detector is on (poll) or off (stop polling) in the config in force. */
  setOn(on: boolean): void {
    if (on && !this.timer && this.ring) {
      this.timer = setInterval(() => this.poll(), DIGEST_POLL_MS);
      this.timer.unref();
    } else if (!on && this.timer) {
      clearInterval(this.timer);
      this.timer = undefined;
    }
  }

  /** Send what the engine decided since the last poll (exported for tests). */
  poll(): void {
    const sink = this.sink();
    if (!this.ring || !sink) return;
    let fresh: Decision[];
    try {
      fresh = this.ring.decided();
    } catch (e) {
      this.log.warn({ err: (e as Error).message }, 'cannot read the decision ring');
      return;
    }
    const newest = fresh.reduce((m, d) => Math.max(m, d.wave), -1);
    // The engine started its waves again (a restart): take them from there.
    if (newest >= 0 && newest + DECISION.slots < this.lastSent) this.lastSent = -1;
    const out = fresh.filter((d) => d.wave > this.lastSent).sort((a, b) => a.wave - b.wave);
    if (out.length === 0) return;
    this.lastSent = out[out.length - 1].wave;
    this.sent += out.length;
    sink.sendDecisions(out);
  }

  /** The coordinator's ask: the token column of `wave`, or (inputs) the per-row digests of its inputs. */
  column(wave: number, inputs = false): Record<string, unknown> {
    if (!this.ring) return { decidedColumn: { wave, found: false, error: 'no decision ring on this agent' } };
    const r = inputs ? this.ring.inputRowDigests(wave) : this.ring.column(wave);
    if ('error' in r) return { decidedColumn: { wave, found: false, error: r.error } };
    return { decidedColumn: { wave, found: true, column: r.column } };
  }

  close(): void {
    this.setOn(false);
    this.ring?.close();
    this.ring = undefined;
  }
}
