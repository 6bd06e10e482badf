import * as fs from 'fs';
import * as path from 'path';
import pino from 'pino';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import { registry } from '../src/metrics';
import type { RequestStep, StepTelemetry } from '../src/messages';
import * as http from 'http';
import { cleanup, freePortPair, spawnWavebus, tmpDir, waitFor } from './helpers';

// Every guard made here is closed before the temp dirs go: its ledger's ack timers would otherwise
// fire during a later test file and write manifests into a removed dir (making it again).
const guards: Guard[] = [];
const track = (g: Guard): Guard => (guards.push(g), g);
afterAll(async () => {
  for (const g of guards.splice(0)) g.close();
  await cleanup();
});

function step(reqId: string, p: Partial<RequestStep> = {}): RequestStep {
  return { reqId, newTokenIds: [1], newTokenLogprobs: [], newTokenRanks: [], draftLen: 0, accepted: 0, blockIds: [4, 5], finished: false, freed: false, promptLen: 10, numOutputTokens: 0, ...p };
}
const tel = (wave: number, requests: RequestStep[], nanIds: string[] = []): StepTelemetry => ({
  wave,
  requests,
  nonFinite: nanIds.map((id, i) => ({ row: i, reqId: id, kind: 'pos_inf' })),
});

function guard(runtimeConfig: unknown, extra: Record<string, unknown> = {}) {
  const d = tmpDir();
  const startup = parseStartupOptions(JSON.stringify({ runtime_config: runtimeConfig, ...extra }), {}, d);
  const lines: Record<string, unknown>[] = [];
  const log = pino({ level: 'info' }, { write: (s: string) => lines.push(JSON.parse(s)) });
  const g = track(new Guard({ startup, layout: { worldSize: 8, tp: 4, pp: 2, dp: 1, cp: 1 }, log, pid: 4242, pollIntervalMs: 0, verifyIntervalMs: 0 }));
  const root = startup.dumpDir;
  const readJson = (...p: string[]) => JSON.parse(fs.readFileSync(path.join(...p), 'utf8'));
  const reports = (type: string) => {
    const dir = path.join(startup.reportDir, type);
    return fs.existsSync(dir) ? fs.readdirSync(dir).sort().map((f) => ({ name: f, ...readJson(dir, f) })) : [];
  };
  return { g, startup, root, readJson, reports, lines };
}

const DUMP_ON = { on_trigger: ['report', 'dump_kv'] };
const AUTO = { auto_max_times: 1000, auto_cooldown_seconds: 0 };

