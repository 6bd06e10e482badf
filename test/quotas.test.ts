import * as fs from 'fs';
import * as path from 'path';
import pino from 'pino';
import { defaultConfig } from '../src/guard/config';
import { Guard } from '../src/guard/guard';
import { admitIncident, AutoDumpQuota } from '../src/guard/quotas';
import { parseStartupOptions } from '../src/guard/startup';
import type { RequestStep, StepTelemetry } from '../src/messages';
import { cleanup, tmpDir } from './helpers';
import { decideAheadWaves } from '../src/bus/constants';

/** The guard's layout below has pp = 2: a head decides the vector two waves on. */
const AHEAD = decideAheadWaves(2);

// Guards are closed before their temp dirs go: a ledger writes request_info.json a turn after
// arming, and its ack timers fire later still (they would make a removed dir again).
const guards: Guard[] = [];
afterAll(async () => {
  for (const g of guards.splice(0)) g.close();
  await cleanup();
});

const quiet = pino({ level: 'silent' });

function step(reqId: string, p: Partial<RequestStep> = {}): RequestStep {
  return { reqId, newTokenIds: [1], newTokenLogprobs: [], newTokenRanks: [], draftLen: 0, accepted: 0, blockIds: [4, 5], finished: false, freed: false, promptLen: 10, numOutputTokens: 0, ...p };
}
const nanFor = (wave: number, ...ids: string[]): StepTelemetry => ({ wave, requests: ids.map((id) => step(id)), nonFinite: ids.map((id, i) => ({ row: i, reqId: id, kind: 'nan' })) });

