// `wavebus agent`: one per rank. Every agent joins the wave bus; what it acts on there depends on
// its pipeline stage (src/agent/bus-role.ts). Thin on purpose: flags → identity → Agent (src/agent/agent.ts).
import type { CommandModule } from 'yargs';
import * as os from 'os';
import * as path from 'path';
import { Agent } from '../agent/agent';
import { artifactModeOption, parseArtifactMode, type ArtifactModes } from '../artifacts/artifact-mode';
import { DEFAULT_BUS_PORT, DEFAULT_HEARTBEAT_MS } from '../bus/constants';
import { loadClientKeys, type CurveClientKeys } from '../bus/curve';
import { loadBusToken, type BusToken } from '../bus/auth';
import { TokenHasher } from '../guard/token-hash';
import { parseStartupOptions } from '../guard/startup';
import { checkHost, parseBusPort, parseHostPort, type HostPort } from '../bus/endpoints';
import { identityFlagsFromArgv, identityOptions, resolveIdentity } from '../launch/identity';
import type { RankIdentity } from '../layout';
import { ConfigError } from '../errors';
import { createLogger, type Logger } from '../log';
import { claimRunDir, makeRunDir, releaseRunDir } from '../launch/run-dir';
import { recorderSettingsFromEnv } from '../agent/flight-recorder';
import { resolveSnapshotConfig, snapshotFlagsFromArgv, snapshotOptions } from '../snapshot/config';
import { checkRunDirFits } from '../paths';
import { waitForSignal } from './coordinator';
import { checkPathLength, envSetting, flagOrEnv, mibFlag, msFlag } from './flags';
import { DIRECT_FILES_FLAGS, directFilesSetup, type DirectFilesSetup } from './direct-files-flags';
import { DEFAULT_CUDA_STAGING_BYTES } from '../memory';
import { checkLocalRoots } from '../agent/roots';

/** --cuda-staging-mb's ceiling: 1 GiB of pinned (locked) host memory per CUDA region. */
export const MAX_CUDA_STAGING_MB = 1024;

/** --coordinator, else $WAVEBUS_COORDINATOR, else <master addr>:<$WAVEBUS_PORT or 29600>. */
export function coordinatorAddress(raw: unknown, env: NodeJS.ProcessEnv, identity: RankIdentity): HostPort {
  const given = flagOrEnv(raw, '--coordinator', env, 'WAVEBUS_COORDINATOR');
  if (given) return parseHostPort(String(given.raw), given.from);
  const portFrom = envSetting(env, 'WAVEBUS_PORT');
  const port = portFrom ? parseBusPort(portFrom.raw, portFrom.from) : DEFAULT_BUS_PORT;
  checkHost(identity.masterAddr, 'MASTER_ADDR (the coordinator host when neither --coordinator nor WAVEBUS_COORDINATOR is set)');
  return { host: identity.masterAddr, port };
}

export interface AgentSetup {
  identity: RankIdentity;
  coordinator: HostPort;
  heartbeatMs: number;
  /** --run-dir, else $WAVEBUS_RUN_DIR, else '' (a fresh private one is made at start). */
  runDir: string;
  /** Which of the two named runDir, for errors. */
  runDirFlag: string;
  endOfWaveTimeoutMs: number;
  stagingBytes: number;
  /** --cuda-staging-mb: each CUDA region's pinned bounce chunk (AgentOptions.cudaStagingBytes). */
  cudaStagingBytes: number;
  /** CURVE client keys (--curve-server-key + --curve-key), when the coordinator uses CURVE. */
  curve?: CurveClientKeys;
  /** The files of `curve` (verdict.auto's CLI loads them). */
  curveFiles?: { serverKey: string; key: string };
  /** --bus-token-file / WAVEBUS_BUS_TOKEN_FILE: the launcher's token (the coordinator must hold the same). */
  busToken?: BusToken;
  /** --token-hash-key-file / WAVEBUS_TOKEN_HASH_KEY_FILE: the recorder's key for save_sensitive_info "hashed". */
  tokenHasher?: TokenHasher;
  /** --verdict-arg (verdict.auto). */
  verdictArgs: string[];
  /** --dump-root / WAVEBUS_DUMP_ROOT: the only place this agent writes or serves KV dumps. */
  dumpRoot: string;
  /** --artifact-mode: KV dumps and input snapshots. */
  artifactModes: ArtifactModes;
  /** --direct-files, --direct-files-host, --direct-files-port (docs/aggregate.md). */
  directFiles: DirectFilesSetup;
  log: Logger;
}


/**
 * --dump-root, else $WAVEBUS_DUMP_ROOT, else the coordinator's own default for this working
 * directory (<cwd>/runtime/report/kv_cache), so a coordinator and agents started side by side agree.
 */
