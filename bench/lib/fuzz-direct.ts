// Fuzz target: agent A's direct file socket (src/agent/direct-files.ts, docs/aggregate.md "Direct
// fetch"). The socket is opened the way `wavebus aggregate` opens it (a FileServeRequest relayed
// through the CURVE coordinator); then a client with an allowed CURVE key sends garbage and
// mutations of valid file requests (every CoordinatorMessage kind, garbage roots, paths, offsets,
// lengths and buffer acknowledgements), with the wrong number of parts too. Each message's fate is
// predicted with the socket's own decoder: a counted drop by reason, or exactly one answer of its
// kind. Every served byte is checked against the file under the dumps root; the secret outside the
// roots (also behind links inside them) never comes back. Peers without an allowed key (plain, or
// a stranger's key) are refused at the handshake and counted; the agent still serves afterwards.
import * as fs from 'fs';
import * as path from 'path';
import { Dealer } from 'zeromq';
import { crc32c } from '../../src/artifacts/checksum';
import { MAX_IN_FLIGHT, MAX_REQUEST_BYTES } from '../../src/agent/direct-files';
import { DEFAULT_MAX_FRAME_BYTES } from '../../src/bus/constants';
import { clientSocketOptions, type CurveClientKeys } from '../../src/bus/curve';
import { decodeAgentMessage, decodeCoordinatorMessage, encodeCoordinatorMessage } from '../../src/bus/frames';
import { payloadOf } from '../../src/bus/payload';
import { RelayClient } from '../../src/bus/relay-client';
import { checkFileServeReply, DirectClient } from '../../src/tools/aggregate-direct';
import { FILE_CASES, MARKER, plant } from './fuzz-files';
import { coversOneof, perKind } from './fuzz-kinds';
import { count, diff, droppedFromLog, refusedFromLog, sleep, sum, until, within } from './fuzz-procs';
import { sameCounts, type FuzzTarget } from './fuzz-types';

/** What the file socket does with each CoordinatorMessage kind (direct-files.ts onMessage): serve it, or drop it as unexpected. */
export const DIRECT_BODIES = perKind<'served' | 'unexpected'>(
  'CoordinatorMessage',
  'body',
  { fileList: 'served', fileChunk: 'served', snapshot: 'unexpected', status: 'unexpected', heartbeat: 'unexpected', relay: 'unexpected', refused: 'unexpected', fileServe: 'unexpected', proof: 'unexpected', control: 'unexpected', decidedColumn: 'unexpected', replay: 'unexpected' },
  'the direct file socket model (DIRECT_BODIES)',
);

/** Served requests in flight at most: below the socket's own limit, so no request is answered "busy" (that limit is not what this target tests). */
const WINDOW = Math.floor(MAX_IN_FLIGHT / 2);
/** Frames are cut below the socket's message size limit: libzmq drops a peer that sends more (the oversized frame tests that apart). */
const MAX_FRAME = MAX_REQUEST_BYTES - 1024;
/** Peers of each kind without an allowed key. */
const STRANGERS = 10;
const KV = 'token_repeat/req-1/wave_3/dp0_tp0_pp0_cp0/kv.npy';

export function directCorpus(allowKey: string): Buffer[] {
  const { roots, paths, offsets, lengths } = FILE_CASES;
  const out: Buffer[] = [];
  const id = () => out.length + 1;
  for (const root of roots) {
    for (const prefix of ['', ...paths.slice(0, 8)]) out.push(encodeCoordinatorMessage({ requestId: id(), fileList: { root, prefix } }));
    for (const p of paths) {
      for (let k = 0; k < 2; k++) {
        const offset = offsets[(out.length + k) % offsets.length];
        const length = lengths[(out.length * 7 + k) % lengths.length];
        out.push(encodeCoordinatorMessage({ requestId: id(), fileChunk: { root, path: p, offset, length, received: k === 0 ? [] : [1, 2, out.length, 2 ** 40] } }));
      }
    }
  }
  // every other kind the bus knows: not a file request
  out.push(
    encodeCoordinatorMessage({ requestId: id(), snapshot: { epoch: 1 } }),
    encodeCoordinatorMessage({ requestId: id(), status: { ready: true } }),
    encodeCoordinatorMessage({ requestId: id(), heartbeat: { wave: 1, unixMs: 1 } }),
    encodeCoordinatorMessage({ requestId: id(), relay: { rank: 0, error: 'x' } }),
    encodeCoordinatorMessage({ requestId: id(), refused: { protocolVersion: 1, error: 'x' } }),
    encodeCoordinatorMessage({ requestId: id(), fileServe: { allowKeys: [allowKey] } }),
    encodeCoordinatorMessage({ requestId: id(), proof: { nonce: Buffer.alloc(16, 7) } }),
    encodeCoordinatorMessage({ requestId: id(), control: { protocolVersion: 1, error: 'x' } }),
    encodeCoordinatorMessage({ requestId: id(), decidedColumn: { wave: 5 } }),
    encodeCoordinatorMessage({ requestId: id(), replay: { incident: 'incident-wave1-dp0', calls: [1] } }),
  );
  for (const b of validChunks()) out.push(b);
  coversOneof('CoordinatorMessage', 'body', out.map((b) => (decodeCoordinatorMessage(b, MAX_REQUEST_BYTES) as { value?: { body?: string } }).value?.body), 'direct file socket');
  return out;
}

