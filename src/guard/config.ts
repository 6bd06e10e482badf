// runtime_config.json: the schema, its defaults, validation and merging.
// Effective config: at startup defaults ← overlay (startup.ts), on reload defaults ← file. Unknown keys anywhere are errors naming the
// dotted path; wrong types and out-of-range values name the path and what was expected.
import { PP_STAGES, type PpStages } from '../layout';
import { DEFAULT_TENSOR_FORMAT, TENSOR_FORMATS, type TensorFormat } from '../artifacts/tensor-format';
import { ConfigError } from '../errors';
import { ACTIONS, bool, detectorFields, int, num, type Action, type Field } from './config-schema';
import { DETECTORS, type DetectorConfigs, type DetectorName } from './detectors/registry';
import { RECORDER_FIELDS, type RecorderConfig } from './recorder-config';

export type { Action, DumpScope, DetectorCommon } from './config-schema';
export type DumpFormat = TensorFormat;

export interface RuntimeConfig {
  /** One entry per detector of the registry (detectors/registry.ts), each with its own parameters. */
  detector: DetectorConfigs;
  actions: { defaults: { on_trigger: Action[] } };
  dump: {
    auto_max_times: number;
    auto_cooldown_seconds: number;
    manual_dump: number;
    dump_dir?: string;
    free_headroom_bytes: number;
    format: DumpFormat;
    /** Which pipeline stages copy a dump: "last" (the seed's), or "all" (each stage its layers). */
    pp_stages: PpStages;
  };
  report: {
    max_per_req: number;
    backoff_waves: number;
    max_prompt_token_ids: number;
    max_output_token_ids: number;
    include_block_ids: boolean;
    /** true: token ids as they are; "hashed": a keyed hash of each (token-hash.ts); false: none. */
    save_sensitive_info: boolean | 'hashed';
  };
  /** The flight recorder (docs/recorder.md): its triggers, live; its size, startup only (WAVEBUS_RECORD_*). */
  recorder: RecorderConfig;
  /** `wavebus verdict` after each incident's recorder flush, on the replica head's agent (docs/verdict.md): off by default. */
  verdict: { auto: boolean; allow_live_device: boolean };
}

export { DETECTOR_NAMES, type DetectorName } from './detectors/registry';

// ---------------------------------------------------------------- schema

const U32 = 0xffffffff;

export const SCHEMA: Field = {
  kind: 'object',
  fields: {
    detector: {
      kind: 'object',
      fields: {
        // Each detector's parameters are declared in its own file (detectors/registry.ts).
        ...Object.fromEntries(DETECTORS.map((d) => [d.name, detectorFields(d.params)])),
      },
    },
    actions: {
      kind: 'object',
      fields: { defaults: { kind: 'object', fields: { on_trigger: { kind: 'enum_list', def: ['report'], values: ACTIONS } } } },
    },
    dump: {
      kind: 'object',
      fields: {
        auto_max_times: int(0, 0),
        auto_cooldown_seconds: num(300, 0),
        manual_dump: int(0, 0),
        dump_dir: { kind: 'string', optional: true },
        free_headroom_bytes: int(5 * 1024 ** 3, 0),
        format: { kind: 'enum', def: DEFAULT_TENSOR_FORMAT, values: [...TENSOR_FORMATS] },
        pp_stages: { kind: 'enum', def: 'last', values: PP_STAGES },
      },
    },
    report: {
      kind: 'object',
      fields: {
        max_per_req: int(1, 1),
        backoff_waves: int(64, 0, U32),
        max_prompt_token_ids: int(1000, 0),
        max_output_token_ids: int(1000, 0),
        include_block_ids: bool(true),
        save_sensitive_info: { kind: 'bool_or', def: false, values: ['hashed'] },
      },
    },
    recorder: RECORDER_FIELDS,
    verdict: { kind: 'object', fields: { auto: bool(false), allow_live_device: bool(false) } },
  },
};

// ---------------------------------------------------------------- validation

const isPlainObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);
const show = (v: unknown) => (typeof v === 'string' ? JSON.stringify(v) : Array.isArray(v) ? 'an array' : v === null ? 'null' : typeof v === 'object' ? 'an object' : String(v));

function expected(f: Field): string {
  switch (f.kind) {
    case 'bool':
      return 'a boolean';
    case 'bool_or':
      return `a boolean or ${f.values.map((v) => JSON.stringify(v)).join(' | ')}`;
    case 'int':
      return `an integer in [${f.min}, ${f.max ?? 'inf'}]`;
    case 'number':
      return `a number in [${f.min ?? '-inf'}, ${f.max ?? 'inf'}]`;
    case 'enum':
      return `one of ${f.values.map((v) => JSON.stringify(v)).join(' | ')}`;
    case 'string':
      return 'a non-empty string';
    case 'int_list':
      return `a list of integers >= ${f.min}`;
    case 'enum_list':
      return `a list of ${f.values.map((v) => JSON.stringify(v)).join(' | ')}`;
    case 'object':
      return 'an object';
  }
}

