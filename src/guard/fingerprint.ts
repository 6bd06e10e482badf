// A rank's fingerprint as the agent and the coordinator keep it (proto Fingerprint, camelCase):
// whatever came over a socket is cut to local limits, env names outside the allow-list dropped and
// secret-looking values redacted again, so a client of another build cannot smuggle more in.
import { envAllowed, looksSecret } from '../client/fingerprint';

export interface EnvEntry {
  name: string;
  value: string;
  redacted: boolean;
}

export interface WeightChecksum {
  name: string;
  checksum: string;
  bytes: number;
  dtype: string;
}

export interface Fingerprint {
  wavebusVersion: string;
  language: string;
  runtimeVersion: string;
  torchVersion: string;
  cudaRuntimeVersion: string;
  cudaDriverVersion: string;
  engineVersion: string;
  deviceName: string;
  env: EnvEntry[];
  weights: WeightChecksum[];
}

/** The scalar fields every rank of a job should agree on, as the diff names them. */
export const VERSION_FIELDS = [
  ['wavebusVersion', 'wavebus_version'],
  ['language', 'language'],
  ['runtimeVersion', 'runtime_version'],
  ['torchVersion', 'torch_version'],
  ['cudaRuntimeVersion', 'cuda_runtime_version'],
  ['cudaDriverVersion', 'cuda_driver_version'],
  ['engineVersion', 'engine_version'],
  ['deviceName', 'device_name'],
] as const;

export const LIMITS = { text: 256, envValue: 1024, env: 512, weights: 16384, weightName: 512 } as const;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
const CHECKSUM = /^crc32c:[0-9a-f]{8}$/;

function text(v: unknown, max: number): string {
  return typeof v === 'string' ? v.slice(0, max) : '';
}

/** A clean fingerprint from anything (a decoded message, garbage): never throws. */
export function sanitizeFingerprint(raw: unknown): Fingerprint {
  const o = (raw && typeof raw === 'object' ? raw : {}) as Record<string, unknown>;
  const fp = {} as Fingerprint;
  for (const [k] of VERSION_FIELDS) (fp as unknown as Record<string, string>)[k] = text(o[k], LIMITS.text);
  const env = new Map<string, EnvEntry>();
  for (const e of Array.isArray(o.env) ? o.env.slice(0, LIMITS.env) : []) {
    const name = text((e as Record<string, unknown>)?.name, 128);
    if (!ENV_NAME.test(name) || !envAllowed(name)) continue;
    const secret = looksSecret(name) || Boolean((e as Record<string, unknown>).redacted);
    env.set(name, { name, value: secret ? '' : text((e as Record<string, unknown>).value, LIMITS.envValue), redacted: secret });
  }
  fp.env = [...env.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  fp.weights = sanitizeWeights(o.weights);
  return fp;
}

export function sanitizeWeights(raw: unknown): WeightChecksum[] {
  const out = new Map<string, WeightChecksum>();
  for (const w of Array.isArray(raw) ? raw.slice(0, LIMITS.weights) : []) {
    const r = (w ?? {}) as Record<string, unknown>;
    const name = text(r.name, LIMITS.weightName);
    const checksum = text(r.checksum, 32);
    if (!name || !CHECKSUM.test(checksum)) continue;
    const bytes = Number(r.bytes ?? 0);
    out.set(name, { name, checksum, bytes: Number.isSafeInteger(bytes) && bytes >= 0 ? bytes : 0, dtype: text(r.dtype, 32) });
  }
  return [...out.values()];
}
