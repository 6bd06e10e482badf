import * as fs from 'fs';
import * as path from 'path';
import pino from 'pino';
import { configJson, defaultConfig } from '../src/guard/config';
import { Guard } from '../src/guard/guard';
import { ConfigFollower } from '../src/guard/reload';
import { MAX_CONFIG_BYTES } from '../src/guard/config-read';
import { MAX_JSONC_DEPTH } from '../src/guard/jsonc';
import { registry } from '../src/metrics';
import { loadStartupConfig, parseStartupOptions, sha256 } from '../src/guard/startup';
import { cleanup, tmpDir } from './helpers';

afterAll(cleanup);

function recordingLogger() {
  const lines: Record<string, unknown>[] = [];
  const log = pino({ level: 'info' }, { write: (s: string) => lines.push(JSON.parse(s)) });
  return { log, lines, errors: () => lines.filter((l) => (l.level as number) >= 50) };
}

function setup(initialText: string, opts: { verifyIntervalMs?: number } = {}) {
  const d = tmpDir();
  const file = path.join(d, 'runtime_config.json');
  fs.writeFileSync(file, initialText);
  const rec = recordingLogger();
  const f = ConfigFollower.fromFile(file, defaultConfig(), { pollIntervalMs: 0, verifyIntervalMs: opts.verifyIntervalMs ?? 1e12, log: rec.log });
  return { file, f, rec };
}

describe('ConfigFollower (polled hot reload)', () => {
  test('starts from the file; a valid edit gives a new version', () => {
    const { file, f } = setup('{"detector": {"token_repeat": {"enabled": true}}}');
    expect(f.current().detector.token_repeat.enabled).toBe(true);
    expect(f.version()).toBe(1);
    expect(f.poll(1).kind).toBe('unchanged');
    fs.writeFileSync(file, '{"detector": {"token_repeat": {"enabled": true, "window": 8}}, // more\n}');
    const r = f.poll(2);
    expect(r).toMatchObject({ kind: 'changed', version: 2 });
    expect(f.current().detector.token_repeat.window).toBe(8);
    // a comment-only edit is not a new config
    fs.writeFileSync(file, '/* note */ {"detector": {"token_repeat": {"enabled": true, "window": 8}}}');
    expect(f.poll(3).kind).toBe('unchanged');
    expect(f.version()).toBe(2);
  });

  test('invalid JSONC is rejected, the last good config stays, the error is logged once per content', () => {
    const { file, f, rec } = setup('{"dump": {"auto_max_times": 1}}');
    fs.writeFileSync(file, '{"dump": {"auto_max_times": 2 3}}');
    const r = f.poll(1);
    expect(r.kind).toBe('rejected');
    expect(r.kind === 'rejected' && r.error.message).toBe(`${file}:1:31: Unexpected token "3", expected ',' or '}'`);
    for (let t = 2; t < 6; t++) expect(f.poll(t, true).kind).toBe('rejected');
    expect(rec.errors()).toHaveLength(1);
    expect(f.current().dump.auto_max_times).toBe(1);
    // a different bad content is logged again
    fs.writeFileSync(file, '{"dump": {"auto_max_times": "x"}}');
    expect(f.poll(7).kind).toBe('rejected');
    expect(rec.errors()).toHaveLength(2);
    expect(String(rec.errors()[1].err)).toMatch(/dump\.auto_max_times: expected an integer/);
    expect(f.rejections).toBe(2);
    fs.writeFileSync(file, '{"dump": {"auto_max_times": 3}}');
    expect(f.poll(8)).toMatchObject({ kind: 'changed', version: 2 });
    expect(f.current().dump.auto_max_times).toBe(3);
  });

  test('an unknown key is rejected naming its path', () => {
    const { file, f } = setup('{}');
    fs.writeFileSync(file, '{"report": {"max_per_request": 2}}');
    const r = f.poll(1);
    expect(r.kind === 'rejected' && r.error.message).toMatch(/unknown key 'report\.max_per_request'/);
    expect(f.current().report.max_per_req).toBe(1);
  });

  test('a same-size edit that keeps the mtime is caught by the content hash', () => {
    const d = tmpDir();
    const file = path.join(d, 'runtime_config.json');
    const T = 1_700_000_000; // whole seconds: the mtime can be restored exactly
    fs.writeFileSync(file, '{"detector": {"garbled": {"window": 32}}}');
    fs.utimesSync(file, T, T);
    const f = ConfigFollower.fromFile(file, defaultConfig(), { pollIntervalMs: 0, verifyIntervalMs: 1000 });
    expect(f.current().detector.garbled.window).toBe(32);
    const before = fs.statSync(file);
    fs.writeFileSync(file, '{"detector": {"garbled": {"window": 64}}}');
    fs.utimesSync(file, T, T);
    const after = fs.statSync(file);
    expect([after.size, after.mtimeMs]).toEqual([before.size, before.mtimeMs]);
    // stat looks unchanged and the last content check is recent: not read yet
    expect(f.poll(10).kind).toBe('unchanged');
    // once the verify interval has passed the bytes are hashed even though stat is the same
    const r = f.poll(10 + 1000);
    expect(r).toMatchObject({ kind: 'changed', version: 2 });
    expect(f.current().detector.garbled.window).toBe(64);
  });

  test('a deleted file keeps the last good config (logged once); a recreated one is picked up', () => {
    const { file, f, rec } = setup('{"dump": {"manual_dump": 1}}');
    fs.unlinkSync(file);
    expect(f.poll(1).kind).toBe('missing');
    expect(f.poll(2).kind).toBe('missing');
    expect(rec.lines.filter((l) => /gone/.test(String(l.msg)))).toHaveLength(1);
    expect(f.current().dump.manual_dump).toBe(1);
    fs.writeFileSync(file, '{"dump": {"manual_dump": 2}}');
    expect(f.poll(3)).toMatchObject({ kind: 'changed', version: 2 });
    expect(f.current().dump.manual_dump).toBe(2);
  });

  test('the poll interval throttles stats', () => {
    const d = tmpDir();
    const file = path.join(d, 'c.json');
    fs.writeFileSync(file, '{}');
    const f = new ConfigFollower(file, defaultConfig(), { pollIntervalMs: 500, initialHash: sha256(fs.readFileSync(file)) });
    expect(f.poll(1000).kind).toBe('unchanged');
    fs.writeFileSync(file, '{"dump": {"format": "npy"}}');
    expect(f.poll(1200).kind).toBe('unchanged'); // within 500 ms of the last poll
    expect(f.poll(1500).kind).toBe('changed');
  });
});

