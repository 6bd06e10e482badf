// The agent relays its client's one-way wave head to the coordinator byte for byte
// (src/bus/wave-head-relay.ts): what the coordinator decodes must be exactly what the client sent.
import { BusToken, TOKEN_BYTES, TRAILER_BYTES } from '../src/bus/auth';
import { agentWaveHead, oneWayWaveHead, waveHeadBytes } from '../src/bus/wave-head-relay';
import { decodeAgentMessage } from '../src/bus/frames';
import type { RequestStep } from '../src/messages';
import { AgentMessage, ClientRequest, decode, encode, encodeTrusted, messageType } from '../src/proto';
import { prng } from '../src/prng';
import { columnsToWire, TelemetryColumnizer } from '../src/client/telemetry';

const WaveHeadRequest = messageType('WaveHeadRequest');

function step(reqId: string, tokens: number[], blocks: number[], extra: Partial<RequestStep> = {}): RequestStep {
  return { reqId, newTokenIds: tokens, newTokenLogprobs: tokens.map(() => -0.5), newTokenRanks: [], draftLen: 2, accepted: 1, blockIds: blocks, finished: false, freed: false, promptLen: 9, numOutputTokens: 3, ...extra };
}

function waveHeadBody(wave: number, requests: RequestStep[]): Record<string, unknown> {
  const z = new TelemetryColumnizer();
  const columns = columnsToWire(z.columns(requests));
  return { wave, telemetry: { wave: wave - 1, columns, nonFinite: [{ row: 1, reqId: 'b-2', kind: 'nan' }] } };
}

test('the wave head the client encodes reaches the coordinator unchanged, whatever the rank and epoch', () => {
  const token = BusToken.fromBytes(Buffer.alloc(TOKEN_BYTES, 7));
  const requests = [step('a-1', [5, 6], [3, 4], { promptTokenIds: [1, 2, 3] }), step('b-2', [7], [9]), step('c-3', [], [0, 1, 2], { finished: true })];
  for (const wave of [0, 1, 300, 2 ** 40 + 3]) {
    const body = waveHeadBody(wave, requests);
    // The client's two encoders (checked and trusted) make frames the agent relays the same way.
    for (const frame of [encode(ClientRequest, { id: 0, waveHead: body }), encodeTrusted(ClientRequest, { id: 0, waveHead: body })]) {
      const raw = waveHeadBytes(frame)!;
      expect(raw).toBeDefined();
      expect(decode(WaveHeadRequest, raw)).toEqual(decode(ClientRequest, frame).waveHead);
      for (const [rank, epoch] of [[0, 0], [3, 1], [1023, 1796112128864]]) {
        const msg = agentWaveHead(rank, epoch, raw);
        const got = decode(AgentMessage, msg);
        expect(got).toMatchObject({ globalRank: rank, epochSeen: epoch, requestId: 0, body: 'waveHead' });
        expect(got.waveHead).toEqual(decode(ClientRequest, frame).waveHead);
        // and the coordinator's own decoder (columns into typed arrays) takes it
        const d = decodeAgentMessage(msg, 1 << 20);
        expect(d.ok).toBe(true);
        if (d.ok) expect(d.value.waveHead.telemetry.columns.rows).toBe(3);
        // Built with room for the MAC and sealed in place: the same bytes as seal() of the plain one.
        const roomy = agentWaveHead(rank, epoch, raw, TRAILER_BYTES);
        const sealed = token.sealInPlace('to-coordinator', roomy, roomy.length - TRAILER_BYTES);
        expect(sealed.equals(token.seal('to-coordinator', msg))).toBe(true);
        const opened = token.open('to-coordinator', sealed);
        expect(opened.ok && Buffer.from(opened.msg).equals(msg)).toBe(true);
      }
    }
  }
});

