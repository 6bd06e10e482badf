// The one parser for numeric flags and variables. Integers are plain decimal digits only: "1e3",
// "0x10", "1.0", "+5", "" and " " are refused (Number() would take several of them), and every
// error names the flag or variable, its bounds and the value as given.
import { ConfigError } from '../errors';

/** Longest timer Node keeps (setTimeout's limit, 2^31-1 ms); a larger delay fires at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;
export const MAX_PORT = 65535;
export const MIB = 2 ** 20;

/** The last value of a flag given more than once (yargs makes an array of them). */
export function lastOf(v: unknown): unknown {
  return Array.isArray(v) ? v[v.length - 1] : v;
}

/**
 * Where a setting comes from: the flag when given, else the environment variable when set (a blank
 * one counts as unset, as `VAR=` does in a shell), else nowhere (undefined: the default applies).
 * The name travels with the value, so the parser's error names whichever the user set.
 */
export function flagOrEnv(flagValue: unknown, flag: string, env: NodeJS.ProcessEnv, variable: string): Setting | undefined {
  return flagValue !== undefined ? { raw: lastOf(flagValue), from: flag } : envSetting(env, variable);
}

/** An environment variable's value when set and not blank, with its name. */
export function envSetting(env: NodeJS.ProcessEnv, variable: string): Setting | undefined {
  const v = env[variable];
  return isSet(v) ? { raw: v, from: variable } : undefined;
}

/** A variable counts as set when it holds more than blanks (`VAR=` in a shell unsets it). */
export function isSet(v: string | undefined): v is string {
  return v !== undefined && v.trim() !== '';
}

/** A value as given, and the flag or variable it came from. */
export interface Setting {
  raw: unknown;
  from: string;
}

/** A flag's text value, refused by name when empty (a path flag given "" would mean the cwd or nothing). */
export function nonEmpty(v: unknown, name: string): string {
  const s = String(lastOf(v) ?? '');
  if (s.trim() === '') throw new ConfigError(`${name}: expected a non-empty value`);
  return s;
}

/** The integer `raw` spells in plain decimal digits (surrounding blanks allowed), else undefined. */
export function strictInt(raw: unknown): number | undefined {
  if (typeof raw === 'number') return Number.isSafeInteger(raw) && raw >= 0 ? raw : undefined;
  const s = String(raw).trim();
  if (!/^\d+$/.test(s)) return undefined;
  const n = Number(s);
  return Number.isSafeInteger(n) ? n : undefined;
}

export interface IntFlagOptions {
  /** Error code of the ConfigError (default ERR_CONFIG); e.g. ERR_LAUNCH for `wavebus launch`. */
  code?: string;
}

/**
 * An integer flag in [min, max], quoted back with its bounds in the error when it is not one.
 * Every command's integer flags go through here (bounds included), not through parsers of their own.
 */
export function intFlag(raw: unknown, flag: string, min = 1, max = Number.MAX_SAFE_INTEGER, opts: IntFlagOptions = {}): number {
  const n = strictInt(raw);
  if (n === undefined || n < min || n > max) {
    const range = max === Number.MAX_SAFE_INTEGER ? `an integer >= ${min}` : `an integer in ${min}..${max}`;
    throw new ConfigError(`${flag}: expected ${range}, got ${JSON.stringify(raw)}`, opts.code);
  }
  return n;
}

/** A duration in milliseconds, at least `min`, at most what a Node timer keeps. */
export function msFlag(raw: unknown, flag: string, min = 1, max = MAX_TIMER_MS, opts: IntFlagOptions = {}): number {
  return intFlag(raw, flag, min, Math.min(max, MAX_TIMER_MS), opts);
}

/** A TCP port; 0 (let the system pick) only when `min` is 0. */
export function portFlag(raw: unknown, flag: string, min: 0 | 1 = 1, opts: IntFlagOptions = {}): number {
  return intFlag(raw, flag, min, MAX_PORT, opts);
}

/** A size given in whole MiB, returned in bytes. */
export function mibFlag(raw: unknown, flag: string, min = 1, maxMib = Math.floor(Number.MAX_SAFE_INTEGER / MIB), opts: IntFlagOptions = {}): number {
  return intFlag(raw, flag, min, maxMib, opts) * MIB;
}

/** A finite decimal number in [min, max] (exponents allowed: tolerances like 1e-5 are numbers, not counts). */
export function numberFlag(raw: unknown, flag: string, min: number, max = Infinity, opts: IntFlagOptions = {}): number {
  const s = String(raw).trim();
  const n = /^[+]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(s) ? Number(s) : NaN;
  if (!Number.isFinite(n) || n < min || n > max) {
    const range = max === Infinity ? `a number >= ${min}` : `a number in [${min}, ${max}]`;
    throw new ConfigError(`${flag}: expected ${range}, got ${JSON.stringify(raw)}`, opts.code);
  }
  return n;
}

// checkPathLength lives in paths.ts (the snapshot root checks its variables with it too).
export { checkPathLength } from '../paths';