describe('arming', () => {
  test('a hit in the telemetry of wave N-1 arms a job for wave N with request_info.json beside the rank dirs', () => {
    const { g, root, readJson, reports } = guard({ detector: { logits_finite: { enabled: true, ...DUMP_ON } }, dump: AUTO });
    g.onWaveHead(0, 10, tel(9, [step('req-a', { blockIds: [1, 2, 3], promptLen: 17, newTokenIds: [5, 6] })]));
    const lanes = g.onWaveHead(0, 11, tel(10, [step('req-a', { blockIds: [1, 2, 3, 9], promptLen: 0 })], ['req-a']));
    // Decided decideAheadWaves(pp = 2) = 2 waves ahead: detected in wave 10 (head 11), copied at the end of wave 13.
    const dir = path.join(root, 'logits_finite', 'req-a', 'wave_13');
    // The dir is made at arm; request_info.json is written once the coordinator published the vector.
    expect(fs.readdirSync(dir)).toEqual([]);
    g.ledger.published(13, lanes.dumps);
    expect(lanes.dumps).toEqual([
      { incidentType: 'logits_finite', reqId: 'req-a', blockIds: [1, 2, 3, 9], detectWave: 10, armWave: 13, dumpDir: dir, requestFinishedAtDump: false, jobId: '13/logits_finite/req-a', replica: 0, ranks: [4, 5, 6, 7] },
    ]);
    const info = readJson(dir, 'request_info.json');
    expect(info).toMatchObject({
      job_id: '13/logits_finite/req-a',
      incident_type: 'logits_finite',
      req_id: 'req-a',
      detect_wave: 10,
      arm_wave: 13,
      block_ids: [1, 2, 3, 9],
      request_finished_at_dump: false,
      rank: 4,
      expected_ranks: [4, 5, 6, 7],
      prompt_token_count: 17,
      output_token_count: 3,
      format: 'pt',
    });
    expect(info.detector_detail).toEqual({ kind: 'pos_inf', kinds: ['pos_inf'], rows: [0] });
    const [r] = reports('logits_finite');
    expect(r.name).toMatch(/^report_\d{8}_\d{6}_\d{3}_req-a_pid4242\.json$/);
    expect(r).toMatchObject({
      incident_type: 'logits_finite',
      req_id: 'req-a',
      rank: 4,
      detect_wave: 10,
      dump_attempted: true,
      dump_arm_wave: 13,
      dump_count: 1,
      dump_max_times: 1000,
      dump_dir: dir,
      block_ids: [1, 2, 3, 9],
      detail: { kind: 'pos_inf', kinds: ['pos_inf'], rows: [0], prompt_token_count: 17, output_token_count: 3 },
    });
    expect(r.request_finished_at_dump).toBeUndefined();
    expect(Date.parse(r.ts)).not.toBeNaN();
  });

  test('finished in the detect wave: armed with request_finished_at_dump everywhere', () => {
    const { g, root, readJson, reports } = guard({ detector: { logits_finite: { enabled: true, ...DUMP_ON } }, dump: AUTO });
    const lanes = g.onWaveHead(0, 5, tel(4, [step('x', { finished: true })], ['x']));
    expect(lanes.dumps).toHaveLength(1);
    expect(lanes.dumps[0].requestFinishedAtDump).toBe(true);
    g.ledger.published(7, lanes.dumps);
    expect(readJson(root, 'logits_finite', 'x', 'wave_7', 'request_info.json').request_finished_at_dump).toBe(true);
    expect(reports('logits_finite')[0].request_finished_at_dump).toBe(true);
  });

  test('freed requests are refused at arm (freed now, or seen freed earlier)', () => {
    const { g, root, readJson, reports, startup } = guard({ detector: { logits_finite: { enabled: true, ...DUMP_ON } }, dump: AUTO, report: { max_per_req: 5, backoff_waves: 0 } });
    let lanes = g.onWaveHead(0, 5, tel(4, [step('y', { finished: true, freed: true })], ['y']));
    expect(lanes.dumps).toEqual([]);
    const sk = readJson(root, 'logits_finite', 'y', 'wave_7', 'dump_skipped.json');
    expect(sk).toMatchObject({ reason: 'finished_or_reaped', req_id: 'y', incident_type: 'logits_finite', stage: 'arm', rank: 4, wave: 7 });
    expect(reports('logits_finite')[0]).toMatchObject({ dump_attempted: true, dump_arm_wave: null, dump_skipped_reason: 'finished_or_reaped' });
    // a late non-finite row for the already-freed request
    lanes = g.onWaveHead(0, 6, tel(5, [], ['y']));
    expect(lanes.dumps).toEqual([]);
    expect(fs.existsSync(path.join(root, 'logits_finite', 'y', 'wave_8', 'dump_skipped.json'))).toBe(true);
    expect(fs.existsSync(path.join(root, 'logits_finite', 'y', 'wave_8', 'request_info.json'))).toBe(false);
    expect(g.status().tracked_requests).toBe(1); // the stub for the late row; 'y' itself was forgotten at free
    expect(startup.reportDir).toBe(path.dirname(root));
  });

  test('empty block ids → dump_skipped empty_block_ids', () => {
    const { g, root, readJson } = guard({ detector: { logits_finite: { enabled: true, ...DUMP_ON } }, dump: AUTO });
    const lanes = g.onWaveHead(0, 3, tel(2, [step('z', { blockIds: [] })], ['z']));
    expect(lanes.dumps).toEqual([]);
    expect(readJson(root, 'logits_finite', 'z', 'wave_5', 'dump_skipped.json').reason).toBe('empty_block_ids');
  });

  test('the same (wave, req_id) is armed once, whatever the detectors', () => {
    const { g, lines } = guard({
      detector: { logits_finite: { enabled: true, ...DUMP_ON }, spec_acceptance: { enabled: true, window: 1, ...DUMP_ON } },
      dump: AUTO,
    });
    const lanes = g.onWaveHead(0, 3, tel(2, [step('d', { draftLen: 4, accepted: 1 })], ['d']));
    expect(lanes.dumps.map((j) => `${j.incidentType}:${j.reqId}`)).toEqual(['spec_acceptance:d']);
    expect((g.status().dumps as Record<string, number>).duplicates).toBe(1);
    expect(lines.some((l) => /already armed/.test(String(l.msg)))).toBe(true);
  });

  test('scope all_requests arms every running request (one auto-dump use)', () => {
    const { g } = guard({ detector: { logits_finite: { enabled: true, on_trigger: ['dump_kv'], dump_kv: { scope: 'all_requests' } } }, dump: AUTO });
    g.onWaveHead(0, 1, tel(0, [step('a'), step('b'), step('c', { finished: true }), step('e', { blockIds: [] })]));
    const lanes = g.onWaveHead(0, 2, tel(1, [step('b')], ['b']));
    expect(lanes.dumps.map((j) => j.reqId).sort()).toEqual(['a', 'b']);
    expect(g.status().auto_dumps_used).toBe(1);
    expect((g.status().dumps as Record<string, Record<string, number>>).skipped).toEqual({ empty_block_ids: 1 });
  });

  test('unsafe request ids become safe, distinct path components', () => {
    const { g, root } = guard({ detector: { logits_finite: { enabled: true, ...DUMP_ON } }, dump: AUTO });
    const lanes = g.onWaveHead(0, 2, tel(1, [step('../../etc'), step('a/b')], ['../../etc', 'a/b']));
    g.ledger.published(4, lanes.dumps);
    for (const j of lanes.dumps) {
      expect(path.dirname(path.dirname(j.dumpDir))).toBe(path.join(root, 'logits_finite'));
      expect(fs.existsSync(path.join(j.dumpDir, 'request_info.json'))).toBe(true);
    }
    expect(new Set(lanes.dumps.map((j) => path.basename(path.dirname(j.dumpDir)))).size).toBe(2);
  });
});

