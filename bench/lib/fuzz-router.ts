// Fuzz targets on the coordinator's ROUTER: mutated AgentMessages and garbage, with and without
// the bus token (no MAC, wrong MACs, MACs of the wrong direction, mutations of MACed messages,
// MACed garbage from a holder of the token), through CURVE with an allowed key, hellos of every
// protocol version, and peers without an allowed key (refused at the handshake, counted).
import { Dealer } from 'zeromq';
import type { BusToken } from '../../src/bus/auth';
import { DEFAULT_MAX_FRAME_BYTES } from '../../src/bus/constants';
import { clientSocketOptions, type CurveClientKeys } from '../../src/bus/curve';
import { decodeCoordinatorMessage } from '../../src/bus/frames';
import { tcpEndpoint } from '../../src/bus/endpoints';
import { agentCorpus, CoordinatorModel, helloCorpus, type Job } from './fuzz-coordinator';
import type { Mutator } from './fuzz-mutator';
import { count, diff, sleep, statusOf, sum, until } from './fuzz-procs';
import { perKind } from './fuzz-kinds';
import { sameCounts, type FuzzCtx, type FuzzTarget, type SocketResult } from './fuzz-types';

/** One message for the ROUTER: a mutation of a valid one, with a MAC in every way a peer could get it wrong. */
export function routerMessage(m: Mutator, corpus: Buffer[], token?: BusToken): Buffer[] {
  let parts = m.parts(() => m.mutate(m.pick(corpus)), 1);
  // a chunk header (or anything) followed by a data frame
  if (m.rand() < 0.05) parts = [m.mutate(m.pick(corpus)), m.bytes(m.int(64))];
  if (!token) return parts;
  const r = m.rand();
  if (r < 0.25) return parts; // no MAC at all
  const [p, d] = [parts[0], parts[1]];
  if (r < 0.6 && parts.length <= 2) return [token.seal('to-coordinator', p, d), ...(d ? [d] : [])]; // MACed garbage
  if (r < 0.7) return [token.seal(m.pick(['pub', 'from-coordinator'] as const), m.pick(corpus))]; // a MAC of another direction
  return [m.mutate(token.seal('to-coordinator', m.pick(corpus)))]; // a MACed valid message, mutated
}

/**
 * What each CoordinatorMessage kind the fuzzer's connection gets is: an immediate reply (predicted
 * by the model), a relay reply (predicted with waitRelays: it waits on an agent), a request the
 * coordinator forwards from a relay to the rank this connection said Hello as (a consequence of
 * relays, as unpredicted as their replies without waitRelays), or never sent on the ROUTER.
 */
export const ROUTER_REPLIES = perKind<'reply' | 'relay' | 'forwarded' | 'never'>(
  'CoordinatorMessage',
  'body',
  { snapshot: 'reply', status: 'reply', refused: 'reply', proof: 'reply', control: 'reply', relay: 'relay', fileList: 'forwarded', fileChunk: 'forwarded', fileServe: 'forwarded', replay: 'forwarded', heartbeat: 'never', decidedColumn: 'never' /* asked only after two ranks' digests differ, with rank_divergence on (off here) */ },
  'the coordinator model (ROUTER_REPLIES)',
);

/** Bodies of what the coordinator sent back to the fuzzer, counted by kind. */
function replyCounter(d: Dealer, token: BusToken | undefined, forwardedIds: Set<number>, onReply?: (parts: Buffer[]) => void): { got: Record<string, number>; forwardedIds: Set<number>; done: Promise<void> } {
  const got: Record<string, number> = {};
  const done = (async () => {
    try {
      for await (const parts of d) {
        onReply?.(parts);
        const r = decodeCoordinatorMessage(parts[0], DEFAULT_MAX_FRAME_BYTES, token, parts[1]);
        const kind = r.ok ? (r.value.body ?? 'empty') : `undecodable_${r.reason}`;
        count(got, kind);
        if (r.ok && ROUTER_REPLIES[kind] === 'forwarded') forwardedIds.add(Number(r.value.requestId));
      }
    } catch {
      /* closed */
    }
  })();
  return { got, forwardedIds, done };
}

/** The replies the model predicts: immediate ones, relay replies with waitRelays, and none of the kinds that never come; never forwarded requests. */
function predictable(got: Record<string, number>, waitRelays?: boolean): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(got)) {
    const kind = ROUTER_REPLIES[k]; // undefined: an undecodable answer; 'never': one that must not come (both compared, so a problem)
    if (kind !== 'forwarded' && !(kind === 'relay' && !waitRelays)) out[k] = v;
  }
  return out;
}

export function fuzzDealer(job: Job, keys?: CurveClientKeys): Dealer {
  const d = new Dealer({ linger: 0, sendHighWaterMark: 0, ...clientSocketOptions(keys ?? job.coord.curve) });
  d.connect(tcpEndpoint('127.0.0.1', job.coord.port + 1));
  return d;
}