export function localDumpRoot(raw: unknown, env: NodeJS.ProcessEnv, cwd: string): string {
  const pick = (v: string, flag: string): string => {
    if (v.includes('\0')) throw new ConfigError(`${flag}: the path contains NUL`);
    const resolved = path.resolve(cwd, v);
    checkPathLength(resolved, flag); // the agent opens it component by component: ENAMETOOLONG otherwise
    return resolved;
  };
  if (raw !== undefined && raw !== '') return pick(String(raw), '--dump-root');
  if (env.WAVEBUS_DUMP_ROOT) return pick(env.WAVEBUS_DUMP_ROOT, 'WAVEBUS_DUMP_ROOT');
  return parseStartupOptions(undefined, {}, cwd).dumpDir;
}

/** Everything `wavebus agent` builds from its flags and environment; throws ConfigError naming the flag. */
export function setupAgent(argv: Record<string, unknown>, env: NodeJS.ProcessEnv): AgentSetup {
  const identity = resolveIdentity(env, identityFlagsFromArgv(argv));
  const coordinator = coordinatorAddress(argv.coordinator, env, identity);
  const heartbeatMs = msFlag(argv['heartbeat-ms'], '--heartbeat-ms');
  const endOfWaveTimeoutMs = msFlag(argv['end-of-wave-timeout-ms'], '--end-of-wave-timeout-ms');
  const stagingBytes = mibFlag(argv['staging-mb'], '--staging-mb');
  // Pinned memory is locked RAM, one chunk per CUDA region: bounded so a typo cannot pin the host.
  const cudaStagingBytes = mibFlag(argv['cuda-staging-mb'] ?? DEFAULT_CUDA_STAGING_BYTES / 2 ** 20, '--cuda-staging-mb', 1, MAX_CUDA_STAGING_MB);
  const flagDir = argv['run-dir'] as string | undefined;
  const given = flagDir || env.WAVEBUS_RUN_DIR || '';
  const runDirFlag = flagDir ? '--run-dir' : 'WAVEBUS_RUN_DIR';
  if (given) checkRunDirFits(given, identity.localRank, runDirFlag);
  const curve = loadClientKeys(argv['curve-server-key'] as string | undefined, argv['curve-key'] as string | undefined);
  // Their paths too: verdict.auto's CLI loads the same files (auto-verdict.ts).
  const curveFiles = curve ? { serverKey: String(argv['curve-server-key']), key: String(argv['curve-key']) } : undefined;
  const busToken = loadBusToken(argv['bus-token-file'], env, argv['bus-token-fd']);
  const keyFlag = argv['token-hash-key-file'];
  const tokenHasher = keyFlag || env.WAVEBUS_TOKEN_HASH_KEY_FILE ? TokenHasher.fromFlags(keyFlag, env) : undefined;
  const dumpRoot = localDumpRoot(argv['dump-root'], env, process.cwd());
  const log = createLogger(`wavebus-agent-rank${identity.globalRank}`);
  const artifactModes = parseArtifactMode(argv['artifact-mode'], '--artifact-mode');
  const directFiles = directFilesSetup(argv, env, identity.localRank);
  const verdictArgs = argv['verdict-arg'] === undefined ? [] : ([] as unknown[]).concat(argv['verdict-arg']).map(String);
  return { identity, coordinator, heartbeatMs, runDir: given, runDirFlag, endOfWaveTimeoutMs, stagingBytes, cudaStagingBytes, curve, curveFiles, busToken, tokenHasher, verdictArgs, dumpRoot, artifactModes, directFiles, log };
}

