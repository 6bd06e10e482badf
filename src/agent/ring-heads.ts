// Wave heads from the telemetry ring: a slot whose extra column holds the head's sparse part is a
// whole head, which the agent finds by polling the ring's written word (the engine sends no message
// and makes no system call; when it polls: PollSchedule below); a head too large for the extra column comes as a
// message naming its slot (ring_seq). Either way the agent reads the slot, checks it
// (ring-columns.ts), and relays the head with the columns in it. The coordinator sees the same
// TelemetryColumns as from an inline head: the columns go as the bytes the engine wrote, one copy
// each, never re-encoded per element. Garbage is counted per kind and reported per rank
// (Heartbeat.ring_garbage, /metrics wavebus_ring_garbage{rank}); the head itself always goes on.
import type { Logger } from '../log';
import { encodeTrusted, longNumber, messageType } from '../proto';
import { ringColumns, RowIndex, type RingGarbage } from '../client/ring-columns';
import { RING_LAYOUT, type RingAsk, type RingSlotRead } from '../client/ring-layout';
import { TelemetryRingReader } from './telemetry-ring';

/** How often the agent looks for whole heads in the ring once one is due: at most this much latency per head. */
export const POLL_MS = 1;
/** The part of the engine's (shortest recent) step the poll sleeps after a head: the next one is not due before. */
export const QUIET_FRACTION = 0.75;
/** The longest quiet after a head, whatever the steps' length (a paused engine is polled every POLL_MS again after it). */
export const MAX_QUIET_MS = 50;

/** How many of the last gaps between heads the quiet time is taken from (the shortest of them). */
export const GAPS_KEPT = 8;

/**
 * When the agent next looks at the ring. A poll wakes the agent (a timer, a pread) whether or not a
 * head is there; at a 6 ms step, one every POLL_MS cost TP0's agent ~6 wake-ups a wave, the most
 * of its CPU at 1024 running requests. The engine writes one head a step, so after a head the poll
 * sleeps QUIET_FRACTION of the shortest of the last GAPS_KEPT gaps between heads (steps vary:
 * the shortest keeps a short step from waiting), then looks every POLL_MS until the next one:
 * ~2 wake-ups a wave. A head written sooner than that waits at most the quiet time; one written
 * later costs at most POLL_MS, as before.
 */
export class PollSchedule {
  private lastHeadMs = -1;
  private readonly gaps: number[] = [];

  /** A poll at `now` found `heads` new heads: the delay to the next poll. */
  next(now: number, heads: number): number {
    if (heads > 0) {
      const gap = this.lastHeadMs < 0 ? 0 : (now - this.lastHeadMs) / heads;
      this.lastHeadMs = now;
      // Gaps past MAX_QUIET_MS (a pause, the first head) say nothing about the step's length.
      if (gap > 0 && gap < MAX_QUIET_MS) {
        this.gaps.push(gap);
        if (this.gaps.length > GAPS_KEPT) this.gaps.shift();
      }
    }
    if (this.lastHeadMs < 0 || this.gaps.length === 0) return POLL_MS;
    const quiet = QUIET_FRACTION * Math.min(...this.gaps) - (now - this.lastHeadMs);
    return Math.max(POLL_MS, quiet);
  }
}

const WaveHeadRequest = messageType('WaveHeadRequest');
const StepTelemetry = messageType('StepTelemetry');
const TelemetryColumns = messageType('TelemetryColumns');

export interface RingStats {
  ringHeads: number;
  ringGarbage: number;
  ringGarbageByKind: Record<string, number>;
}

