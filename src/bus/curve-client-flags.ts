// The CURVE flags of every command that connects to a coordinator as a client (`wavebus
// aggregate`, status queries): `--curve-dir DIR` with the names `wavebus launch --curve-dir` uses
// (coordinator.pub, agent.key), or the explicit --curve-server-key / --curve-key pair `wavebus
// agent` takes. One loader for both (curve.ts); errors name the flag and the file.
import { ConfigError } from '../errors';
import { loadClientKeys, loadCurveDirClient, type CurveClientKeys } from './curve';

export const CURVE_CLIENT_FLAGS = {
  'curve-dir': { type: 'string', describe: 'CURVE: a key directory as `wavebus launch --curve-dir` uses (coordinator.pub, agent.key; see docs/security.md)' },
  'curve-server-key': { type: 'string', describe: 'CURVE: the coordinator\'s public key file (its NAME.pub); needs --curve-key' },
  'curve-key': { type: 'string', describe: 'CURVE: this peer\'s key pair file (NAME.key from `wavebus keys`); its public key must be on the coordinator\'s allow-list' },
} as const;

const given = (v: unknown): v is string => typeof v === 'string' && v !== '';

/** The client keys the flags name, or undefined when none is given. */
export function curveClientKeysFromFlags(argv: Record<string, unknown>): CurveClientKeys | undefined {
  const dir = argv['curve-dir'];
  const serverKey = argv['curve-server-key'];
  const key = argv['curve-key'];
  if (given(dir)) {
    if (given(serverKey) || given(key)) throw new ConfigError('--curve-dir: give either --curve-dir or --curve-server-key with --curve-key, not both');
    return loadCurveDirClient(dir);
  }
  return loadClientKeys(given(serverKey) ? serverKey : undefined, given(key) ? key : undefined);
}
