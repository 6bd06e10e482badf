// pendingDump(reqId): is a dump of this request armed for a wave whose end_of_wave has not run on
// this rank yet? Vectors are published a wave ahead (docs/architecture.md, "Waves"), so a request
// can finish between its detection and its copy; an engine that asks before freeing a request's
// blocks keeps them one step longer and the copy reads the request's own KV, not reused blocks.
// With no dump_due in the ring's vectors after the last ended wave the answer costs a few memory
// loads (no system call); for a wave with dump_due the req ids are asked of the agent once.
import type { MailboxReader } from './mailbox';

const SLOTS = 8;
/** The agent could not say which requests are due: every request counts as pending (kept a step). */
const ALL = 'all' as const;
type DueSet = Set<string> | typeof ALL;

export class PendingDumps {
  /** The last wave whose end_of_wave ran on this rank (-1: none yet). */
  private lastEnded = -1;
  private readonly due = new Map<number, DueSet | Promise<DueSet>>();

  constructor(
    private readonly mailbox: MailboxReader,
    /** The req ids of `wave`'s dump jobs, from the agent; undefined when it did not answer. */
    private readonly ask: (wave: number) => Promise<string[] | undefined>,
  ) {}

  /** end_of_wave(wave) ran: its dumps are copied (or failed); older answers are dropped. */
  ended(wave: number): void {
    this.lastEnded = wave;
    for (const w of this.due.keys()) if (w <= wave) this.due.delete(w);
  }

  /** Waves after the last ended one whose vector (already in the ring) has dump_due. */
  private dueWaves(): number[] {
    const top = this.mailbox.floor() - 1; // the newest decided wave
    const from = Math.max(this.lastEnded + 1, top - SLOTS + 1, 0);
    let out: number[] | undefined;
    for (let w = from; w <= top; w++) {
      const v = this.mailbox.read(w);
      if (v && v.dumpDue && !v.implied) (out ??= []).push(w);
    }
    return out ?? NONE;
  }

  check(reqId: string): Promise<boolean> {
    const waves = this.dueWaves();
    if (waves.length === 0) return FALSE;
    return Promise.all(waves.map((w) => this.setOf(w))).then((sets) => sets.some((s) => s === ALL || s.has(reqId)));
  }

  private setOf(wave: number): Promise<DueSet> {
    const got = this.due.get(wave);
    if (got instanceof Promise) return got;
    if (got) return Promise.resolve(got);
    const p = this.ask(wave).then(
      (ids): DueSet => (ids ? new Set(ids) : ALL),
      (): DueSet => ALL,
    );
    this.due.set(wave, p);
    void p.then((s) => {
      // Cache the answer unless the wave ended meanwhile (or the agent could not answer: ask again).
      if (this.due.get(wave) === p) {
        if (s === ALL) this.due.delete(wave);
        else this.due.set(wave, s);
      }
    });
    return p;
  }
}

const NONE: number[] = [];
const FALSE: Promise<boolean> = Promise.resolve(false);
