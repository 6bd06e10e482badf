// Coordinator-side cost of the runtime guard per wave head with every detector on:
// `wavebus bench detectors --requests 1024 --steps 500 --json`. Each running request produces one
// token per step with its log-prob and rank, and speculative stats; the streams are healthy (no
// hits), as in production. Target: ≤ 100 µs of CPU per step for 1024 requests.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import pino from 'pino';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import type { RequestStep, StepTelemetry } from '../src/messages';

function flag(argv: string[], name: string, def: number): number {
  const i = argv.indexOf(`--${name}`);
  const raw = i >= 0 ? argv[i + 1] : argv.find((a) => a.startsWith(`--${name}=`))?.split('=')[1];
  if (raw === undefined) return def;
  const v = Number(raw);
  if (!Number.isInteger(v) || v <= 0) throw new Error(`--${name}: expected a positive integer, got ${JSON.stringify(raw)}`);
  return v;
}

export async function run(argv: string[]): Promise<Record<string, unknown>> {
  const requests = flag(argv, 'requests', 1024);
  const steps = flag(argv, 'steps', 500);
  const warmup = Math.min(100, steps);
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
    const guard = new Guard({ startup, rank: 0, expectedRanks: [0], log: pino({ level: 'silent' }) });
    const reqs: RequestStep[] = [];
    for (let r = 0; r < requests; r++) {
      reqs.push({
        reqId: `req-${r}`,
        newTokenIds: [0],
        newTokenLogprobs: [0],
        newTokenRanks: [0],
        draftLen: 3,
        accepted: 2,
        blockIds: [r * 4, r * 4 + 1, r * 4 + 2, r * 4 + 3],
        finished: false,
        freed: false,
        promptLen: 128,
        numOutputTokens: 0,
      });
    }
    const telemetry: StepTelemetry = { wave: 0, requests: reqs, nonFinite: [] };
    let cpuUs = 0;
    let wallNs = 0n;
    for (let s = 0; s < warmup + steps; s++) {
      // healthy streams: varied tokens, confident log-probs, one accepted draft in three
      for (let r = 0; r < requests; r++) {
        const q = reqs[r];
        q.newTokenIds[0] = (s * 7919 + r * 104729) % 50021;
        q.newTokenLogprobs[0] = -0.2 - ((s + r) % 7) * 0.15;
        q.newTokenRanks[0] = (s + r) % 3;
        q.accepted = 1 + ((s + r) % 3);
      }
      telemetry.wave = s;
      const c0 = process.cpuUsage();
      const t0 = process.hrtime.bigint();
      guard.onWaveHead(s + 1, telemetry);
      const t1 = process.hrtime.bigint();
      const c1 = process.cpuUsage(c0);
      if (s >= warmup) {
        cpuUs += c1.user + c1.system;
        wallNs += t1 - t0;
      }
    }
    const status = guard.status();
    guard.close();
    return {
      bench: 'detectors',
      requests,
      steps,
      cpu_us_per_step: Math.round((cpuUs / steps) * 10) / 10,
      wall_us_per_step: Math.round((Number(wallNs) / 1000 / steps) * 10) / 10,
      cpu_ns_per_request_step: Math.round((cpuUs * 1000) / steps / requests),
      target_us_per_step: 100,
      incidents: status.incidents,
    };
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