describe('detectors through the guard', () => {
  test('token_repeat report with sensitive token ids only when allowed', () => {
    for (const sensitive of [false, true]) {
      const { g, reports } = guard({
        detector: { token_repeat: { enabled: true, window: 4, min_tokens: 4, repeat_sum_threshold: 5 } },
        report: { save_sensitive_info: sensitive, include_block_ids: false, max_prompt_token_ids: 3 },
      });
      // the prompt's ids come with the request's first step only (the first binding)
      for (let w = 1; w <= 6; w++) g.onWaveHead(0, w + 1, tel(w, [step('t', { newTokenIds: [9], promptTokenIds: w === 1 ? [101, 102, 103, 104] : [] }), step('u', { newTokenIds: [w] })]));
      const rs = reports('token_repeat');
      expect(rs).toHaveLength(1);
      expect(rs[0]).toMatchObject({ req_id: 't', detect_wave: 4, dump_attempted: false, dump_arm_wave: null, dump_dir: null });
      expect(rs[0].detail).toMatchObject({ repeat_sum: 6, threshold: 5, window: 4, content_tokens_seen: 4, last_score: 3, consecutive_hits: 1, output_token_count: 4 });
      expect(rs[0].block_ids).toBeUndefined();
      if (sensitive) {
        expect(rs[0].detail.recent_token_ids).toEqual([9, 9, 9, 9]);
        expect(rs[0].detail.output_token_ids).toEqual([9, 9, 9, 9]);
        expect(rs[0].detail.prompt_token_ids).toEqual([101, 102, 103]); // the first max_prompt_token_ids
      } else {
        expect(rs[0].detail.recent_token_ids).toBeUndefined();
        expect(rs[0].detail.output_token_ids).toBeUndefined();
        expect(rs[0].detail.prompt_token_ids).toBeUndefined();
      }
    }
  });

  test('garbled and spec_acceptance reach reports', () => {
    const { g, reports } = guard({ detector: { garbled: { enabled: true, window: 4, min_tokens: 4 }, spec_acceptance: { enabled: true, window: 2 } } });
    for (let w = 1; w <= 4; w++) g.onWaveHead(0, w + 1, tel(w, [step('g', { newTokenLogprobs: [-9], newTokenRanks: [400] }), step('s', { draftLen: 3, accepted: 4 })]));
    expect(reports('garbled').map((r) => [r.req_id, r.detect_wave])).toEqual([['g', 4]]);
    expect(reports('spec_acceptance').map((r) => [r.req_id, r.detect_wave, r.detail.direction])).toEqual([['s', 2, 'high']]);
  });

  test('spec_acceptance alerts on every full-window step; "quotas alone decide whether that alert is reported"', () => {
    const { g, reports } = guard({ detector: { spec_acceptance: { enabled: true, window: 2 } }, report: { max_per_req: 3, backoff_waves: 2 } });
    // nothing but the bonus token accepted, every step: the low condition holds from detect wave 2 on
    for (let w = 1; w <= 12; w++) g.onWaveHead(0, w + 1, tel(w, [step('s', { draftLen: 4, accepted: 1 })]));
    // reports at 2, then a gap of 2 (wave 4), then of 4 (wave 8): the cap of 3 is reached and mutes it
    expect(reports('spec_acceptance').map((r) => r.detect_wave)).toEqual([2, 4, 8]);
    const inc = (g.status().incidents as Record<string, Record<string, number>>).spec_acceptance;
    expect(inc.report).toBe(3);
    expect(inc.suppressed_backoff).toBe(4); // the alerts of detect waves 3, 5, 6 and 7; after 8 the request is muted
    expect(inc.suppressed_max_per_req).toBeUndefined();
  });

  test('non-finite rows without a request: warning and a count, never a report', () => {
    const { g, reports, lines } = guard({ detector: { logits_finite: { enabled: true } } });
    g.onWaveHead(0, 2, { wave: 1, requests: [step('a')], nonFinite: [{ row: 3, reqId: '', kind: 'nan' }, { row: 4, reqId: '', kind: 'nan' }] });
    expect(reports('logits_finite')).toEqual([]);
    expect(g.status().unattributed_non_finite).toBe(2);
    expect(lines.filter((l) => /no request/.test(String(l.msg)))).toHaveLength(1);
  });

  test('detectors are off by default', () => {
    const { g, reports, startup } = guard({});
    for (let w = 1; w < 50; w++) g.onWaveHead(0, w + 1, tel(w, [step('a', { newTokenIds: [7], newTokenLogprobs: [-20], draftLen: 4, accepted: 1 })], ['a']));
    for (const t of ['token_repeat', 'logits_finite', 'spec_acceptance', 'garbled']) expect(reports(t)).toEqual([]);
    expect(fs.existsSync(startup.reportDir)).toBe(false);
  });

  test('incidents are counted in the Prometheus registry by type and action', async () => {
    const { g } = guard({ detector: { logits_finite: { enabled: true } } });
    const before = await registry.getSingleMetricAsString('wavebus_incidents_total');
    const count = (text: string) => Number(/wavebus_incidents_total\{incident_type="logits_finite",action="report"\} (\d+)/.exec(text)?.[1] ?? 0);
    g.onWaveHead(0, 2, tel(1, [step('p')], ['p']));
    const after = await registry.getSingleMetricAsString('wavebus_incidents_total');
    expect(count(after) - count(before)).toBe(1);
  });
});

