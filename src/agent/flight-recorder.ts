// The flight recorder on the agent (docs/recorder.md): off unless WAVEBUS_RECORD_FORWARDS=K. It
// owns the ring its engine copies each forward into, watches the engine's pid (from its hello),
// and writes the ring out when the engine dies without saying goodbye (crash-rank<g>.json beside
// the forwards) or when asked (a flush named the same on every rank). The engine's per-forward
// path never reaches the agent.
import * as fs from 'fs';
import * as os from 'os';
import type { ArtifactModes } from '../artifacts/artifact-mode';
import { ConfigError } from '../errors';
import { MAX_RECORD_BYTES, MAX_RECORD_FORWARDS, recorderSizeMismatch, RECORDER_TRIGGERS, type RecorderTrigger, type SensitiveInfo } from '../guard/recorder-config';
import type { RankIdentity } from '../layout';
import type { Logger } from '../log';
import { readEngineFault } from './engine-fault';
import { crashFileName, flushRing, writeCrash, type EngineExit, type FlushResult } from './recorder-flush';
import { DEFAULT_FLUSH_PRIVACY, type FlushPrivacy } from './recorder-sensitive';
import { RecorderRing, type RecorderSettings } from './recorder-ring';

export const DEFAULT_RECORD_MAX_BYTES = 256 * 2 ** 20;
// The limits are the config key's too (recorder.forwards / max_bytes).
export { MAX_RECORD_BYTES, MAX_RECORD_FORWARDS } from '../guard/recorder-config';
/** How often the engine's pid is looked at. */
export const ENGINE_WATCH_MS = 100;
/** After its connection drops, how long the engine has to be seen gone by its pid (its exit status read first). */
export const CONNECTION_GRACE_MS = 250;

function intVar(env: NodeJS.ProcessEnv, name: string, lo: number, hi: number): number | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  if (!/^\d+$/.test(raw.trim()) || Number(raw) < lo || Number(raw) > hi) throw new ConfigError(`${name} must be an integer in ${lo}..${hi}, got ${JSON.stringify(raw)}`, 'ERR_RECORDER');
  return Number(raw);
}

/** WAVEBUS_RECORD_FORWARDS (K; 0 or unset: off) and WAVEBUS_RECORD_MAX_BYTES (the ring's data, default 256 MiB). */
export function recorderSettingsFromEnv(env: NodeJS.ProcessEnv): RecorderSettings | undefined {
  const forwards = intVar(env, 'WAVEBUS_RECORD_FORWARDS', 0, MAX_RECORD_FORWARDS) ?? 0;
  const maxBytes = intVar(env, 'WAVEBUS_RECORD_MAX_BYTES', 1, MAX_RECORD_BYTES) ?? DEFAULT_RECORD_MAX_BYTES;
  return forwards > 0 ? { forwards, maxBytes } : undefined;
}

/** What /proc says of a pid: alive, gone (unknown how), or a zombie with its wait status. */
export function engineState(pid: number): { alive: true } | { alive: false; code: number | null; signal: string | null } {
  let stat: string;
  try {
    stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    try {
      process.kill(pid, 0);
      return { alive: true }; // no /proc here
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'EPERM') return { alive: true };
      return { alive: false, code: null, signal: null };
    }
  }
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  if (fields[0] !== 'Z' && fields[0] !== 'X') return { alive: true };
  // Field 52 (exit_code, Linux 3.5+), the wait status: readable while the parent has not reaped it.
  const status = Number(fields[49]);
  if (!Number.isInteger(status)) return { alive: false, code: null, signal: null };
  const sig = status & 0x7f;
  return sig ? { alive: false, code: null, signal: signalName(sig) } : { alive: false, code: (status >> 8) & 0xff, signal: null };
}

/** This process's pid namespace as /proc/self/ns/pid reads ("pid:[4026531836]"), or '' (no /proc). */
export function ownPidNamespace(): string {
  try {
    return fs.readlinkSync('/proc/self/ns/pid');
  } catch {
    return '';
  }
}

function signalName(n: number): string {
  const found = Object.entries(os.constants.signals).find(([, v]) => v === n);
  return found ? found[0] : `signal ${n}`;
}

