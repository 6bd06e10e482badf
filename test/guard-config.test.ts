import * as fs from 'fs';
import * as path from 'path';
import { ConfigError } from '../src/errors';
import { actionsFor, checkConfigPartial, configFromRaw, defaultConfig, mergeConfig } from '../src/guard/config';
import { loadStartupConfig, parseStartupOptions, runtimeRootOf } from '../src/guard/startup';
import { cleanup, tmpDir } from './helpers';

afterAll(cleanup);

function messageOf(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as Error).message;
  }
  throw new Error('expected a ConfigError');
}

describe('runtime_config schema', () => {
  test('defaults', () => {
    const d = defaultConfig();
    expect(d.detector.token_repeat).toEqual({ enabled: false, window: 32, repeat_sum_threshold: 64, min_tokens: 32, consecutive_hits: 1, ignore_token_ids: [] });
    expect(d.detector.logits_finite).toEqual({ enabled: false, item_sync: false });
    expect(d.detector.spec_acceptance).toEqual({ enabled: false, window: 10, low_accept_rate: 0.3, low_accept_len: 1.4, high_accept_rate: 0.96, high_accept_len: 2.8 });
    expect(d.detector.garbled.enabled).toBe(false);
    expect(d.actions.defaults.on_trigger).toEqual(['report']);
    expect(d.dump).toEqual({ auto_max_times: 0, auto_cooldown_seconds: 300, manual_dump: 0, free_headroom_bytes: 5 * 1024 ** 3, format: 'pt' });
    expect(d.report).toEqual({ max_per_req: 1, backoff_waves: 64, max_prompt_token_ids: 1000, max_output_token_ids: 1000, include_block_ids: true, save_sensitive_info: false });
    expect(actionsFor(d, 'garbled')).toEqual(['report']);
  });

  test('unknown keys name the dotted path', () => {
    expect(messageOf(() => configFromRaw({ detector: { token_repeat: { windw: 3 } } }, 'cfg.json'))).toMatch(/^cfg\.json: unknown key 'detector\.token_repeat\.windw'/);
    expect(messageOf(() => configFromRaw({ dumps: {} }, 'cfg.json'))).toMatch(/unknown key 'dumps' \(allowed here: detector, actions, dump, report\)/);
    expect(messageOf(() => configFromRaw({ detector: { token_repeat: { dump_kv: { scope: 'request', x: 1 } } } }, 'c'))).toMatch(/unknown key 'detector\.token_repeat\.dump_kv\.x'/);
  });

  test('wrong types and out-of-range values name the path and what was expected', () => {
    expect(messageOf(() => configFromRaw({ detector: { token_repeat: { window: '32' } } }, 'c'))).toBe('c: detector.token_repeat.window: expected an integer in [1, 65536], got "32"');
    expect(messageOf(() => configFromRaw({ detector: { token_repeat: { enabled: 1 } } }, 'c'))).toMatch(/detector\.token_repeat\.enabled: expected a boolean, got 1/);
    expect(messageOf(() => configFromRaw({ report: { max_per_req: 0 } }, 'c'))).toMatch(/report\.max_per_req: expected an integer in \[1, inf\], got 0/);
    expect(messageOf(() => configFromRaw({ detector: { spec_acceptance: { low_accept_rate: 1.5 } } }, 'c'))).toMatch(/low_accept_rate: expected a number in \[0, 1\], got 1\.5/);
    expect(messageOf(() => configFromRaw({ dump: { manual_dump: 1.5 } }, 'c'))).toMatch(/dump\.manual_dump: expected an integer/);
    expect(messageOf(() => configFromRaw({ dump: { format: 'zip' } }, 'c'))).toMatch(/dump\.format: expected one of "pt" \| "npy" \| "safetensors", got "zip"/);
    expect(messageOf(() => configFromRaw({ detector: { garbled: { on_trigger: ['report', 'email'] } } }, 'c'))).toMatch(/detector\.garbled\.on_trigger: .*\(item 1 is "email"\)/);
    expect(messageOf(() => configFromRaw({ detector: { token_repeat: { ignore_token_ids: [1, -2] } } }, 'c'))).toMatch(/ignore_token_ids: .*item 1 is -2/);
    expect(messageOf(() => configFromRaw({ detector: [] }, 'c'))).toMatch(/detector: expected an object, got an array/);
  });

  test('merging: defaults ← file ← overlay, deep, per key', () => {
    const file = checkConfigPartial({ detector: { token_repeat: { enabled: true, window: 16 } }, dump: { auto_max_times: 2 } }, 'f');
    const overlay = checkConfigPartial({ detector: { token_repeat: { window: 8 }, garbled: { on_trigger: ['dump_kv'], dump_kv: {} } } }, 'o');
    const c = mergeConfig(defaultConfig(), file, overlay);
    expect(c.detector.token_repeat.enabled).toBe(true);
    expect(c.detector.token_repeat.window).toBe(8);
    expect(c.detector.token_repeat.min_tokens).toBe(32);
    expect(c.dump.auto_max_times).toBe(2);
    expect(c.detector.garbled.dump_kv).toEqual({ scope: 'request' });
    expect(actionsFor(c, 'garbled')).toEqual(['dump_kv']);
    expect(defaultConfig().detector.token_repeat.window).toBe(32); // defaults not mutated
  });
});

