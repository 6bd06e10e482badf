// An agent's record of the waves: which vectors arrived, which waves ended here, the floor below
// which every wave is decided (vectors are published a wave ahead: docs/architecture.md, "Waves"),
// and the end_of_wave waits for a vector not known yet. Bounded: old waves are forgotten.
const WAVE_HISTORY = 64;

export class WaveBook {
  /** Waves whose vector arrived. */
  private readonly arrived = new Set<number>();
  /** Waves whose end_of_wave ran here (or was missed). */
  readonly ended = new Set<number>();
  /** Every wave below this is decided: one with no vector has nothing due. */
  private floor = 0;
  private readonly waiters = new Map<number, (() => void)[]>();

  has(wave: number): boolean {
    return this.arrived.has(wave);
  }

  /** `wave`'s vector arrived (and, when given, the floor moved): wake its waiters. */
  arrive(wave: number, floor?: number): void {
    this.arrived.add(wave);
    this.wake(wave);
    if (floor !== undefined) this.setFloor(floor);
    trim(this.arrived);
    trim(this.ended);
  }

  /** The floor follows the newest vector (it moves down too: an engine that restarted its waves). */
  setFloor(floor: number): void {
    this.floor = floor;
    for (const w of [...this.waiters.keys()]) if (w < floor) this.wake(w);
  }

  /** Is `wave`'s vector known: arrived, or implied (below the floor, nothing due)? */
  known(wave: number): boolean {
    return this.arrived.has(wave) || wave < this.floor;
  }

  /** Resolves true once `wave`'s vector is known, false after `ms`. */
  waitFor(wave: number, ms: number): Promise<boolean> {
    if (this.known(wave)) return Promise.resolve(true);
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        const list = this.waiters.get(wave) ?? [];
        this.waiters.set(wave, list.filter((f) => f !== done));
        resolve(false);
      }, ms);
      const list = this.waiters.get(wave) ?? [];
      list.push(done);
      this.waiters.set(wave, list);
    });
  }

  private wake(wave: number): void {
    for (const fn of this.waiters.get(wave) ?? []) fn();
    this.waiters.delete(wave);
  }
}

/**
 * Keep the WAVE_HISTORY highest waves. Called on every wave, so the set is at most one over:
 * the lowest is found by one pass (no copy, no sort), which also holds when waves went backwards.
 */
function trim(m: Set<number>): void {
  while (m.size > WAVE_HISTORY) {
    let low = Infinity;
    for (const k of m) if (k < low) low = k;
    m.delete(low);
  }
}

export { WAVE_HISTORY };