export const command: CommandModule = {
  command: 'agent',
  describe: 'Run the per-rank agent; every agent joins the wave bus (other PP stages than the last take KV dumps only with dump.pp_stages "all")',
  builder: (y) => {
    y.epilog(
      'Every agent joins the coordinator\'s wave bus. The last PP stage\'s ranks take the wave vector every step while the bus is active (hot reload, a detector or a manual dump on) and copy KV dumps; ' +
        'bus readiness waits for them. Ranks of the other stages follow the config lane (applied at its wave) and copy KV dumps only ' +
        'while dump.pp_stages is "all"; their engine reads the wave vector only then or while a config is due. The startup log says which (docs/bus.md).',
    );
    for (const [f, o] of Object.entries(identityOptions)) y.option(f, o);
    for (const [f, o] of Object.entries(snapshotOptions)) y.option(f, o);
    return y
      .option('coordinator', { type: 'string', describe: `HOST:PORT of the coordinator (default $WAVEBUS_COORDINATOR, else $MASTER_ADDR:\${WAVEBUS_PORT:-${DEFAULT_BUS_PORT}})` })
      .option('heartbeat-ms', { type: 'string', default: String(DEFAULT_HEARTBEAT_MS), describe: 'heartbeat period; a coordinator silent for 3 periods is lost' })
      .option('run-dir', { type: 'string', describe: 'directory for the engine-client socket and mailbox (default $WAVEBUS_RUN_DIR, else a fresh private one): created 0700, or an existing one of yours with mode 0700' })
      .option('end-of-wave-timeout-ms', { type: 'string', default: '50', describe: 'longest an engine waits at end_of_wave for a wave vector that has not arrived' })
      .option('artifact-mode', artifactModeOption)
      .option('staging-mb', { type: 'string', default: '1024', describe: 'host staging bound for KV dump copies' })
      .option('cuda-staging-mb', { type: 'string', default: String(DEFAULT_CUDA_STAGING_BYTES / 2 ** 20), describe: `pinned bounce chunk per CUDA region, in MiB (1..${MAX_CUDA_STAGING_MB}); allocated on a region's first copy` })
      .option('curve-server-key', { type: 'string', describe: 'CURVE: the coordinator\'s public key file (its NAME.pub); needs --curve-key' })
      .option('dump-root', { type: 'string', describe: 'the only directory this agent writes and serves KV dumps under; a dump_dir from the bus must be it or below it (default $WAVEBUS_DUMP_ROOT, else <cwd>/runtime/report/kv_cache)' })
      .option('bus-token-fd', { type: 'string', describe: 'read the bus token from this descriptor (how `wavebus launch` hands it to its agents; takes the place of --bus-token-file)' })
      .option('bus-token-file', { type: 'string', describe: 'the launcher\'s bus token file (0600): coordinator messages without its MAC are dropped (default $WAVEBUS_BUS_TOKEN_FILE)' })
      .option('verdict-arg', { type: 'string', array: true, nargs: 1, describe: 'verdict.auto: an argument for `wavebus verdict` on this replica\'s incident flushes, repeatable, written with = (--verdict-arg=--engine-out=DIR)' })
      .option('token-hash-key-file', { type: 'string', describe: 'report.save_sensitive_info "hashed": the key (0600, 64 hex digits; the coordinator\'s) the flight recorder hashes token ids with (default $WAVEBUS_TOKEN_HASH_KEY_FILE, else a key of this agent only)' })
      .options(DIRECT_FILES_FLAGS)
      .option('curve-key', { type: 'string', describe: 'CURVE: this agent\'s key pair file (NAME.key from `wavebus keys`); its public key must be on the coordinator\'s allow-list' });
  },
  handler: async (argv) => {
    const a = setupAgent(argv as Record<string, unknown>, process.env);
    const { identity, log } = a;
    const snapshot = resolveSnapshotConfig(process.env, snapshotFlagsFromArgv(argv as Record<string, unknown>), (m: string) => log.warn(m));
    checkLocalRoots({ dumps: a.dumpRoot, snapshots: snapshot.snapshotRoot }, snapshot.enabled);
    // A named run dir is created 0700 or must already be ours and 0700; without one, an
    // unpredictable private dir in tmpdir. Only a dir created here is removed at exit.
    const rd = a.runDir ? claimRunDir(a.runDir, a.runDirFlag) : makeRunDir(`wavebus-agent-rank${identity.globalRank}-`, os.tmpdir());
    // Every way out of this process but SIGKILL removes a dir made here (a failed start included).
    process.once('exit', () => releaseRunDir(rd));
    const agent = new Agent({
      identity,
      runDir: rd.path,
      coordinator: a.coordinator,
      heartbeatMs: a.heartbeatMs,
      endOfWaveTimeoutMs: a.endOfWaveTimeoutMs,
      stagingBytes: a.stagingBytes,
      cudaStagingBytes: a.cudaStagingBytes,
      curve: a.curve,
      curveFiles: a.curveFiles,
      busToken: a.busToken,
      tokenHasher: a.tokenHasher,
      artifactModes: a.artifactModes,
      directFiles: a.directFiles,
      snapshot,
      roots: { dumps: a.dumpRoot, snapshots: snapshot.snapshotRoot },
      recorder: recorderSettingsFromEnv(process.env),
      verdictArgs: a.verdictArgs,
      logger: log,
    });
    const signal = waitForSignal();
    await agent.start();
    log.info({ rank: identity.globalRank, lastPp: identity.isLastPp, runDir: rd.path, snapshots: snapshot.enabled, dumpRoot: a.dumpRoot, busToken: a.busToken !== undefined, ...(snapshot.enabled ? { snapshotRoot: snapshot.snapshotRoot, snapshotRootFrom: snapshot.rootSource } : {}) }, 'agent started');
    log.info({ signal: await signal }, 'stopping');
    await agent.stop();
    process.exit(0);
  },
};
