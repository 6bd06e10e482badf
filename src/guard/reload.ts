// Polled hot reload of runtime_config.json (the seed polls, it does not watch: NFS and bind mounts
// miss inotify events). Each poll stats the file; when mtime or size changed, or when the last
// content check is older than verifyIntervalMs (coarse mtimes, same-size edits), the bytes are
// hashed (sha256) and a new hash is parsed and validated. A bad file keeps the last good config
// and is logged once per distinct content; a deleted file keeps it too, logged once.
import * as fs from 'fs';
import type { Logger } from '../log';
import { configJson, RuntimeConfig } from './config';
import { configFromText, sha256 } from './startup';

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
  /** Distinct rejected contents, for status(). */
  rejections = 0;
  lastError: string | null = null;

  constructor(path: string, initial: RuntimeConfig, opts: FollowerOptions = {}) {
    this.path = path;
    this.cfg = initial;
    this.ver = 1;
    this.pollIntervalMs = opts.pollIntervalMs ?? 500;
    this.verifyIntervalMs = opts.verifyIntervalMs ?? 2000;
    this.lastHash = opts.initialHash ?? null;
    this.log = opts.log;
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
    let bytes: Buffer;
    try {
      bytes = fs.readFileSync(this.path);
    } catch (e) {
      return { kind: 'missing' };
    }
    const hash = sha256(bytes);
    if (hash === this.lastHash) return UNCHANGED;
    let next: RuntimeConfig;
    try {
      next = configFromText(bytes.toString('utf8'), this.path);
    } catch (e) {
      const err = e as Error;
      this.lastError = err.message;
      if (!this.loggedBad.has(hash)) {
        this.loggedBad.add(hash);
        this.rejections++;
        this.log?.error({ path: this.path, err: err.message }, 'runtime config rejected; keeping the last good config');
      }
      return { kind: 'rejected', error: err };
    }
    this.lastHash = hash;
    this.lastError = null;
    if (configJson(next) === configJson(this.cfg)) return UNCHANGED; // comments/whitespace only
    this.cfg = next;
    this.ver++;
    this.log?.info({ path: this.path, version: this.ver }, 'runtime config reloaded');
    return { kind: 'changed', config: next, version: this.ver };
  }
}
