// The ZAP handler (RFC 27) of a ZeroMQ context: admits only allow-listed CURVE client keys (or, on
// a plain-text bus with the token, only PLAIN subscribers with the token's subscriber password),
// and counts and logs the refusals by reason.
import { timingSafeEqual } from 'crypto';
import { Context, Router } from 'zeromq';
import type { Logger } from '../log';
import { ZAP_ENDPOINT, z85Encode, type AllowList } from './curve';

export type RefusalReason = 'unknown_key' | 'wrong_password' | 'wrong_mechanism' | 'bad_zap_request' | 'handshake_failed';

/** Whom a handler admits: CURVE clients with an allow-listed key, or PLAIN peers with this user and password. */
export type ZapAdmits = { curve: AllowList } | { plain: { user: string; password: string } };

/**
 * The ZAP handler (RFC 27) of one ZeroMQ context: answers every CURVE (or PLAIN) handshake of that
 * context's server sockets with 200 for an allow-listed client key (the right user and password)
 * and 400 otherwise. It must be
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
    private readonly admits: ZapAdmits,
    private readonly log?: Logger,
    private readonly onRefuse?: (reason: RefusalReason) => void,
  ) {}

  private get mechanism(): 'CURVE' | 'PLAIN' {
    return 'curve' in this.admits ? 'CURVE' : 'PLAIN';
  }

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
      this.log?.warn({ reason, total: this.refused[reason], ...detail }, `refused a bus peer (${this.mechanism})`);
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
    const label = 'curve' in this.admits ? this.curveLabel(this.admits.curve, mechanism, creds, address) : this.plainLabel(this.admits.plain, mechanism, creds, address);
    if (label === undefined) {
      await send('400', `${this.mechanism} with ${'curve' in this.admits ? 'an allow-listed key' : "the bus token's subscriber password"} required`);
      return;
    }
    this.admitted++;
    await send('200', 'OK', label);
  }

  /** The allow-list's label of a CURVE client's key; undefined (counted) when refused. */
  private curveLabel(allow: AllowList, mechanism: Buffer, creds: Buffer[], address: Buffer): string | undefined {
    if (mechanism.toString() !== 'CURVE' || creds.length !== 1 || creds[0].length !== 32) {
      this.refuse('wrong_mechanism', { address: address.toString(), mechanism: mechanism.toString('latin1').slice(0, 16) });
      return undefined;
    }
    const key = z85Encode(creds[0]);
    const label = allow.get(key);
    if (label === undefined) this.refuse('unknown_key', { address: address.toString(), key });
    return label;
  }

  /** The user name of a PLAIN peer with the right user and password; undefined (counted) when refused. */
  private plainLabel(want: { user: string; password: string }, mechanism: Buffer, creds: Buffer[], address: Buffer): string | undefined {
    if (mechanism.toString() !== 'PLAIN' || creds.length !== 2) {
      this.refuse('wrong_mechanism', { address: address.toString(), mechanism: mechanism.toString('latin1').slice(0, 16) });
      return undefined;
    }
    const password = Buffer.from(want.password);
    const ok = creds[0].equals(Buffer.from(want.user)) && creds[1].length === password.length && timingSafeEqual(creds[1], password);
    if (!ok) {
      this.refuse('wrong_password', { address: address.toString(), user: creds[0].toString('latin1').slice(0, 32) });
      return undefined;
    }
    return want.user;
  }
}
