// The wave vectors stopped coming (a dead or lost coordinator, a stalled chain): the engine pays
// one bound for it, once, and then nothing until the mailbox moves again. Set when a wait for a
// vector ran out (end_of_wave timed out, a due_dumps question went unanswered, or the agent said
// its coordinator is lost); over as soon as the agent publishes anything new (the mailbox's
// floor or epoch changed: a vector arrived, or a restarted coordinator's snapshot).
import type { MailboxReader } from './mailbox';

export class VectorStall {
  /** Stretches of stalled vectors seen (each cost the engine at most one bound). */
  stalls = 0;
  private floor = -1;
  private epoch = -1;
  private on = false;

  constructor(private readonly mailbox: Pick<MailboxReader, 'floor' | 'epoch'>) {}

  /** A wait for a vector ran out: no more waits until the mailbox moves. */
  begin(): void {
    if (this.active()) return;
    this.on = true;
    this.stalls++;
    this.floor = this.mailbox.floor();
    this.epoch = this.mailbox.epoch();
  }

  /** Still stalled: nothing was published since begin() (two memory loads). */
  active(): boolean {
    if (!this.on) return false;
    if (this.mailbox.floor() !== this.floor || this.mailbox.epoch() !== this.epoch) this.on = false;
    return this.on;
  }
}
