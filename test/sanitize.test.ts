// Untrusted ids → single safe path components; joinUnder never lets a path escape its root.
import * as fs from 'fs';
import * as path from 'path';
import { isSafeComponent, joinUnder, safeComponent, MAX_COMPONENT_BYTES } from '../src/artifacts/sanitize';
import { CaptureError } from '../src/errors';
import { readPt } from '../src/artifacts/pt-reader';
import { cleanup, tmpDir, waitFor } from './helpers';
import { runWave, startHarnessJob, step, stopHarnessJob, type HarnessJob } from './job-harness';

afterAll(cleanup);

/** Layer names as real models spell them, and the awkward ones. */
const LAYER_NAMES = [
  'model.layers.0.self_attn', // Llama / vLLM
  'decoder/layers_0/attn', // Flax / T5X
  'layers[3].kv',
  'h.0.attn.c_attn', // GPT-2
  'attn%mix',
  '注意力.层0',
  '.hidden_layer',
  'transformer.blocks.' + 'very_long_module_name.'.repeat(12) + 'attn', // > 160 bytes
];

const NASTY = ['../', '..', '.', '', '/', '/etc/passwd', '..\\..\\x', 'a/../../b', 'nul\0byte', 'tab\tnew\nline', '\x7f', '.hidden', '%2E%2E', 'ok-id_1.2'];

describe('safeComponent', () => {
  test.each(NASTY)('%j becomes one component that stays inside its folder', (raw) => {
    const root = tmpDir('wavebus-san-');
    const c = safeComponent(raw, 'req_id');
    expect(c.length).toBeGreaterThan(0);
    expect(c).not.toMatch(/[/\\\0]/);
    // eslint-disable-next-line no-control-regex
    expect(c).not.toMatch(/[\x00-\x1f\x7f]/);
    expect(c === '.' || c === '..').toBe(false);
    expect(c.startsWith('.')).toBe(false);
    const p = path.join(root, c);
    expect(path.dirname(p)).toBe(root);
    fs.mkdirSync(p); // really creatable
    expect(fs.readdirSync(root)).toEqual([c]);
  });

  test('is injective on tricky inputs and keeps ordinary ids unchanged', () => {
    const outs = NASTY.map((s) => safeComponent(s, 'x'));
    expect(new Set(outs).size).toBe(NASTY.length);
    expect(safeComponent('chatcmpl-123_abc.4', 'req_id')).toBe('chatcmpl-123_abc.4');
    expect(safeComponent('a/b', 'x')).toBe('a%2Fb');
    expect(safeComponent('%2F', 'x')).toBe('%252F');
    expect(safeComponent('..', 'x')).toBe('%2E.');
    expect(safeComponent('', 'x')).toBe('%empty');
  });

  test('unicode is kept; lone surrogates are escaped', () => {
    expect(safeComponent('请求-ü-🚀', 'req_id')).toBe('请求-ü-🚀');
    expect(safeComponent('a\ud800b', 'x')).toBe('a%uD800b');
  });

  test('very long ids are bounded, distinct and stable', () => {
    const a = 'x'.repeat(500);
    const b = 'x'.repeat(499) + 'y';
    const ca = safeComponent(a, 'req_id');
    const cb = safeComponent(b, 'req_id');
    expect(Buffer.byteLength(ca)).toBeLessThanOrEqual(MAX_COMPONENT_BYTES);
    expect(ca).not.toBe(cb);
    expect(safeComponent(a, 'req_id')).toBe(ca);
    expect(ca).toMatch(/^x+~[0-9a-f]{16}$/);
    const u = safeComponent('🚀'.repeat(300), 'req_id');
    expect(Buffer.byteLength(u)).toBeLessThanOrEqual(MAX_COMPONENT_BYTES);
    expect(u).toMatch(/^(🚀)+~[0-9a-f]{16}$/); // cut on a character boundary
    const root = tmpDir('wavebus-san-long-');
    fs.mkdirSync(path.join(root, ca));
    fs.mkdirSync(path.join(root, u));
  });

  test('non-strings are refused naming the field', () => {
    expect(() => safeComponent(undefined as unknown as string, 'req_id')).toThrow(CaptureError);
    expect(() => safeComponent(5 as unknown as string, 'req_id')).toThrow(/req_id/);
  });
});

