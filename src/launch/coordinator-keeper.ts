// `wavebus launch` keeps the coordinator up while the command runs (and lingers), until teardown: one that dies (kill -9, the
// OOM killer, a crash) is started again, a new process and so a new epoch; the agents see it
// publish, sync from its snapshot and rejoin, as after any coordinator restart. Restarts back off
// (RESTART_BACKOFF_MS doubling up to RESTART_BACKOFF_MAX_MS, back to the start once one has stayed
// up RESTART_STABLE_MS), so a coordinator that cannot start costs an attempt now and then, never a
// busy loop. Before each start the bus ports are probed from this process: while another process
// holds them (a squatter after kill -9) an attempt costs one bind, not a node process start (about
// 0.8 s of CPU taken from the engine's host). The engine does not wait for any of it: agents answer
// at once while their coordinator is lost (docs/faults.md).
import type { Sidecar } from './sidecar';

export const RESTART_BACKOFF_MS = 500;
export const RESTART_BACKOFF_MAX_MS = 10000;
export const RESTART_STABLE_MS = 30000;

/** Resolves with why the coordinator cannot start now (its ports held), or undefined when it can. */
export type PortsProbe = () => Promise<string | undefined>;

export class CoordinatorKeeper {
  /** Coordinators started after the first. */
  restarts = 0;
  /** Attempts not started because the bus ports were held by another process. */
  portsHeld = 0;
  private backoffMs = RESTART_BACKOFF_MS;
  private timer?: NodeJS.Timeout;
  private stopped = false;

  constructor(
    /** The coordinator now (replaced on each restart). */
    public current: Sidecar,
    /** Start a new coordinator process with the same arguments. */
    private readonly spawn: () => Sidecar,
    private readonly say: (line: string) => void,
    private readonly probe?: PortsProbe,
  ) {}

  /** From now on a coordinator that exits is restarted. */
  watch(): void {
    const s = this.current;
    const startedAt = Date.now();
    void s.exited.then(() => {
      if (this.stopped || s !== this.current) return;
      if (Date.now() - startedAt >= RESTART_STABLE_MS) this.backoffMs = RESTART_BACKOFF_MS;
      const wait = this.nextWait();
      this.say(`the coordinator ${s.exitDescription()}; starting it again in ${wait} ms (a new epoch; the agents rejoin it)`);
      this.schedule(wait);
    });
  }

  /** Teardown: no more restarts. */
  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
  }

  private nextWait(): number {
    const wait = this.backoffMs;
    this.backoffMs = Math.min(RESTART_BACKOFF_MAX_MS, 2 * this.backoffMs);
    return wait;
  }

  private schedule(wait: number): void {
    this.timer = setTimeout(() => void this.attempt(), wait);
  }

  private async attempt(): Promise<void> {
    this.timer = undefined;
    if (this.stopped) return;
    const held = this.probe ? await this.probe().catch((e: Error) => e.message) : undefined;
    if (this.stopped) return;
    if (held !== undefined) {
      const wait = this.nextWait();
      // Said the first time, then every 10th: a squatter may hold the ports for hours.
      if (this.portsHeld++ % 10 === 0) this.say(`not starting the coordinator: ${held}; trying again in ${wait} ms`);
      this.schedule(wait);
      return;
    }
    this.restarts++;
    this.current = this.spawn();
    this.watch();
  }
}
