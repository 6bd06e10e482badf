// Input snapshot settings, resolved once per process from flags and environment.
// A malformed selection or format fails here, at startup, rather than mid-request
// (a typo must not silently disable a debugging run); a malformed rank list only warns.
import { TENSOR_FORMATS, type TensorFormat } from '../artifacts/tensor-format';
import type { Options } from 'yargs';
import { ConfigError } from '../errors';
import { pyInt, pyStrip } from './py-int';
import { resolveSnapshotRoot } from './root';

export type SnapshotFormat = TensorFormat;
export const SNAPSHOT_FORMATS: readonly SnapshotFormat[] = TENSOR_FORMATS;

/** Which post-warmup calls of a compiled graph the call-index rule selects. */
export type CallRule =
  | { kind: 'first' } // no rule configured at all: call 0 only
  | { kind: 'all' } // CAPTURE_AT_CALL=-1
  | { kind: 'indices'; indices: Set<number> }
  | { kind: 'never' }; // only token/request rules configured

export interface SnapshotConfig {
  enabled: boolean;
  callRule: CallRule;
  tokenTargets: Set<number>;
  requestIds: string[];
  maxCaptures: number;
  /** tp ranks allowed to capture; null = every rank. */
  ranks: Set<number> | null;
  format: SnapshotFormat;
  /** The directory holding `<compilation_hash>/rank<g>/call<N>` (see resolveSnapshotRoot). */
  snapshotRoot: string;
  /** Where snapshotRoot came from, for logs and docs: the flag or variable that decided it. */
  rootSource: string;
}

/** Flag values of the same meaning as the variables; any that is set overrides the environment. */
export interface SnapshotFlags {
  enable: boolean | string;
  captureAtCall: string | number;
  captureToken: string | number;
  captureRequest: string;
  maxCaptures: string | number;
  ranks: string | number;
  format: string;
  cacheRoot: string;
}

export type SnapshotLog = (message: string) => void;

export const DEFAULT_MAX_CAPTURES = 4;
export const DEFAULT_FORMAT: SnapshotFormat = 'pt';

const PREFIX = 'WAVEBUS_SNAPSHOT_';
const SEED_PREFIX = 'VLLM_NEURON_RUNTIME_INPUT_SNAPSHOT_';

export type Setting = 'ENABLE' | 'CAPTURE_AT_CALL' | 'CAPTURE_TOKEN' | 'CAPTURE_REQUEST' | 'MAX_CAPTURES' | 'RANKS' | 'FORMAT';

const FLAG_OF: Record<Setting, keyof SnapshotFlags> = {
  ENABLE: 'enable',
  CAPTURE_AT_CALL: 'captureAtCall',
  CAPTURE_TOKEN: 'captureToken',
  CAPTURE_REQUEST: 'captureRequest',
  MAX_CAPTURES: 'maxCaptures',
  RANKS: 'ranks',
  FORMAT: 'format',
};

/** The variable name wavebus documents for a setting. */
export function snapshotVar(setting: Setting): string {
  return PREFIX + setting;
}

/** The seed's (vLLM-Neuron) name for the same setting, accepted as an alias. */
export function seedVar(setting: Setting): string {
  return SEED_PREFIX + setting;
}

function kebab(s: string): string {
  return s.replace(/[A-Z]/g, (c) => '-' + c.toLowerCase());
}

/** A raw value plus the name to blame in error messages. */
export interface Raw {
  name: string;
  value: string;
}

/**
 * The raw value of a setting: the flag when given, else WAVEBUS_SNAPSHOT_X, else the seed alias.
 * Both variables set to different values is an error: guessing which one the user meant could
 * silently capture the wrong forward.
 */
function rawSetting(env: NodeJS.ProcessEnv, flags: Partial<SnapshotFlags>, setting: Setting): Raw | undefined {
  const flag = flags[FLAG_OF[setting]];
  if (flag !== undefined && flag !== null) {
    return { name: `--snapshot-${kebab(FLAG_OF[setting])}`, value: String(flag) };
  }
  const ours = env[snapshotVar(setting)];
  const seed = env[seedVar(setting)];
  if (ours !== undefined && seed !== undefined && pyStrip(ours) !== pyStrip(seed)) {
    throw new ConfigError(
      `${snapshotVar(setting)}=${JSON.stringify(ours)} and ${seedVar(setting)}=${JSON.stringify(seed)} disagree; ` +
        `set only one of them (or both to the same value)`,
      'ERR_SNAPSHOT_ALIAS_CONFLICT',
    );
  }
  if (ours !== undefined) return { name: snapshotVar(setting), value: ours };
  if (seed !== undefined) return { name: seedVar(setting), value: seed };
  return undefined;
}