describe('manual dump watermark', () => {
  function hotGuard() {
    const h = guard({}, { runtime_config_hot_reload: true });
    const setManual = (n: number) => {
      const live = JSON.parse(fs.readFileSync(h.startup.configPath, 'utf8'));
      live.dump.manual_dump = n;
      fs.writeFileSync(h.startup.configPath, JSON.stringify(live));
      // make the change visible to a stat even on coarse-mtime file systems
      const t = Date.now() / 1000 + n;
      fs.utimesSync(h.startup.configPath, t, t);
    };
    return { ...h, setManual };
  }
  const running = () => [step('a'), step('b'), step('f', { finished: true })];

  test('0 → 1 gives exactly one manual dump of all running requests', () => {
    const { g, setManual, root, readJson } = hotGuard();
    g.onWaveHead(0, 1, tel(0, running()));
    setManual(1);
    const waves: string[][] = [];
    for (let w = 2; w <= 5; w++) {
      const lanes = g.onWaveHead(0, w, tel(w - 1, running()));
      g.ledger.published(w + 2, lanes.dumps);
      waves.push(lanes.dumps.map((j) => `${j.incidentType}:${j.reqId}@${j.armWave}`));
    }
    expect(waves).toEqual([['manual_trigger:a@4', 'manual_trigger:b@4'], [], [], []]);
    expect(readJson(root, 'manual_trigger', 'a', 'wave_4', 'request_info.json')).toMatchObject({ incident_type: 'manual_trigger', manual_dump: 1, arm_wave: 4, detect_wave: 1 });
    expect(g.status()).toMatchObject({ manual_dump: 1, manual_dump_done: 1 });
    expect(g.snapshotState(0).manualDumpDone).toBe(1);
  });

  test('1 → 4 catches up one dump per wave over three waves', () => {
    const { g, setManual } = hotGuard();
    setManual(1);
    g.onWaveHead(0, 1, tel(0, running()));
    expect(g.status().manual_dump_done).toBe(1);
    setManual(4);
    const counts: number[] = [];
    for (let w = 2; w <= 6; w++) counts.push(g.onWaveHead(0, w, tel(w - 1, running())).dumps.length);
    expect(counts).toEqual([2, 2, 2, 0, 0]);
    expect(g.status()).toMatchObject({ manual_dump: 4, manual_dump_done: 4 });
  });

  test('no running request: the trigger is consumed with no_dump_targets', () => {
    const { g, setManual, root, readJson } = hotGuard();
    setManual(1);
    expect(g.onWaveHead(0, 3, null).dumps).toEqual([]);
    expect(readJson(root, 'manual_trigger', 'wave_5', 'dump_skipped.json')).toMatchObject({ reason: 'no_dump_targets', stage: 'arm', wave: 5 });
    expect(g.status().manual_dump_done).toBe(1);
  });
});

