// The detectors' state kept in a slab of per-request records (src/guard/detectors/slab.ts):
// the guard (many requests, slots reused after a request is freed, hot-reloaded windows) against
// one standalone detector per request.
import * as fs from 'fs';
import * as path from 'path';
import pino from 'pino';
import { defaultConfig } from '../src/guard/config';
import { DetectorSet, GarbledDetector, SpecAcceptanceDetector, StateSlab, TokenRepeatDetector } from '../src/guard/detectors';
import { detectStep, headerLayout, HitBuffer, LAYOUT, nativeDetector, newParams, PARAM, PARAM_COUNT, paramSlots } from '../src/guard/detectors/kernel';
import { DETECTOR_NAMES, DETECTORS } from '../src/guard/detectors/registry';
import { native } from '../src/native';
import { Guard } from '../src/guard/guard';
import { admitIncident, IncidentCount } from '../src/guard/quotas';
import { parseStartupOptions } from '../src/guard/startup';
import type { RequestStep } from '../src/messages';
import { cleanup, tmpDir } from './helpers';

afterAll(cleanup);

let seed = 4242;
const rnd = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
const int = (n: number) => Math.floor(rnd() * n);

describe('state slab', () => {
  test('records of a slot are independent, kept across growth, and reset to zero', () => {
    const slab = new StateSlab(10);
    for (let slot = 0; slot < 5000; slot += 7) {
      slab.ensure(slot); // grows by doubling, copying what is there
      const b = slab.base(slot);
      slab.i32[b] = slot + 1;
      slab.f64[(b + 2) >> 1] = slot / 3;
    }
    expect(slab.records).toBeGreaterThan(4998);
    for (let slot = 0; slot < 5000; slot += 7) {
      const b = slab.base(slot);
      expect(slab.i32[b]).toBe(slot + 1);
      expect(slab.f64[(b + 2) >> 1]).toBe(slot / 3);
    }
    slab.reset(14);
    expect(slab.i32[slab.base(14)]).toBe(0);
    expect(slab.i32[slab.base(21)]).toBe(22);
  });
});