export interface FlightRecorderOptions {
  file: string;
  settings: RecorderSettings;
  /** Where flushes go (the snapshot root, else the dump root). */
  root: string | undefined;
  identity: RankIdentity;
  log: Logger;
  artifactModes?: ArtifactModes;
  /** The engine's faulthandler file (engine-fault.ts), read after a death. */
  faultFile?: string;
  /** The name of this host's crash flush (the same for every rank of one launch on this host). */
  crashName: string;
  /** A crash was flushed (the agent tells the coordinator); `file` is empty when crash-rank<g>.json could not be written. */
  onCrash?: (c: { file: string; exit: EngineExit; flush: FlushResult; note: string }) => void;
  /** Which inputs hold token ids and the key to hash them with (save_sensitive_info comes from configure()). */
  privacy?: Omit<FlushPrivacy, 'sensitive'>;
}

export class FlightRecorder {
  readonly ring: RecorderRing;
  private pid = 0;
  /** The engine's pid means something here (same pid namespace, seen alive at its hello). */
  private pidVisible = false;
  private helloMs = 0;
  private closedCleanly = false;
  private timer?: NodeJS.Timeout;
  /** A dropped connection's grace under way (connectionLost). */
  private lost?: NodeJS.Timeout;
  private crashed?: Promise<void>;
  /** Flushes done (name -> result), newest last. */
  readonly flushes: FlushResult[] = [];
  /** recorder.on in force (all until the coordinator's config says otherwise). */
  private triggers = new Set<RecorderTrigger>(RECORDER_TRIGGERS);
  /** report.save_sensitive_info in force: what crash-rank<g>.json keeps of the engine's last words, and the flushes of token ids. */
  private sensitive: SensitiveInfo = false;

  constructor(private readonly o: FlightRecorderOptions) {
    this.ring = RecorderRing.create(o.file, o.settings);
  }

  get forwards(): number {
    return this.o.settings.forwards;
  }

  get settings(): RecorderSettings {
    return this.o.settings;
  }

  /** Whether the ring is written out on `t` now (recorder.on). */
  writesOn(t: RecorderTrigger): boolean {
    return this.triggers.has(t);
  }

  /** The runtime config's recorder.on and report.save_sensitive_info, from now on. */
  configure(on: readonly RecorderTrigger[], sensitive: SensitiveInfo): void {
    this.triggers = new Set(on);
    this.sensitive = sensitive;
  }

  /**
   * The engine said hello (its pid, its pid namespace): watch the pid when it means something
   * here. An engine in another pid namespace (its link differs from ours, or its pid is not alive
   * here) is watched by its connection only (connectionLost).
   */
  engine(pid: number, pidNamespace = ''): void {
    if (!Number.isSafeInteger(pid) || pid <= 0 || pid === process.pid || (pid === this.pid && !this.closedCleanly)) return;
    this.pid = pid;
    this.helloMs = Date.now();
    this.closedCleanly = false;
    clearInterval(this.timer);
    const ours = ownPidNamespace();
    this.pidVisible = pid > 1 && !(pidNamespace && ours && pidNamespace !== ours) && engineState(pid).alive;
    if (!this.pidVisible) {
      this.o.log.info({ pid, pidNamespace, ours }, "the engine's pid is not visible to this agent (another pid namespace?): its death is seen by its connection only");
      return;
    }
    this.timer = setInterval(() => this.check(), ENGINE_WATCH_MS);
    this.timer.unref();
  }

  /** The engine closed its client: its end is not a crash. */
  engineClosed(): void {
    this.closedCleanly = true;
    clearInterval(this.timer);
  }

  /**
   * The connection of the client that said hello with `pid` closed without its goodbye. Given
   * CONNECTION_GRACE_MS for a pid gone to be read as such (with its exit status), it is then a
   * death whatever the pid says: an engine alive without its connection records for nobody.
   */
  connectionLost(pid: number): void {
    if (pid !== this.pid || this.closedCleanly || this.crashed || this.lost) return;
    this.lost = setTimeout(() => this.decideLost(pid), CONNECTION_GRACE_MS);
    this.lost.unref();
  }

  private decideLost(pid: number): void {
    clearTimeout(this.lost);
    this.lost = undefined;
    if (pid !== this.pid || this.closedCleanly || this.crashed) return;
    const st = this.pidVisible ? engineState(pid) : undefined;
    if (st && !st.alive) return this.crash({ pid, code: st.code, signal: st.signal, how: 'the connection closed without goodbye; the engine process is gone' });
    const how = st ? `the connection closed without goodbye; pid ${pid} is still alive` : `the connection closed without goodbye; pid ${pid} is not visible to this agent`;
    this.crash({ pid, code: null, signal: null, how, pidAlive: Boolean(st), pidVisible: this.pidVisible });
  }

