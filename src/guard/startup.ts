// Startup options of the runtime guard (seed: --additional-config keys) and the startup load of
// runtime_config.json. Flags override the same keys given in --additional-config.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import type { Options } from 'yargs';
import { ConfigError } from '../errors';
import { parseJsonc } from './jsonc';
import { checkConfigPartial, configFromRaw, configJson, defaultConfig, mergeConfig, RuntimeConfig } from './config';
import { LockOptions, writeConfigFile } from './config-file';
import { configTooBigError, readCapped } from './config-read';
import { checkTrustedPathSync } from '../artifacts/safe-mkdir';

export interface StartupOptions {
  configPath: string;
  hotReload: boolean;
  /** The runtime_config overlay, already checked against the schema ({} when it was rejected). */
  overlay: Record<string, unknown>;
  /** Why the runtime_config overlay was rejected (the defaults are used), or null. */
  overlayError: string | null;
  reportDir: string;
  /** The dump root used when the config has no dump.dump_dir. */
  dumpDir: string;
  /** runtime_dump_dir was given explicitly (it then seeds dump.dump_dir). */
  dumpDirExplicit: boolean;
}

/** yargs-shaped flags (camelCase, as yargs gives them). */
export interface GuardFlags {
  additionalConfig?: string;
  runtimeConfigPath?: string;
  runtimeConfigHotReload?: boolean;
  runtimeReportDir?: string;
  runtimeDumpDir?: string;
}

/** yargs options for commands that host the guard (coordinator, launch). */
export const guardOptions: Record<string, Options> = {
  'additional-config': {
    type: 'string',
    describe: 'JSON object with runtime guard startup keys: runtime_config_path, runtime_config_hot_reload, runtime_config, runtime_report_dir, runtime_dump_dir',
  },
  'runtime-config-path': { type: 'string', describe: 'runtime_config.json path (default <cwd>/runtime/config/runtime_config.json)' },
  'runtime-config-hot-reload': { type: 'boolean', describe: 'poll runtime_config.json for changes (startup writes the effective config to it)' },
  'runtime-report-dir': { type: 'string', describe: 'report root (default <runtime_root>/report)' },
  'runtime-dump-dir': { type: 'string', describe: 'KV dump root; seeds dump.dump_dir (default <report_dir>/kv_cache)' },
};

const STARTUP_KEYS = ['runtime_config_path', 'runtime_config_hot_reload', 'runtime_config', 'runtime_report_dir', 'runtime_dump_dir'];

/** runtime_root: the config file's grandparent when its folder is named `config`, else its folder. */
export function runtimeRootOf(configPath: string): string {
  const dir = path.dirname(configPath);
  return path.basename(dir) === 'config' ? path.dirname(dir) : dir;
}

function str(v: unknown, what: string): string {
  if (typeof v !== 'string' || v === '') throw new ConfigError(`${what}: expected a non-empty string path, got ${JSON.stringify(v)}`);
  return v;
}