describe('startup options', () => {
  test('defaults derive from cwd and the config path', () => {
    const o = parseStartupOptions(undefined, {}, '/srv/job');
    expect(o.configPath).toBe('/srv/job/runtime/config/runtime_config.json');
    expect(o.reportDir).toBe('/srv/job/runtime/report');
    expect(o.dumpDir).toBe('/srv/job/runtime/report/kv_cache');
    expect(o.hotReload).toBe(false);
    expect(runtimeRootOf('/a/b/cfg.json')).toBe('/a/b');
    const p = parseStartupOptions('{"runtime_config_path": "/data/rt/my.json"}', {}, '/x');
    expect(p.reportDir).toBe('/data/rt/report');
  });

  test('JSON keys, flags override them, overlay is validated', () => {
    const json = JSON.stringify({
      runtime_config_path: 'c/runtime_config.json',
      runtime_config_hot_reload: true,
      runtime_config: { detector: { token_repeat: { enabled: true } } },
      runtime_report_dir: '/r',
    });
    const o = parseStartupOptions(json, { runtimeDumpDir: 'dumps', runtimeConfigHotReload: false }, '/w');
    expect(o.configPath).toBe('/w/c/runtime_config.json');
    expect(o.hotReload).toBe(false);
    expect(o.reportDir).toBe('/r');
    expect(o.dumpDir).toBe('/w/dumps');
    expect(o.dumpDirExplicit).toBe(true);
    expect(o.overlay).toEqual({ detector: { token_repeat: { enabled: true } } });
  });

  test('bad startup input names the key', () => {
    expect(messageOf(() => parseStartupOptions('{"runtime_config_pth": "x"}', {}, '/'))).toMatch(/--additional-config: unknown key 'runtime_config_pth'/);
    expect(messageOf(() => parseStartupOptions('{"runtime_config_hot_reload": "yes"}', {}, '/'))).toMatch(/runtime_config_hot_reload: expected a boolean/);
    expect(messageOf(() => parseStartupOptions('{"runtime_config": {"detector": {"nope": {}}}}', {}, '/'))).toMatch(/runtime_config: unknown key 'detector\.nope'/);
    expect(messageOf(() => parseStartupOptions('{"runtime_config": 1', {}, '/'))).toMatch(/^--additional-config:1:21: Unexpected end of input/);
  });
});

describe('startup config load', () => {
  test('no file: defaults ← overlay; dump dir seeded by runtime_dump_dir', () => {
    const d = tmpDir();
    const o = parseStartupOptions(JSON.stringify({ runtime_config: { dump: { manual_dump: 2 } }, runtime_dump_dir: 'kv' }), {}, d);
    const { config, fileHash } = loadStartupConfig(o);
    expect(config.dump.manual_dump).toBe(2);
    expect(config.dump.dump_dir).toBe(path.join(d, 'kv'));
    expect(fileHash).toBeNull();
    expect(fs.existsSync(o.configPath)).toBe(false);
  });

  test('an invalid file is a startup error naming the file and line:col or field', () => {
    const d = tmpDir();
    const file = path.join(d, 'runtime', 'config', 'runtime_config.json');
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, '{\n  "report": { // caps\n    "max_per_req": 1,\n    "backoff_waves" 64\n  }\n}\n');
    const o = parseStartupOptions(undefined, {}, d);
    expect(messageOf(() => loadStartupConfig(o))).toBe(`${file}:4:21: Unexpected token "6", expected ':'`);
    fs.writeFileSync(file, '{"report": {"max_per_req": -1}}');
    expect(messageOf(() => loadStartupConfig(o))).toMatch(new RegExp(`^${file.replace(/[.]/g, '\\.')}: report\\.max_per_req: expected an integer`));
  });

  test('hot reload writes the effective config back (dirs created, atomically, JSON)', () => {
    const d = tmpDir();
    const file = path.join(d, 'deep', 'config', 'runtime_config.json');
    const o = parseStartupOptions(JSON.stringify({ runtime_config_path: file, runtime_config_hot_reload: true, runtime_config: { detector: { logits_finite: { enabled: true } } } }), {}, d);
    const { config, fileHash } = loadStartupConfig(o);
    const written = JSON.parse(fs.readFileSync(file, 'utf8'));
    expect(written).toEqual(JSON.parse(JSON.stringify(config)));
    expect(written.detector.logits_finite.enabled).toBe(true);
    expect(fileHash).toMatch(/^[0-9a-f]{64}$/);
    expect(fs.readdirSync(path.dirname(file))).toEqual(['runtime_config.json']);
    expect(o.reportDir).toBe(path.join(d, 'deep', 'report'));
    // an existing file is the base: file values survive, overlay wins
    fs.writeFileSync(file, '{ // jsonc\n "dump": {"auto_max_times": 3,}, "detector": {"logits_finite": {"enabled": false}} }');
    const again = loadStartupConfig(o).config;
    expect(again.dump.auto_max_times).toBe(3);
    expect(again.detector.logits_finite.enabled).toBe(true);
  });
});
