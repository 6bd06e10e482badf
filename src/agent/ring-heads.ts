// Wave heads that name a telemetry-ring slot: the agent reads the slot, checks it
// (ring-columns.ts), and relays the head with the columns in it. The coordinator sees the same
// TelemetryColumns as from an inline head: the columns go as the bytes the engine wrote, one copy
// each, never re-encoded per element. Garbage is counted per kind and reported per rank
// (Heartbeat.ring_garbage, /metrics wavebus_ring_garbage{rank}); the head itself always goes on.
import type { Logger } from '../log';
import { encodeTrusted, messageType } from '../proto';
import { ringColumns, RowIndex, type RingGarbage } from './ring-columns';
import { TelemetryRingReader, type RingAsk } from './telemetry-ring';

const WaveHeadRequest = messageType('WaveHeadRequest');
const StepTelemetry = messageType('StepTelemetry');
const TelemetryColumns = messageType('TelemetryColumns');

export interface RingStats {
  ringHeads: number;
  ringGarbage: number;
  ringGarbageByKind: Record<string, number>;
}

export function newRingStats(): RingStats {
  return { ringHeads: 0, ringGarbage: 0, ringGarbageByKind: {} };
}

export class RingHeads {
  private ring: TelemetryRingReader | null = null;
  private readonly index = new RowIndex();
  private lastWarn = 0;

  constructor(
    private readonly file: string,
    readonly stats: RingStats,
    private readonly log: Logger,
  ) {}

  /** A client asked for a ring at hello: a fresh one (a previous client's is replaced). */
  open(ask: RingAsk): string {
    this.close();
    this.ring = TelemetryRingReader.create(this.file, ask);
    return this.ring.path;
  }

  get active(): boolean {
    return this.ring !== null;
  }

  /** The head's bytes to relay: as they came, or with the ring slot's columns put in. */
  fill(raw: Uint8Array): Uint8Array {
    let head: Record<string, any>;
    try {
      head = WaveHeadRequest.decode(raw) as unknown as Record<string, any>;
    } catch {
      return raw; // the coordinator counts it as garbage, as from any client
    }
    const seq = Number(head.ringSeq ?? 0);
    if (!seq) return raw;
    this.stats.ringHeads++;
    const tel = (head.telemetry ??= StepTelemetry.create({ wave: Math.max(0, Number(head.wave) - 1) })) as Record<string, any>;
    const cols = (tel.columns ??= TelemetryColumns.create()) as Record<string, any>;
    for (const [k, v] of Object.entries(this.columnsOf(seq, Number(head.wave)))) cols[k] = v;
    head.ringSeq = 0;
    return encodeTrusted(WaveHeadRequest, head as never);
  }

  private columnsOf(seq: number, wave: number): Record<string, unknown> {
    if (!this.ring) return this.miss(['no_ring'], 'a head named a ring slot, and this agent has no ring');
    const slot = this.ring.read(seq);
    if ('garbage' in slot) return this.miss([slot.garbage], slot.detail);
    if (slot.wave !== wave) return this.miss(['torn'], `slot of seq ${seq} holds wave ${slot.wave}, the head is wave ${wave}`);
    const out = ringColumns(slot, this.ring.ask, this.index);
    if (out.garbage.length > 0) this.miss(out.garbage, `wave ${wave}`);
    return out.columns ?? { rows: 0 };
  }

  private miss(kinds: RingGarbage[], detail: string): Record<string, unknown> {
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
    this.ring?.close();
    this.ring = null;
  }
}
