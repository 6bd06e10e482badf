// The client side of `wavebus status / dump / capture` (docs/control.md): a DEALER on the
// coordinator's ROUTER, authenticated as `wavebus aggregate` is (the relay client: CURVE keys, the
// job's bus token). It first asks for the coordinator's status, which every version answers, so a
// coordinator of another protocol version gets a clear answer instead of silence; then the control
// request. Every wait is bounded by the caller's deadline.
import { RelayClient } from '../bus/relay-client';
import type { BusToken } from '../bus/auth';
import type { CurveClientKeys } from '../bus/curve';
import { DEFAULT_MAX_FRAME_BYTES } from '../bus/constants';
import { tcpEndpoint, type HostPort } from '../bus/endpoints';
import { PROTOCOL_VERSION } from '../bus/protocol-version';
import { ControlError, WavebusError } from '../errors';

export interface ControlTarget {
  coordinator: HostPort;
  busToken?: BusToken;
  curve?: CurveClientKeys;
}

export class ControlClient {
  private readonly relay: RelayClient;
  readonly endpoint: string;

  constructor(private readonly target: ControlTarget) {
    this.endpoint = tcpEndpoint(target.coordinator.host, target.coordinator.port + 1);
    this.relay = new RelayClient(target.coordinator, DEFAULT_MAX_FRAME_BYTES, target.busToken, target.curve);
  }

  /** Whether a coordinator of this protocol version answers within `timeoutMs` (throws a ControlError saying why not). */
  async probe(timeoutMs: number): Promise<void> {
    try {
      await this.relay.status(timeoutMs);
    } catch (e) {
      throw this.why(e, timeoutMs);
    }
  }

  /** One control request (a ControlRequest body such as `{ status: {} }`); its ControlReply, or a ControlError. */
  async request(body: Record<string, unknown>, timeoutMs: number): Promise<Record<string, any>> {
    let m;
    try {
      m = await this.relay.request({ control: { protocolVersion: PROTOCOL_VERSION, ...body } }, timeoutMs);
    } catch (e) {
      throw this.why(e, timeoutMs);
    }
    if (m.body === 'refused') throw new ControlError(`${this.endpoint}: ${m.refused.error}`, 'ERR_PROTOCOL_VERSION');
    if (m.body !== 'control') throw new ControlError(`${this.endpoint}: the coordinator answered ${m.body} to a control request`);
    const r = m.control as Record<string, any>;
    if (r.error) throw new ControlError(r.error, r.errorCode || 'ERR_CONTROL');
    return r;
  }

  /** The errors of the relay client, in this command's words. */
  private why(e: unknown, timeoutMs: number): ControlError {
    const code = e instanceof WavebusError ? e.code : 'ERR_CONTROL';
    if (code === 'ERR_TIMEOUT') {
      const auth = this.target.curve ? '' : ' (a coordinator that runs with CURVE answers only with --curve-dir)';
      return new ControlError(`no coordinator answered at ${this.endpoint} within ${timeoutMs} ms: is the job running, and is --coordinator its HOST:PORT?${auth}`, 'ERR_TIMEOUT');
    }
    return new ControlError((e as Error).message, code);
  }

  async close(): Promise<void> {
    await this.relay.close();
  }
}

/** Ask again every `everyMs` until `done` says so or `deadline` (Date.now()) passes; a coordinator that stops answering ended the job. */
export async function pollUntil<T>(
  client: ControlClient,
  ask: (timeoutMs: number) => Promise<T>,
  done: (v: T) => boolean,
  deadline: number,
  what: string,
  everyMs = 200,
): Promise<{ value: T; timedOut: boolean }> {
  let last: T | undefined;
  for (;;) {
    const left = deadline - Date.now();
    if (left <= 0) {
      if (last === undefined) throw new ControlError(`${what}: --timeout ran out before the coordinator answered`, 'ERR_TIMEOUT');
      return { value: last, timedOut: true };
    }
    try {
      last = await ask(Math.max(1, Math.min(left, 5000)));
    } catch (e) {
      if (e instanceof ControlError && e.code === 'ERR_TIMEOUT') {
        throw new ControlError(`${what}: the coordinator at ${client.endpoint} stopped answering (the job ended?)`, 'ERR_JOB_ENDED');
      }
      throw e;
    }
    if (done(last)) return { value: last, timedOut: false };
    await new Promise((r) => setTimeout(r, Math.min(everyMs, Math.max(1, deadline - Date.now()))));
  }
}
