import { spawnSync } from 'child_process';
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as os from 'os';
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
    expect(d.dump).toEqual({ auto_max_times: 0, auto_cooldown_seconds: 300, manual_dump: 0, pp_stages: 'last', free_headroom_bytes: 5 * 1024 ** 3, format: 'pt' });
    expect(d.report).toEqual({ max_per_req: 1, backoff_waves: 64, max_prompt_token_ids: 1000, max_output_token_ids: 1000, include_block_ids: true, save_sensitive_info: false });
    expect(actionsFor(d, 'garbled')).toEqual(['report']);
  });

  test('unknown keys name the dotted path', () => {
    expect(messageOf(() => configFromRaw({ detector: { token_repeat: { windw: 3 } } }, 'cfg.json'))).toMatch(/^cfg\.json: unknown key 'detector\.token_repeat\.windw'/);
    expect(messageOf(() => configFromRaw({ dumps: {} }, 'cfg.json'))).toMatch(/unknown key 'dumps' \(allowed here: detector, actions, dump, report, recorder, verdict\)/);
    expect(messageOf(() => configFromRaw({ detector: { token_repeat: { dump_kv: { scope: 'request', x: 1 } } } }, 'c'))).toMatch(/unknown key 'detector\.token_repeat\.dump_kv\.x'/);
  });

  test('wrong types and out-of-range values name the path and what was expected', () => {
    expect(messageOf(() => configFromRaw({ detector: { token_repeat: { window: '32' } } }, 'c'))).toBe('c: detector.token_repeat.window: expected an integer in [1, 65536], got "32"');
    expect(messageOf(() => configFromRaw({ detector: { token_repeat: { enabled: 1 } } }, 'c'))).toMatch(/detector\.token_repeat\.enabled: expected a boolean, got 1/);
    expect(messageOf(() => configFromRaw({ report: { max_per_req: 0 } }, 'c'))).toMatch(/report\.max_per_req: expected an integer in \[1, inf\], got 0/);
    expect(messageOf(() => configFromRaw({ detector: { spec_acceptance: { low_accept_rate: 1.5 } } }, 'c'))).toMatch(/low_accept_rate: expected a number in \[0, 1\], got 1\.5/);
    expect(messageOf(() => configFromRaw({ dump: { manual_dump: 1.5 } }, 'c'))).toMatch(/dump\.manual_dump: expected an integer/);
    expect(messageOf(() => configFromRaw({ dump: { format: 'zip' } }, 'c'))).toMatch(/dump\.format: expected one of "pt" \| "npy" \| "safetensors", got "zip"/);
    expect(messageOf(() => configFromRaw({ dump: { pp_stages: 'first' } }, 'c'))).toBe('c: dump.pp_stages: expected one of "last" | "all", got "first"');
    expect(messageOf(() => configFromRaw({ detector: { garbled: { on_trigger: ['report', 'email'] } } }, 'c'))).toMatch(/detector\.garbled\.on_trigger: .*\(item 1 is "email"\)/);
    expect(messageOf(() => configFromRaw({ detector: { token_repeat: { ignore_token_ids: [1, -2] } } }, 'c'))).toMatch(/ignore_token_ids: .*item 1 is -2/);
    expect(messageOf(() => configFromRaw({ detector: [] }, 'c'))).toMatch(/detector: expected an object, got an array/);
  });

  test('merging: deep, per key, left to right (defaults ← overlay at startup, defaults ← file on reload)', () => {
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
    // a bad overlay is not fatal: it is kept as overlayError and the defaults are used
    const o = parseStartupOptions('{"runtime_config": {"detector": {"nope": {}}}}', {}, '/');
    expect(o.overlay).toEqual({});
    expect(o.overlayError).toMatch(/^--additional-config runtime_config: unknown key 'detector\.nope'/);
    expect(messageOf(() => parseStartupOptions('{"runtime_config": 1', {}, '/'))).toMatch(/^--additional-config:1:21: Unexpected end of input/);
  });
});

const quiet = () => {
  const lines: { level: string; obj: Record<string, unknown>; msg: string }[] = [];
  return {
    lines,
    log: {
      error: (obj: object, msg: string) => lines.push({ level: 'error', obj: obj as Record<string, unknown>, msg }),
      warn: (obj: object, msg: string) => lines.push({ level: 'warn', obj: obj as Record<string, unknown>, msg }),
    },
  };
};

