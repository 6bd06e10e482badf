// An agent's record of the waves: which vectors arrived, which waves ended here, the floor below
// which every wave is decided (vectors are published a wave ahead: docs/architecture.md, "Waves"),
// and the end_of_wave waits for a vector not known yet. Bounded: old waves are forgotten.
const WAVE_HISTORY = 64;
/**
 * How often a wait looks at the mailbox the host receiver writes (decidedElsewhere): only while
 * the engine waits on this agent for a vector it does not follow, i.e. a late one.
 */
const MAILBOX_POLL_MS = 1;

export class WaveBook {
  /** Waves whose vector arrived. */
  private readonly arrived = new Set<number>();
  /** Waves whose end_of_wave ran here (or was missed). */
  readonly ended = new Set<number>();
  /** Every wave below this is decided: one with no vector has nothing due. */
  private floor = 0;
  private readonly waiters = new Map<number, (() => void)[]>();
  /**
   * A lanes-only agent (docs/bus.md, "One receiver per host") never sees a plain wave's head: the
   * host receiver writes that vector into this rank's mailbox. This says whether the mailbox shows
   * `wave` decided with nothing due (a wave with work still waits for its head and lanes).
   */
  private decidedElsewhere?: (wave: number) => boolean;
  private poll?: NodeJS.Timeout;

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

  /** Is `wave`'s vector known: arrived, implied (below the floor, nothing due), or decided with nothing due by the host receiver? */
  known(wave: number): boolean {
    return this.arrived.has(wave) || wave < this.floor || (this.decidedElsewhere?.(wave) ?? false);
  }

  /** Follow the vectors another process writes for this rank (undefined: only what arrives here). */
  followMailbox(decided: ((wave: number) => boolean) | undefined): void {
    this.decidedElsewhere = decided;
    if (decided && this.waiters.size > 0) this.startPoll();
  }

  private startPoll(): void {
    if (this.poll || !this.decidedElsewhere) return;
    this.poll = setInterval(() => {
      for (const w of [...this.waiters.keys()]) if (this.known(w)) this.wake(w);
      if (this.waiters.size === 0) this.stopPoll();
    }, MAILBOX_POLL_MS);
  }

  private stopPoll(): void {
    if (this.poll) clearInterval(this.poll);
    this.poll = undefined;
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
        const list = (this.waiters.get(wave) ?? []).filter((f) => f !== done);
        if (list.length > 0) this.waiters.set(wave, list);
        else this.waiters.delete(wave);
        if (this.waiters.size === 0) this.stopPoll();
        resolve(false);
      }, ms);
      const list = this.waiters.get(wave) ?? [];
      list.push(done);
      this.waiters.set(wave, list);
      this.startPoll();
    });
  }

  /** Stop looking at the mailbox (the agent stops); pending waits still end at their bound. */
  close(): void {
    this.stopPoll();
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
