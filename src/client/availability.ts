// Degraded mode: whether the agent answers. A call that gets no answer within its bound marks the
// agent unavailable (warned once per loss); calls then skip it, sending at most one probe per
// interval, until any answer arrives.
import { WavebusError } from '../errors';

export interface AvailabilityStats {
  /** Times the agent stopped answering (each starts a stretch of degraded mode). */
  agentLost: number;
  /** Times it answered again afterwards. */
  agentBack: number;
  probes: number;
}

export class AgentAvailability {
  /** True while the agent is known not to answer: calls skip it until it answers again. */
  unavailable = false;
  /** The last error a per-step call met and swallowed (the step went on). */
  lastError = '';
  /** Monotonic ms of the agent's last answer (any answer proves it alive). */
  lastAnswerAt = -Infinity;
  private lastProbeAt = -Infinity;
  private probing = false;

  constructor(
    private readonly endpoint: string,
    private readonly stats: AvailabilityStats,
    private readonly probeIntervalMs: number,
    /** Sends a ping answered within `timeoutMs`; undefined when the client is closed. */
    private readonly ping: (timeoutMs: number) => Promise<unknown> | undefined,
    /** The agent answers again: it may be a new agent, so hello and regions go again. */
    private readonly back: () => void,
  ) {}

  /**
   * `e` (from a call to the agent) means the agent is not answering: no answer within the bound,
   * or the socket refused the message. Marks it unavailable (warned once per loss) and says so.
   */
  lostOn(e: unknown, where: string): boolean {
    const code = (e as WavebusError)?.code;
    if (code === 'ERR_CLOSED' || (e instanceof WavebusError && code !== 'ERR_TIMEOUT' && code !== 'ERR_CAPTURE_TIMEOUT')) return false;
    this.markUnavailable(`${where}: ${(e as Error)?.message ?? String(e)}`);
    return true;
  }

  markUnavailable(why: string): void {
    this.lastProbeAt = performance.now();
    if (this.unavailable) return;
    this.unavailable = true;
    this.stats.agentLost++;
    this.lastError = why;
    process.stderr.write(`wavebus: warning: the agent at ${this.endpoint} is not answering (${why}); engine calls skip it until it answers again\n`);
  }

  /** Any answer from the agent: it is alive. After a loss, hello and regions go again on the next call. */
  heard(): void {
    this.lastAnswerAt = performance.now();
    if (!this.unavailable) return;
    this.unavailable = false;
    this.stats.agentBack++;
    this.back();
    process.stderr.write(`wavebus: the agent at ${this.endpoint} answers again; engine calls use it again\n`);
  }

  /** While the agent is unavailable: at most one probe per interval, never waited for. */
  probe(): void {
    if (!this.unavailable || this.probing || performance.now() - this.lastProbeAt < this.probeIntervalMs) return;
    const sent = this.ping(this.probeIntervalMs);
    if (!sent) return;
    this.probing = true;
    this.lastProbeAt = performance.now();
    this.stats.probes++;
    // The answer itself (heard) ends the unavailability; a timeout leaves it as it is.
    sent.catch(() => undefined).finally(() => (this.probing = false));
  }
}