  /** Checks the engine once more (the agent is stopping) and waits for a crash flush under way. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.check();
    if (this.lost) this.decideLost(this.pid); // a connection dropped just before the stop: decided now
    await this.crashed;
    this.ring.close({ unlink: true });
    try {
      if (this.o.faultFile) fs.unlinkSync(this.o.faultFile); // its words are in crash-rank<g>.json by now
    } catch {
      /* none, or not ours to remove (a directory) */
    }
  }

  private check(): void {
    if (!this.pid || !this.pidVisible || this.closedCleanly || this.crashed) return;
    const st = engineState(this.pid);
    if (st.alive) return;
    this.crash({ pid: this.pid, code: st.code, signal: st.signal, how: 'the engine process is gone (pid watch)' });
  }

  /** The one way to a crash flush (the pid watch and a dropped connection race: the first wins). */
  private crash(exit: EngineExit): void {
    if (this.crashed) return;
    clearInterval(this.timer);
    if (!this.writesOn('crash')) {
      this.crashed = Promise.resolve();
      this.o.log.warn({ pid: this.pid, how: exit.how }, 'engine died; recorder.on leaves out "crash": the flight recorder is not written out');
      return;
    }
    // What the engine could say itself: its faulthandler's signal and traceback (written since its hello).
    const fault = this.o.faultFile ? readEngineFault(this.o.faultFile, this.helloMs - 2000) : undefined;
    if (fault) {
      exit.faultTraceback = fault.traceback;
      if (exit.signal === null && exit.code === null && fault.signal) Object.assign(exit, { signal: fault.signal, signalFrom: 'faulthandler' });
    }
    this.crashed = this.flushCrash(exit).catch((e) => this.o.log.error({ err: String((e as Error)?.message ?? e) }, 'flight recorder: crash flush failed'));
  }

  private async flushCrash(exit: EngineExit): Promise<void> {
    const read = this.ring.read();
    this.o.log.warn({ pid: exit.pid, code: exit.code, signal: exit.signal, forwards: read.entries.length, note: read.note || undefined }, 'engine died: flushing the flight recorder');
    const flush = await this.flush(this.o.crashName, 'crash', read);
    if (!flush) return;
    const last = read.entries[read.entries.length - 1];
    const failed = flush.forwards.filter((f) => !f.callDir).map((f) => ({ forward: f.forward, ...(f.tooLarge ? { too_large: true } : { error_code: f.errorCode ?? '' }) }));
    let file = '';
    try {
      file = writeCrash(flush, exit, read, this.o.identity, Number(last?.entry.wave ?? 0), this.o.artifactModes, this.sensitive);
    } catch (e) {
      // A full disk: the log (and the coordinator, below) say what the file would have.
      this.o.log.error({ err: String((e as Error)?.message ?? e), dir: flush.dir, written: flush.forwards.filter((f) => f.callDir).map((f) => f.forward), failed }, `flight recorder: ${crashFileName(this.o.identity)} could not be written`);
    }
    if (file) this.o.log.warn({ crash: file, dir: flush.dir, written: flush.forwards.filter((f) => f.callDir).length, failed, leftOut: flush.torn.length }, 'flight recorder flushed after the engine died');
    this.o.onCrash?.({ file, exit, flush, note: read.note });
  }

  /**
   * A flush armed for `wave` (every rank of the replica gets the same): once the engine has
   * recorded a forward past `wave` (or died, or `waitMs` went by), the newest K-1 forwards recorded
   * at or before it. K-1: the engine may be overwriting the oldest slot while the ring is read.
   */
  async flushAtWave(name: string, wave: number, reason: string, waitMs = 10000): Promise<FlushResult | undefined> {
    const until = Date.now() + waitMs;
    while (Date.now() < until && !this.crashed && this.ring.newestWave() <= wave) await new Promise((r) => setTimeout(r, 5));
    const read = this.ring.read();
    const keep = read.entries.filter((e) => Number(e.entry.wave ?? 0) <= wave).slice(-Math.max(1, this.forwards - 1));
    const r = await this.flush(name, reason, { ...read, entries: keep, torn: read.torn.filter((t) => keep.length === 0 || t.forward >= keep[0].forward) });
    this.o.log.info({ name, wave, written: r?.forwards.filter((f) => f.callDir).length ?? 0, dir: r?.dir }, 'flight recorder flushed');
    return r;
  }

  /**
   * An incident's dump is copied at the end of `wave` on this rank: the engine waits in
   * end_of_wave, so the ring is read now, whole and the same on every rank of the replica (each
   * has recorded the same forwards up to `wave`); the bundles are written behind the engine.
   */
  atIncident(name: string, wave: number, what: Record<string, unknown>): Promise<FlushResult | undefined> {
    if (!this.writesOn('incident')) return Promise.resolve(undefined);
    const read = this.ring.read();
    const keep = read.entries.filter((e) => Number(e.entry.wave ?? 0) <= wave);
    return this.flush(name, 'incident', { ...read, entries: keep }).then((r) => {
      this.o.log.warn({ ...what, wave, dir: r?.dir, forwards: r?.forwards.map((f) => f.forward) }, 'flight recorder flushed for an incident');
      return r;
    });
  }

  /** Write the ring out under <root>/recorder/<name> (undefined without a root: logged). */
  async flush(name: string, reason: string, read = this.ring.read()): Promise<FlushResult | undefined> {
    if (!this.o.root) {
      this.o.log.error({ name }, 'flight recorder: no snapshot or dump root on this agent; nothing flushed');
      return undefined;
    }
    // The setting in force now, not when the forwards were recorded: a flush never keeps more than it allows.
    const privacy: FlushPrivacy = { ...DEFAULT_FLUSH_PRIVACY, ...this.o.privacy, sensitive: this.sensitive };
    const r = await flushRing(read, this.o.root, name, reason, this.o.identity, this.o.artifactModes, privacy);
    this.flushes.push(r);
    if (this.flushes.length > 64) this.flushes.shift();
    return r;
  }
}

