// Faults the simulated engine can inject, from a JSON config. Each names the request or rank it
// hits and the step it starts at, so a test knows exactly which incident to expect.
import * as fs from 'fs';
import { ConfigError } from '../errors';

export interface SimFaults {
  /** Request index that falls into a token repetition loop from step `from`. */
  repetition?: { request: number; from: number; period?: number };
  /** Request index whose logits row turns non-finite at step `at`. */
  nonFinite?: { request: number; at: number; kind?: 'nan' | 'pos_inf' | 'neg_inf' };
  /** Request index whose sampled tokens become improbable (garbled) from step `from`. */
  garbled?: { request: number; from: number };
  /** Request index whose speculative acceptance collapses from step `from`. */
  specDrift?: { request: number; from: number };
  /** Global rank that exits (code 1) at step `at`. */
  rankDies?: { rank: number; at: number };
  /** Global rank whose engine raises an uncaught exception at step `at`, after that forward's beforeForward (the recorder's note). */
  uncaught?: { rank: number; at: number };
  /** Global rank that is `extraMs` slower per step. */
  slowRank?: { rank: number; extraMs: number };
  /** From step `from` the engine frees finished requests' blocks without asking pendingDump (a non-deferring engine). */
  eagerFree?: { from: number };
  /** Global rank whose first weight shard has one byte flipped (with --weights): a corrupted load the fingerprint diff names. */
  weightFlip?: { rank: number };
}

const KEYS: Record<string, string[]> = {
  repetition: ['request', 'from', 'period'],
  nonFinite: ['request', 'at', 'kind'],
  garbled: ['request', 'from'],
  specDrift: ['request', 'from'],
  rankDies: ['rank', 'at'],
  uncaught: ['rank', 'at'],
  slowRank: ['rank', 'extraMs'],
  eagerFree: ['from'],
  weightFlip: ['rank'],
};

/** Parse `--faults` (inline JSON or a file path); unknown keys and bad values name the field. */
export function parseFaults(spec: string | undefined, where = '--faults'): SimFaults {
  if (!spec) return {};
  let text = spec;
  if (!spec.trim().startsWith('{')) {
    try {
      text = fs.readFileSync(spec, 'utf8');
    } catch (e) {
      throw new ConfigError(`${where}: cannot read '${spec}': ${(e as Error).message}`);
    }
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new ConfigError(`${where}: not valid JSON: ${(e as Error).message}`);
  }
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) throw new ConfigError(`${where}: must be a JSON object`);
  for (const [k, v] of Object.entries(doc as Record<string, unknown>)) {
    const allowed = KEYS[k];
    if (!allowed) throw new ConfigError(`${where}: unknown fault '${k}' (known: ${Object.keys(KEYS).join(', ')})`);
    if (v === null || typeof v !== 'object') throw new ConfigError(`${where}.${k}: must be an object`);
    for (const [f, x] of Object.entries(v as Record<string, unknown>)) {
      if (!allowed.includes(f)) throw new ConfigError(`${where}.${k}.${f}: unknown field (known: ${allowed.join(', ')})`);
      if (f === 'kind') {
        if (!['nan', 'pos_inf', 'neg_inf'].includes(String(x))) throw new ConfigError(`${where}.${k}.kind: must be nan, pos_inf or neg_inf`);
      } else if (typeof x !== 'number' || !Number.isInteger(x) || x < 0) {
        throw new ConfigError(`${where}.${k}.${f}: must be a non-negative integer, got ${JSON.stringify(x)}`);
      }
    }
  }
  return doc as SimFaults;
}

/** The faults `wavebus demo` injects by default: one of each detector's incidents. */
export const DEMO_FAULTS: SimFaults = {
  repetition: { request: 1, from: 8, period: 3 },
  nonFinite: { request: 2, at: 12, kind: 'nan' },
  garbled: { request: 3, from: 10 },
  specDrift: { request: 4, from: 6 },
};