/**
 * Send `frames` messages made by `make` on one connection, predict each one's fate, then wait for
 * the coordinator's counters and replies to show exactly that. Relay replies are not predicted
 * (they wait on an agent): only the immediate ones are compared.
 */
/** Relay requests in flight at most (waitRelays). */
const RELAY_WINDOW = 256;

export interface RouterOptions {
  token?: BusToken;
  /** Every reply as it arrives. */
  onReply?: (parts: Buffer[]) => void;
  /**
   * Relay replies are predicted too (one per relay request that gets through), and an agent's
   * answer that comes after its relay timed out is a drop of the stream state ('unknown_request'),
   * at most one per relay.
   */
  waitRelays?: boolean;
}

export async function fuzzRouter(ctx: FuzzCtx, socket: string, job: Job, make: () => Buffer[], opts: RouterOptions): Promise<SocketResult> {
  const t0 = Date.now();
  const problems: string[] = [];
  const before = await statusOf(job.coord);
  const polls0 = job.coord.polls;
  const model = new CoordinatorModel(new Set(job.registered), opts.token);
  const expected: Record<string, number> = {};
  const replies: Record<string, number> = {};
  const d = fuzzDealer(job);
  const rc = replyCounter(d, opts.token, job.forwardedIds, opts.onReply);
  let sent = 0;
  // Answers predicted as asked by nobody, by request id: the coordinator takes one instead when its
  // id is a request it forwarded (from a relay) to this connection, or to an earlier target's
  // connection of the same rank, and still waits on.
  const answerIds: number[] = [];
  const takenAsAnswers = () => answerIds.filter((id) => rc.forwardedIds.has(id)).length;
  const send = async (parts: Buffer[]) => {
    const f = model.fate(parts);
    count(expected, f.drop);
    if (f.answerId !== undefined) answerIds.push(f.answerId);
    if (f.reply !== 'relay' || opts.waitRelays) count(replies, f.reply);
    // Relays in flight are bounded, as `wavebus aggregate` bounds its own (--window): the target
    // tests what each request gets, not how deep the coordinator's queue to an agent is.
    if (f.reply === 'relay' && opts.waitRelays) {
      while ((replies.relay ?? 0) - (rc.got.relay ?? 0) > RELAY_WINDOW) await sleep(2);
    }
    sent++;
    await d.send(parts);
  };
  for (let i = 0; i < ctx.frames; i++) await send(make());
  if (ctx.oversized) await send([Buffer.alloc(DEFAULT_MAX_FRAME_BYTES + 1)]);
  let hung = false;
  let after = before;
  // The ROUTER handles one connection's messages in order: all are in once the counts are reached.
  await until(
    async () => {
      after = await statusOf(job.coord, 5000);
      const got = diff(after.dropped, before.dropped);
      const immediate = predictable(rc.got, opts.waitRelays);
      const short = (k: string) => (k === 'unknown_request' ? takenAsAnswers() : 0);
      return Object.keys(expected).every((k) => (got[k] ?? 0) >= expected[k] - short(k)) && Object.keys(replies).every((k) => (immediate[k] ?? 0) >= replies[k]);
    },
    `the ${socket} coordinator to take every frame`,
    300000,
  ).catch((e) => {
    hung = true;
    problems.push(String(e));
  });
  await sleep(300); // anything beyond the prediction shows now
  after = await statusOf(job.coord, 5000).catch(() => after);
  d.close();
  await rc.done;
  for (const r of model.hellos) job.registered.add(r);
  const dropped = diff(after.dropped, before.dropped);
  const received = after.received - before.received;
  const polls = job.coord.polls - polls0;
  const got = predictable(rc.got, opts.waitRelays);
  const forwarded = sum(Object.fromEntries(Object.entries(rc.got).filter(([k]) => ROUTER_REPLIES[k] === 'forwarded')));
  // Late agent answers to relays that timed out: counted drops, not predictable from the bytes.
  const late = opts.waitRelays ? (dropped.unknown_request ?? 0) - (expected.unknown_request ?? 0) : 0;
  if (late > 0 && late <= (replies.relay ?? 0)) {
    dropped.unknown_request -= late;
    if (dropped.unknown_request === 0) delete dropped.unknown_request;
  }
  // Answers the coordinator took as answers to requests it had forwarded to us: at most the answers
  // whose id was one of those requests', never more (accounted as such, not as drops).
  const maybeTaken = takenAsAnswers();
  const taken = (expected.unknown_request ?? 0) - (dropped.unknown_request ?? 0);
  const answered = taken > 0 && taken <= maybeTaken ? taken : 0;
  if (answered > 0) {
    expected.unknown_request -= answered;
    if (expected.unknown_request === 0) delete expected.unknown_request;
  }
  const accepted = sent - sum(expected);
  // Without an agent, everything the ROUTER received is ours: the frames and the status polls.
  const exactReceived = job.agent ? received >= sent + polls : received === sent + polls;
  const accounted = sameCounts(dropped, expected) && sameCounts(got, replies) && exactReceived && received - polls - sum(dropped) >= accepted;
  if (!accounted) problems.push(`${socket}: got drops ${JSON.stringify(dropped)}, replies ${JSON.stringify(got)}, received ${received} (polls ${polls}); expected drops ${JSON.stringify(expected)}, replies ${JSON.stringify(replies)}, sent ${sent}`);
  let alive = false;
  try {
    await statusOf(job.coord, 5000);
    alive = true;
  } catch (e) {
    problems.push(`${socket}: no status after the garbage: ${String(e)}`);
  }
  return { socket, frames: ctx.frames, seconds: (Date.now() - t0) / 1000, sent, accepted, dropped, expected_dropped: expected, replies: { got, expected: replies }, received, ...(late > 0 ? { late_agent_answers: late } : {}), ...(forwarded > 0 ? { forwarded_requests: forwarded } : {}), ...(answered > 0 ? { answers_to_forwarded: answered } : {}), accounted, hung, alive, problems };
}