describe('isSafeComponent (the bundle writer checks names, never escapes them again)', () => {
  test.each([...NASTY, ...LAYER_NAMES])('safeComponent(%j) is safe, also with a file suffix, and is not escaped again', (raw) => {
    const c = safeComponent(raw, 'layer name');
    expect(isSafeComponent(c)).toBe(true);
    for (const suffix of ['.pt', '.k.npy', '.v.safetensors']) expect(isSafeComponent(c + suffix)).toBe(true);
  });

  test.each(['', '.', '..', '.hidden', 'a/b', 'a\\b', 'nul\0', 'tab\t', '\x7f', '%', '%2', '%zz', '%2e', '100%', '%u12', 'a\ud800b', '\udc00', 'x'.repeat(256)])('refuses %j', (bad) => {
    expect(isSafeComponent(bad)).toBe(false);
  });

  test('accepts plain and unicode names as they are', () => {
    for (const ok of ['chatcmpl-123_abc.4', 'layers.0.pt', '请求-ü-🚀', '%empty', '%2Ehidden', 'a%252Fb', 'x'.repeat(255)]) expect(isSafeComponent(ok)).toBe(true);
    expect(isSafeComponent(5)).toBe(false);
  });
});

describe('layer names that need escaping, through a real dump', () => {
  let job: HarnessJob | undefined;
  afterAll(async () => {
    if (job) await stopHarnessJob(job);
  });

  test.each(['pt', 'npy'])('every layer is dumped (%s) under its escaped name, and the files carry the original name', async (format) => {
    if (job) await stopHarnessJob(job);
    job = await startHarnessJob({
      tp: 1,
      layers: LAYER_NAMES.length,
      layerName: (l) => LAYER_NAMES[l],
      runtimeConfig: { detector: { token_repeat: { enabled: true } }, dump: { manual_dump: 1, format, free_headroom_bytes: 0 } },
    });
    await waitFor(() => job!.ranks[0].client.featureFlags() !== 0, 'bus active');
    for (let w = 1; w <= 3; w++) await runWave(job, w, { wave: w - 1, requests: [step('req-layers-1', [1], [1, 2])], nonFinite: [] });
    await job.ranks[0].agent.drain();
    const waveRoot = path.join(job.dumpRoot, 'manual_trigger', 'req-layers-1');
    await waitFor(() => fs.existsSync(waveRoot) && fs.readdirSync(waveRoot).length > 0, 'manual dump');
    const rankDir = path.join(waveRoot, fs.readdirSync(waveRoot)[0], 'dp0_tp0_pp0_cp0');
    await waitFor(() => fs.existsSync(path.join(rankDir, 'dump.json')), 'the rank bundle');
    expect(job.ranks[0].agent.stats).toMatchObject({ dumpsWritten: 1, dumpsFailed: 0 });
    const want = LAYER_NAMES.flatMap((n) => (format === 'pt' ? [`${safeComponent(n, 'x')}.pt`] : ['k', 'v'].map((kv) => `${safeComponent(n, 'x')}.${kv}.npy`)));
    expect(fs.readdirSync(rankDir).sort()).toEqual([...want, 'dump.json'].sort());
    expect(fs.readdirSync(rankDir)).toEqual(expect.arrayContaining(['decoder%2Flayers_0%2Fattn' + (format === 'pt' ? '.pt' : '.k.npy'), '%2Ehidden_layer' + (format === 'pt' ? '.pt' : '.v.npy')]));
    if (format === 'pt') {
      for (const n of LAYER_NAMES) expect((readPt(path.join(rankDir, `${safeComponent(n, 'x')}.pt`)).value as Map<string, unknown>).get('layer')).toBe(n);
    }
  });
});

describe('joinUnder', () => {
  test('joins safe components', () => {
    expect(joinUnder('/r', 'a', 'b')).toBe('/r/a/b');
    expect(joinUnder('/r', safeComponent('../../etc', 'x'))).toBe('/r/%2E.%2F..%2Fetc');
  });
  test.each([['..'], ['../x'], ['/etc'], ['a', '../../b'], ['.'], ['a\0b']])('refuses %j', (...parts) => {
    expect(() => joinUnder('/r', ...parts)).toThrow(CaptureError);
  });
});
