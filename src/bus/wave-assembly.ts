// An agent's assembly of its replica's waves from in-order frames: a head, then the lanes it says
// are due (same wave); the wave is delivered once whole. A lane without its head is dropped.
import type { Logger } from '../log';
import type { WaveHead } from '../messages';
import type { WaveEvent } from './agent-bus-types';
import type { DecodedFrame, DropCounter } from './frames';

export class WaveAssembly {
  private pending?: WaveEvent;
  latestHead?: WaveHead;
  /** The last wave delivered (or covered by a snapshot). */
  lastWave = 0;

  constructor(
    private readonly drops: DropCounter,
    private readonly log: Logger,
    private readonly deliver: (w: WaveEvent) => void,
  ) {}

  /** Forget a wave in progress (resync, lost coordinator). */
  reset(): void {
    this.pending = undefined;
  }

  /** A snapshot covering `wave` was applied. */
  snapshot(wave: number): void {
    this.lastWave = Math.max(this.lastWave, wave);
    this.pending = undefined;
  }

  /** Apply one frame, in seq order of the stream. */
  apply(f: DecodedFrame): void {
    if (f.kind === 'heartbeat') return;
    if (f.kind === 'head') {
      if (this.pending) {
        this.log.warn({ wave: this.pending.head.wave }, 'wave head arrived before the previous wave was complete; previous wave dropped');
      }
      this.pending = { head: { ...f.head!, epoch: f.epoch, seq: f.seq } };
    } else {
      const w = this.pending;
      const lane = f.kind === 'config' ? f.config! : f.dump!;
      const due = f.kind === 'config' ? w?.head.configDue : w?.head.dumpDue;
      if (!w || !due || lane.wave !== w.head.wave || w[f.kind] !== undefined) {
        this.drops.drop('stale', `orphan ${f.kind} lane of wave ${lane.wave}`);
        return;
      }
      if (f.kind === 'config') w.config = f.config;
      else w.dump = f.dump;
    }
    const w = this.pending!;
    if ((!w.head.configDue || w.config) && (!w.head.dumpDue || w.dump)) {
      this.pending = undefined;
      this.latestHead = w.head;
      this.lastWave = w.head.wave;
      this.deliver(w);
    }
  }
}