/**
 * `capture --flush-recorder` arms of replica `dpRank` (each taken once: `seen`): the recorder
 * writes its ring out at the arm's wave; each rank says where (or why not) as a capture result.
 */
export function takeFlushArms(
  arms: readonly Record<string, any>[] | undefined,
  seen: Set<string>,
  recorder: FlightRecorder | undefined,
  dpRank: number,
  send: (r: { armId: string; wave: number; callDir: string; error: string; done: boolean }) => void,
): void {
  for (const a of arms ?? []) {
    if (!a.flushRecorder || a.replica !== dpRank || seen.has(a.id)) continue;
    seen.add(a.id);
    if (seen.size > 64) seen.delete(seen.values().next().value as string);
    const say = (callDir: string, error: string) => send({ armId: a.id, wave: Number(a.wave), callDir, error, done: true });
    if (!recorder) {
      say('', 'the flight recorder is off on this rank (set WAVEBUS_RECORD_FORWARDS)');
      continue;
    }
    if (!recorder.writesOn('flush')) {
      say('', 'recorder.on leaves out "flush" on this rank (the runtime config)');
      continue;
    }
    recorder.flushAtWave(`flush-${a.id}`, Number(a.wave), 'user').then(
      (r) => say(r?.dir ?? '', r ? '' : 'this agent has no snapshot or dump root'),
      (e) => say('', String((e as Error)?.message ?? e)),
    );
  }
}

/**
 * The runtime config's `recorder` and `report.save_sensitive_info` on an agent: the triggers and
 * the sensitive setting apply at once; a size other than the ring's (or a recorder asked of an
 * agent started without one) is logged, once per setting, and not applied: the ring is sized at
 * startup (WAVEBUS_RECORD_*). Returns the warning, if any.
 */
export function applyRecorderConfig(
  recorder: FlightRecorder | undefined,
  view: { recorder: { on: readonly RecorderTrigger[]; forwards: number; maxBytes: number }; sensitive: SensitiveInfo },
  log: Logger,
  warned: Set<string>,
): string | undefined {
  recorder?.configure(view.recorder.on, view.sensitive);
  const why = recorderSizeMismatch(recorder?.settings, view.recorder.forwards, view.recorder.maxBytes);
  if (why && !warned.has(why)) {
    warned.add(why);
    log.warn({ forwards: view.recorder.forwards, max_bytes: view.recorder.maxBytes }, `flight recorder: ${why}`);
  }
  return why;
}
