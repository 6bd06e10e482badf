// The agent relays its client's one-way wave head to the coordinator byte for byte
// (src/bus/wave-head-relay.ts): what the coordinator decodes must be exactly what the client sent.
import { agentWaveHead, waveHeadBytes } from '../src/bus/wave-head-relay';
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