test('frames the relay cannot take as they are are left to the full re-encode; garbage never throws', () => {
  const body = waveHeadBody(8, [step('a-1', [5], [3])]);
  const once = encode(ClientRequest, { id: 0, waveHead: body });
  // wave_head twice (protobuf would merge the two): not relayed raw
  expect(waveHeadBytes(Buffer.concat([once, once]))).toBeUndefined();
  // no wave_head at all
  expect(waveHeadBytes(encode(ClientRequest, { id: 4, endOfWave: { wave: 3 } }))).toBeUndefined();
  // a field cut short
  expect(waveHeadBytes(once.subarray(0, once.length - 1))).toBeUndefined();
  // a wire type that does not exist (6)
  expect(waveHeadBytes(Buffer.from([0x26, 0x01]))).toBeUndefined();
  const rand = prng(11);
  for (let i = 0; i < 20000; i++) {
    const junk = Buffer.alloc(1 + Math.floor(rand() * 64));
    for (let k = 0; k < junk.length; k++) junk[k] = Math.floor(rand() * 256);
    const raw = waveHeadBytes(junk);
    if (raw) {
      expect(raw.byteOffset + raw.length).toBeLessThanOrEqual(junk.byteOffset + junk.length);
      expect(raw.byteOffset).toBeGreaterThanOrEqual(junk.byteOffset);
    }
  }
});

test('the agent takes a one-way wave head without decoding it, and leaves everything else to the full decode', () => {
  const body = waveHeadBody(2 ** 40 + 3, [step('a-1', [5, 6], [3, 4], { promptTokenIds: [1, 2, 3] }), step('b-2', [7], [9])]);
  for (const frame of [encode(ClientRequest, { id: 0, waveHead: body }), encodeTrusted(ClientRequest, { waveHead: body })]) {
    const raw = oneWayWaveHead(frame)!;
    expect(raw).toBeDefined();
    expect(Buffer.from(raw)).toEqual(Buffer.from(waveHeadBytes(frame)!));
    expect(decode(WaveHeadRequest, raw)).toEqual(decode(ClientRequest, frame).waveHead);
  }
  const once = encode(ClientRequest, { id: 0, waveHead: body });
  // a request id (the client waits for a reply), even one above 2^32, or one written with extra zero groups
  expect(oneWayWaveHead(encode(ClientRequest, { id: 7, waveHead: body }))).toBeUndefined();
  expect(oneWayWaveHead(encode(ClientRequest, { id: 2 ** 33, waveHead: body }))).toBeUndefined();
  expect(oneWayWaveHead(Buffer.concat([Buffer.from([0x08, 0x80, 0x00]), once]))).toBeDefined();
  // wave_head twice, another body after it, an unknown field: the full decode decides
  expect(oneWayWaveHead(Buffer.concat([once, once]))).toBeUndefined();
  expect(oneWayWaveHead(Buffer.concat([once, encode(ClientRequest, { endOfWave: { wave: 3 } })]))).toBeUndefined();
  expect(oneWayWaveHead(Buffer.concat([once, Buffer.from([0x78, 0x01])]))).toBeUndefined();
  // cut short, at the outer or at the inner level
  expect(oneWayWaveHead(once.subarray(0, once.length - 1))).toBeUndefined();
  expect(oneWayWaveHead(Buffer.from([0x22, 0x02, 0x08]))).toBeUndefined();
  // a wave head whose own fields do not walk: a wire type that does not exist, a group, field 0
  for (const inner of [[0x0e, 0x01], [0x0b, 0x0c], [0x00, 0x01], [0x08, 0xff]]) {
    expect(oneWayWaveHead(Buffer.from([0x22, inner.length, ...inner]))).toBeUndefined();
  }
  // not a wave head at all
  expect(oneWayWaveHead(encode(ClientRequest, { id: 4, endOfWave: { wave: 3 } }))).toBeUndefined();
  expect(oneWayWaveHead(Buffer.alloc(0))).toBeUndefined();
  // random bytes never throw, and what is taken lies inside the frame and walks as a wave head
  const rand = prng(12);
  for (let i = 0; i < 20000; i++) {
    const junk = Buffer.alloc(1 + Math.floor(rand() * 64));
    for (let k = 0; k < junk.length; k++) junk[k] = Math.floor(rand() * 256);
    if (i % 2 === 0) (junk[0] = 0x22), (junk[1] = Math.min(junk[1] & 0x3f, junk.length - 2));
    const raw = oneWayWaveHead(junk);
    if (raw) {
      expect(raw.byteOffset).toBeGreaterThanOrEqual(junk.byteOffset);
      expect(raw.byteOffset + raw.length).toBeLessThanOrEqual(junk.byteOffset + junk.length);
    }
  }
});