/** Chunk requests a tool sends for the planted file (each answer checked byte for byte), and a list of the dumps root. */
export function validChunks(): Buffer[] {
  const out: Buffer[] = [encodeCoordinatorMessage({ requestId: 900001, fileList: { root: 'dumps', prefix: '' } })];
  for (const [off, len] of [[0, 2 ** 20], [2 ** 20, 2 ** 21], [3 * 2 ** 20 - 100, 4 * 2 ** 20], [12345, 65536], [7, 1]]) {
    out.push(encodeCoordinatorMessage({ requestId: 900001 + out.length, fileChunk: { root: 'dumps', path: KV, offset: off, length: len } }));
  }
  return out;
}

/**
 * What the file socket does with one message: a counted drop, or one answer of this kind for this
 * request id (and, for a chunk request, the answers it acknowledges: their buffers may be refilled).
 */
export function directFate(parts: Buffer[]): { drop: string } | { served: string; id: number; acks: number[] } {
  if (parts.length !== 1) return { drop: 'frame_count' };
  const d = decodeCoordinatorMessage(parts[0], MAX_REQUEST_BYTES);
  if (!d.ok) return { drop: d.reason };
  const body = d.value.body ?? '';
  if (DIRECT_BODIES[body] !== 'served') return { drop: 'unexpected' };
  const acks = body === 'fileChunk' ? ((d.value.fileChunk?.received ?? []) as unknown[]).map(Number) : [];
  return { served: body, id: Number(d.value.requestId), acks };
}

/** Whether `rel` names a regular file under `root` reached without a link; its real path if so. */
function plainFileUnder(root: string, rel: string): string | undefined {
  let p = root;
  for (const c of rel.split('/')) {
    if (c === '' || c === '.' || c === '..') return undefined;
    p = path.join(p, c);
    try {
      if (fs.lstatSync(p).isSymbolicLink()) return undefined;
    } catch {
      return undefined;
    }
  }
  return fs.statSync(p).isFile() ? p : undefined;
}

function strangerDealer(endpoint: string, serverKey: string, keys?: CurveClientKeys): Dealer {
  const d = new Dealer({ linger: 0, reconnectInterval: -1, sendTimeout: 0, receiveTimeout: 0, ...(keys ? clientSocketOptions({ ...keys, serverPublicKey: serverKey }) : {}) });
  d.connect(endpoint);
  return d;
}

