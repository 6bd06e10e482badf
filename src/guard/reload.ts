// Polled hot reload of runtime_config.json (the seed polls, it does not watch: NFS and bind mounts
// miss inotify events). Each poll stats the file; when mtime or size changed, or when the last
// content check is older than verifyIntervalMs (coarse mtimes, same-size edits), the bytes are
// hashed (sha256) and a new hash is parsed and validated. A bad file keeps the last good config
// and is logged once per distinct content; a deleted file keeps it too, logged once.
// A file over MAX_CONFIG_BYTES is refused from its fstat, unread; content already rejected is
// recognised by its hash (or, over the cap, by size and mtime) and never parsed again, so a bad
// file costs each poll a stat, not a parse.
import * as fs from 'fs';
import { ConfigError, UntrustedPathError, WavebusError } from '../errors';
import { checkTrustedPathSync, checkTrustedStat } from '../artifacts/safe-mkdir';
import type { Logger } from '../log';
import { gauge } from '../metrics';
import { configJson, RuntimeConfig } from './config';
import { configFromText, sha256 } from './startup';
import { configTooBigError, MAX_CONFIG_BYTES, readCapped } from './config-read';

/** runtime_config.json is a few KiB; anything over this is refused without being read. */
const configErrorGauge = () => gauge('wavebus_config_error', '1 while the runtime config file on disk is rejected (the last good config is in use), else 0');

export interface FollowerOptions {
  /** Minimum ms between two stats of the file (default 500). 0: stat on every poll. */
  pollIntervalMs?: number;
  /** Re-hash the bytes at least this often even when stat looks unchanged (default 2000). */
  verifyIntervalMs?: number;
  /** Hash of the content the initial config came from (no reload of identical bytes). */
  initialHash?: string | null;
  log?: Pick<Logger, 'info' | 'warn' | 'error'>;
}

export type PollResult =
  | { kind: 'unchanged' }
  | { kind: 'changed'; config: RuntimeConfig; version: number }
  | { kind: 'rejected'; error: Error }
  | { kind: 'missing' };

// Returned by most polls (every wave head): one shared object, no allocation.
const UNCHANGED: PollResult = Object.freeze({ kind: 'unchanged' });

/** Follows one config file; used by the coordinator's guard and by ranks that are not last-PP. */
export class ConfigFollower {
  readonly path: string;
  private cfg: RuntimeConfig;
  private ver: number;
  private readonly pollIntervalMs: number;
  private readonly verifyIntervalMs: number;
  private readonly log?: FollowerOptions['log'];
  private lastPollAt = -Infinity;
  private lastVerifyAt = -Infinity;
  private lastMtimeMs = -1;
  private lastSize = -1;
  private lastHash: string | null;
  private readonly loggedBad = new Set<string>();
  private missingLogged = false;
  /** The last rejected content: its size and mtime, its hash (null when refused unread), the error. */
  private rejected: { size: number; mtimeMs: number; hash: string | null; error: Error } | null = null;
  /** Distinct rejected contents, for status(). */
  rejections = 0;
  lastError: string | null = null;
  /** What polls cost: parses (JSONC + validation) and bytes read, since construction. */
  readonly stats = { parses: 0, bytesRead: 0 };

  constructor(path: string, initial: RuntimeConfig, opts: FollowerOptions = {}) {
    this.path = path;
    this.cfg = initial;
    this.ver = 1;
    this.pollIntervalMs = opts.pollIntervalMs ?? 500;
    this.verifyIntervalMs = opts.verifyIntervalMs ?? 2000;
    this.lastHash = opts.initialHash ?? null;
    this.log = opts.log;
    // Served from the start (0: the file is good), so a dashboard sees the series before any rejection.
    configErrorGauge().set(0);
  }

  /** A follower that starts from the file as it is now (falls back to `fallback` if it is bad or absent). */
  static fromFile(path: string, fallback: RuntimeConfig, opts: Omit<FollowerOptions, 'initialHash'> = {}): ConfigFollower {
    const f = new ConfigFollower(path, fallback, opts);
    f.poll(0, true);
    f.ver = 1;
    return f;
  }

  current(): RuntimeConfig {
    return this.cfg;
  }

  version(): number {
    return this.ver;
  }