/** The ROUTER of a job's coordinator, with the valid corpus mutated. */
export function routerTarget(name: string, jobName: string): FuzzTarget {
  return {
    name,
    async run(ctx) {
      const job = await ctx.job(jobName);
      const corpus = agentCorpus();
      // Agent A (when the job has one) said Hello as rank 0 on its own connection.
      return fuzzRouter(ctx, name, job, () => routerMessage(ctx.m, corpus, job.coord.token), { token: job.coord.token });
    },
  };
}

/** Hellos and status requests of every protocol version, old and future, valid and mutated, on one connection. */
export function helloTarget(name: string, jobName: string): FuzzTarget {
  return {
    name,
    async run(ctx) {
      const job = await ctx.job(jobName);
      const corpus = helloCorpus();
      const m = ctx.m;
      const make = () => {
        const valid = m.pick(corpus);
        const parts = m.rand() < 0.5 ? [valid] : [m.mutate(valid)];
        return job.coord.token && m.rand() < 0.9 ? [job.coord.token.seal('to-coordinator', parts[0])] : parts;
      };
      return fuzzRouter(ctx, name, job, make, { token: job.coord.token });
    },
  };
}

/**
 * Peers without an allowed key: a plain-text DEALER, and CURVE DEALERs with a key not on the
 * allow-list. Each connects once (no reconnect) and sends a request; none is answered, each is
 * counted as refused at the handshake, and the coordinator still answers an allowed client.
 */
export function refusalTarget(name: string, jobName: string, peers = 40): FuzzTarget {
  return {
    name,
    async run(ctx) {
      const t0 = Date.now();
      const job = await ctx.job(jobName);
      if (!job.keys) throw new Error(`${name}: job ${jobName} has no CURVE keys`);
      const problems: string[] = [];
      const before = (await statusOf(job.coord)).security?.refused ?? {};
      const expected: Record<string, number> = {};
      let answered = 0;
      const socks: Dealer[] = [];
      for (let i = 0; i < peers; i++) {
        const stranger = i % 2 === 1;
        const d = new Dealer({ linger: 0, reconnectInterval: -1, sendTimeout: 0, receiveTimeout: 0, ...(stranger ? clientSocketOptions(job.keys.stranger) : {}) });
        d.connect(tcpEndpoint('127.0.0.1', job.coord.port + 1));
        count(expected, stranger ? 'unknown_key' : 'handshake_failed');
        socks.push(d);
      }
      let refused: Record<string, number> = {};
      let hung = false;
      await until(
        async () => {
          refused = diff((await statusOf(job.coord)).security?.refused ?? {}, before);
          return Object.keys(expected).every((k) => (refused[k] ?? 0) >= expected[k]);
        },
        `${name}: every refused peer counted`,
        60000,
      ).catch((e) => {
        hung = true;
        problems.push(String(e));
      });
      for (const d of socks) {
        try {
          await d.send(Buffer.from('x'));
          await d.receive();
          answered++;
        } catch {
          /* refused: no pipe, nothing sent or received */
        }
        d.close();
      }
      await sleep(300);
      refused = diff((await statusOf(job.coord)).security?.refused ?? {}, before);
      if (answered > 0) problems.push(`${name}: ${answered} peers without an allowed key got an answer`);
      const accounted = sameCounts(refused, expected) && answered === 0;
      if (!accounted) problems.push(`${name}: refused ${JSON.stringify(refused)}, expected ${JSON.stringify(expected)}`);
      let alive = false;
      try {
        await statusOf(job.coord, 5000);
        alive = true;
      } catch (e) {
        problems.push(`${name}: no status after the refusals: ${String(e)}`);
      }
      return { socket: name, frames: peers, seconds: (Date.now() - t0) / 1000, sent: peers, accepted: 0, dropped: {}, expected_dropped: {}, refused, accounted, hung, alive, problems };
    },
  };
}
