// The client's side of a TensorBatch (its TensorHost, tensor-batch.ts): the checks every tensor
// head passes, as waveHead's do; the telemetry ring its hello asked for; the head queue an inline
// head goes through. And client.tensorBatch()'s creation: the batch's ring request goes in the
// next hello (a client already greeted says it again).
import { ConfigError } from '../errors';
import type { AgentAvailability } from './availability';
import type { AgentHello } from './hello';
import type { MailboxReader } from './mailbox';
import type { ClientFeatures } from './options';
import { TensorBatch, type TensorBatchOptions } from './tensor-batch';
import type { RingAtHello } from './telemetry-ring-writer';
import { isWaveNumber, type WaveHeadSender } from './wave-head';

export interface TensorClient {
  mailbox: MailboxReader;
  hello: AgentHello;
  availability: AgentAvailability;
  head: WaveHeadSender;
  ring: RingAtHello;
  stats: { skippedUnavailable: number };
  /** The bound of a hello said on the way (the call bound and its margin). */
  helloBoundMs: () => number;
  /** The wave of the head being sent (which wave a forward belongs to: live-capture.ts). */
  headWave: (wave: number) => void;
}

/** A TensorBatch of `maxRows` rows sending through client `c`. */
export function attachTensorBatch(c: TensorClient, maxRows: number, opts: TensorBatchOptions): TensorBatch {
  const host = { gate: (w: number) => tensorGate(c, w), ring: () => c.ring.get(), send: (b: Record<string, unknown>) => c.head.enqueue(b), epoch: () => c.mailbox.epoch() };
  const batch = new TensorBatch(host, maxRows, opts);
  c.hello.ringRequest = batch.ringRequest();
  if (c.hello.features) c.hello.forget(); // hello again, asking for the ring
  return batch;
}

/** The checks every tensor head passes (as waveHead's): the features when this rank sends now, else null. */
function tensorGate(c: TensorClient, wave: number): ClientFeatures | null | Promise<ClientFeatures | null> {
  if (!isWaveNumber(wave)) throw new ConfigError(`waveHead(): wave ${wave} is not a non-negative integer`);
  c.headWave(wave);
  const bits = c.mailbox.features();
  if (bits === 0) return null;
  if (c.availability.unavailable) {
    c.stats.skippedUnavailable++;
    c.availability.probe();
    return null;
  }
  const known = c.hello.current(bits);
  if (known) return sends(known);
  return helloFirst(c, wave);
}

function sends(f: ClientFeatures): ClientFeatures | null {
  return f.tp0 && f.bus ? f : null;
}

/** The gate's slow path (a hello is due), apart: its closure would cost the usual call an allocation. */
function helloFirst(c: TensorClient, wave: number): Promise<ClientFeatures | null> {
  return c.hello.ensure(c.helloBoundMs()).then(sends, (e) => {
    if (!c.availability.lostOn(e, `waveHead(${wave})`)) throw e;
    return null;
  });
}
