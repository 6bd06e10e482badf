// The building blocks of the runtime config's schema (config.ts): field kinds with their defaults
// and bounds, and the fields every detector shares. Its own file so that each detector's file can
// declare its parameters (detectors/registry.ts) without importing config.ts, which imports them.
export type Action = 'report' | 'dump_kv';
export type DumpScope = 'request' | 'all_requests';

export const ACTIONS = ['report', 'dump_kv'] as const;

export interface DetectorCommon {
  enabled: boolean;
  /** Absent: actions.defaults.on_trigger applies. */
  on_trigger?: Action[];
  dump_kv?: { scope: DumpScope };
}

export type Field =
  | { kind: 'bool'; def: boolean }
  /** A boolean, or one of a few named settings (report.save_sensitive_info: "hashed"). */
  | { kind: 'bool_or'; def: boolean; values: readonly string[] }
  | { kind: 'int'; def: number; min: number; max?: number }
  | { kind: 'number'; def: number; min?: number; max?: number; exclusiveMin?: boolean }
  | { kind: 'enum'; def: string; values: readonly string[] }
  | { kind: 'string'; optional: true }
  | { kind: 'int_list'; def: number[]; min: number }
  | { kind: 'enum_list'; def?: string[]; values: readonly string[]; optional?: boolean }
  | { kind: 'object'; fields: Record<string, Field>; optional?: boolean };

export const bool = (def: boolean): Field => ({ kind: 'bool', def });
export const int = (def: number, min: number, max?: number): Field => ({ kind: 'int', def, min, max });
export const num = (def: number, min?: number, max?: number): Field => ({ kind: 'number', def, min, max });

/** A detector's schema node: the shared fields (off by default), then its own parameters. */
export function detectorFields(params: Record<string, Field>): Field {
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
