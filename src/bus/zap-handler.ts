// The ZAP handler (RFC 27) of a ZeroMQ context: admits only allow-listed CURVE client keys, and
// counts and logs the refusals by reason.
import { Context, Router } from 'zeromq';
import type { Logger } from '../log';
import { ZAP_ENDPOINT, z85Encode, type AllowList } from './curve';

export type RefusalReason = 'unknown_key' | 'wrong_mechanism' | 'bad_zap_request' | 'handshake_failed';

/**
 * The ZAP handler (RFC 27) of one ZeroMQ context: answers every CURVE handshake of that
 * context's server sockets with 200 for an allow-listed client key and 400 otherwise. It must be
 * bound before the server sockets accept anyone; each coordinator uses its own context, so
 * several coordinators in one process keep separate allow-lists.
 */
export class ZapHandler {
  readonly refused: Record<string, number> = {};
  admitted = 0;
  private router?: Router;
  private loop?: Promise<void>;
  private readonly lastLog = new Map<string, number>();

  constructor(
    private readonly context: Context,
    private readonly allow: AllowList,
    private readonly log?: Logger,
    private readonly onRefuse?: (reason: RefusalReason) => void,
  ) {}

  async start(): Promise<void> {
    const router = new Router({ context: this.context, linger: 0 });
    await router.bind(ZAP_ENDPOINT);
    this.router = router;
    this.loop = this.serve(router);
  }

  async stop(): Promise<void> {
    this.router?.close();
    await this.loop;
  }

  /** Count (and log at most every 5 s per reason) a refused peer. */
  refuse(reason: RefusalReason, detail: Record<string, unknown>): void {
    this.refused[reason] = (this.refused[reason] ?? 0) + 1;
    this.onRefuse?.(reason);
    const now = Date.now();
    const last = this.lastLog.get(reason);
    if (last === undefined || now - last >= 5000) {
      this.lastLog.set(reason, now);
      this.log?.warn({ reason, total: this.refused[reason], ...detail }, 'refused a bus peer (CURVE)');
    }
  }

  private async serve(router: Router): Promise<void> {
    while (!router.closed) {
      let parts: Buffer[];
      try {
        parts = await router.receive();
      } catch {
        if (router.closed) break;
        continue;
      }
      try {
        await this.answer(router, parts);
      } catch (e) {
        if (!router.closed) this.log?.error({ err: String(e) }, 'ZAP handler failed to answer');
      }
    }
  }

  private async answer(router: Router, parts: Buffer[]): Promise<void> {
    // [routing id, empty, version, request id, domain, address, identity, mechanism, credentials...]
    if (parts.length < 8 || parts[1].length !== 0) {
      this.refuse('bad_zap_request', { frames: parts.length });
      return; // not a ZAP request we can answer at all
    }
    const [rid, empty, version, requestId, , address, , mechanism, ...creds] = parts;
    const send = (code: '200' | '400' | '500', text: string, userId = '') =>
      router.send([rid, empty, '1.0', requestId, code, text, userId, Buffer.alloc(0)]);
    if (version.toString() !== '1.0') {
      this.refuse('bad_zap_request', { version: version.toString('latin1').slice(0, 8) });
      await send('500', 'unsupported ZAP version');
      return;
    }
    if (mechanism.toString() !== 'CURVE' || creds.length !== 1 || creds[0].length !== 32) {
      this.refuse('wrong_mechanism', { address: address.toString(), mechanism: mechanism.toString('latin1').slice(0, 16) });
      await send('400', 'CURVE with an allow-listed key required');
      return;
    }
    const key = z85Encode(creds[0]);
    const label = this.allow.get(key);
    if (label === undefined) {
      this.refuse('unknown_key', { address: address.toString(), key });
      await send('400', 'client key not allowed');
      return;
    }
    this.admitted++;
    await send('200', 'OK', label);
  }
}