export function parseStartupOptions(additionalConfigJson: string | undefined, flags: GuardFlags, cwd: string): StartupOptions {
  let extra: Record<string, unknown> = {};
  if (additionalConfigJson !== undefined && additionalConfigJson.trim() !== '') {
    extra = parseJsonc(additionalConfigJson, '--additional-config');
  }
  for (const k of Object.keys(extra)) {
    if (!STARTUP_KEYS.includes(k)) throw new ConfigError(`--additional-config: unknown key '${k}' (allowed: ${STARTUP_KEYS.join(', ')})`);
  }
  const src = (k: string) => `--additional-config: ${k}`;
  let configPath = path.resolve(cwd, 'runtime', 'config', 'runtime_config.json');
  if (extra.runtime_config_path !== undefined) configPath = path.resolve(cwd, str(extra.runtime_config_path, src('runtime_config_path')));
  if (flags.runtimeConfigPath !== undefined) configPath = path.resolve(cwd, str(flags.runtimeConfigPath, '--runtime-config-path'));

  let hotReload = false;
  if (extra.runtime_config_hot_reload !== undefined) {
    if (typeof extra.runtime_config_hot_reload !== 'boolean') {
      throw new ConfigError(`${src('runtime_config_hot_reload')}: expected a boolean, got ${JSON.stringify(extra.runtime_config_hot_reload)}`);
    }
    hotReload = extra.runtime_config_hot_reload;
  }
  if (flags.runtimeConfigHotReload !== undefined) hotReload = flags.runtimeConfigHotReload;

  // A bad overlay does not stop the job (seed: an invalid startup config falls back to the
  // defaults with a logged rejection); the guard logs it and shows it in /healthz.
  let overlay: Record<string, unknown> = {};
  let overlayError: string | null = null;
  if (extra.runtime_config !== undefined) {
    try {
      overlay = checkConfigPartial(extra.runtime_config, '--additional-config runtime_config');
    } catch (e) {
      if (!(e instanceof ConfigError)) throw e;
      overlayError = e.message;
    }
  }

  let reportDir = path.join(runtimeRootOf(configPath), 'report');
  if (extra.runtime_report_dir !== undefined) reportDir = path.resolve(cwd, str(extra.runtime_report_dir, src('runtime_report_dir')));
  if (flags.runtimeReportDir !== undefined) reportDir = path.resolve(cwd, str(flags.runtimeReportDir, '--runtime-report-dir'));

  let dumpDir = path.join(reportDir, 'kv_cache');
  let dumpDirExplicit = false;
  if (extra.runtime_dump_dir !== undefined) {
    dumpDir = path.resolve(cwd, str(extra.runtime_dump_dir, src('runtime_dump_dir')));
    dumpDirExplicit = true;
  }
  if (flags.runtimeDumpDir !== undefined) {
    dumpDir = path.resolve(cwd, str(flags.runtimeDumpDir, '--runtime-dump-dir'));
    dumpDirExplicit = true;
  }
  return { configPath, hotReload, overlay, overlayError, reportDir, dumpDir, dumpDirExplicit };
}

/** Parse and validate a config file's bytes: defaults ← file. */
export function configFromText(text: string, source: string): RuntimeConfig {
  return configFromRaw(parseJsonc(text, source), source);
}

export function sha256(buf: Buffer | string): string {
  return crypto.createHash('sha256').update(buf).digest('hex');
}

export interface StartupIssue {
  /** overlay: --additional-config runtime_config; file: the runtime_config.json found at start; write: the rewrite. */
  source: 'overlay' | 'file' | 'write';
  error: string;
}

export interface StartupConfig {
  config: RuntimeConfig;
  /** sha256 of the file bytes the follower starts from (what was written, else what was there); null when there is no file. */
  fileHash: string | null;
  /** What went wrong at startup; the job runs on regardless (with the defaults where the overlay was rejected). */
  issues: StartupIssue[];
}

type StartupLog = { error: (o: object, msg: string) => void; warn: (o: object, msg: string) => void };

/**
 * The effective config at startup and the rewrite of runtime_config.json, as the seed and its
 * upstream do (vllm-ascend runtime_config bootstrap + ensure_persisted): effective = defaults ←
 * overlay, with runtime_dump_dir seeding dump.dump_dir; the file found at start is not read into
 * it (so a stale `manual_dump: N` in it fires nothing) and is overwritten with the effective
 * config, whether hot reload is on or off. An invalid overlay is logged and the defaults are used;
 * an invalid old file is logged (it is replaced all the same); a failed write is logged and the
 * job runs on the in-memory config. Never throws over configuration.
 */
/** Whether `text` starts, after blanks and JSONC comments, with '{' (or is empty): a runtime config, valid or not. */
export function looksLikeJsonObject(text: string): boolean {
  const rest = text.replace(/^(?:\s+|\/\/[^\n]*(?:\n|$)|\/\*[\s\S]*?\*\/)*/, '');
  // An empty or comments-only file has no brace either: kept, as the rule says (docs/runtime-guard.md).
  return rest.startsWith('{');
}