describe('guard hot reload', () => {
  test('a changed file reaches the ranks as the config lane of the next wave head', () => {
    const d = tmpDir();
    const opts = parseStartupOptions(JSON.stringify({ runtime_config_hot_reload: true }), {}, d);
    const rec = recordingLogger();
    const g = new Guard({ startup: opts, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, log: rec.log, pollIntervalMs: 0, verifyIntervalMs: 0 });
    const first = g.onWaveHead(0, 1, null);
    expect(first.config?.version).toBe(1);
    expect(first.config!.config).toMatchObject({ dumpRoot: path.join(d, 'runtime', 'report', 'kv_cache'), hotReload: true, busActive: true, detectors: [] });
    expect(g.onWaveHead(0, 2, null).config).toBeUndefined();
    // startup wrote the effective config; the operator edits it
    const live = JSON.parse(fs.readFileSync(opts.configPath, 'utf8'));
    live.detector.logits_finite.enabled = true;
    live.detector.logits_finite.item_sync = true;
    fs.writeFileSync(opts.configPath, JSON.stringify(live, null, 2));
    const lanes = g.onWaveHead(0, 3, null);
    expect(lanes.config?.version).toBe(2);
    expect(lanes.config!.config).toMatchObject({ detectors: ['logits_finite'], itemSync: true });
    expect(g.snapshotState(0)).toEqual({ configVersion: 2, config: lanes.config!.config, manualDumpDone: 0 });
    expect(g.onWaveHead(0, 4, null).config).toBeUndefined();
    // a bad edit: no lane, status shows the error, the last good config stays
    fs.writeFileSync(opts.configPath, '{"detector": ');
    expect(g.onWaveHead(0, 5, null).config).toBeUndefined();
    expect(g.status()).toMatchObject({ config_version: 2, config_rejections: 1 });
    expect(String(g.status().config_error)).toMatch(/:1:14: Unexpected end of input/);
    expect(g.config().detector.logits_finite.enabled).toBe(true);
    expect(configJson(g.config())).toBe(JSON.stringify(JSON.parse(configJson(g.config())), null, 2));
    g.close();
  });

  test('with hot reload off the file is rewritten at startup and never followed', () => {
    const d = tmpDir();
    const opts = parseStartupOptions(JSON.stringify({ runtime_config: { report: { max_per_req: 2 } } }), {}, d);
    fs.mkdirSync(path.dirname(opts.configPath), { recursive: true });
    fs.writeFileSync(opts.configPath, '{"report": {"max_per_req": 5}}');
    const g = new Guard({ startup: opts, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, log: recordingLogger().log, pollIntervalMs: 0, verifyIntervalMs: 0 });
    expect(g.config().report.max_per_req).toBe(2); // defaults ← overlay; the old file is not read
    expect(JSON.parse(fs.readFileSync(opts.configPath, 'utf8')).report.max_per_req).toBe(2);
    fs.writeFileSync(opts.configPath, '{"report": {"max_per_req": 3}}');
    g.onWaveHead(0, 1, null);
    expect(g.onWaveHead(0, 2, null).config).toBeUndefined();
    expect(g.config().report.max_per_req).toBe(2);
    expect(fs.readFileSync(opts.configPath, 'utf8')).toBe('{"report": {"max_per_req": 3}}');
  });
});

