// What "everything off" costs an engine step, measured without the host's noise: a real client on
// a real mailbox whose agent says every feature is off (features 0), driven through one step's
// calls (two pendingDump asks, waveHead, beforeForward, endOfWave) in a tight loop, each awaited
// as an engine does, against the same loop of bare awaits. The rates of `bench overhead` carry
// ±3 % of run-to-run spread on a small shared host; this is the part of the off ratio the client
// itself is responsible for.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { WavebusClient } from '../../src/client/client';
import { MailboxWriter } from '../../src/client/mailbox';

export interface OffPathCost {
  /** µs per step of the client's calls with everything off (best of the rounds). */
  client_us_per_step: number;
  /** µs per step of five bare awaits (the same loop with no client). */
  bare_awaits_us_per_step: number;
  steps_per_round: number;
  rounds: number;
}

export async function offPathCost(steps = 200_000, rounds = 3): Promise<OffPathCost> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-bench-offpath-'));
  const mbox = path.join(dir, 'mailbox');
  const writer = MailboxWriter.create(mbox);
  writer.setFeatures(0);
  // Nothing is ever sent with features 0, so the endpoint is never connected.
  const client = await WavebusClient.connect({ endpoint: `ipc://${path.join(dir, 'agent.sock')}`, mailbox: mbox });
  let best = Infinity;
  let bare = Infinity;
  try {
    for (let r = 0; r < rounds; r++) {
      let t0 = process.hrtime.bigint();
      for (let s = 1; s <= steps; s++) {
        await client.pendingDump('req-a');
        await client.pendingDump('req-b');
        await client.waveHead(s, undefined);
        await client.beforeForward({ compilationHash: 'off', globalStep: s }, []);
        await client.endOfWave(s);
      }
      best = Math.min(best, Number(process.hrtime.bigint() - t0) / steps / 1000);
      t0 = process.hrtime.bigint();
      for (let s = 1; s <= steps; s++) {
        await undefined;
        await undefined;
        await undefined;
        await undefined;
        await undefined;
      }
      bare = Math.min(bare, Number(process.hrtime.bigint() - t0) / steps / 1000);
    }
    if (client.stats.sent !== 0) throw new Error(`the client sent ${client.stats.sent} messages with every feature off`);
  } finally {
    await client.close();
    writer.close({ unlink: true });
    fs.rmSync(dir, { recursive: true, force: true });
  }
  return { client_us_per_step: Number(best.toFixed(3)), bare_awaits_us_per_step: Number(bare.toFixed(3)), steps_per_round: steps, rounds };
}
