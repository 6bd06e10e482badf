// Which bus frames are a sign of life: only one newer than every frame this subscriber already saw
// of its epoch. A frame carries the token's MAC however often it is sent again, so whoever holds
// the coordinator's port after it died could replay frames it recorded and keep every agent
// believing its coordinator alive (issue 28); the seq, strictly increasing within an epoch and a
// replica's stream (BusFrame), tells a replay from a frame just published.

/** Epochs remembered: as many as the agent remembers having left (coordinator-liveness.ts). */
const MAX_EPOCHS = 16;

export class FrameFreshness {
  /** The highest seq seen, by epoch, in the order the epochs were first seen. */
  private readonly last = new Map<number, number>();

  /** Whether seq is newer than every frame seen of `epoch`; if so, it is the newest from now on. */
  fresh(epoch: number, seq: number): boolean {
    const last = this.last.get(epoch);
    if (last !== undefined && seq <= last) return false;
    this.last.set(epoch, seq);
    if (last === undefined && this.last.size > MAX_EPOCHS) this.last.delete(this.last.keys().next().value as number);
    return true;
  }
}