/** Why a head's sparse part (the extra column) cannot go on: bindings and tables of rows past the ring, an empty request id. */
export function extraError(head: Record<string, any>, maxRows: number): string | undefined {
  const cols = head.telemetry?.columns;
  for (const [i, b] of (cols?.bind ?? []).entries()) {
    if (!(b.slot < maxRows)) return `bind[${i}].slot ${b.slot} is past the ring's ${maxRows} rows`;
    if (typeof b.reqId !== 'string' || b.reqId === '') return `bind[${i}].req_id is empty`;
  }
  for (const [i, b] of (cols?.blocks ?? []).entries()) if (!(b.slot < maxRows)) return `blocks[${i}].slot ${b.slot} is past the ring's ${maxRows} rows`;
  return undefined;
}

export function newRingStats(): RingStats {
  return { ringHeads: 0, ringGarbage: 0, ringGarbageByKind: {} };
}

export class RingHeads {
  private ring: TelemetryRingReader | null = null;
  private readonly index = new RowIndex();
  private lastWarn = 0;

  private polled = 0;
  private lastMiss: RingGarbage[] = [];
  private timer: NodeJS.Timeout | null = null;
  private schedule = new PollSchedule();
  /** Heads relayed by poll() since the timer last ran (the schedule learns the steps' length from them). */
  private found = 0;

  constructor(
    private readonly file: string,
    readonly stats: RingStats,
    private readonly log: Logger,
    /** Relays a head's bytes to the coordinator (when this rank heads its stream and the bus is on). */
    private readonly relay: (head: Uint8Array) => void,
  ) {}

  /** A client asked for a ring at hello: a fresh one (a previous client's is replaced). */
  open(ask: RingAsk): string {
    this.poll(); // heads the client wrote before this hello go on first (else the next poll's tick would have taken them)
    this.close();
    this.ring = TelemetryRingReader.create(this.file, ask);
    this.polled = 0;
    this.consumed = 0;
    this.schedule = new PollSchedule();
    this.found = 0;
    this.arm(POLL_MS);
    return this.ring.path;
  }

  private arm(ms: number): void {
    this.timer = setTimeout(() => this.tick(), ms);
    this.timer.unref();
  }

  private tick(): void {
    this.timer = null;
    this.found = 0;
    try {
      this.poll();
    } finally {
      // Re-armed whatever the poll did (a relay that threw must not stop the heads).
      if (this.ring) this.arm(this.schedule.next(performance.now(), this.found));
    }
  }

  /** The heads written whole since the last poll, relayed in order. */
  poll(): void {
    const ring = this.ring;
    if (!ring) return;
    const word = ring.written();
    const written = word - (word % 2); // an odd word is garbage: its slot is checked like any other
    if (!Number.isSafeInteger(written) || written <= this.polled) return;
    // Older than the ring holds: overwritten before this poll (the agent was not scheduled), one miss for them all.
    const oldest = Math.max(this.polled + 2, written - 2 * (RING_LAYOUT.slots - 1));
    if (oldest > this.polled + 2) this.miss(['torn'], `${(oldest - this.polled - 2) / 2} slots overwritten before the agent read them`);
    // A slot whose head comes as a message (ring_seq) is not released here: the client writes whole
    // heads again only once the agent took that message, so a later whole head never overtakes it.
    let release = written;
    for (let s = oldest; s <= written; s += 2) {
      this.lastMiss = [];
      const head = this.wholeHead(ring, s);
      if (head) {
        this.found++;
        this.relay(head);
      }
      else if (this.lastMiss.length === 0 && release === written) release = s - 2;
    }
    this.polled = written;
    this.consume(release);
  }

  /** One slot as the poll takes it: the head to relay and what was dropped of it, or why not (null head, no drops: its head comes as a message). */
  take(seq: number): { head: Uint8Array | null; dropped: RingGarbage[] } {
    this.lastMiss = [];
    const head = this.ring ? this.wholeHead(this.ring, seq) : null;
    return { head, dropped: this.lastMiss };
  }