export function directTarget(name: string, jobName: string): FuzzTarget {
  return {
    name,
    async run(ctx) {
      const t0 = Date.now();
      const job = await ctx.job(jobName);
      if (!job.agent || !job.keys) throw new Error(`${name}: job ${jobName} has no agent with CURVE`);
      plant(job);
      const agent = job.agent;
      const dumpRoot = agent.dumpRoot;
      const problems: string[] = [];
      const where = 'rank 0 file socket';
      const dropped0 = droppedFromLog(agent.proc.err, where);
      const refused0 = refusedFromLog(agent.proc.err);
      // The socket as `wavebus aggregate` finds it: asked for through the coordinator.
      const relay = new RelayClient({ host: '127.0.0.1', port: job.coord.port }, DEFAULT_MAX_FRAME_BYTES, job.coord.token, job.keys.fuzzer);
      let served: { endpoint: string; serverKey: string };
      try {
        const r = checkFileServeReply(await relay.fileServe(0, 10000));
        if ('reason' in r) throw new Error(`${name}: agent A did not open its file socket: ${r.reason}`);
        served = r;
      } finally {
        await relay.close();
      }
      const corpus = directCorpus(job.keys.fuzzer.publicKey);
      const valid = validChunks();
      const m = ctx.m;
      const expected: Record<string, number> = {};
      const want: Record<string, number> = {};
      const got: Record<string, number> = {};
      const samples: Record<string, Buffer[]> = {};
      /**
       * Served requests waiting for their answer, by request id: their kinds, and whether a later
       * request acknowledged that id early. The agent may then refill the answer's buffer before
       * ZeroMQ sent it (FileServer's ChunkBuffers trust the peer's acks; a peer that acks what it
       * has not received garbles only its own answers, whose crc32c then shows it): such an
       * answer's bytes are not checked against the file, only for the secret.
       */
      const pending = new Map<number, Array<{ kind: string; acked: boolean }>>();
      let earlyAcked = 0;
      let outstanding = 0;
      let servedBytes = 0;
      let answeredErrors = 0;
      let sent = 0;
      const d = new Dealer({ linger: 0, sendHighWaterMark: 0, maxMessageSize: 2 * DEFAULT_MAX_FRAME_BYTES, ...clientSocketOptions({ ...job.keys.fuzzer, serverPublicKey: served.serverKey }) });
      d.connect(served.endpoint);
      const check = (parts: Buffer[]): void => {
        if (parts.some((p) => p.includes(MARKER))) problems.push(`${name}: an answer carried the secret outside the roots`);
        const a = decodeAgentMessage(parts[0], DEFAULT_MAX_FRAME_BYTES);
        if (!a.ok || parts.length > 2) return void problems.push(`${name}: an answer that does not decode (${a.ok ? `${parts.length} parts` : a.reason})`);
        const msg = a.value;
        const waiting = pending.get(msg.requestId) ?? [];
        const at = waiting.findIndex((w) => w.kind === msg.body);
        if (at < 0) return void problems.push(`${name}: a ${msg.body} answer to request ${msg.requestId}, which asked for ${waiting.map((w) => w.kind).join('/') || 'nothing'}`);
        // Two requests of one kind with one id: either may be this answer.
        const acked = waiting.some((w) => w.kind === msg.body && w.acked);
        waiting.splice(at, 1);
        if (waiting.length === 0) pending.delete(msg.requestId);
        outstanding--;
        count(got, msg.body);
        const inner = msg[msg.body!] as Record<string, any>;
        if (inner.error) {
          answeredErrors++;
          return;
        }
        if (msg.body === 'fileList') {
          if (inner.files.length > 0 && inner.files.some((f: { path: string }) => !plainFileUnder(dumpRoot, f.path))) problems.push(`${name}: a list named a file that is not a plain file under the dumps root: ${JSON.stringify(inner.files.map((f: { path: string }) => f.path)).slice(0, 300)}`);
          return;
        }
        const data = parts[1] ?? Buffer.alloc(0); // a chunk's bytes are the answer's second frame
        servedBytes += data.length;
        if (acked) return void earlyAcked++;
        const file = inner.root === 'dumps' ? plainFileUnder(dumpRoot, String(inner.path)) : undefined;
        if (!file) return void problems.push(`${name}: served ${data.length} bytes of ${inner.root}/${String(inner.path).slice(0, 80)}, not a plain file under the dumps root`);
        const bytes = fs.readFileSync(file).subarray(Number(inner.offset), Number(inner.offset) + data.length);
        if (!bytes.equals(data) || crc32c(data) >>> 0 !== Number(inner.crc32c) >>> 0) problems.push(`${name}: the bytes served for ${inner.path} at ${inner.offset} are not the file's (or their crc32c is wrong)`);
      };
      const drain = (async () => {
        try {
          for await (const parts of d) check(parts);
        } catch {
          /* closed */
        }
      })();
      const send = async (parts: Buffer[]) => {
        const f = directFate(parts);
        if ('drop' in f) {
          count(expected, f.drop);
          samples[f.drop] ??= parts;
        } else {
          count(want, f.served);
          for (const id of f.acks) for (const w of pending.get(id) ?? []) w.acked = true;
          pending.set(f.id, [...(pending.get(f.id) ?? []), { kind: f.served, acked: false }]);
          outstanding++;
          while (outstanding > WINDOW) await sleep(2);
        }
        sent++;
        await d.send(parts);
      };
      for (let i = 0; i < ctx.frames; i++) {
        const make = () => {
          const r = m.rand();
          const b = r < 0.15 ? m.pick(valid) : r < 0.4 ? m.pick(corpus) : m.mutate(m.pick(corpus));
          return b.length > MAX_FRAME ? b.subarray(0, MAX_FRAME) : b;
        };
        await send(m.parts(make, 1));
      }
      // Peers without an allowed key: none gets an answer; each is counted at the handshake.
      const refusedWant: Record<string, number> = {};
      const strangers: Dealer[] = [];
      const tryStrangers = (n: number) => {
        for (let i = 0; i < n; i++) {
          strangers.push(strangerDealer(served.endpoint, served.serverKey));
          count(refusedWant, 'handshake_failed');
          strangers.push(strangerDealer(served.endpoint, served.serverKey, job.keys!.stranger));
          count(refusedWant, 'unknown_key');
        }
      };
      tryStrangers(STRANGERS);
      let hung = false;
      await until(() => outstanding === 0, `${name}: the agent to answer every served request`, 120000).catch((e) => {
        hung = true;
        problems.push(`${String(e)} (${outstanding} outstanding)`);
      });
      // A frame over the size limit: libzmq drops that peer; nothing is counted or answered.
      let oversized: string | undefined;
      if (ctx.oversized) {
        const big = new Dealer({ linger: 0, reconnectInterval: -1, ...clientSocketOptions({ ...job.keys.fuzzer, serverPublicKey: served.serverKey }) });
        const gone = new Promise<boolean>((r) => big.events.on('disconnect', () => r(true)));
        big.connect(served.endpoint);
        await big.send(Buffer.alloc(MAX_REQUEST_BYTES + 1));
        oversized = (await within(gone, 10000, false)) ? 'peer dropped' : 'peer kept';
        if (oversized !== 'peer dropped') problems.push(`${name}: a ${MAX_REQUEST_BYTES + 1}-byte frame did not get its peer dropped`);
        big.close();
      }
      // Each reason's running total is logged at most every 5 s: wait that out, then one more
      // message per reason (and one more refused peer of each kind) logs the final totals.
      await sleep(5200);
      for (const parts of Object.values(samples)) await send(parts);
      tryStrangers(1);
      const dropped = () => diff(droppedFromLog(agent.proc.err, where), dropped0);
      const refused = () => diff(refusedFromLog(agent.proc.err), refused0);
      await until(() => Object.keys(expected).every((k) => (dropped()[k] ?? 0) >= expected[k]) && Object.keys(refusedWant).every((k) => (refused()[k] ?? 0) >= refusedWant[k]), `${name}: agent A to log its drop and refusal totals`, 60000).catch((e) => {
        hung = true;
        problems.push(String(e));
      });
      await until(() => outstanding === 0, `${name}: the last answers`, 30000).catch((e) => problems.push(String(e)));
      let strangerAnswers = 0;
      for (const s of strangers) {
        try {
          await s.send(Buffer.from('x'));
          await s.receive();
          strangerAnswers++;
        } catch {
          /* refused: no pipe, nothing sent or received */
        }
        s.close();
      }
      await sleep(300); // anything beyond the prediction shows now
      d.close();
      await drain;
      if (strangerAnswers > 0) problems.push(`${name}: ${strangerAnswers} peers without an allowed key got an answer`);
      const droppedNow = dropped();
      const refusedNow = refused();
      const accounted = sameCounts(droppedNow, expected) && sameCounts(got, want) && sameCounts(refusedNow, refusedWant) && strangerAnswers === 0 && problems.length === 0;
      if (!accounted) problems.push(`${name}: dropped ${JSON.stringify(droppedNow)}, answered ${JSON.stringify(got)}, refused ${JSON.stringify(refusedNow)}; expected ${JSON.stringify(expected)}, ${JSON.stringify(want)}, ${JSON.stringify(refusedWant)}`);
      // Alive: a tool's direct client gets a whole, correct chunk after all that.
      let alive = !agent.proc.exit;
      const client = new DirectClient(0, served.endpoint, served.serverKey, job.keys.fuzzer, false);
      try {
        const c = await client.fileChunk(0, { root: 'dumps', path: KV, offset: 2 ** 20, length: 2 ** 20 }, 10000);
        const data = payloadOf(c);
        if (!data || !data.equals(fs.readFileSync(path.join(dumpRoot, KV)).subarray(2 ** 20, 2 ** 21))) throw new Error('wrong bytes');
      } catch (e) {
        alive = false;
        problems.push(`${name}: no correct chunk after the garbage: ${String(e)}`);
      } finally {
        await client.close();
      }
      return {
        socket: name, frames: ctx.frames, seconds: (Date.now() - t0) / 1000, sent, accepted: sum(got), dropped: droppedNow, expected_dropped: expected, refused: refusedNow,
        replies: { got, expected: want }, answered_errors: answeredErrors, served_bytes: servedBytes, early_acked: earlyAcked, ...(oversized ? { oversized } : {}), accounted, hung, alive, problems,
      };
    },
  };
}
