// What `wavebus demo` must find, derived from the configuration in force: the runtime config (the
// demo's or --runtime-config), the snapshot settings (the demo's defaults, each overridden by the
// user's WAVEBUS_SNAPSHOT_* / seed variables), and the layout flags. The demo passes when exactly
// that happened, and says why nothing was expected from what was off.
import * as fs from 'fs';
import * as path from 'path';
import { actionsFor, checkConfigPartial, configFromRaw, DETECTOR_NAMES, type DetectorName, type RuntimeConfig } from '../guard/config';
import { parseJsonc } from '../guard/jsonc';
import { rankCoordinates, type WorldLayout } from '../layout';
import type { SimFaults } from '../sim/faults';
import { resolveSnapshotConfig, seedVar, snapshotVar, type Setting, type SnapshotConfig, type SnapshotFlags } from '../snapshot/config';
import { ConfigError } from '../errors';

/** The injected fault that makes each detector fire (a detector without one: nothing expected of it). */
export const FAULT_OF: Partial<Record<DetectorName, keyof SimFaults>> = {
  token_repeat: 'repetition',
  logits_finite: 'nonFinite',
  spec_acceptance: 'specDrift',
  garbled: 'garbled',
};

export interface DetectorExpectation {
  name: DetectorName;
  /** At least one report of this type must exist; when false, none may. */
  report: boolean;
  /** Dumps of this type may appear (its on_trigger has dump_kv and the quota allows one). */
  dump: boolean;
  /** Why nothing (or no dump) is expected, for the summary. */
  why?: string;
}

export interface DemoExpectations {
  config: RuntimeConfig;
  /** The runtime config as the overlay the demo hands to `wavebus launch`. */
  overlay: Record<string, unknown>;
  detectors: DetectorExpectation[];
  /** Automatic dumps: at least `min`, at most `max` (dump.auto_max_times). */
  autoDumps: { min: number; max: number; why?: string };
  snapshot: SnapshotConfig;
  /** Demo defaults the launch flags carry (the settings the user's environment does not set). */
  snapshotFlags: Partial<SnapshotFlags>;
  /** Global ranks that must write at least one snapshot (and at most maxCaptures); all others none. */
  snapshotRanks: number[];
  snapshotWhy?: string;
}

/** The demo's runtime config: every detector on, each hit reported and dumped. */
export function demoRuntimeConfig(format: string): Record<string, unknown> {
  const on = { enabled: true, on_trigger: ['report', 'dump_kv'] };
  return {
    detector: Object.fromEntries(DETECTOR_NAMES.map((name) => [name, on])),
    dump: { auto_max_times: 16, auto_cooldown_seconds: 0, free_headroom_bytes: 0, format },
  };
}

/** The demo's snapshot selection, used for every setting the environment leaves unset. */
export function demoSnapshotDefaults(format: string, captureToken = '17'): Partial<SnapshotFlags> {
  // The token rule targets decode step 5 of request 0 (prompt length 12): token position 17.
  return { enable: true, captureToken, maxCaptures: '2', format };
}

const SETTING_OF: Record<keyof SnapshotFlags, Setting | undefined> = {
  enable: 'ENABLE',
  captureAtCall: 'CAPTURE_AT_CALL',
  captureToken: 'CAPTURE_TOKEN',
  captureRequest: 'CAPTURE_REQUEST',
  maxCaptures: 'MAX_CAPTURES',
  ranks: 'RANKS',
  format: 'FORMAT',
  cacheRoot: undefined,
};

/** True when the user's environment sets this snapshot setting under either name. */
function envSets(env: NodeJS.ProcessEnv, setting: Setting): boolean {
  return env[snapshotVar(setting)] !== undefined || env[seedVar(setting)] !== undefined;
}