function guard(runtimeConfig: unknown, clock?: () => number) {
  const d = tmpDir();
  const startup = parseStartupOptions(JSON.stringify({ runtime_config: runtimeConfig }), {}, d);
  const g = new Guard({ startup, layout: { worldSize: 4, tp: 2, pp: 2, dp: 1, cp: 1 }, log: quiet, clock });
  guards.push(g);
  const reports = (type: string) => {
    const dir = path.join(startup.reportDir, type);
    return fs.existsSync(dir) ? fs.readdirSync(dir).sort().map((f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'))) : [];
  };
  return { g, startup, reports };
}

describe('report quota (max_per_req, backoff)', () => {
  test('admitIncident: cap and doubling gaps', () => {
    const r = { ...defaultConfig().report, max_per_req: 4, backoff_waves: 64 };
    const c = { count: 0, lastWave: 0 };
    expect(admitIncident(c, 10, r)).toEqual({ ok: true, capReached: false });
    expect(admitIncident(c, 73, r)).toEqual({ ok: false, reason: 'backoff', waitUntilWave: 74 });
    expect(admitIncident(c, 74, r).ok).toBe(true); // gap 64
    expect(admitIncident(c, 74 + 127, r).ok).toBe(false);
    expect(admitIncident(c, 74 + 128, r).ok).toBe(true); // gap 128
    expect(admitIncident(c, 202 + 256, r)).toEqual({ ok: true, capReached: true }); // gap 256, 4th of 4
    expect(admitIncident(c, 100000, r)).toEqual({ ok: false, reason: 'max_per_req' });
  });

  test('default max_per_req 1: one report per (type, request), detection stops for it', () => {
    const { g, reports } = guard({ detector: { logits_finite: { enabled: true } } });
    for (let w = 1; w <= 5; w++) g.onWaveHead(0, w + 1, nanFor(w, 'r1'));
    g.onWaveHead(0, 7, nanFor(6, 'r2'));
    const rs = reports('logits_finite');
    expect(rs.map((r) => r.req_id)).toEqual(['r1', 'r2']);
    expect((g.status().incidents as Record<string, Record<string, number>>).logits_finite).toEqual({ report: 2 });
  });

  test('max_per_req 3: reports spaced by 64 then 128 waves, then no more', () => {
    const { g, reports } = guard({ detector: { logits_finite: { enabled: true } }, report: { max_per_req: 3 } });
    const waves: number[] = [];
    for (let w = 1; w <= 400; w++) g.onWaveHead(0, w + 1, nanFor(w, 'r1'));
    for (const r of reports('logits_finite')) waves.push(r.detect_wave);
    expect(waves.sort((a, b) => a - b)).toEqual([1, 65, 193]);
    const inc = (g.status().incidents as Record<string, Record<string, number>>).logits_finite;
    expect(inc.report).toBe(3);
    expect(inc.suppressed_backoff).toBe(63 + 127); // waves 2..64 and 66..192; after the cap the detector is stopped
    expect(inc.suppressed_max_per_req).toBeUndefined();
  });
});

describe('automatic dump quota and cooldown', () => {
  test('AutoDumpQuota', () => {
    const q = new AutoDumpQuota();
    const d = { ...defaultConfig().dump, auto_max_times: 2, auto_cooldown_seconds: 10 };
    expect(q.tryTake(0, d)).toEqual({ ok: true });
    expect(q.tryTake(9999, d)).toEqual({ ok: false, reason: 'cooldown' });
    expect(q.tryTake(10000, d)).toEqual({ ok: true });
    expect(q.tryTake(1e9, d)).toEqual({ ok: false, reason: 'quota' });
    expect(new AutoDumpQuota().tryTake(0, defaultConfig().dump)).toEqual({ ok: false, reason: 'quota' });
  });

  test('default auto_max_times 0: dump_kv hits report dump_attempted but write dump_skipped instead of arming', () => {
    const { g, reports, startup } = guard({ detector: { logits_finite: { enabled: true, on_trigger: ['report', 'dump_kv'] } } });
    const lanes = g.onWaveHead(0, 8, nanFor(7, 'a'));
    expect(lanes.dumps).toEqual([]);
    const [r] = reports('logits_finite');
    expect(r).toMatchObject({ dump_attempted: true, dump_arm_wave: null, dump_count: 0, dump_max_times: 0, dump_skipped_reason: 'quota_or_cooldown_blocked' });
    // The head of wave 8 decides wave 8 + AHEAD (pp = 2: two waves ahead): the refusal sits where the dump would have gone.
    const wave = 8 + AHEAD;
    const skipped = JSON.parse(fs.readFileSync(path.join(startup.dumpDir, 'logits_finite', 'a', `wave_${wave}`, 'dump_skipped.json'), 'utf8'));
    expect(skipped).toMatchObject({ reason: 'quota_or_cooldown_blocked', req_id: 'a', incident_type: 'logits_finite', stage: 'arm', rank: 2, wave });
    expect(skipped.detail.blocked_by).toBe('quota');
    expect(r.dump_dir).toBe(path.join(startup.dumpDir, 'logits_finite', 'a', `wave_${wave}`));
  });

  test('auto_max_times 2 with a cooldown: the clock decides', () => {
    let now = 1_000_000;
    const { g, reports } = guard(
      { detector: { logits_finite: { enabled: true, on_trigger: ['report', 'dump_kv'] } }, dump: { auto_max_times: 2, auto_cooldown_seconds: 60 } },
      () => now,
    );
    expect(g.onWaveHead(0, 2, nanFor(1, 'a')).dumps.map((j) => j.reqId)).toEqual(['a']);
    now += 59_999;
    expect(g.onWaveHead(0, 3, nanFor(2, 'b')).dumps).toEqual([]); // cooling down
    now += 1;
    expect(g.onWaveHead(0, 4, nanFor(3, 'c')).dumps.map((j) => j.reqId)).toEqual(['c']);
    now += 3_600_000;
    expect(g.onWaveHead(0, 5, nanFor(4, 'd')).dumps).toEqual([]); // quota spent
    const byReq = Object.fromEntries(reports('logits_finite').map((r) => [r.req_id, r]));
    expect(byReq.a).toMatchObject({ dump_arm_wave: 2 + AHEAD, dump_count: 1, dump_max_times: 2 }); // copied AHEAD waves after its head
    expect(byReq.b).toMatchObject({ dump_arm_wave: null, dump_skipped_reason: 'quota_or_cooldown_blocked' });
    expect(byReq.c).toMatchObject({ dump_arm_wave: 4 + AHEAD, dump_count: 2 });
    expect(byReq.d).toMatchObject({ dump_arm_wave: null, dump_count: 2 });
    expect(g.status().auto_dumps_used).toBe(2);
  });
});
