// Whether an agent's coordinator is alive, and which of its incarnations (epochs) the agent left:
// a fresh frame on the stream is a sign of life, silence past the liveness window loses it. Apart
// from agent-bus.ts, whose sync state machine acts on what this says.
import { FrameFreshness } from './frame-freshness';

const MAX_LEFT_EPOCHS = 16;

export class CoordinatorLiveness {
  private lastFrameAt = 0;
  /** Only a frame newer than any seen of its epoch counts as the coordinator's sign of life. */
  private readonly freshness = new FrameFreshness();
  private alive = false;
  private wasLost = false;
  /** Epochs this agent moved away from; their late frames are dropped, not resynced on. */
  private readonly leftEpochs: number[] = [];

  /** `onAlive`: the first sign of life since start or since the coordinator was lost. */
  constructor(private readonly deadAfterMs: number, private readonly onAlive: () => void) {}

  /** No frame from the coordinator within the liveness window since it was last heard (until heard again). */
  get lost(): boolean {
    return this.wasLost;
  }

  /**
   * A frame of `epoch` / `seq` came at `now`: 'stale' when one as new was seen before (a replay is
   * no sign of life); 'back' when the coordinator had been lost (the agent resyncs); else 'heard'.
   */
  frame(epoch: number, seq: number, now: number): 'stale' | 'heard' | 'back' {
    if (!this.freshness.fresh(epoch, seq)) return 'stale';
    this.lastFrameAt = now;
    if (this.alive) return 'heard';
    this.alive = true;
    this.onAlive();
    if (!this.wasLost) return 'heard';
    this.wasLost = false;
    return 'back';
  }

  /** At a heartbeat tick: how long it was silent when the coordinator is lost just now, else undefined. */
  silence(now: number): number | undefined {
    if (!this.alive || now - this.lastFrameAt <= this.deadAfterMs) return undefined;
    this.alive = false;
    this.wasLost = true;
    return now - this.lastFrameAt;
  }

  /** The agent moves from `epoch` to another incarnation (0: none yet). */
  leave(epoch: number): void {
    if (epoch === 0) return;
    this.leftEpochs.push(epoch);
    if (this.leftEpochs.length > MAX_LEFT_EPOCHS) this.leftEpochs.shift();
  }

  hasLeft(epoch: number): boolean {
    return this.leftEpochs.includes(epoch);
  }
}
