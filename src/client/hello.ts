// What the agent knows of this client: the hello (protocol version, the agent's features) and
// which registered regions it has. Said once per agent: again when the mailbox's feature bits
// change (it may be a new agent), after the agent answered again, and after a restart
// (ERR_NO_HELLO); the regions go again with it.
import { ProtocolError, WavebusError } from '../errors';
import type { MailboxReader } from './mailbox';
import type { ClientFeatures } from './options';
import { CLIENT_PROTOCOL_VERSION, protocolMismatch } from './protocol';
import { regionMessage, type ClientRegion } from './region';
import type { AgentTransport, Reply } from './transport';

export class AgentHello {
  /** The features the agent reported; undefined until a hello was answered (or after forget()). */
  features: ClientFeatures | undefined;
  /** The decision ring the agent's hello named (rank_divergence; '' when none). */
  decisionPath = '';
  private featureBits = -1;
  /** The flight recorder's ring the last hello named ('' : the recorder is off); ClientReply.recorder_path. */
  recorderPath = '';
  /** The telemetry ring asked for at hello (tensorBatch(); empty: none) and the path the agent answered ('' : no ring). */
  ringRequest: Record<string, number> = {};
  ringPath = '';
  /** Hellos answered: a new one may be a new agent with a new ring (mapped again). */
  hellos = 0;
  /** Every region register() accepted, in order; kept to send again to a new agent. */
  readonly registered: ClientRegion[] = [];
  private readonly sent = new Set<string>();

  constructor(
    private readonly endpoint: string,
    private readonly transport: AgentTransport,
    private readonly mailbox: MailboxReader,
    private readonly asyncScheduling: boolean,
    private readonly stats: { rejoins: number },
    /** ClientHello.fingerprint (fingerprint.ts): taken once at connect, sent with every hello. */
    private readonly fingerprint: Record<string, unknown> = {},
  ) {}

  /** The features while the mailbox still shows `bits` (the usual step: no hello needed), else undefined. */
  current(bits: number): ClientFeatures | undefined {
    return bits === this.featureBits ? this.features : undefined;
  }

  /** It may be a new agent: the next call introduces us again, regions included. */
  forget(): void {
    this.features = undefined;
    this.sent.clear();
  }

  /** Hello (and the regions it lacks) unless the agent already has them; its features. */
  async ensure(timeoutMs: number): Promise<ClientFeatures> {
    const bits = this.mailbox.features();
    const known = this.current(bits);
    if (known) return known;
    // A first hello, or the agent's features changed (it may be a new agent): regions go again.
    this.sent.clear();
    // Hello and the regions go out back to back (the agent takes them in order), then both are checked.
    const hello = this.transport.request(
      { hello: { pid: process.pid, asyncScheduling: this.asyncScheduling, language: 'typescript', protocolVersion: CLIENT_PROTOCOL_VERSION, fingerprint: this.fingerprint, ...this.ringRequest } },
      timeoutMs,
    );
    const regions = this.flushRegistrations(timeoutMs);
    regions.catch(() => undefined); // checked below, after the hello's own verdict
    const reply = await hello;
    // A version mismatch is refused at once, by either side, naming both versions.
    if (!reply.ok && reply.errorCode === 'ERR_PROTOCOL_VERSION') throw new ProtocolError(`the agent at ${this.endpoint} refused the client: ${reply.error}`, 'ERR_PROTOCOL_VERSION');
    const mismatch = protocolMismatch('client', reply.protocolVersion, `hello to the agent at ${this.endpoint}`);
    if (mismatch) throw mismatch;
    if (!reply.ok) throw new WavebusError(reply.errorCode || 'ERR_AGENT', `agent refused the client: ${reply.error}`);
    if (!reply.features) throw new ProtocolError(`the agent at ${this.endpoint} answered hello without its features (ClientReply.features)`);
    this.features = reply.features as ClientFeatures;
    this.decisionPath = String((reply as { decisionPath?: string }).decisionPath ?? '');
    this.featureBits = bits;
    this.recorderPath = typeof reply.recorderPath === 'string' ? reply.recorderPath : '';
    // Every hello that asks makes a fresh ring file (the same path, a new file): mapped again (hellos says when).
    this.ringPath = typeof reply.ringPath === 'string' ? reply.ringPath : '';
    this.hellos++;
    await regions;
    return this.features;
  }

  /** The registered regions the agent has not got yet. */
  async flushRegistrations(timeoutMs: number): Promise<void> {
    // Sent back to back (the agent handles them in order), then the answers are checked.
    const unsent = this.registered.filter((r) => !this.sent.has(r.name));
    const replies = await Promise.all(unsent.map((r) => this.transport.request({ register: regionMessage(r) }, timeoutMs)));
    replies.forEach((reply, i) => {
      if (!reply.ok) throw new WavebusError(reply.errorCode || 'ERR_REGISTER', `register('${unsent[i].name}'): ${reply.error}`);
      this.sent.add(unsent[i].name);
    });
  }

  /**
   * Forget what the agent knew of us and introduce ourselves again (after an agent restart), then
   * send `retry`. Hello, regions and the retried request go out back to back without waiting on
   * each other (the agent handles one client's requests in order), so it all fits in one bound.
   */
  async rejoin(retry: Record<string, unknown>, timeoutMs: number, capturingMs?: number): Promise<Reply> {
    this.forget();
    this.stats.rejoins++;
    const hello = this.ensure(timeoutMs);
    const again = this.transport.request(retry, timeoutMs, capturingMs);
    again.catch(() => undefined); // awaited below, unless the hello fails first
    await hello;
    return again;
  }
}