describe('startup (seed: startup overwrites the JSON from defaults/overlay)', () => {
  test('a manual_dump: 2 left in the file no longer fires two catch-up dumps at the first waves', () => {
    const d = tmpDir();
    const startup = parseStartupOptions(JSON.stringify({ runtime_config_hot_reload: true }), {}, d);
    fs.mkdirSync(path.dirname(startup.configPath), { recursive: true });
    fs.writeFileSync(startup.configPath, JSON.stringify({ dump: { manual_dump: 2 } }));
    const g = track(new Guard({ startup, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, log: pino({ level: 'silent' }), pollIntervalMs: 0, verifyIntervalMs: 0 }));
    const counts: number[] = [];
    for (let w = 1; w <= 4; w++) counts.push(g.onWaveHead(0, w, tel(w - 1, [step('a'), step('b')])).dumps.length);
    expect(counts).toEqual([0, 0, 0, 0]);
    expect(g.status()).toMatchObject({ manual_dump: 0, manual_dump_done: 0, startup_config_errors: [] });
    expect(JSON.parse(fs.readFileSync(startup.configPath, 'utf8')).dump.manual_dump).toBe(0);
    g.close();
  });

  test('an invalid overlay and file: the guard runs on the defaults; the errors show in status and as a metric', async () => {
    const d = tmpDir();
    const startup = parseStartupOptions(JSON.stringify({ runtime_config: { detector: { token_repeat: { window: 0 } } } }), {}, d);
    fs.mkdirSync(path.dirname(startup.configPath), { recursive: true });
    fs.writeFileSync(startup.configPath, '{"dump": ');
    const metric = async (source: string) =>
      Number(new RegExp(`wavebus_runtime_config_startup_errors_total\\{source="${source}"\\} (\\d+)`).exec(await registry.metrics())?.[1] ?? 0);
    const before = [await metric('overlay'), await metric('file')];
    const { g, lines } = (() => {
      const lines: Record<string, unknown>[] = [];
      const log = pino({ level: 'info' }, { write: (x: string) => lines.push(JSON.parse(x)) });
      return { g: track(new Guard({ startup, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, log })), lines };
    })();
    expect(g.config().detector.token_repeat.window).toBe(32);
    const errs = g.status().startup_config_errors as { source: string; error: string }[];
    expect(errs.map((e) => e.source)).toEqual(['file', 'overlay']);
    expect(errs[1].error).toMatch(/detector\.token_repeat\.window: expected an integer in \[1, 65536\], got 0/);
    expect(lines.filter((l) => l.level === 50 && /^RUNTIME CONFIG ERROR/.test(String(l.msg)))).toHaveLength(2);
    expect([await metric('overlay'), await metric('file')]).toEqual([before[0] + 1, before[1] + 1]);
    g.close();
  });

  test('`wavebus coordinator` with a bad file and a bad overlay keeps serving; /healthz and /metrics show the error', async () => {
    const d = tmpDir();
    const file = path.join(d, 'runtime', 'config', 'runtime_config.json');
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, '{ "dump": { "manual_dump": 2 }, oops }');
    const port = await freePortPair();
    const c = spawnWavebus([
      'coordinator', '--port', String(port), '--world-size', '1', '--metrics-port', '0',
      '--runtime-config-path', file, '--additional-config', JSON.stringify({ runtime_config: { dump: { format: 'zip' } } }),
    ]);
    const started = await waitFor(() => c.stdout().split('\n').map((l) => (l.includes('"started"') ? JSON.parse(l) : null)).find((x) => x), 'the coordinator to start', 30000);
    const get = (u: string) =>
      new Promise<string>((resolve, reject) => {
        http.get(`http://${started.metrics.host}:${started.metrics.port}${u}`, (res) => {
          let body = '';
          res.on('data', (ch) => (body += ch));
          res.on('end', () => resolve(body));
        }).on('error', reject);
      });
    const health = JSON.parse(await get('/healthz'));
    expect(health.startup_config_errors.map((e: { source: string }) => e.source)).toEqual(['file', 'overlay']);
    expect(health.startup_config_errors[1].error).toMatch(/dump\.format: expected one of "pt" \| "npy" \| "safetensors", got "zip"/);
    expect(health.manual_dump).toBe(0);
    expect(await get('/metrics')).toMatch(/wavebus_runtime_config_startup_errors_total\{source="overlay"\} 1/);
    expect(c.stderr()).toMatch(/RUNTIME CONFIG ERROR: startup overlay rejected; using the defaults/);
    expect(JSON.parse(fs.readFileSync(file, 'utf8')).dump).toMatchObject({ manual_dump: 0, format: 'pt' });
    expect(c.child.exitCode).toBeNull();
    c.child.kill('SIGTERM');
    await c.exited;
  });
});

