// Coordinator-side cost of the runtime guard per wave head with every detector on:
// `wavebus bench detectors --requests 1024 --steps 500 --json`. Each running request produces one
// token per step with its log-prob and rank, speculative stats and its block ids; the streams are
// healthy (no hits), as in production. Target: ≤ 100 µs of guard CPU per step for 1024 requests.
// Three figures, each the CPU time (process.cpuUsage: all threads, GC included) per step:
//  - cpu_us_per_step: Guard.onWaveHead alone, on prebuilt telemetry objects;
//  - decode_us_per_step: decoding the wave-head AgentMessage that carries the telemetry, as the
//    coordinator does (decodeAgentMessage); decode_generic_us_per_step: protobufjs decode +
//    toObject of the same bytes, for comparison;
//  - coordinator_us_per_step: both in one loop (decode, then the guard on what was decoded), and
//    guard_after_decode_us_per_step: the guard's share of it.
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
import { AgentMessage, decode } from '../src/proto';

function flag(argv: string[], name: string, def: number): number {
  const i = argv.indexOf(`--${name}`);
  const raw = i >= 0 ? argv[i + 1] : argv.find((a) => a.startsWith(`--${name}=`))?.split('=')[1];
  if (raw === undefined) return def;
  const v = Number(raw);
  if (!Number.isInteger(v) || v <= 0) throw new Error(`--${name}: expected a positive integer, got ${JSON.stringify(raw)}`);
  return v;
}

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

export async function run(argv: string[]): Promise<Record<string, unknown>> {
  const requests = flag(argv, 'requests', 1024);
  const steps = flag(argv, 'steps', 500);
  const blocks = flag(argv, 'blocks', 16); // KV blocks per request (~256 tokens of context at block size 16)
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
    const newGuard = () => new Guard({ startup, rank: 0, expectedRanks: [0], log: pino({ level: 'silent' }) });
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
    // The same telemetry as the coordinator receives it: a wave-head AgentMessage per variant.
    const frames = variants.map((t, v) => encodeAgentMessage({ globalRank: 0, epochSeen: 1, requestId: 0, waveHead: { wave: v + 1, telemetry: t } }));
    const telemetryOf = (bytes: Buffer): StepTelemetry => {
      const d = decodeAgentMessage(bytes, MAX_FRAME);
      if (!d.ok || !d.value.waveHead?.telemetry) throw new Error(`bench frame did not decode: ${d.ok ? 'no telemetry' : d.reason}`);
      return d.value.waveHead.telemetry as StepTelemetry;
    };

    // 1. the guard alone
    const guard = newGuard();
    let wave = 1;
    for (let s = 0; s < warmup; s++, wave++) guard.onWaveHead(wave, variants[wave % PERIOD]);
    const t0 = process.hrtime.bigint();
    const g = timed(steps, () => {
      guard.onWaveHead(wave, variants[wave % PERIOD]);
      wave++;
    });
    const wallNs = process.hrtime.bigint() - t0;
    const status = guard.status();
    guard.close();

    // 2. decoding the wave-head message: the coordinator's decoder, and plain protobufjs
    for (let s = 0; s < warmup; s++) telemetryOf(frames[s % PERIOD]);
    const dec = timed(steps, (s) => telemetryOf(frames[s % PERIOD]));
    for (let s = 0; s < warmup; s++) decode(AgentMessage, frames[s % PERIOD]);
    const gen = timed(steps, (s) => decode(AgentMessage, frames[s % PERIOD]));

    // 3. both, as the coordinator runs them per wave head
    const guard2 = newGuard();
    wave = 1;
    for (let s = 0; s < warmup; s++, wave++) guard2.onWaveHead(wave, telemetryOf(frames[wave % PERIOD]));
    // (the guard's share timed apart: it runs on telemetry just decoded, warm in the caches)
    let guardWarmUs = 0;
    const both = timed(steps, () => {
      const t = telemetryOf(frames[wave % PERIOD]);
      const c0 = process.cpuUsage();
      guard2.onWaveHead(wave, t);
      guardWarmUs += cpuUs(c0);
      wave++;
    });
    const status2 = guard2.status();
    guard2.close();

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
      decode_generic_us_per_step: perStep(gen.us, steps),
      decode_generic_us_per_step_best_chunk: gen.bestPerStep,
      frame_bytes: frames[0].length,
      coordinator_us_per_step: perStep(both.us, steps),
      coordinator_us_per_step_best_chunk: both.bestPerStep,
      guard_after_decode_us_per_step: perStep(guardWarmUs, steps),
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