/** A setting counts as given only when it has non-blank content. */
function given(raw: Raw | undefined): raw is Raw {
  return raw !== undefined && pyStrip(raw.value) !== '';
}

const TRUTHY = new Set(['1', 'true', 'yes', 'on']);
const FALSY = new Set(['0', 'false', 'no', 'off', '']);

export function parseEnable(raw: Raw | undefined): boolean {
  if (raw === undefined) return false;
  const v = pyStrip(raw.value).toLowerCase();
  if (TRUTHY.has(v)) return true;
  if (FALSY.has(v)) return false;
  throw new ConfigError(
    `${raw.name}=${JSON.stringify(raw.value)} is not a switch value; use 1/true/yes/on or 0/false/no/off`,
    'ERR_SNAPSHOT_ENABLE',
  );
}

function badPiece(raw: Raw, piece: string, why: string): ConfigError {
  return new ConfigError(`${raw.name}=${JSON.stringify(raw.value)}: bad entry ${JSON.stringify(piece)}: ${why}`, 'ERR_SNAPSHOT_SELECTION');
}

/** Split on ',', strip each piece; an empty piece ("1,,2", a trailing comma) is an error, as upstream's int('') is. */
function pieces(raw: Raw): string[] {
  return raw.value.split(',').map((p, i, all) => {
    const s = pyStrip(p);
    if (s === '') {
      throw badPiece(raw, p, `empty entry at position ${i} of ${all.length} (stray or trailing comma?)`);
    }
    return s;
  });
}

/** Python's int() on a stripped piece (src/snapshot/py-int.ts). */
function toInt(raw: Raw, piece: string): number {
  const r = pyInt(piece);
  if (!r.ok) throw badPiece(raw, piece, r.why);
  return r.value;
}

/**
 * Non-negative integers; `-1` means "all" only where allowAll is set. As upstream: `-1` may not be
 * combined with an index (`-1,3` is an error) but may repeat (`-1,-1` is still every call).
 */
export function parseIndexList(raw: Raw, allowAll: boolean): Set<number> | 'all' {
  const out = new Set<number>();
  let sawAll = false;
  for (const p of pieces(raw)) {
    const n = toInt(raw, p);
    if (n === -1 && allowAll) {
      sawAll = true;
      continue;
    }
    if (n < 0) {
      throw badPiece(raw, p, allowAll ? 'negative index (only -1, meaning every call, is allowed)' : 'negative position');
    }
    out.add(n);
  }
  if (sawAll && out.size > 0) {
    throw badPiece(raw, String([...out][0]), '-1 (every call) cannot be combined with other indices');
  }
  return sawAll ? 'all' : out;
}

/** Request ids: pieces stripped, empty pieces dropped (as upstream); only commas means no rule at all. */
export function parseRequestList(raw: Raw): string[] {
  const out: string[] = [];
  for (const p of raw.value.split(',')) {
    const s = pyStrip(p);
    if (s !== '' && !out.includes(s)) out.push(s);
  }
  return out;
}

/** A positive integer. Blank is an error too (upstream: only an unset variable gets the default 4). */
export function parseMaxCaptures(raw: Raw): number {
  const r = pyInt(raw.value);
  if (!r.ok || r.value <= 0) {
    const why = pyStrip(raw.value) === '' ? 'is blank; unset it for the default ' + DEFAULT_MAX_CAPTURES + ' or give' : 'must be';
    throw new ConfigError(`${raw.name}=${JSON.stringify(raw.value)} ${why} a positive integer`, 'ERR_SNAPSHOT_MAX_CAPTURES');
  }
  return r.value;
}

/** pt | npy | safetensors (a wavebus extension), any case. Blank is an error (upstream: only unset means pt). */
export function parseFormat(raw: Raw): SnapshotFormat {
  const v = pyStrip(raw.value).toLowerCase();
  if ((SNAPSHOT_FORMATS as readonly string[]).includes(v)) return v as SnapshotFormat;
  const what = v === '' ? `is blank; unset it for the default ${DEFAULT_FORMAT} or use` : 'is not a snapshot format; use';
  throw new ConfigError(`${raw.name}=${JSON.stringify(raw.value)} ${what} one of ${SNAPSHOT_FORMATS.join(', ')}`, 'ERR_SNAPSHOT_FORMAT');
}