/** A selection variable the user set narrows what the demo selects; the demo's rule is then not added. */
function selectionFromEnv(env: NodeJS.ProcessEnv): boolean {
  return (['CAPTURE_AT_CALL', 'CAPTURE_TOKEN', 'CAPTURE_REQUEST'] as const).some((s) => envSets(env, s));
}

export function readRuntimeConfigFile(file: string): Record<string, unknown> {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new ConfigError(`--runtime-config ${file}: ${(e as Error).message}`);
  }
  return checkConfigPartial(parseJsonc(text, `--runtime-config ${file}`), `--runtime-config ${file}`);
}

export function demoExpectations(opts: {
  runtimeConfig?: string;
  format: string;
  layout: WorldLayout;
  faults: SimFaults;
  env: NodeJS.ProcessEnv;
  /** The token rule's target (the engine's decode step 5 of request 0); default the simulator's. */
  captureToken?: string;
}): DemoExpectations {
  const overlay = opts.runtimeConfig ? readRuntimeConfigFile(path.resolve(opts.runtimeConfig)) : demoRuntimeConfig(opts.format);
  const where = opts.runtimeConfig ? `--runtime-config ${opts.runtimeConfig}` : 'the demo config';
  const config = configFromRaw(overlay, where);
  const quota = config.dump.auto_max_times;
  const detectors: DetectorExpectation[] = DETECTOR_NAMES.map((name) => {
    const d = config.detector[name];
    const actions = actionsFor(config, name);
    const fault = FAULT_OF[name];
    if (fault === undefined || !opts.faults[fault]) return { name, report: false, dump: false, why: 'no fault injected for it' };
    if (!d.enabled) return { name, report: false, dump: false, why: `detector.${name}.enabled is false in ${where}` };
    if (!actions.includes('report')) {
      return { name, report: false, dump: false, why: `detector.${name}.on_trigger has no "report"` };
    }
    if (!actions.includes('dump_kv')) return { name, report: true, dump: false, why: `detector.${name}.on_trigger has no "dump_kv"` };
    if (quota <= 0) return { name, report: true, dump: false, why: 'dump.auto_max_times is 0' };
    return { name, report: true, dump: true };
  });
  const dumping = detectors.filter((d) => d.dump).length;
  // dump.auto_max_times is per replica (each replica's guard has its own budget).
  const autoDumps = dumping === 0 ? { min: 0, max: 0, why: 'no detector both fires and dumps' } : { min: opts.layout.dp, max: quota * opts.layout.dp };

  const defaults = demoSnapshotDefaults(opts.format, opts.captureToken);
  const narrowed = selectionFromEnv(opts.env);
  const snapshotFlags: Partial<SnapshotFlags> = {};
  for (const [k, v] of Object.entries(defaults) as [keyof SnapshotFlags, never][]) {
    const setting = SETTING_OF[k];
    if (setting && envSets(opts.env, setting)) continue;
    if (k === 'captureToken' && narrowed) continue;
    snapshotFlags[k] = v;
  }
  const snapshot = resolveSnapshotConfig(opts.env, snapshotFlags, () => undefined);
  const world = opts.layout.worldSize;
  let snapshotRanks: number[] = [];
  let snapshotWhy: string | undefined;
  if (!snapshot.enabled) snapshotWhy = `snapshots are off (${snapshotVar('ENABLE')} in the environment)`;
  else if (snapshot.maxCaptures <= 0) snapshotWhy = 'the capture budget is 0';
  else {
    snapshotRanks = Array.from({ length: world }, (_, g) => g).filter((g) => !snapshot.ranks || snapshot.ranks.has(rankCoordinates(g, opts.layout).tpRank));
    if (snapshot.ranks) snapshotWhy = `only tp-ranks [${[...snapshot.ranks].sort((a, b) => a - b).join(', ')}] capture (${snapshotVar('RANKS')})`;
  }
  return { config, overlay, detectors, autoDumps, snapshot, snapshotFlags, snapshotRanks, snapshotWhy };
}
