// Direct file serving for `wavebus aggregate` on a job with CURVE (docs/aggregate.md): instead of
// every chunk crossing two CURVE hops (agent -> coordinator -> tool, the coordinator decrypting
// and re-encrypting each byte), the agent serves its files itself on a CURVE ROUTER of its own.
// The socket exists only once the coordinator asked for it (a FileServeRequest over the agent's
// authenticated bus connection), with a fresh key pair of this process, admitting only the client
// keys the coordinator sent: the coordinator's own allow-list. Every request goes through the same
// FileServer (roots local, no links, chunk size limit) as relayed ones; anything else is dropped
// and counted, never answered with more than an error.
import * as dgram from 'dgram';
import { Context, Router } from 'zeromq';
import { FileServer, type ServeRoots } from './file-server';
import { decodeCoordinatorMessage, DropCounter, encodeAgentMessage, type CoordinatorMsg } from '../bus/frames';
import { isZ85Key, newKeyPair, serverSocketOptions, type AllowList } from '../bus/curve';
import { ZapHandler } from '../bus/zap-handler';
import { payloadOf } from '../bus/payload';
import { receiveLoop } from '../bus/receive-loop';
import { SendQueue } from '../bus/send-queue';
import { socketIpOptions, tcpEndpoint, type HostPort } from '../bus/endpoints';
import { watchHandshakes } from '../bus/server-sockets';
import type { Logger } from '../log';

/** A request on the file socket is a small protobuf (a chunk's bytes only ever go the other way). */
export const MAX_REQUEST_BYTES = 64 * 1024;
/** Requests served at once; more are answered with an error (each may hold a 4 MiB read). */
export const MAX_IN_FLIGHT = 64;
/** Peers whose chunk buffers are tracked apart; beyond that the numbering starts over (a reused number only stops buffer reuse). */
const MAX_PEERS = 1024;

export interface DirectFilesOptions {
  globalRank: number;
  /** The served roots, read on every request (FileServer). */
  roots: () => ServeRoots;
  /** The coordinator: the socket binds this host's address toward it unless `host` is given. */
  coordinator: HostPort;
  /** --direct-files=false: every FileServeRequest is answered with an error (tools use the relay). */
  enabled: boolean;
  /** --direct-files-host: the address to bind. */
  host?: string;
  /** --direct-files-port: the port to bind (0: an ephemeral one). */
  port?: number;
  log: Logger;
}

/**
 * The local address this host uses toward `to`: a UDP socket `connect`ed there (which sends
 * nothing) reports the source address the routing table picks.
 */
export function localAddressToward(to: HostPort): Promise<string> {
  return new Promise((resolve, reject) => {
    const family = to.host.includes(':') ? 'udp6' : 'udp4';
    const s = dgram.createSocket(family);
    s.once('error', (e) => {
      s.close();
      reject(e);
    });
    s.connect(to.port || 9, to.host, () => {
      const a = s.address().address;
      s.close();
      resolve(a);
    });
  });
}

export class DirectFiles {
  private readonly allow: AllowList = new Map();
  private readonly server: FileServer;
  private started?: Promise<{ endpoint: string; serverKey: string }>;
  private router?: Router;
  private zap?: ZapHandler;
  private sends?: SendQueue;
  private loop?: Promise<void>;
  private running = false;
  private inFlight = 0;
  private readonly peers = new Map<string, number>();
  /** What came to the file socket and was not a file request, by reason. */
  readonly drops: DropCounter;

  constructor(private readonly opts: DirectFilesOptions) {
    // Buffers are reused once the tool says it received an answer whole (FileChunkRequest.received).
    this.server = new FileServer(opts.globalRank, opts.roots, opts.log);
    this.drops = new DropCounter(opts.log, `rank ${opts.globalRank} file socket`);
  }

  /** Refusals on the file socket (ZAP), by reason. */
  get refused(): Record<string, number> {
    return this.zap?.refused ?? {};
  }

  get endpoint(): string | undefined {
    return this.router?.lastEndpoint ?? undefined;
  }

  /** Answers a FileServeRequest from the coordinator with a FileServeReply body. */
  async handle(req: CoordinatorMsg): Promise<Record<string, unknown>> {
    const fail = (error: string) => ({ fileServe: { globalRank: this.opts.globalRank, error } });
    if (!this.opts.enabled) return fail(`rank ${this.opts.globalRank}: direct file serving is off on this agent (--direct-files=false)`);
    const keys = ((req.fileServe?.allowKeys ?? []) as unknown[]).filter((k): k is string => typeof k === 'string' && isZ85Key(k));
    if (keys.length === 0) return fail(`rank ${this.opts.globalRank}: the file serve request names no valid client key`);
    // The coordinator's current allow-list, replacing the last one (the ZAP handler reads this map).
    this.allow.clear();
    for (const k of keys) this.allow.set(k, 'allowed by the coordinator');
    try {
      const s = await (this.started ??= this.start());
      return { fileServe: { globalRank: this.opts.globalRank, endpoint: s.endpoint, serverKey: s.serverKey } };
    } catch (e) {
      this.started = undefined;
      return fail(`rank ${this.opts.globalRank}: cannot open the file socket: ${String((e as Error)?.message ?? e)}`);
    }
  }

