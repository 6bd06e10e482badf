// What this rank runs, sent once in the hello (Fingerprint in proto/wavebus.proto): versions, the
// device, and the environment variables that change numerics or communication. The same allow-list
// and secret rule hold in the Python client (wavebus_client/fingerprint.py) and again in the agent
// and the coordinator (guard/fingerprint.ts), which never trust what a client sent.
import { packageRoot } from '../paths';
import * as fs from 'fs';
import * as path from 'path';

/** Prefixes of the variables that change numerics or communication (docs/fingerprints.md). */
export const ENV_PREFIXES = ['NCCL_', 'CUDA_', 'TORCH_', 'VLLM_', 'CUBLAS_'] as const;
/** A name holding one of these words (any case) keeps its value to itself: only the name is sent. */
export const SECRET_WORDS = ['TOKEN', 'KEY', 'SECRET', 'PASSWORD'] as const;

export interface EnvEntry {
  name: string;
  value: string;
  redacted: boolean;
}

export function envAllowed(name: string): boolean {
  return ENV_PREFIXES.some((p) => name.startsWith(p));
}

export function looksSecret(name: string): boolean {
  const up = name.toUpperCase();
  return SECRET_WORDS.some((w) => up.includes(w));
}

/** The allow-listed variables of `env`, sorted by name; secret-looking ones without their value. */
export function fingerprintEnv(env: NodeJS.ProcessEnv): EnvEntry[] {
  return Object.keys(env)
    .filter(envAllowed)
    .sort()
    .map((name) => (looksSecret(name) ? { name, value: '', redacted: true } : { name, value: String(env[name] ?? ''), redacted: false }));
}

let version: string | undefined;
/** wavebus's version (package.json). */
export function wavebusVersion(): string {
  if (version === undefined) {
    try {
      version = String((JSON.parse(fs.readFileSync(path.join(packageRoot(), 'package.json'), 'utf8')) as { version?: string }).version ?? '');
    } catch {
      version = '';
    }
  }
  return version;
}

/** This process's fingerprint as ClientHello.fingerprint carries it (the agent adds weight checksums). */
export function clientFingerprint(opts: { engineVersion?: string; deviceName?: string; env?: NodeJS.ProcessEnv } = {}): Record<string, unknown> {
  return {
    wavebusVersion: wavebusVersion(),
    language: 'typescript',
    runtimeVersion: `node ${process.versions.node}`,
    engineVersion: opts.engineVersion ?? '',
    deviceName: opts.deviceName ?? 'cpu',
    env: fingerprintEnv(opts.env ?? process.env),
  };
}
