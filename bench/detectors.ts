// Coordinator-side cost of the runtime guard per wave head with every detector on:
// `wavebus bench detectors --requests 1024 --steps 2000 --json`. Each running request produces one
// token per step with its log-prob and rank, speculative stats and its block ids; the streams are
// healthy (no hits), as in production. Target: ≤ 100 µs of coordinator CPU per step for 1024
// requests. The telemetry is what the clients send: columns (src/client/telemetry.ts), the requests
// bound in an earlier step, block tables unchanged. Figures, each the CPU time
// (process.cpuUsage: all threads, GC included) per step:
//  - coordinator_us_per_step: what the coordinator does per wave head: decode the AgentMessage
//    (decodeAgentMessage, columns checked and turned into typed arrays), then the guard;
//  - cpu_us_per_step: Guard.onWaveHead alone, on telemetry decoded beforehand;
//  - decode_us_per_step: decodeAgentMessage alone;
//  - rows_*: the same telemetry in the row form (one RequestStep per request, the older wire
//    form), for comparison.
// Each figure also comes as the best of 10 timed chunks (`*_best_chunk`): the least disturbed by
// other processes on a shared machine.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import pino from 'pino';
import { decodeAgentMessage, encodeAgentMessage } from '../src/bus/frames';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import type { RequestStep, StepTelemetry } from '../src/messages';
import { ColumnScratch, columnsToWire, TelemetryColumnizer } from '../src/client/telemetry';
import type { BenchArgs, BenchFlags } from './lib/flags';

export const summary = 'Coordinator CPU per wave head with every detector of the runtime guard on (target: <= 100 us per step for 1024 requests).';
export const flags = {
  requests: { type: 'int', default: 1024, describe: 'running requests, each one token per step' },
  steps: { type: 'int', default: 2000, describe: 'timed steps (after 300 warm-up steps)' },
  blocks: { type: 'int', default: 16, describe: 'KV blocks per request (~256 tokens of context at block size 16)' },
} satisfies BenchFlags;

const MAX_FRAME = 1 << 28;

function cpuUs(since: NodeJS.CpuUsage): number {
  const c = process.cpuUsage(since);
  return c.user + c.system;
}

function perStep(us: number, steps: number): number {
  return Math.round((us / steps) * 10) / 10;
}

/**
 * Run `step` `steps` times in CHUNKS timed chunks: total CPU µs, and the least CPU µs per step of
 * any chunk. On a loaded machine (other processes evict the caches, the hypervisor steals time)
 * the total inflates with the load; the best chunk is the least disturbed one, closer to the
 * cost on an idle coordinator host.
 */
const CHUNKS = 10;
function timed(steps: number, step: (s: number) => void): { us: number; bestPerStep: number } {
  let us = 0;
  let best = Infinity;
  let s = 0;
  for (let k = 0; k < CHUNKS; k++) {
    const n = Math.floor(steps / CHUNKS) + (k < steps % CHUNKS ? 1 : 0);
    if (n === 0) continue;
    const c0 = process.cpuUsage();
    for (let i = 0; i < n; i++, s++) step(s);
    const chunk = cpuUs(c0);
    us += chunk;
    best = Math.min(best, chunk / n);
  }
  return { us, bestPerStep: Math.round(best * 10) / 10 };
}