/**
 * A bad rank list degrades to "all ranks" with a warning instead of aborting the job. Pieces are
 * read as int() reads them (`-0` is rank 0); a negative rank names no rank, so it is bad too.
 */
export function parseRanks(raw: Raw, log: SnapshotLog): Set<number> | null {
  const out = new Set<number>();
  for (const p of raw.value.split(',')) {
    const r = pyInt(pyStrip(p));
    if (!r.ok || r.value < 0) {
      log(`${raw.name}=${JSON.stringify(raw.value)}: bad tp rank ${JSON.stringify(p)} (${r.ok ? 'negative' : r.why}); capturing on all ranks`);
      return null;
    }
    out.add(r.value);
  }
  return out;
}

const defaultLog: SnapshotLog = (m) => process.stderr.write(`wavebus: warning: ${m}\n`);

/**
 * Resolve the snapshot configuration. Flags override variables; WAVEBUS_SNAPSHOT_* and the seed's
 * VLLM_NEURON_RUNTIME_INPUT_SNAPSHOT_* are aliases. When capture is disabled the selection
 * variables are not read at all (capture off adds nothing, not even a startup failure).
 */
export function resolveSnapshotConfig(
  env: NodeJS.ProcessEnv = process.env,
  flags: Partial<SnapshotFlags> = {},
  log: SnapshotLog = defaultLog,
): SnapshotConfig {
  const get = (s: Setting) => rawSetting(env, flags, s);
  const enableRaw = get('ENABLE');
  const enabled = parseEnable(enableRaw);
  // Capture off adds nothing: a blank root variable is then read as unset, not a startup failure.
  const { root: snapshotRoot, source: rootSource } = resolveSnapshotRoot(env, flags, enableRaw?.name === seedVar('ENABLE'), enabled);
  const off: SnapshotConfig = {
    enabled: false,
    callRule: { kind: 'first' },
    tokenTargets: new Set(),
    requestIds: [],
    maxCaptures: DEFAULT_MAX_CAPTURES,
    ranks: null,
    format: DEFAULT_FORMAT,
    snapshotRoot,
    rootSource,
  };
  if (!enabled) return off;

  const atCall = get('CAPTURE_AT_CALL');
  const token = get('CAPTURE_TOKEN');
  const request = get('CAPTURE_REQUEST');
  // As upstream: a blank index list is no rule; only commas in CAPTURE_REQUEST is no rule either.
  const tokenTargets = given(token) ? (parseIndexList(token, false) as Set<number>) : new Set<number>();
  const requestIds = request !== undefined ? parseRequestList(request) : [];

  let callRule: CallRule;
  if (given(atCall)) {
    const parsed = parseIndexList(atCall, true);
    callRule = parsed === 'all' ? { kind: 'all' } : { kind: 'indices', indices: parsed };
  } else if (tokenTargets.size > 0 || requestIds.length > 0) {
    callRule = { kind: 'never' };
  } else {
    callRule = { kind: 'first' };
  }

  // Set but blank is an error for these two: only an unset variable takes the default.
  const max = get('MAX_CAPTURES');
  const ranks = get('RANKS');
  const format = get('FORMAT');
  return {
    enabled: true,
    callRule,
    tokenTargets,
    requestIds,
    maxCaptures: max !== undefined ? parseMaxCaptures(max) : DEFAULT_MAX_CAPTURES,
    ranks: given(ranks) ? parseRanks(ranks, log) : null,
    format: format !== undefined ? parseFormat(format) : DEFAULT_FORMAT,
    snapshotRoot,
    rootSource,
  };
}

export interface GatingFacts {
  asyncScheduling: boolean;
  backendHasMemoryAccess: boolean;
}

export interface GatingVerdict {
  noop: boolean;
  reason?: string;
}

/**
 * Startup preconditions. Async scheduling is refused: capture reads the input buffers inline, and
 * under async scheduling they may still belong to an in-flight prior forward. A backend without
 * memory access makes capture a stated no-op (logged and recorded by the caller, never a crash).
 */
