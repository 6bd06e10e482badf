// The per-step wave head: built and checked during the engine's call, encoded and sent once the
// engine yields. Also keeps the telemetry's request slots (the columnizer) and when to re-send them.
import { ConfigError } from '../errors';
import type { NonFiniteRow, StepTelemetry } from '../messages';
import { ClientRequest, encodeTrusted } from '../proto';
import { columnsToWire, TelemetryColumnizer } from './telemetry';

/** Steps between re-sends of every request's binding and block table (a lost one heals by then). */
const RESEND_EVERY = 64;

export type WaveTelemetry = Omit<StepTelemetry, 'wave'> & { wave?: number };

export const isWaveNumber = (n: unknown): boolean => Number.isSafeInteger(n) && (n as number) >= 0;

/** A rejected promise for a bad wave number (the per-step calls never throw synchronously). */
export function waveError(wave: number, where: string): Promise<never> | undefined {
  if (isWaveNumber(wave)) return undefined;
  return Promise.reject(new ConfigError(`${where}(): wave ${wave} is not a non-negative integer`));
}

export class WaveHeadSender {
  /** Request slots and last-sent block tables of the telemetry; null after a pause in sending. */
  private columnizer: TelemetryColumnizer | null = null;
  private telemetryEpoch = -1;
  private sinceResend = 0;
  /** A wave head built during the engine's call, encoded and sent once the engine yields. */
  private queued: Record<string, unknown> | null = null;
  private flushScheduled = false;

  constructor(
    /** The client's socket (AgentTransport): where the encoded head is queued. */
    private readonly out: { readonly closed: boolean; oneWayFrame(frame: Buffer, what: string): void },
    /** A head that could not be encoded: recorded as the client's last error, never thrown. */
    private readonly failed: (message: string) => void,
  ) {}

  /** Sending paused (features off, agent gone): requests freed meanwhile go unseen, so slots start over. */
  reset(): void {
    this.columnizer = null;
  }

  /** A head (with its bindings) may have been lost: every binding and block table goes again. */
  resendBindings(): void {
    this.columnizer?.resend();
  }

  /**
   * Builds the head of `wave` now (checked and copied: the engine may reuse its objects once its call
   * returns) and queues it. `epoch`: the coordinator's, from the mailbox (a new one knows no bindings).
   */
  build(wave: number, telemetry: WaveTelemetry | undefined, opts: { detectors: boolean; epoch: number }): void {
    const body: Record<string, unknown> = { wave };
    if (telemetry) {
      const columnizer = this.columnizer ?? (this.columnizer = new TelemetryColumnizer());
      // A new coordinator (epoch) knows no bindings; a periodic re-send heals a lost message.
      if (opts.epoch !== this.telemetryEpoch || ++this.sinceResend >= RESEND_EVERY) {
        this.telemetryEpoch = opts.epoch;
        this.sinceResend = 0;
        columnizer.resend();
      }
      const telemetryWave = telemetry.wave ?? wave - 1;
      if (!isWaveNumber(telemetryWave)) throw new ConfigError(`waveHead(): telemetry.wave ${String(telemetry.wave)} is not a non-negative integer`);
      // The message is encoded later without protobufjs's own checks: everything is checked here.
      const nonFinite = opts.detectors ? (telemetry.nonFinite ?? []).map(nonFiniteRow) : [];
      let columns;
      try {
        // Without detectors only what a manual dump needs travels: requests, blocks, finish/free.
        columns = columnizer.columns(telemetry.requests ?? [], { tokens: opts.detectors, where: 'waveHead(): telemetry' });
      } catch (e) {
        this.columnizer = null; // slots taken by the bad step were never sent: start over
        throw e;
      }
      body.telemetry = { wave: telemetryWave, columns: columnsToWire(columns), nonFinite };
    }
    this.queue(body);
  }

  /** Queues a head built elsewhere (the tensor path, tensor-batch.ts), checked by its builder. */
  enqueue(body: Record<string, unknown>): void {
    this.queue(body);
  }

  /**
   * One-way (id 0): the engine never waits for the agent or the coordinator at the head of a wave.
   * Encoding and the socket send (~50 µs of CPU when the process wakes cold) run when the engine
   * next yields to the event loop, typically while it awaits the forward on the device, instead of
   * inside its step. Anything else sent meanwhile flushes the head first, so order is kept.
   */
  private queue(body: Record<string, unknown>): void {
    if (this.queued) this.flush(); // two heads without a yield between them
    this.queued = body;
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(() => {
        this.flushScheduled = false;
        this.flush();
      });
    }
  }

  /** Sends the queued head, if any (before anything else goes to the agent, and at close). */
  flush(): void {
    const body = this.queued;
    if (!body || this.out.closed) return;
    this.queued = null;
    try {
      // Built here from checked columns: encoded without protobufjs's verify/fromObject pass.
      this.out.oneWayFrame(encodeTrusted(ClientRequest, { id: 0, waveHead: body }), 'waveHead');
    } catch (e) {
      // Runs outside the engine's call (setImmediate): never throw into its event loop.
      this.failed(`waveHead: ${(e as Error).message}`);
      this.columnizer?.resend();
    }
  }
}

/** A checked copy of one non-finite logits row for the wire. */
export function nonFiniteRow(r: NonFiniteRow, i: number): NonFiniteRow {
  if (!Number.isInteger(r?.row) || r.row < 0 || r.row > 0xffffffff) throw new ConfigError(`waveHead(): telemetry.nonFinite[${i}].row ${String(r?.row)} is not a non-negative integer`);
  if (typeof r.reqId !== 'string') throw new ConfigError(`waveHead(): telemetry.nonFinite[${i}].reqId must be a string`);
  if (typeof r.kind !== 'string') throw new ConfigError(`waveHead(): telemetry.nonFinite[${i}].kind must be a string`);
  return { row: r.row, reqId: r.reqId, kind: r.kind };
}