describe('dump completion manifest', () => {
  const result = (rank: number, jobId: string, p: Record<string, unknown> = {}) => ({
    globalRank: rank,
    jobId,
    wave: 2,
    files: [{ path: `dp0_tp${rank - 4}_pp1_cp0/layer0.pt`, bytes: 100 + rank, checksum: `sha256:${rank}` }],
    bytes: 100 + rank,
    error: '',
    skippedReason: '',
    ...p,
  });

  test('all ranks ack → complete manifest', () => {
    const { g, readJson } = guard({ detector: { logits_finite: { enabled: true, ...DUMP_ON } }, dump: AUTO });
    const [job] = g.onWaveHead(0, 2, tel(1, [step('m')], ['m'])).dumps;
    for (const r of [4, 5, 6]) g.ledger.ack(result(r, job.jobId));
    expect(fs.existsSync(path.join(job.dumpDir, 'manifest.json'))).toBe(false);
    g.ledger.ack(result(7, job.jobId));
    // Every rank acked, but the copy wave's telemetry is not in yet: the manifest waits for it.
    expect(fs.existsSync(path.join(job.dumpDir, 'manifest.json'))).toBe(false);
    g.onWaveHead(0, 3, tel(2, [step('m')]));
    g.onWaveHead(0, 4, tel(3, [step('m')]));
    expect(fs.existsSync(path.join(job.dumpDir, 'manifest.json'))).toBe(false);
    g.onWaveHead(0, 5, tel(4, [step('m')])); // the telemetry of the copy wave (4): m still holds its blocks
    const m = readJson(job.dumpDir, 'manifest.json');
    expect(m.incomplete_reason).toBeUndefined();
    expect(m).toMatchObject({ job_id: job.jobId, incident_type: 'logits_finite', req_id: 'm', arm_wave: 4, detect_wave: 1, expected_ranks: [4, 5, 6, 7], completed_ranks: [4, 5, 6, 7], missing_ranks: [], failed_ranks: {}, complete: true, timed_out: false });
    expect(m.files['5']).toEqual([{ path: 'dp0_tp1_pp1_cp0/layer0.pt', bytes: 105, checksum: 'sha256:5' }]);
    expect(g.status().dumps).toMatchObject({ armed: 1, completed: 1, incomplete: 0, pending: 0 });
  });

  test('a request freed before its copy wave ended: the manifest says freed_before_copy, never complete', () => {
    const { g, readJson } = guard({ detector: { logits_finite: { enabled: true, ...DUMP_ON } }, dump: AUTO });
    // Detected in wave 1 (head 2), copied at the end of wave 4 (pp = 2); the engine gives m's blocks back in wave 4.
    const [job] = g.onWaveHead(0, 2, tel(1, [step('m'), step('k')], ['m'])).dumps;
    expect(job.armWave).toBe(4);
    g.onWaveHead(0, 3, tel(2, [step('m'), step('k')]));
    g.onWaveHead(0, 4, tel(3, [step('m', { finished: true }), step('k')]));
    for (const r of [4, 5, 6, 7]) g.ledger.ack(result(r, job.jobId));
    g.onWaveHead(0, 5, tel(4, [step('m', { finished: true, freed: true }), step('k')]));
    const m = readJson(job.dumpDir, 'manifest.json');
    expect(m).toMatchObject({ complete: false, incomplete_reason: 'freed_before_copy', freed_wave: 4, arm_wave: 4, completed_ranks: [4, 5, 6, 7] });
    expect(g.status().dumps).toMatchObject({ completed: 0, incomplete: 1, freed_before_copy: 1 });
  });

  test('a request freed after its copy wave (an engine that deferred the free): the dump is complete', () => {
    const { g, readJson } = guard({ detector: { logits_finite: { enabled: true, ...DUMP_ON } }, dump: AUTO });
    const [job] = g.onWaveHead(0, 2, tel(1, [step('m')], ['m'])).dumps;
    g.onWaveHead(0, 3, tel(2, [step('m', { finished: true })]));
    g.onWaveHead(0, 4, tel(3, []));
    g.onWaveHead(0, 5, tel(4, [])); // kept through the copy wave, 4 (pendingDump)
    for (const r of [4, 5, 6, 7]) g.ledger.ack(result(r, job.jobId));
    g.onWaveHead(0, 6, tel(5, [step('m', { finished: true, freed: true })]));
    expect(readJson(job.dumpDir, 'manifest.json')).toMatchObject({ complete: true, completed_ranks: [4, 5, 6, 7] });
    expect(g.status().dumps).toMatchObject({ completed: 1, incomplete: 0, freed_before_copy: 0 });
  });

  test('acks in, but the guard stops before the copy window closed: copy_window_unconfirmed', () => {
    const { g, readJson } = guard({ detector: { logits_finite: { enabled: true, ...DUMP_ON } }, dump: AUTO });
    const [job] = g.onWaveHead(0, 2, tel(1, [step('m')], ['m'])).dumps;
    for (const r of [4, 5, 6, 7]) g.ledger.ack(result(r, job.jobId));
    g.close();
    expect(readJson(job.dumpDir, 'manifest.json')).toMatchObject({ complete: false, incomplete_reason: 'copy_window_unconfirmed' });
  });

  // Timeouts, late acks and ranks outside the job: test/dump-ledger.test.ts.
});