/** Check a partial config (a file, an overlay) against the schema; returns a deep copy. */
function checkPartial(v: unknown, f: Field, path: string, source: string): unknown {
  const bad = (why?: string): never => {
    throw new ConfigError(`${source}: ${path || '(root)'}: expected ${expected(f)}, got ${show(v)}${why ? ` (${why})` : ''}`);
  };
  switch (f.kind) {
    case 'bool':
      if (typeof v !== 'boolean') bad();
      return v;
    case 'bool_or':
      if (typeof v !== 'boolean' && !(typeof v === 'string' && f.values.includes(v))) bad();
      return v;
    case 'int':
      if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < f.min || (f.max !== undefined && v > f.max)) bad();
      return v;
    case 'number':
      if (typeof v !== 'number' || !Number.isFinite(v) || (f.min !== undefined && v < f.min) || (f.max !== undefined && v > f.max)) bad();
      return v;
    case 'enum':
      if (typeof v !== 'string' || !f.values.includes(v)) bad();
      return v;
    case 'string':
      if (typeof v !== 'string' || v === '') bad();
      return v;
    case 'int_list':
      if (!Array.isArray(v)) bad();
      (v as unknown[]).forEach((x, k) => {
        if (typeof x !== 'number' || !Number.isSafeInteger(x) || x < f.min) bad(`item ${k} is ${show(x)}`);
      });
      return [...(v as number[])];
    case 'enum_list': {
      if (!Array.isArray(v)) bad();
      (v as unknown[]).forEach((x, k) => {
        if (typeof x !== 'string' || !f.values.includes(x)) bad(`item ${k} is ${show(x)}`);
      });
      return [...new Set(v as string[])];
    }
    case 'object': {
      if (!isPlainObject(v)) bad();
      const out: Record<string, unknown> = {};
      for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
        const sub = f.fields[k];
        const p = path ? `${path}.${k}` : k;
        if (!sub) throw new ConfigError(`${source}: unknown key '${p}' (allowed here: ${Object.keys(f.fields).join(', ')})`);
        out[k] = checkPartial(x, sub, p, source);
      }
      return out;
    }
  }
}

/** Defaults for a schema node (optional fields without a default are left out). */
function defaultsOf(f: Field): unknown {
  switch (f.kind) {
    case 'object': {
      const out: Record<string, unknown> = {};
      for (const [k, sub] of Object.entries(f.fields)) {
        if ((sub.kind === 'object' || sub.kind === 'enum_list' || sub.kind === 'string') && sub.optional) continue;
        out[k] = defaultsOf(sub);
      }
      return out;
    }
    case 'string':
      return undefined;
    case 'int_list':
      return [...f.def];
    case 'enum_list':
      return f.def ? [...f.def] : undefined;
    default:
      return f.def;
  }
}

/** Deep merge of a checked partial onto a full config; an optional object takes its own defaults. */
function mergeInto(base: unknown, partial: unknown, f: Field): unknown {
  if (f.kind !== 'object') return partial;
  const out: Record<string, unknown> = { ...(isPlainObject(base) ? base : (defaultsOf(f) as Record<string, unknown>)) };
  for (const [k, x] of Object.entries(partial as Record<string, unknown>)) out[k] = mergeInto(out[k], x, f.fields[k]);
  return out;
}

export function defaultConfig(): RuntimeConfig {
  return defaultsOf(SCHEMA) as RuntimeConfig;
}

/** Validate `raw` (a parsed file or overlay) and return it as a checked partial. Throws ConfigError. */
export function checkConfigPartial(raw: unknown, source: string): Record<string, unknown> {
  return checkPartial(raw, SCHEMA, '', source) as Record<string, unknown>;
}

/** base ← each checked partial, left to right. */
export function mergeConfig(base: RuntimeConfig, ...partials: Record<string, unknown>[]): RuntimeConfig {
  let out: unknown = base;
  for (const p of partials) out = mergeInto(out, p, SCHEMA);
  return out as RuntimeConfig;
}

/** defaults ← raw, validated. */
export function configFromRaw(raw: unknown, source: string): RuntimeConfig {
  return mergeConfig(defaultConfig(), checkConfigPartial(raw, source));
}

/** The actions a detector takes on a hit. */
export function actionsFor(cfg: RuntimeConfig, name: DetectorName): Action[] {
  return cfg.detector[name].on_trigger ?? cfg.actions.defaults.on_trigger;
}

/** Stable JSON (keys in schema order, 2-space indent): the config file as written back, and how a reload compares. */
export function configJson(cfg: RuntimeConfig): string {
  return JSON.stringify(cfg, null, 2);
}