export async function run(args: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  const { requests, steps, blocks } = args;
  const warmup = 300; // let the optimising compiler settle before timing
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-bench-detectors-'));
  try {
    const runtime_config = {
      detector: {
        token_repeat: { enabled: true },
        logits_finite: { enabled: true },
        spec_acceptance: { enabled: true },
        garbled: { enabled: true },
      },
    };
    const startup = parseStartupOptions(JSON.stringify({ runtime_config }), {}, dir);
    const newGuard = () => new Guard({ startup, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, log: pino({ level: 'silent' }) });
    // PERIOD prebuilt telemetry variants, cycled: no per-step setup inside the timed loop, and a
    // token comes back only every PERIOD steps, beyond token_repeat's window (healthy, no hits).
    const PERIOD = 64;
    const variants: StepTelemetry[] = [];
    for (let v = 0; v < PERIOD; v++) {
      const reqs: RequestStep[] = [];
      for (let r = 0; r < requests; r++) {
        reqs.push({
          reqId: `cmpl-${r.toString(16).padStart(8, '0')}-0`,
          newTokenIds: [(v * 7919 + r * 104729) % 50021],
          newTokenLogprobs: [-0.2 - ((v + r) % 7) * 0.15],
          newTokenRanks: [(v + r) % 3],
          draftLen: 3,
          accepted: 2 + ((v + r) % 2), // one or two of three drafts accepted: rate 0.5, far from both edges
          blockIds: Array.from({ length: blocks }, (_, k) => r * blocks + k),
          finished: false,
          freed: false,
          promptLen: 128,
          numOutputTokens: 200 + v,
        });
      }
      variants.push({ wave: v, requests: reqs, nonFinite: [] });
    }
    // The same telemetry as the coordinator receives it: a wave-head AgentMessage per variant, in
    // columns from one client-side columnizer (its first step, which binds the requests and sends
    // their block tables, is fed to each guard before the timed steps).
    const z = new TelemetryColumnizer();
    const frameOf = (wave: number, t: StepTelemetry) =>
      encodeAgentMessage({ globalRank: 0, epochSeen: 1, requestId: 0, waveHead: { wave, telemetry: { wave: wave - 1, columns: columnsToWire(z.columns(t.requests ?? [])), nonFinite: [] } } });
    const join = frameOf(1, variants[0]);
    const frames = variants.map((t, v) => frameOf(v + 2, t));
    const rowFrames = variants.map((t, v) => encodeAgentMessage({ globalRank: 0, epochSeen: 1, requestId: 0, waveHead: { wave: v + 2, telemetry: t } }));
    const telemetryOf = (bytes: Buffer): StepTelemetry => {
      const d = decodeAgentMessage(bytes, MAX_FRAME);
      if (!d.ok || !d.value.waveHead?.telemetry) throw new Error(`bench frame did not decode: ${d.ok ? 'no telemetry' : d.reason}`);
      return d.value.waveHead.telemetry as StepTelemetry;
    };
    const decoded = frames.map(telemetryOf);

    // 1. the guard alone, on decoded columns
    const guard = newGuard();
    guard.onWaveHead(0, 1, telemetryOf(join));
    let wave = 2;
    for (let s = 0; s < warmup; s++, wave++) guard.onWaveHead(0, wave, decoded[wave % PERIOD]);
    const t0 = process.hrtime.bigint();
    const g = timed(steps, () => {
      guard.onWaveHead(0, wave, decoded[wave % PERIOD]);
      wave++;
    });
    const wallNs = process.hrtime.bigint() - t0;
    const status = guard.status();
    guard.close();

    // 2. decoding the wave-head message as the coordinator does
    const decScratch = new ColumnScratch();
    const decodeOnly = (bytes: Buffer) => decodeAgentMessage(bytes, MAX_FRAME, decScratch);
    for (let s = 0; s < warmup; s++) decodeOnly(frames[s % PERIOD]);
    const dec = timed(steps, (s) => decodeOnly(frames[s % PERIOD]));

    // 3. both, as the coordinator runs them per wave head (its column scratch reused per message)
    const scratch = new ColumnScratch();
    const coordinatorTelemetryOf = (bytes: Buffer): StepTelemetry => {
      const d = decodeAgentMessage(bytes, MAX_FRAME, scratch);
      if (!d.ok || !d.value.waveHead?.telemetry) throw new Error(`bench frame did not decode: ${d.ok ? 'no telemetry' : d.reason}`);
      return d.value.waveHead.telemetry as StepTelemetry;
    };
    const guard2 = newGuard();
    guard2.onWaveHead(0, 1, telemetryOf(join));
    wave = 2;
    for (let s = 0; s < warmup; s++, wave++) guard2.onWaveHead(0, wave, coordinatorTelemetryOf(frames[wave % PERIOD]));
    const both = timed(steps, () => {
      guard2.onWaveHead(0, wave, coordinatorTelemetryOf(frames[wave % PERIOD]));
      wave++;
    });
    const status2 = guard2.status();
    guard2.close();

    // 4. the row form for comparison: decode + guard
    const guard3 = newGuard();
    wave = 2;
    for (let s = 0; s < warmup; s++, wave++) guard3.onWaveHead(0, wave, telemetryOf(rowFrames[wave % PERIOD]));
    const rows = timed(steps, () => {
      guard3.onWaveHead(0, wave, telemetryOf(rowFrames[wave % PERIOD]));
      wave++;
    });
    guard3.close();

    return {
      bench: 'detectors',
      requests,
      steps,
      blocks_per_request: blocks,
      cpu_us_per_step: perStep(g.us, steps),
      cpu_us_per_step_best_chunk: g.bestPerStep,
      wall_us_per_step: Math.round((Number(wallNs) / 1000 / steps) * 10) / 10,
      cpu_ns_per_request_step: Math.round((g.us * 1000) / steps / requests),
      target_us_per_step: 100,
      decode_us_per_step: perStep(dec.us, steps),
      decode_us_per_step_best_chunk: dec.bestPerStep,
      frame_bytes: frames[0].length,
      coordinator_us_per_step: perStep(both.us, steps),
      coordinator_us_per_step_best_chunk: both.bestPerStep,
      rows_frame_bytes: rowFrames[0].length,
      rows_coordinator_us_per_step: perStep(rows.us, steps),
      rows_coordinator_us_per_step_best_chunk: rows.bestPerStep,
      // cpu time is process-wide (GC and compiler threads included); on a loaded machine all
      // numbers inflate, so the load is reported with them
      load_avg_1m: Math.round(os.loadavg()[0] * 100) / 100,
      cpus: os.cpus().length,
      incidents: status.incidents,
      incidents_after_decode: status2.incidents,
    };
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