  private async start(): Promise<{ endpoint: string; serverKey: string }> {
    const host = this.opts.host ?? (await localAddressToward(this.opts.coordinator));
    const keyPair = newKeyPair();
    // An own context: its ZAP handler (one per context) answers for this socket alone.
    const context = new Context();
    // Refusals are counted by reason (refused) and logged with their running total.
    const zap = new ZapHandler(context, { curve: this.allow }, this.opts.log);
    await zap.start();
    const router = new Router({ context, linger: 0, maxMessageSize: MAX_REQUEST_BYTES, ...socketIpOptions(host), ...serverSocketOptions({ keyPair, allow: this.allow }) });
    watchHandshakes(router, zap);
    try {
      await router.bind(tcpEndpoint(host, this.opts.port ?? 0));
    } catch (e) {
      router.close();
      await zap.stop();
      throw e;
    }
    this.router = router;
    this.zap = zap;
    this.running = true;
    this.sends = new SendQueue(router, (e) => this.opts.log.warn({ err: String(e) }, 'file socket: an answer could not be sent'));
    this.loop = receiveLoop(router, { role: 'file ROUTER', what: 'a file request', running: () => this.running, log: this.opts.log }, (parts) => this.onMessage(parts));
    const endpoint = router.lastEndpoint!;
    this.opts.log.info({ rank: this.opts.globalRank, endpoint, allowed: this.allow.size }, 'serving files directly (CURVE)');
    return { endpoint, serverKey: keyPair.publicKey };
  }

  /** [routing id, CoordinatorMessage{fileChunk|fileList}] → [routing id, AgentMessage (, bytes)]. */
  private onMessage(parts: Buffer[]): void {
    if (parts.length !== 2) return this.drops.drop('frame_count', `${parts.length - 1} frames`);
    const [route, body] = parts;
    const d = decodeCoordinatorMessage(body, MAX_REQUEST_BYTES);
    if (!d.ok) return this.drops.drop(d.reason, d.detail);
    const msg = d.value;
    if (msg.body !== 'fileChunk' && msg.body !== 'fileList') return this.drops.drop('unexpected', `a ${msg.body} message`);
    const requestId = Number(msg.requestId);
    if (this.inFlight >= MAX_IN_FLIGHT) {
      this.drops.drop('busy', `${this.inFlight} requests in flight`);
      return this.reply(route, { requestId, [msg.body]: { globalRank: this.opts.globalRank, error: `rank ${this.opts.globalRank}: busy (${MAX_IN_FLIGHT} requests in flight); ask again` } });
    }
    // Chunk buffers are keyed by peer (as the bus keys them by epoch): a peer acknowledges its own answers only.
    const hex = route.toString('hex');
    let peer = this.peers.get(hex);
    if (peer === undefined) {
      if (this.peers.size >= MAX_PEERS) this.peers.clear();
      peer = this.peers.size + 1;
      this.peers.set(hex, peer);
    }
    this.inFlight++;
    this.server
      .handle({ ...msg, epoch: peer, requestId })
      .then(
        (answer) => this.reply(route, { requestId, ...answer }, payloadOf(answer)),
        (e) => this.reply(route, { requestId, [msg.body!]: { globalRank: this.opts.globalRank, error: String((e as Error)?.message ?? e) } }),
      )
      .finally(() => this.inFlight--);
  }

  private reply(route: Buffer, m: Record<string, unknown>, payload?: Buffer): void {
    if (!this.running) return;
    const enc = encodeAgentMessage({ globalRank: this.opts.globalRank, ...m });
    this.sends!.push(payload ? [route, enc, payload] : [route, enc]);
  }

  async stop(): Promise<void> {
    this.running = false;
    const started = this.started;
    this.started = undefined;
    await started?.catch(() => undefined);
    await this.sends?.idle();
    this.router?.close();
    await this.loop;
    await this.zap?.stop();
  }
}

/** The agent's settings for its file socket (--direct-files, --direct-files-host, --direct-files-port). */
export interface DirectFilesSettings {
  enabled: boolean;
  host?: string;
  port?: number;
}

/**
 * An agent's file socket, or none: only a job with CURVE can authenticate a tool on a socket of
 * the agent's own, and `enabled` false turns it off. Nothing is bound until the coordinator asks
 * (handle()); the agent closes it with stop().
 */
export function agentDirectFiles(
  curve: boolean,
  settings: DirectFilesSettings | undefined,
  base: Pick<DirectFilesOptions, 'globalRank' | 'roots' | 'coordinator' | 'log'>,
): DirectFiles | undefined {
  if (!curve || settings?.enabled === false) return undefined;
  return new DirectFiles({ ...base, enabled: true, host: settings?.host, port: settings?.port });
}

/** An agent's bus request handler: file lists and chunks from its FileServer, file serve requests to `direct`. */
export function fileRequestHandler(files: FileServer, direct: DirectFiles | undefined, globalRank: number): (req: CoordinatorMsg) => Promise<Record<string, unknown>> {
  return (req) => {
    if (req.body !== 'fileServe') return files.handle(req);
    if (!direct) return Promise.resolve({ fileServe: { globalRank, error: `rank ${globalRank}: this agent does not serve files directly` } });
    return direct.handle(req);
  };
}