describe('startup config load', () => {
  test('"startup overwrites the JSON from defaults/overlay": a manual_dump left in the file is not used', () => {
    const d = tmpDir();
    const o = parseStartupOptions(JSON.stringify({ runtime_config: { detector: { token_repeat: { enabled: true } } }, runtime_dump_dir: 'kv' }), {}, d);
    fs.mkdirSync(path.dirname(o.configPath), { recursive: true });
    fs.writeFileSync(o.configPath, '{ "dump": { "manual_dump": 2, "auto_max_times": 9 }, } // left from the last run');
    const q = quiet();
    const { config, fileHash, issues } = loadStartupConfig(o, q.log);
    expect(issues).toEqual([]);
    expect(config.dump.manual_dump).toBe(0);
    expect(config.dump.auto_max_times).toBe(0);
    expect(config.detector.token_repeat.enabled).toBe(true);
    expect(config.dump.dump_dir).toBe(path.join(d, 'kv'));
    const text = fs.readFileSync(o.configPath, 'utf8');
    expect(JSON.parse(text)).toEqual(JSON.parse(JSON.stringify(config)));
    expect(fileHash).toBe(crypto.createHash('sha256').update(text).digest('hex'));
    expect(q.lines.filter((l) => l.level === 'warn').map((l) => l.msg)).toEqual([expect.stringMatching(/rewritten from defaults ← --additional-config runtime_config/)]);
    // nothing is left beside it: no temp file, no lock
    expect(fs.readdirSync(path.dirname(o.configPath))).toEqual(['runtime_config.json']);
  });

  test('hot reload off still rewrites the file (as upstream\'s ensure_persisted); dirs are created', () => {
    const d = tmpDir();
    const file = path.join(d, 'deep', 'config', 'runtime_config.json');
    const o = parseStartupOptions(JSON.stringify({ runtime_config_path: file, runtime_config: { detector: { logits_finite: { enabled: true } } } }), {}, d);
    expect(o.hotReload).toBe(false);
    const { config } = loadStartupConfig(o);
    expect(JSON.parse(fs.readFileSync(file, 'utf8')).detector.logits_finite.enabled).toBe(true);
    expect(config.detector.logits_finite.enabled).toBe(true);
    expect(o.reportDir).toBe(path.join(d, 'deep', 'report'));
  });

  test('"an invalid startup file or overlay is logged loudly and the defaults are used"', () => {
    const d = tmpDir();
    const file = path.join(d, 'runtime', 'config', 'runtime_config.json');
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, '{\n  "report": { // caps\n    "max_per_req": 1,\n    "backoff_waves" 64\n  }\n}\n');
    const o = parseStartupOptions(JSON.stringify({ runtime_config: { report: { max_per_req: 0 }, detector: { token_repeat: { enabled: true } } } }), {}, d);
    const q = quiet();
    const { config, issues } = loadStartupConfig(o, q.log);
    expect(config).toEqual(defaultConfig()); // the whole overlay is dropped, as upstream does
    expect(issues).toEqual([
      { source: 'file', error: `${file}:4:21: Unexpected token "6", expected ':'` },
      { source: 'overlay', error: expect.stringMatching(/^--additional-config runtime_config: report\.max_per_req: expected an integer in \[1, inf\], got 0/) },
    ]);
    expect(q.lines.map((l) => [l.level, l.obj.source])).toEqual([['error', 'file'], ['error', 'overlay']]);
    expect(q.lines.every((l) => /^RUNTIME CONFIG ERROR: /.test(l.msg))).toBe(true);
    // the broken file was replaced by the effective (default) config
    expect(JSON.parse(fs.readFileSync(file, 'utf8'))).toEqual(JSON.parse(JSON.stringify(defaultConfig())));
  });

  test('a file that is not a JSON object at all (--runtime-config-path ../../etc/passwd) is kept, never replaced; the job runs on the in-memory config', () => {
    const d = tmpDir();
    const file = path.join(d, 'passwd');
    const text = 'root:x:0:0:root:/root:/bin/bash\n';
    fs.writeFileSync(file, text);
    const o = parseStartupOptions(JSON.stringify({ runtime_config_path: file, runtime_config: { detector: { token_repeat: { enabled: true } } } }), {}, d);
    const q = quiet();
    const { config, issues } = loadStartupConfig(o, q.log);
    expect(config.detector.token_repeat.enabled).toBe(true);
    expect(issues.map((i) => i.source)).toEqual(['file', 'write']);
    expect(issues[1].error).toMatch(/not a JSON object \(not a runtime config\); it is kept as it is/);
    expect(fs.readFileSync(file, 'utf8')).toBe(text);
    // a config with comments before its brace is a config (replaced, as the seed does)
    fs.writeFileSync(file, '// ours\n/* x */ { "report": { ');
    expect(loadStartupConfig(o, quiet().log).issues.map((i) => i.source)).toEqual(['file']);
    expect(JSON.parse(fs.readFileSync(file, 'utf8')).detector.token_repeat.enabled).toBe(true);
  });

  test('an empty file and a comments-only file have no brace either: kept, never replaced (issue 45)', () => {
    const d = tmpDir();
    const file = path.join(d, 'notes');
    const o = parseStartupOptions(JSON.stringify({ runtime_config_path: file, runtime_config: { detector: { token_repeat: { enabled: true } } } }), {}, d);
    for (const text of ['', '  \n', '// only a note\n/* and a block */\n']) {
      fs.writeFileSync(file, text);
      const { config, issues } = loadStartupConfig(o, quiet().log);
      expect(config.detector.token_repeat.enabled).toBe(true);
      expect(issues.find((i) => i.source === 'write')?.error).toMatch(/not a JSON object \(not a runtime config\); it is kept as it is/);
      expect(fs.readFileSync(file, 'utf8')).toBe(text);
    }
  });

  test('writes go through a temp file plus rename under <path>.lock; a live holder blocks, a stale lock from a dead pid is broken', () => {
    const d = tmpDir();
    const file = path.join(d, 'runtime_config.json');
    const lock = `${file}.lock`;
    fs.writeFileSync(file, '{}');
    const o = parseStartupOptions(JSON.stringify({ runtime_config_path: file }), {}, d);
    // a live holder (this process, this host): the write waits, then fails without touching the file
    fs.writeFileSync(lock, `${process.pid} ${os.hostname()}\n`);
    const held = loadStartupConfig(o, quiet().log, { waitMs: 100 });
    expect(held.issues).toEqual([{ source: 'write', error: expect.stringMatching(/runtime_config\.json\.lock: held by pid \d+ on .* for more than 100 ms/) }]);
    expect(fs.readFileSync(file, 'utf8')).toBe('{}');
    expect(held.fileHash).toBe(crypto.createHash('sha256').update('{}').digest('hex')); // the follower starts from what is there
    expect(held.config).toEqual(defaultConfig()); // the job runs on in memory
    // a dead holder: a child that has exited
    const dead = spawnSync(process.execPath, ['-e', 'process.stdout.write(String(process.pid))']);
    fs.writeFileSync(lock, `${dead.stdout.toString()} ${os.hostname()}\n`);
    const stale: string[] = [];
    const ok = loadStartupConfig(o, quiet().log, { waitMs: 2000, onStale: (_l, why) => stale.push(why) });
    expect(ok.issues).toEqual([]);
    expect(stale).toEqual([`its holder, pid ${dead.stdout.toString()}, is gone`]);
    expect(JSON.parse(fs.readFileSync(file, 'utf8'))).toEqual(JSON.parse(JSON.stringify(defaultConfig())));
    expect(fs.existsSync(lock)).toBe(false);
    // a lock of another host is judged by its age only
    fs.writeFileSync(lock, '1 some-other-host\n');
    const old = (Date.now() - 120_000) / 1000;
    fs.utimesSync(lock, old, old);
    expect(loadStartupConfig(o, quiet().log, { waitMs: 100 }).issues).toEqual([]);
    fs.writeFileSync(lock, '1 some-other-host\n');
    expect(loadStartupConfig(o, quiet().log, { waitMs: 100 }).issues.map((i) => i.source)).toEqual(['write']);
    fs.rmSync(lock);
  });

  test('no link is followed: a link at the old fixed temp name <path>.tmp is ignored, a link at the config is replaced, their target untouched', () => {
    const d = tmpDir();
    const file = path.join(d, 'runtime_config.json');
    const victim = path.join(d, 'victim.txt');
    fs.writeFileSync(victim, 'precious');
    fs.symlinkSync(victim, `${file}.tmp`);
    fs.symlinkSync(victim, file);
    const o = parseStartupOptions(JSON.stringify({ runtime_config_path: file }), {}, d);
    const r = loadStartupConfig(o, quiet().log);
    expect(r.issues.map((i) => i.source)).toEqual(['file']); // the link's target is not a config
    expect(fs.readFileSync(victim, 'utf8')).toBe('precious');
    expect(fs.lstatSync(file).isSymbolicLink()).toBe(false);
    // the temp name is unpredictable (artifacts/atomic-write.ts): the planted link is never opened
    expect(fs.readlinkSync(`${file}.tmp`)).toBe(victim);
    expect(fs.readdirSync(d).filter((n) => n.includes('.tmp-'))).toEqual([]);
  });
});
