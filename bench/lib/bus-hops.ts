// CPU per hop of one wave on the bus, measured in this process call by call (the bus runs the
// same code in the coordinator and the agents): what each step costs before scheduling and the
// network add theirs. Median and p99 of single calls, µs.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { randomBytes } from 'crypto';
import { BusToken, TRAILER_BYTES } from '../../src/bus/auth';
import { DropCounter, decodeBusFrame, encodeBusFrame } from '../../src/bus/frames';
import { openRouterMessage } from '../../src/bus/router-inbox';
import { agentWaveHead, oneWayWaveHead, waveHeadBytes } from '../../src/bus/wave-head-relay';
import { ColumnScratch, columnsToWire, TelemetryColumnizer } from '../../src/client/telemetry';
import { WaveBook } from '../../src/agent/wave-book';
import { MailboxWriter } from '../../src/client/mailbox';
import { ClientRequest, encodeTrusted, messageType } from '../../src/proto';
import { DEFAULT_MAX_FRAME_BYTES } from '../../src/bus/constants';
import { p50p99 } from './bus-receipts';

const CALLS = 5000;

function time(fn: (i: number) => void): { p50_us: number; p99_us: number } {
  for (let i = 0; i < 500; i++) fn(i); // warm the JIT
  const xs: number[] = [];
  for (let i = 0; i < CALLS; i++) {
    const t0 = process.hrtime.bigint();
    fn(i);
    xs.push(Number(process.hrtime.bigint() - t0) / 1000);
  }
  const { p50_us, p99_us } = p50p99(xs);
  return { p50_us, p99_us };
}

/** One entry per CPU step of a wave head's round trip, with and without the bus token. */
export function cpuHops(): Record<string, { p50_us: number; p99_us: number }> {
  const token = BusToken.fromBytes(randomBytes(32));
  const epoch = 123456789;
  const head = (seq: number) => ({ epoch, seq, wave: seq, configDue: false, dumpDue: false });
  const [topic, frame] = encodeBusFrame(epoch, 1, 'head', head(1), true);
  const topicBuf = Buffer.from(topic, 'latin1');
  const sealed = token.seal('pub', frame, undefined, topicBuf);
  const waveHeadReq = encodeTrusted(messageType('WaveHeadRequest'), { wave: 1000 });
  const relayed = token.seal('to-coordinator', agentWaveHead(3, epoch, waveHeadReq));
  // A tensor-path head of 1024 running requests, as TP0's agent relays it from the ring: what the
  // columns add to a wave against a head without them (the detectors-in-the-agent question,
  // docs/benchmarks.md).
  const rows = 1024;
  const u32 = (f: (i: number) => number) => Buffer.from(Uint32Array.from({ length: rows }, (_, i) => f(i)).buffer);
  const columns = { rows, slot: u32((i) => i), flags: Buffer.alloc(rows), tokenCount: u32(() => 1), tokenIds: u32((i) => (i * 7) % 32000), tokenLogprobs: Buffer.from(new Float32Array(rows).fill(-0.5).buffer), draftLen: u32(() => 3), accepted: u32(() => 2) };
  const columnsHead = encodeTrusted(messageType('WaveHeadRequest'), { wave: 1000, telemetry: { wave: 999, columns } });
  const relaySealed = (h: Uint8Array): Buffer => {
    const m = agentWaveHead(3, epoch, h, TRAILER_BYTES);
    return token.sealInPlace('to-coordinator', m, m.length - TRAILER_BYTES);
  };
  const relayedColumns = relaySealed(columnsHead);
  // The client's wave head as the engine sends it: telemetry of a 64-request batch.
  const batch = Array.from({ length: 64 }, (_, i) => ({ reqId: `req-${i}`, newTokenIds: [100 + i], newTokenLogprobs: [-0.5], newTokenRanks: [], draftLen: 0, accepted: 0, blockIds: [i, i + 64], finished: false, freed: false, promptLen: 100, numOutputTokens: 10 }));
  const clientHead = encodeTrusted(ClientRequest, { id: 0, waveHead: { wave: 1000, telemetry: { wave: 999, columns: columnsToWire(new TelemetryColumnizer().columns(batch)) } } });
  const book = new WaveBook();
  const drops = new DropCounter(undefined, 'bench');
  const scratch = new ColumnScratch();
  const routingId = Buffer.from([0, 1, 2, 3, 4]);
  const dir = fs.mkdtempSync(path.join(fs.existsSync('/dev/shm') ? '/dev/shm' : os.tmpdir(), 'wavebus-bench-'));
  const mailbox = MailboxWriter.create(path.join(dir, 'mailbox'));
  try {
    return {
      // agent: the client's wave head forwarded to the coordinator (bytes as they came, + MAC)
      // agent 0: its client's wave head (64 requests' telemetry) taken for the relay, as it does now
      // (a walk of the fields) and as it did before 6c6d13e (a full decode), for comparison
      agent_take_client_wave_head: time(() => oneWayWaveHead(clientHead)),
      agent_take_client_wave_head_by_decode: time(() => (ClientRequest.decode(clientHead), waveHeadBytes(clientHead))),
      agent_relay_wave_head: time(() => agentWaveHead(3, epoch, waveHeadReq)),
      // agent: its record of the waves on a vector's arrival (bounded history)
      agent_wave_book_arrive: time((i) => book.arrive(i + 1, i - 1)),
      agent_relay_seal: time(() => token.seal('to-coordinator', agentWaveHead(3, epoch, waveHeadReq))),
      // coordinator: open + decode the relayed wave head (no telemetry)
      coordinator_open_wave_head: time(() => openRouterMessage([routingId, relayed], DEFAULT_MAX_FRAME_BYTES, token, scratch, drops)),
      // the same two hops for a head with 1024 requests' columns (~25 KB)
      agent_relay_seal_1024_columns: time(() => relaySealed(columnsHead)),
      coordinator_open_wave_head_1024_columns: time(() => openRouterMessage([routingId, relayedColumns], DEFAULT_MAX_FRAME_BYTES, token, scratch, drops)),
      // coordinator: the head frame published
      coordinator_encode_head: time((i) => encodeBusFrame(epoch, i + 1, 'head', head(i + 1), true)),
      coordinator_seal_head: time(() => token.seal('pub', frame, undefined, topicBuf)),
      // agent: the head frame received
      agent_open_head: time(() => token.open('pub', sealed, undefined, topicBuf)),
      agent_decode_head: time(() => decodeBusFrame([topicBuf, frame], DEFAULT_MAX_FRAME_BYTES)),
      agent_open_decode_head: time(() => decodeBusFrame([topicBuf, sealed], DEFAULT_MAX_FRAME_BYTES, token)),
      // agent: the vector into the client's mailbox (seqlock write + futex wake)
      agent_mailbox_write: time((i) => mailbox.publish({ wave: i + 1, configDue: 0, dumpDue: 0 })),
    };
  } finally {
    mailbox.close({ unlink: true });
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