export function checkSnapshotGating(config: SnapshotConfig, facts: GatingFacts): GatingVerdict {
  if (!config.enabled) return { noop: true, reason: 'disabled' };
  if (facts.asyncScheduling) {
    throw new ConfigError(
      'input snapshots need sync scheduling: under async scheduling the input buffers may still belong to an ' +
        'in-flight prior forward. Disable async scheduling (--no-async-scheduling / async_scheduling=False) ' +
        `or unset ${snapshotVar('ENABLE')} (and ${seedVar('ENABLE')})`,
      'ERR_SNAPSHOT_ASYNC',
    );
  }
  if (!facts.backendHasMemoryAccess) {
    return { noop: true, reason: 'backend_without_memory_access' };
  }
  return { noop: false };
}

/** yargs options for `wavebus launch` / `wavebus agent`; each mirrors one WAVEBUS_SNAPSHOT_* variable. */
export const snapshotOptions: Record<string, Options> = {
  'snapshot-enable': { type: 'boolean', group: 'Input snapshots:', describe: `Turn input snapshot capture on (${snapshotVar('ENABLE')})` },
  'snapshot-capture-at-call': {
    type: 'string',
    group: 'Input snapshots:',
    describe: `Call-index rule: comma-separated 0-based post-warmup call indices per compiled graph, or -1 for every call (${snapshotVar('CAPTURE_AT_CALL')})`,
  },
  'snapshot-capture-token': {
    type: 'string',
    group: 'Input snapshots:',
    describe: `Token rule: comma-separated token positions; fires on the decode forward that generates one (${snapshotVar('CAPTURE_TOKEN')})`,
  },
  'snapshot-capture-request': {
    type: 'string',
    group: 'Input snapshots:',
    describe: `Request rule: comma-separated request ids, matched exactly or as "<id>-" prefix (${snapshotVar('CAPTURE_REQUEST')})`,
  },
  'snapshot-max-captures': {
    type: 'string',
    group: 'Input snapshots:',
    describe: `Capture budget per process (default ${DEFAULT_MAX_CAPTURES}) (${snapshotVar('MAX_CAPTURES')})`,
  },
  'snapshot-ranks': { type: 'string', group: 'Input snapshots:', describe: `tp ranks that capture, comma-separated; default all (${snapshotVar('RANKS')})` },
  'snapshot-format': {
    type: 'string',
    group: 'Input snapshots:',
    describe: `Tensor file format: ${SNAPSHOT_FORMATS.join(' | ')} (default ${DEFAULT_FORMAT}) (${snapshotVar('FORMAT')})`,
  },
};

/** The flags of `snapshotOptions`, read from a parsed argv (camelCase keys, as yargs gives them). */
export function snapshotFlagsFromArgv(argv: Record<string, unknown>): Partial<SnapshotFlags> {
  const out: Partial<SnapshotFlags> = {};
  const pick = (k: keyof SnapshotFlags, key: string) => {
    const v = argv[key];
    if (v !== undefined && v !== null) (out as Record<string, unknown>)[k] = typeof v === 'boolean' ? v : String(v);
  };
  pick('enable', 'snapshotEnable');
  pick('captureAtCall', 'snapshotCaptureAtCall');
  pick('captureToken', 'snapshotCaptureToken');
  pick('captureRequest', 'snapshotCaptureRequest');
  pick('maxCaptures', 'snapshotMaxCaptures');
  pick('ranks', 'snapshotRanks');
  pick('format', 'snapshotFormat');
  return out;
}

/**
 * Environment values carrying the given flags down to agents (and the engine's client). Each flag
 * sets both WAVEBUS_SNAPSHOT_X and the seed alias to the same value, so that a stale alias in the
 * user's environment cannot conflict with, or override, an explicit flag.
 */
export function snapshotEnvFromArgv(argv: Record<string, unknown>): Record<string, string> {
  const flags = snapshotFlagsFromArgv(argv);
  const env: Record<string, string> = {};
  for (const setting of Object.keys(FLAG_OF) as Setting[]) {
    const v = flags[FLAG_OF[setting]];
    if (v === undefined) continue;
    const s = typeof v === 'boolean' ? (v ? '1' : '0') : String(v);
    env[snapshotVar(setting)] = s;
    env[seedVar(setting)] = s;
  }
  return env;
}
