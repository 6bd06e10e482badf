// runtime_config.json: the schema, its defaults, validation and merging.
// Effective config: at startup defaults ← overlay (startup.ts), on reload defaults ← file. Unknown keys anywhere are errors naming the
// dotted path; wrong types and out-of-range values name the path and what was expected.
import { PP_STAGES, type PpStages } from '../layout';
import { DEFAULT_TENSOR_FORMAT, TENSOR_FORMATS, type TensorFormat } from '../artifacts/tensor-format';
import { ConfigError } from '../errors';

export type Action = 'report' | 'dump_kv';
export type DumpScope = 'request' | 'all_requests';
export type DumpFormat = TensorFormat;

export interface DetectorCommon {
  enabled: boolean;
  /** Absent: actions.defaults.on_trigger applies. */
  on_trigger?: Action[];
  dump_kv?: { scope: DumpScope };
}

export interface TokenRepeatConfig extends DetectorCommon {
  window: number;
  repeat_sum_threshold: number;
  min_tokens: number;
  consecutive_hits: number;
  ignore_token_ids: number[];
}

export interface LogitsFiniteConfig extends DetectorCommon {
  /** Client side: check before sampling and block on the result (else the check overlaps sampling). */
  item_sync: boolean;
}

export interface SpecAcceptanceConfig extends DetectorCommon {
  window: number;
  low_accept_rate: number;
  low_accept_len: number;
  high_accept_rate: number;
  high_accept_len: number;
}

export interface GarbledConfig extends DetectorCommon {
  window: number;
  min_tokens: number;
  surprise_logprob: number;
  surprise_rank: number;
  surprise_fraction: number;
  mean_surprisal_bits: number;
}

export interface RuntimeConfig {
  detector: {
    token_repeat: TokenRepeatConfig;
    logits_finite: LogitsFiniteConfig;
    spec_acceptance: SpecAcceptanceConfig;
    garbled: GarbledConfig;
  };
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
    save_sensitive_info: boolean;
  };
}

export type DetectorName = keyof RuntimeConfig['detector'];
export const DETECTOR_NAMES: readonly DetectorName[] = ['token_repeat', 'logits_finite', 'spec_acceptance', 'garbled'];

// ---------------------------------------------------------------- schema

type Field =
  | { kind: 'bool'; def: boolean }
  | { kind: 'int'; def: number; min: number; max?: number }
  | { kind: 'number'; def: number; min?: number; max?: number; exclusiveMin?: boolean }
  | { kind: 'enum'; def: string; values: readonly string[] }
  | { kind: 'string'; optional: true }
  | { kind: 'int_list'; def: number[]; min: number }
  | { kind: 'enum_list'; def?: string[]; values: readonly string[]; optional?: boolean }
  | { kind: 'object'; fields: Record<string, Field>; optional?: boolean };

const bool = (def: boolean): Field => ({ kind: 'bool', def });
const int = (def: number, min: number, max?: number): Field => ({ kind: 'int', def, min, max });
const num = (def: number, min?: number, max?: number): Field => ({ kind: 'number', def, min, max });
const ACTIONS = ['report', 'dump_kv'] as const;
const U32 = 0xffffffff;

function detector(params: Record<string, Field>): Field {
  return {
    kind: 'object',
    fields: {
      enabled: bool(false),
      on_trigger: { kind: 'enum_list', values: ACTIONS, optional: true },
      dump_kv: { kind: 'object', optional: true, fields: { scope: { kind: 'enum', def: 'request', values: ['request', 'all_requests'] } } },
      ...params,
    },
  };
}

export const SCHEMA: Field = {
  kind: 'object',
  fields: {
    detector: {
      kind: 'object',
      fields: {
        token_repeat: detector({
          window: int(32, 1, 65536),
          repeat_sum_threshold: int(64, 0),
          min_tokens: int(32, 0),
          consecutive_hits: int(1, 1),
          ignore_token_ids: { kind: 'int_list', def: [], min: 0 },
        }),
        logits_finite: detector({ item_sync: bool(false) }),
        spec_acceptance: detector({
          window: int(10, 1, 65536),
          low_accept_rate: num(0.3, 0, 1),
          low_accept_len: num(1.4, 0),
          high_accept_rate: num(0.96, 0, 1),
          high_accept_len: num(2.8, 0),
        }),
        garbled: detector({
          window: int(32, 1, 65536),
          min_tokens: int(32, 0),
          surprise_logprob: num(-5, undefined, 0),
          surprise_rank: int(50, 1),
          surprise_fraction: num(0.5, 0, 1),
          mean_surprisal_bits: num(4, 0),
        }),
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
        save_sensitive_info: bool(false),
      },
    },
  },
};

// ---------------------------------------------------------------- validation

const isPlainObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);
const show = (v: unknown) => (typeof v === 'string' ? JSON.stringify(v) : Array.isArray(v) ? 'an array' : v === null ? 'null' : typeof v === 'object' ? 'an object' : String(v));

function expected(f: Field): string {
  switch (f.kind) {
    case 'bool':
      return 'a boolean';
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