describe('hot reload limits (issue 13 item 6)', () => {
  test('a 100 MB file found at startup is not read either: a startup error naming the cap, and the file is replaced', () => {
    const dir = tmpDir();
    const file = path.join(dir, 'config', 'runtime_config.json');
    fs.mkdirSync(path.dirname(file));
    const fd = fs.openSync(file, 'w');
    fs.ftruncateSync(fd, 100 * 2 ** 20); // sparse: no 100 MB written here
    fs.closeSync(fd);
    const opts = parseStartupOptions(undefined, { runtimeConfigPath: file }, dir);
    const r = loadStartupConfig(opts);
    expect(r.issues.map((i) => i.error).join('\n')).toMatch(new RegExp(`over the runtime config size cap of ${MAX_CONFIG_BYTES} bytes`));
    expect(r.config).toEqual(defaultConfig());
    expect(fs.statSync(file).size).toBeLessThan(MAX_CONFIG_BYTES);
  });

  test('a 100 MB config is refused from its size, unread and unparsed, naming the cap and the file; later polls do not read it', () => {
    const { file, f, rec } = setup('{"dump": {"auto_max_times": 1}}');
    const base = { ...f.stats };
    // 100 MB of real bytes: a valid-looking object padded with spaces.
    const fd = fs.openSync(file, 'w');
    const block = Buffer.alloc(1 << 20, 0x20);
    fs.writeSync(fd, '{"dump": {"auto_max_times": 5}}');
    for (let i = 0; i < 100; i++) fs.writeSync(fd, block);
    fs.closeSync(fd);
    const r = f.poll(1);
    expect(r.kind).toBe('rejected');
    const msg = r.kind === 'rejected' ? r.error.message : '';
    expect(msg).toContain(file);
    expect(msg).toContain(`size cap of ${MAX_CONFIG_BYTES} bytes`);
    for (let t = 2; t < 8; t++) expect(f.poll(t, true).kind).toBe('rejected');
    expect(f.stats).toEqual(base); // never read, never parsed
    expect(rec.errors()).toHaveLength(1);
    expect(f.rejections).toBe(1);
    expect(f.current().dump.auto_max_times).toBe(1);
    fs.truncateSync(file, 0);
  });

  test('content already rejected is not parsed again on later polls', () => {
    const { file, f } = setup('{}');
    const before = f.stats.parses;
    fs.writeFileSync(file, '{"dump": {"auto_max_times": "many"}}');
    for (let t = 1; t < 10; t++) expect(f.poll(t, true).kind).toBe('rejected');
    expect(f.stats.parses - before).toBe(1);
    // a new bad content is parsed (once) and named
    fs.writeFileSync(file, '{"dump": {"auto_max_times": "lots"}}');
    for (let t = 10; t < 15; t++) expect(f.poll(t, true).kind).toBe('rejected');
    expect(f.stats.parses - before).toBe(2);
  });

  test('deep nesting is rejected with file:line:column, not a stack overflow', () => {
    const { file, f } = setup('{}');
    fs.writeFileSync(file, `{"dump":\n  ${'['.repeat(200000)}${']'.repeat(200000)}}`);
    const r = f.poll(1, true);
    expect(r.kind).toBe('rejected');
    const msg = r.kind === 'rejected' ? r.error.message : '';
    expect(msg).toBe(`${file}:2:${3 + MAX_JSONC_DEPTH - 1}: nesting deeper than ${MAX_JSONC_DEPTH} levels (MAX_JSONC_DEPTH)`);
  });

  test('restoring the good file clears config_error in status() and the wavebus_config_error metric', async () => {
    const d = tmpDir();
    const opts = parseStartupOptions(JSON.stringify({ runtime_config_hot_reload: true }), {}, d);
    const g = new Guard({ startup: opts, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, log: recordingLogger().log, pollIntervalMs: 0, verifyIntervalMs: 0 });
    const metric = async () => (await registry.metrics()).split('\n').find((l) => l.startsWith('wavebus_config_error '));
    g.onWaveHead(0, 1, null);
    const good = fs.readFileSync(opts.configPath);
    fs.writeFileSync(opts.configPath, '{"detector": ');
    g.onWaveHead(0, 2, null);
    expect(String(g.status().config_error)).toMatch(/:1:14: Unexpected end of input/);
    expect(await metric()).toBe('wavebus_config_error 1');
    // The operator puts back exactly the bytes the job runs with.
    fs.writeFileSync(opts.configPath, good);
    expect(g.onWaveHead(0, 3, null).config).toBeUndefined();
    expect(g.status()).toMatchObject({ config_error: null, config_version: 1, config_rejections: 1 });
    expect(await metric()).toBe('wavebus_config_error 0');
    g.close();
  });
});