  /** Check the file now (or when the poll interval allows). `force` skips the interval and stat shortcut. */
  poll(nowMs: number = Date.now(), force = false): PollResult {
    if (!force && nowMs - this.lastPollAt < this.pollIntervalMs) return UNCHANGED;
    this.lastPollAt = nowMs;
    let st: fs.Stats;
    try {
      st = fs.statSync(this.path);
    } catch (e) {
      if (!this.missingLogged) {
        this.missingLogged = true;
        this.log?.warn({ path: this.path, err: (e as Error).message }, 'runtime config file is gone; keeping the last good config');
      }
      this.lastMtimeMs = -1;
      this.lastSize = -1;
      return { kind: 'missing' };
    }
    if (this.missingLogged) {
      this.missingLogged = false;
      this.log?.info({ path: this.path }, 'runtime config file is back');
    }
    const statChanged = st.mtimeMs !== this.lastMtimeMs || st.size !== this.lastSize;
    if (!force && !statChanged && nowMs - this.lastVerifyAt < this.verifyIntervalMs) return UNCHANGED;
    this.lastMtimeMs = st.mtimeMs;
    this.lastSize = st.size;
    this.lastVerifyAt = nowMs;
    // Only a file of ours (or root's), in directories nobody else can write, is applied: another
    // user who could replace it would otherwise steer the job (docs/security.md). Checked on
    // every read, not only at startup: an owner fixed later (chown) is accepted again.
    try {
      checkTrustedPathSync(this.path, 'runtime config file', 'file');
    } catch (e) {
      if (e instanceof WavebusError) return this.reject(e, null, st);
      return { kind: 'missing' }; // gone or unreadable meanwhile
    }
    const r = this.rejected;
    // Refused unread before, and size and mtime say it is the same file: refuse it again unread.
    if (r && r.hash === null && !(r.error instanceof UntrustedPathError) && r.size === st.size && r.mtimeMs === st.mtimeMs) return this.reject(r.error, null, st);
    let read: ReturnType<typeof readCapped>;
    try {
      read = readCapped(this.path);
    } catch (e) {
      return { kind: 'missing' };
    }
    try {
      checkTrustedStat(read.st, this.path, 'runtime config file'); // the file actually read
    } catch (e) {
      return this.reject(e as Error, null, read.st);
    }
    if ('tooBig' in read) return this.reject(configTooBigError(this.path, read.tooBig), null, read.st);
    const bytes = read.bytes;
    this.stats.bytesRead += bytes.length;
    const hash = sha256(bytes);
    if (hash === this.lastHash) return this.accepted(UNCHANGED);
    if (r && r.hash === hash) return this.reject(r.error, hash, read.st);
    let next: RuntimeConfig;
    try {
      this.stats.parses++;
      next = configFromText(bytes.toString('utf8'), this.path);
    } catch (e) {
      return this.reject(e as Error, hash, read.st);
    }
    this.lastHash = hash;
    if (configJson(next) === configJson(this.cfg)) return this.accepted(UNCHANGED); // comments/whitespace only
    this.cfg = next;
    this.ver++;
    this.log?.info({ path: this.path, version: this.ver }, 'runtime config reloaded');
    return this.accepted({ kind: 'changed', config: next, version: this.ver });
  }

  /** The file on disk is good again (new, or back to the last good bytes): the error clears. */
  private accepted(result: PollResult): PollResult {
    if (this.lastError !== null) {
      this.lastError = null;
      this.rejected = null;
      configErrorGauge().set(0);
      this.log?.info({ path: this.path }, 'runtime config file is good again');
    }
    return result;
  }

  /** Remember what was rejected (so it is not read or parsed again) and log each content once. */
  private reject(err: Error, hash: string | null, st: fs.Stats): PollResult {
    const again = this.rejected !== null && this.rejected.error === err;
    this.rejected = { size: st.size, mtimeMs: st.mtimeMs, hash, error: err };
    this.lastError = err.message;
    configErrorGauge().set(1);
    if (!again && !this.loggedBad.has(hash ?? `unread:${err.message}`)) {
      this.loggedBad.add(hash ?? `unread:${err.message}`);
      this.rejections++;
      this.log?.error({ path: this.path, err: err.message }, 'runtime config rejected; keeping the last good config');
    }
    return { kind: 'rejected', error: err };
  }
}