describe('guard: slab state per request vs one standalone detector per request', () => {
  function newGuard() {
    const d = tmpDir();
    const runtime_config = {
      detector: {
        token_repeat: { enabled: true, window: 6, min_tokens: 6, repeat_sum_threshold: 12 },
        spec_acceptance: { enabled: true, window: 4 },
        garbled: { enabled: true, window: 5, min_tokens: 5 },
        logits_finite: { enabled: false },
      },
      report: { max_per_req: 1000, backoff_waves: 1 },
    };
    const startup = parseStartupOptions(JSON.stringify({ runtime_config }), {}, d);
    const g = new Guard({ startup, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, log: pino({ level: 'silent' }), pollIntervalMs: 0, verifyIntervalMs: 0 });
    const reports = () => {
      const out: { type: string; req: string; wave: number; detail: Record<string, unknown> }[] = [];
      for (const type of ['token_repeat', 'spec_acceptance', 'garbled']) {
        const dir = path.join(startup.reportDir, type);
        if (!fs.existsSync(dir)) continue;
        for (const f of fs.readdirSync(dir)) {
          const r = JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
          out.push({ type, req: r.req_id, wave: r.detect_wave, detail: r.detail });
        }
      }
      return out.sort((a, b) => a.wave - b.wave || a.req.localeCompare(b.req) || a.type.localeCompare(b.type));
    };
    return { g, startup, reports };
  }

  test('random streams over 30 requests with frees (slot reuse), inserts and reorders: the same incidents, wave for wave', () => {
    const { g, reports } = newGuard();
    const cfg = g.config().detector;
    const models = new Map<string, { tr: TokenRepeatDetector; trs: ReturnType<TokenRepeatDetector['newState']>; sp: SpecAcceptanceDetector; sps: ReturnType<SpecAcceptanceDetector['newState']>; ga: GarbledDetector; gas: ReturnType<GarbledDetector['newState']> }>();
    const model = (id: string) => {
      let m = models.get(id);
      if (!m) {
        const tr = new TokenRepeatDetector(cfg.token_repeat);
        const sp = new SpecAcceptanceDetector(cfg.spec_acceptance);
        const ga = new GarbledDetector(cfg.garbled);
        m = { tr, trs: tr.newState(), sp, sps: sp.newState(), ga, gas: ga.newState() };
        models.set(id, m);
      }
      return m;
    };
    const want: { type: string; req: string; wave: number; detail: Record<string, unknown> }[] = [];
    // the guard's report quota (backoff between repeated incidents) applies to the model's hits too
    const counts = new Map<string, IncidentCount>();
    const hit = (type: string, req: string, wave: number, detail: unknown) => {
      const k = `${type}/${req}`;
      const c = counts.get(k) ?? { count: 0, lastWave: 0 };
      counts.set(k, c);
      if (admitIncident(c, wave, g.config().report).ok) want.push({ type, req, wave, detail: detail as Record<string, unknown> });
    };
    let live = Array.from({ length: 30 }, (_, i) => `r${i}`);
    let next = 30;
    for (let wave = 1; wave <= 250; wave++) {
      const steps: RequestStep[] = [];
      const freedNow: string[] = [];
      for (const id of live) {
        const loopy = id.charCodeAt(1) % 3 === 0; // some requests stutter, some are garbled
        const n = int(3);
        const newTokenIds = Array.from({ length: n }, () => (loopy ? int(3) : int(400)));
        const newTokenLogprobs = newTokenIds.map(() => (rnd() < 0.3 ? -9 - rnd() * 5 : -rnd()));
        const newTokenRanks = newTokenIds.map(() => int(80));
        const draftLen = int(4);
        const accepted = int(draftLen + 2);
        const freed = rnd() < 0.02;
        if (freed) freedNow.push(id);
        steps.push({ reqId: id, newTokenIds, newTokenLogprobs, newTokenRanks, draftLen, accepted, blockIds: [1], finished: freed, freed, promptLen: 3, numOutputTokens: 0 });
        const m = model(id);
        const detect = wave - 1;
        if (n > 0) {
          const h = m.tr.onTokens(m.trs, newTokenIds);
          if (h) hit('token_repeat', id, detect, h);
        }
        const hs = m.sp.onStep(m.sps, draftLen, accepted);
        if (hs) hit('spec_acceptance', id, detect, hs);
        if (n > 0) {
          const hg = m.ga.onTokens(m.gas, newTokenLogprobs, newTokenRanks, n);
          if (hg) hit('garbled', id, detect, hg);
        }
      }
      g.onWaveHead(0, wave, { wave: wave - 1, requests: steps, nonFinite: [] });
      // freed requests leave; new ones (new ids, reused slots) arrive
      live = live.filter((id) => !freedNow.includes(id));
      for (const _ of freedNow) live.splice(int(live.length + 1), 0, `r${next++}`); // anywhere in the batch
      if (rnd() < 0.05) live.sort(() => rnd() - 0.5); // the engine may reorder its batch
      if (rnd() < 0.05) live.reverse();
    }
    expect(next).toBeGreaterThan(33); // slots were reused
    const got = reports();
    want.sort((a, b) => a.wave - b.wave || a.req.localeCompare(b.req) || a.type.localeCompare(b.type));
    expect(want.length).toBeGreaterThan(20);
    expect(got.map((r) => ({ ...r, detail: undefined }))).toEqual(want.map((r) => ({ ...r, detail: undefined })));
    for (let i = 0; i < got.length; i++) expect(got[i].detail).toMatchObject(want[i].detail);
    g.close();
  });

  test('a hot-reloaded detector config restarts every request\'s state', () => {
    const d = tmpDir();
    const cfgPath = path.join(d, 'config', 'runtime_config.json');
    fs.mkdirSync(path.dirname(cfgPath), { recursive: true });
    const write = (window: number) =>
      fs.writeFileSync(cfgPath, JSON.stringify({ detector: { token_repeat: { enabled: true, window, min_tokens: 0, repeat_sum_threshold: 5 } } }));
    write(8);
    const startup = parseStartupOptions(JSON.stringify({ runtime_config_path: cfgPath, runtime_config_hot_reload: true }), {}, d);
    const g = new Guard({ startup, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, log: pino({ level: 'silent' }), pollIntervalMs: 0, verifyIntervalMs: 0 });
    const st = (t: number): RequestStep => ({ reqId: 'a', newTokenIds: [t], newTokenLogprobs: [], newTokenRanks: [], draftLen: 0, accepted: 0, blockIds: [1], finished: false, freed: false, promptLen: 1, numOutputTokens: 0 });
    // scores 0,1,2 → sum 3: not over 5
    for (let w = 1; w <= 3; w++) g.onWaveHead(0, w, { wave: w - 1, requests: [st(7)], nonFinite: [] });
    write(9); // new window: state restarts, so three more 7s score 0,1,2 again (sum 3), no alert
    for (let w = 4; w <= 6; w++) g.onWaveHead(0, w, { wave: w - 1, requests: [st(7)], nonFinite: [] });
    expect(g.config().detector.token_repeat.window).toBe(9);
    expect(g.status().incidents).toEqual({});
    g.onWaveHead(0, 7, { wave: 6, requests: [st(7)], nonFinite: [] }); // score 3: sum 6 > 5
    expect(g.status().incidents).toMatchObject({ token_repeat: { report: 1 } });
    g.close();
  });
});

