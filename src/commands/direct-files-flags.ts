// The flags of direct file serving (src/agent/direct-files.ts, docs/aggregate.md), shared by
// `wavebus agent` and `wavebus launch` (which passes them to every agent).
import { ConfigError } from '../errors';
import { checkHost } from '../bus/endpoints';
import { MAX_PORT, portFlag } from './flags';

export interface DirectFilesSetup {
  enabled: boolean;
  host?: string;
  port?: number;
}

export const DIRECT_FILES_FLAGS = {
  'direct-files': { type: 'string', describe: 'with CURVE: serve this rank\'s files to `wavebus aggregate` on a CURVE socket of its own, admitting the coordinator\'s allow-list (on|off; default $WAVEBUS_DIRECT_FILES, else on; off: through the coordinator only)' },
  'direct-files-host': { type: 'string', describe: 'address of that socket (default $WAVEBUS_DIRECT_FILES_HOST, else this host\'s address toward the coordinator)' },
  'direct-files-port': { type: 'string', describe: 'its port: local rank L listens on PORT + L (default $WAVEBUS_DIRECT_FILES_PORT, else an ephemeral port)' },
} as const;

/**
 * Direct file serving (with CURVE): --direct-files / WAVEBUS_DIRECT_FILES (on unless "0", "off",
 * "false"), --direct-files-host / WAVEBUS_DIRECT_FILES_HOST (default: this host's address toward
 * the coordinator), --direct-files-port / WAVEBUS_DIRECT_FILES_PORT (a base: local rank L binds
 * PORT + L; default an ephemeral port).
 */
export function directFilesSetup(argv: Record<string, unknown>, env: NodeJS.ProcessEnv, localRank: number): DirectFilesSetup {
  const onOff = (raw: unknown, flag: string): boolean => {
    if (typeof raw === 'boolean') return raw;
    const v = String(raw).trim().toLowerCase();
    if (['1', 'on', 'true', 'yes'].includes(v)) return true;
    if (['0', 'off', 'false', 'no'].includes(v)) return false;
    throw new ConfigError(`${flag}: expected on or off, got ${JSON.stringify(raw)}`);
  };
  const pick = (flag: string, name: string): [unknown, string] | undefined => {
    const v = argv[flag];
    if (v !== undefined && v !== '') return [v, `--${flag}`];
    if (env[name] !== undefined && env[name] !== '') return [env[name], name];
    return undefined;
  };
  const en = pick('direct-files', 'WAVEBUS_DIRECT_FILES');
  const host = pick('direct-files-host', 'WAVEBUS_DIRECT_FILES_HOST');
  const port = pick('direct-files-port', 'WAVEBUS_DIRECT_FILES_PORT');
  if (host) checkHost(String(host[0]), host[1]);
  const base = port ? portFlag(port[0], port[1], 1) : undefined;
  if (base !== undefined && base + localRank > MAX_PORT) throw new ConfigError(`${port![1]}: ${base} + local rank ${localRank} is over ${MAX_PORT}`);
  return {
    enabled: en ? onOff(en[0], en[1]) : true,
    ...(host ? { host: String(host[0]) } : {}),
    ...(base !== undefined ? { port: base + localRank } : {}),
  };
}
