// The process-global capture budget (MAX_CAPTURES): a broad rule must not dump without end.
// Budget is consumed only after a forward has been selected; running out is logged once.

export type BudgetLog = (message: string) => void;

export class CaptureBudget {
  private used = 0;
  private announced = false;

  constructor(
    readonly max: number,
    private readonly log: BudgetLog = (m) => process.stderr.write(`wavebus: ${m}\n`),
  ) {
    if (!Number.isSafeInteger(max) || max <= 0) throw new RangeError(`capture budget must be a positive integer, got ${max}`);
  }

  get consumed(): number {
    return this.used;
  }

  get remaining(): number {
    return this.max - this.used;
  }

  /** Take one capture from the budget; false (and one log line, the first time) when none is left. */
  tryConsume(): boolean {
    if (this.used < this.max) {
      this.used += 1;
      return true;
    }
    if (!this.announced) {
      this.announced = true;
      this.log(`input snapshot budget exhausted: ${this.max} capture(s) taken; further selected forwards are not captured (raise WAVEBUS_SNAPSHOT_MAX_CAPTURES)`);
    }
    return false;
  }
}

let processBudget: CaptureBudget | undefined;

/**
 * The one budget of this process, created on first use. Every capturer in the process shares it,
 * as the seed's budget is process-global; later calls ignore `max` (the config is resolved once).
 */
export function processCaptureBudget(max: number, log?: BudgetLog): CaptureBudget {
  if (!processBudget) processBudget = new CaptureBudget(max, log);
  return processBudget;
}
