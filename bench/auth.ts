// `wavebus bench auth [--frames N]`: the per-frame cost of the bus token (src/bus/auth.ts): seal (sender) and
// open (receiver) of frames the size of a wave head, a config lane and a file chunk, against the
// encode of the same wave head as the baseline, measured in one run.
import { randomBytes } from 'crypto';
import { BusToken } from '../src/bus/auth';
import { encodeAgentMessage } from '../src/bus/frames';
import type { BenchArgs, BenchFlags } from './lib/flags';

export const summary = 'The bus token\'s cost per frame: seal and open of wave-head, small and 8 KiB frames and a 4 MiB chunk, against encoding a wave head.';
export const flags = {
  frames: { type: 'int', default: 50000, describe: 'frames timed per measurement (the 4 MiB chunk: frames / 5000, at least 5)' },
} satisfies BenchFlags;

function usPer(n: number, fn: () => void): number {
  for (let i = 0; i < Math.min(n, 1000); i++) fn(); // warm up
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) fn();
  return Number(process.hrtime.bigint() - t0) / n / 1000;
}

export async function run(args: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  const n = args.frames;
  const token = BusToken.fromBytes(randomBytes(32));
  const rows = 64;
  const u32 = (k: number) => Buffer.alloc(4 * k, 1);
  // A decode-step wave head with 64 running requests in columns (what clients send).
  const head = encodeAgentMessage({
    globalRank: 0,
    epochSeen: 123456789,
    waveHead: { wave: 1000, telemetry: { wave: 999, nonFinite: [], columns: { rows, slot: u32(rows), tokenCount: u32(rows), tokenIds: u32(rows), flags: Buffer.alloc(rows), bind: [], blocks: [] } } },
  });
  const out: Record<string, unknown> = { frames: n, wave_head_bytes: head.length };
  out.encode_wave_head_us = usPer(n, () => encodeAgentMessage({ globalRank: 0, epochSeen: 123456789, waveHead: { wave: 1000 } }));
  for (const [name, bytes] of [['wave_head', head], ['small_frame', randomBytes(64)], ['config_lane_8k', randomBytes(8192)]] as const) {
    const sealed = token.seal('to-coordinator', bytes);
    out[`seal_${name}_us`] = usPer(n, () => token.seal('to-coordinator', bytes));
    out[`open_${name}_us`] = usPer(n, () => token.open('to-coordinator', sealed));
  }
  const chunk = randomBytes(4 * 2 ** 20);
  const hdr = randomBytes(40);
  const sealedHdr = token.seal('to-coordinator', hdr, chunk);
  out.open_4mib_chunk_us = usPer(Math.max(5, Math.floor(n / 5000)), () => token.open('to-coordinator', sealedHdr, chunk));
  return out;
}