/** The config startup puts in force (seed): defaults ← overlay, plus an explicit runtime_dump_dir. Reads and writes nothing. */
export function effectiveStartupConfig(opts: Pick<StartupOptions, 'overlay' | 'dumpDir' | 'dumpDirExplicit'>): RuntimeConfig {
  const config = mergeConfig(defaultConfig(), opts.overlay);
  return opts.dumpDirExplicit ? mergeConfig(config, { dump: { dump_dir: opts.dumpDir } }) : config;
}

export function loadStartupConfig(opts: StartupOptions, log?: StartupLog, lock?: LockOptions): StartupConfig {
  const issues: StartupIssue[] = [];
  let old: Buffer | null = null;
  try {
    const r = readCapped(opts.configPath);
    if ('tooBig' in r) issues.push({ source: 'file', error: configTooBigError(opts.configPath, r.tooBig).message });
    else old = r.bytes;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') issues.push({ source: 'file', error: `${opts.configPath}: cannot read runtime config: ${(e as Error).message}` });
  }
  if (old !== null) {
    try {
      configFromText(old.toString('utf8'), opts.configPath);
    } catch (e) {
      issues.push({ source: 'file', error: (e as Error).message });
    }
  }
  if (opts.overlayError !== null) issues.push({ source: 'overlay', error: opts.overlayError });
  const config = effectiveStartupConfig(opts);
  const text = configJson(config) + '\n';
  let fileHash: string | null;
  try {
    // A file there that is not a JSON object at all is not a runtime config with a typo but some
    // other file (`--runtime-config-path ../../etc/passwd` as root replaced the system's user list):
    // it is kept, and the job runs on the in-memory config.
    // (A link there is replaced by the rename, its target untouched.)
    if (old !== null && !looksLikeJsonObject(old.toString('utf8')) && fs.lstatSync(opts.configPath).isFile()) {
      throw new Error('the file there is not a JSON object (not a runtime config); it is kept as it is; point --runtime-config-path at a runtime_config.json, or remove that file');
    }
    writeConfigFile(opts.configPath, text, lock);
    fileHash = sha256(Buffer.from(text));
  } catch (e) {
    issues.push({ source: 'write', error: `${opts.configPath}: cannot write the effective config: ${(e as Error).message}` });
    // the follower must not take the old file's settings as an edit
    fileHash = old !== null ? sha256(old) : null;
  }
  for (const i of issues) {
    const what = i.source === 'overlay' ? 'startup overlay rejected; using the defaults' : i.source === 'file' ? 'runtime config file found at startup is invalid; it is replaced by the startup config' : 'cannot write the runtime config file; running on the in-memory config';
    log?.error({ path: opts.configPath, source: i.source, err: i.error }, `RUNTIME CONFIG ERROR: ${what}`);
  }
  if (old !== null && issues.every((i) => i.source !== 'file') && old.toString('utf8') !== text) {
    log?.warn({ path: opts.configPath }, 'runtime config file rewritten from defaults ← --additional-config runtime_config; its previous settings are not used (startup settings belong in the overlay)');
  }
  return { config, fileHash, issues };
}

/**
 * Refuse to start when the config file, the report dir or the dump root lies where another user
 * could replace it or plant something in it: a component owned by another user (not root), or
 * writable by every user without the sticky bit. Throws UntrustedPathError naming the path and its
 * owner. What does not exist yet is created later, one checked component at a time.
 */
export function checkStartupPaths(opts: StartupOptions): void {
  checkTrustedPathSync(opts.configPath, 'runtime config file', 'file');
  checkTrustedPathSync(opts.reportDir, 'report dir', 'dir');
  checkTrustedPathSync(dumpRootOf(effectiveStartupConfig(opts), opts), 'dump root', 'dir');
}

/** The dump root in effect: the config's dump.dump_dir, else the startup one. */
export function dumpRootOf(config: RuntimeConfig, opts: Pick<StartupOptions, 'dumpDir'>): string {
  return config.dump.dump_dir ?? opts.dumpDir;
}