  private wholeHead(ring: TelemetryRingReader, seq: number): Uint8Array | null {
    const slot = ring.read(seq);
    if ('garbage' in slot) {
      this.miss([slot.garbage], slot.detail);
      return null;
    }
    if (slot.extraLen === 0) return null; // its head comes as a message (ring_seq)
    let head: Record<string, any>;
    try {
      head = WaveHeadRequest.decode(slot.columns.get('extra')!) as unknown as Record<string, any>;
    } catch (e) {
      this.miss(['bad_extra'], `slot of seq ${seq}: ${String((e as Error).message)}`);
      return null;
    }
    const bad = extraError(head, ring.ask.maxRows);
    if (bad) {
      this.miss(['bad_extra'], `slot of seq ${seq}: ${bad}`);
      return null;
    }
    this.stats.ringHeads++;
    return this.merge(head, this.slotColumns(slot, seq, longNumber(head.wave)));
  }

  private consumed = 0;

  /** The client writes over a slot only once it was taken (telemetry-ring.ts markConsumed). */
  private consume(seq: number): void {
    if (seq <= this.consumed || !this.ring) return;
    this.consumed = seq;
    this.ring.markConsumed(seq);
  }

  private merge(head: Record<string, any>, columns: Record<string, unknown>): Uint8Array {
    const tel = (head.telemetry ??= StepTelemetry.create({ wave: Math.max(0, longNumber(head.wave) - 1) })) as Record<string, any>;
    const sent = tel.columns as Record<string, any> | undefined;
    // Of the message's columns only the sparse part is kept: the per-row ones are the slot's.
    const cols = TelemetryColumns.create({ bind: sent?.bind ?? [], blocks: sent?.blocks ?? [] }) as unknown as Record<string, any>;
    tel.columns = cols;
    for (const [k, v] of Object.entries(columns)) cols[k] = v;
    head.ringSeq = 0;
    return encodeTrusted(WaveHeadRequest, head as never);
  }

  get active(): boolean {
    return this.ring !== null;
  }

  /** The head's bytes to relay: as they came, or with the ring slot's columns put in. */
  fill(raw: Uint8Array): Uint8Array {
    // Whole heads written before this one go first, whatever this one is (one naming a slot, or
    // inline: the ring was full, or the step too large for it): the coordinator sees them in order.
    this.poll();
    let head: Record<string, any>;
    try {
      head = WaveHeadRequest.decode(raw) as unknown as Record<string, any>;
    } catch {
      return raw; // the coordinator counts it as garbage, as from any client
    }
    const seq = longNumber(head.ringSeq);
    if (!seq) return raw;
    this.stats.ringHeads++;
    if (!this.ring) return this.merge(head, this.miss(['no_ring'], 'a head named a ring slot, and this agent has no ring'));
    const slot = this.ring.read(seq);
    this.consume(seq);
    if ('garbage' in slot) return this.merge(head, this.miss([slot.garbage], slot.detail));
    return this.merge(head, this.slotColumns(slot, seq, longNumber(head.wave)));
  }

  private slotColumns(slot: RingSlotRead, seq: number, wave: number): Record<string, unknown> {
    if (slot.wave !== wave) return this.miss(['torn'], `slot of seq ${seq} holds wave ${slot.wave}, the head is wave ${wave}`);
    const out = ringColumns(slot, this.ring!.ask, this.index);
    if (out.garbage.length > 0) this.miss(out.garbage, `wave ${wave}`);
    return out.columns ?? { rows: 0 };
  }

  private miss(kinds: RingGarbage[], detail: string): Record<string, unknown> {
    this.lastMiss = kinds;
    this.stats.ringGarbage++;
    for (const k of kinds) this.stats.ringGarbageByKind[k] = (this.stats.ringGarbageByKind[k] ?? 0) + 1;
    const now = Date.now();
    if (now - this.lastWarn > 10_000) {
      this.lastWarn = now;
      this.log.warn({ garbage: kinds, detail, total: this.stats.ringGarbage }, 'telemetry ring: dropped garbage columns');
    }
    return { rows: 0 };
  }

  close(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.ring?.close();
    this.ring = null;
  }
}