describe('native detector pass', () => {
  const cols = { tokenCount: Uint32Array.of(1), tokenIds: Uint32Array.of(7), tokenLogprobs: new Float32Array(0), tokenRanks: new Uint32Array(0), draftLen: new Uint32Array(0), accepted: new Uint32Array(0) };
  test('stays inside its buffers: a record past the state or token counts past the ids are refused with ERR_INVALID_ARG', () => {
    const d = new TokenRepeatDetector({ ...defaultConfig().detector.token_repeat, enabled: true });
    const params = newParams(d.words);
    d.fill(params, 0, 10);
    const state = new Int32Array(d.words);
    const hits = new HitBuffer();
    expect(detectStep(state, params, d.ignore, Int32Array.of(0), Int32Array.of(0), cols, hits)).toBe(0);
    expect(() => detectStep(state, params, d.ignore, Int32Array.of(2), Int32Array.of(0), cols, hits)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG' }));
    expect(() => detectStep(state, params, d.ignore, Int32Array.of(0), Int32Array.of(0), { ...cols, tokenCount: Uint32Array.of(2) }, hits)).toThrow(/tokenCount adds up to more than tokenIds/);
    expect(() => detectStep(state, params, d.ignore, Int32Array.of(0), new Int32Array(0), cols, hits)).toThrow(/rowMuted/);
  });

  test('refuses parameters that would put a detector\'s header or body outside the record, naming the part', () => {
    const d = new TokenRepeatDetector({ ...defaultConfig().detector.token_repeat, enabled: true });
    const hits = new HitBuffer();
    const state = new Int32Array(4 * d.words);
    const run = (p: Float64Array) => () => detectStep(state, p, d.ignore, Int32Array.of(0), Int32Array.of(0), cols, hits);
    const withParts = (head: number, body: number, tweak: (p: Float64Array) => void = () => undefined) => {
      const p = newParams(d.words);
      d.fill(p, head, body);
      tweak(p);
      return p;
    };
    expect(run(withParts(0, 10))).not.toThrow();
    expect(run(withParts(0, 12))).toThrow(/params: token_repeat body at word 12 \(\d+ words\) is outside the \d+-word record/);
    expect(run(withParts(d.words - 8, 10))).toThrow(/params: token_repeat header at word \d+ \(10 words\) is outside/);
    expect(run(withParts(1, 11))).toThrow(/token_repeat header at word 1/); // float64 sum at an odd word
    // a hash shift that does not match the table would probe past it
    expect(run(withParts(0, 10, (p) => (p[PARAM.hashShift] -= 1)))).toThrow(/match the hash shift/);
    const g = new GarbledDetector({ ...defaultConfig().detector.garbled, enabled: true });
    const gp = newParams(g.words);
    g.fill(gp, 0, 8);
    expect(() => detectStep(new Int32Array(g.words), gp, d.ignore, Int32Array.of(0), Int32Array.of(0), cols, hits)).toThrow(/params: garbled body at word 8/);
  });
});

describe('record layout: defined once in native/detector_pass.cc, read by TypeScript', () => {
  test('the addon exports it frozen, with every slot and header word TypeScript uses', () => {
    expect(LAYOUT).toBe(native.detectorLayout);
    expect(Object.isFrozen(LAYOUT)).toBe(true);
    expect(Object.isFrozen(LAYOUT.params)).toBe(true);
    // slots are 0..PARAM_COUNT-1, each once
    expect(Object.values(PARAM).sort((a, b) => a - b)).toEqual(Array.from({ length: PARAM_COUNT }, (_, i) => i));
    expect(Object.keys(PARAM)).toEqual(expect.arrayContaining(['recordWords', 'repeatHead', 'tableAt', 'specBody', 'garbledWindow', 'limitMbits']));
    expect([...LAYOUT.hitTypes]).toEqual(['token_repeat', 'spec_acceptance', 'garbled']);
    expect(LAYOUT.muteBits).toEqual({ token_repeat: 1, logits_finite: 2, spec_acceptance: 4, garbled: 8, rank_divergence: 16 });
    expect(Object.keys(LAYOUT.tokenRepeat as object).sort()).toEqual(['alerted', 'consecutive', 'headerWords', 'lastScore', 'scorePos', 'seen', 'sum', 'tokLen', 'tokPos']);
    expect(Object.keys(LAYOUT.specAcceptance as object).sort()).toEqual(['headerWords', 'len', 'pos', 'sumAcc', 'sumDraft']);
    expect(Object.keys(LAYOUT.garbled as object).sort()).toEqual(['headerWords', 'len', 'pos', 'seen', 'sum', 'surprising']);
  });

  test('every header offset lies inside its header, float64s at even words', () => {
    const f64 = new Set(['sum', 'sumDraft', 'sumAcc']);
    for (const h of [LAYOUT.tokenRepeat, LAYOUT.specAcceptance, LAYOUT.garbled] as Record<string, number>[]) {
      expect(h.headerWords % 2).toBe(0);
      for (const [k, at] of Object.entries(h)) {
        if (k === 'headerWords') continue;
        expect(at).toBeGreaterThanOrEqual(0);
        expect(at + (f64.has(k) ? 2 : 1)).toBeLessThanOrEqual(h.headerWords);
        if (f64.has(k)) expect(at % 2).toBe(0);
      }
    }
  });
});

describe('the detector registry (src/guard/detectors/registry.ts) is what the rest reads', () => {
  test('every detector has its config under its name: off by default, with each of its own parameters at its default', () => {
    const cfg = defaultConfig();
    expect(Object.keys(cfg.detector)).toEqual([...DETECTOR_NAMES]);
    expect(DETECTOR_NAMES).toEqual(DETECTORS.map((d) => d.name));
    for (const d of DETECTORS) {
      const own = cfg.detector[d.name] as unknown as Record<string, unknown>;
      expect(own.enabled).toBe(false);
      for (const [k, f] of Object.entries(d.params)) expect(own[k]).toEqual('def' in f ? f.def : undefined);
    }
  });

  test('the guard builds every enabled per-step detector from its spec and lays their parts end to end', () => {
    const cfg = defaultConfig();
    for (const n of DETECTOR_NAMES) cfg.detector[n].enabled = true;
    const set = new DetectorSet(cfg);
    expect([...set.enabled]).toEqual([...DETECTOR_NAMES]);
    const parts = DETECTORS.flatMap((d) => (d.perStep ? [(d.perStep as (c: unknown) => { headerWords: number; bodyWords: number })(cfg.detector[d.name])] : []));
    expect(parts).toHaveLength(3);
    const words = parts.reduce((a, p) => a + p.headerWords + p.bodyWords, 0);
    expect(set.recordOf(1) - set.recordOf(0)).toBe(words);
    for (const p of parts) expect([p.headerWords % 2, p.bodyWords % 2]).toEqual([0, 0]);
  });

  test('a detector file and an addon that disagree fail at load, naming what the pass lacks', () => {
    expect(() => nativeDetector('fifth_detector', true)).toThrow(expect.objectContaining({ code: 'ERR_NATIVE_LAYOUT', message: expect.stringContaining('mute bit for fifth_detector') }));
    expect(() => headerLayout('garbled', ['pos', 'nope'])).toThrow(/header word garbled\.nope/);
    expect(() => paramSlots(['recordWords', 'fifthOn'])).toThrow(/parameter fifthOn/);
    expect(headerLayout('garbled', ['pos']).pos).toBe((LAYOUT.garbled as { pos: number }).pos);
  });
});
