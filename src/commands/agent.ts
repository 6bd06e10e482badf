// `wavebus agent`: one per rank. Last-PP ranks join the wave bus; other ranks follow the config
// file. Thin on purpose: flags → identity → Agent (src/agent.ts).
import type { CommandModule } from 'yargs';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { Agent } from '../agent';
import { DEFAULT_BUS_PORT, DEFAULT_HEARTBEAT_MS } from '../bus/coordinator';
import { loadClientKeys, type CurveClientKeys } from '../bus/curve';
import { checkHost, parseBusPort, parseHostPort, type HostPort } from '../bus/endpoints';
import { identityFlagsFromArgv, identityOptions, resolveIdentity, type RankIdentity } from '../identity';
import { createLogger, type Logger } from '../log';
import { resolveSnapshotConfig, snapshotFlagsFromArgv, snapshotOptions } from '../snapshot/config';
import { checkRunDirFits } from '../paths';
import { MAX_TIMER_MS, positiveInt, waitForSignal } from './coordinator';

/** --coordinator, else $WAVEBUS_COORDINATOR, else <master addr>:<$WAVEBUS_PORT or 29600>. */
export function coordinatorAddress(raw: unknown, env: NodeJS.ProcessEnv, identity: RankIdentity): HostPort {
  if (raw !== undefined && raw !== '') return parseHostPort(String(raw), '--coordinator');
  if (env.WAVEBUS_COORDINATOR) return parseHostPort(env.WAVEBUS_COORDINATOR, 'WAVEBUS_COORDINATOR');
  const port = env.WAVEBUS_PORT ? parseBusPort(env.WAVEBUS_PORT, 'WAVEBUS_PORT') : DEFAULT_BUS_PORT;
  checkHost(identity.masterAddr, 'MASTER_ADDR (the coordinator host when neither --coordinator nor WAVEBUS_COORDINATOR is set)');
  return { host: identity.masterAddr, port };
}

export interface AgentSetup {
  identity: RankIdentity;
  coordinator: HostPort;
  heartbeatMs: number;
  runDir: string;
  /** The run dir was made up here (no --run-dir / WAVEBUS_RUN_DIR) and is removed at exit. */
  ownRunDir: boolean;
  endOfWaveTimeoutMs: number;
  stagingBytes: number;
  /** CURVE client keys (--curve-server-key + --curve-key), when the coordinator uses CURVE. */
  curve?: CurveClientKeys;
  log: Logger;
}

/** Everything `wavebus agent` builds from its flags and environment; throws ConfigError naming the flag. */
export function setupAgent(argv: Record<string, unknown>, env: NodeJS.ProcessEnv): AgentSetup {
  const identity = resolveIdentity(env, identityFlagsFromArgv(argv));
  const coordinator = coordinatorAddress(argv.coordinator, env, identity);
  const heartbeatMs = positiveInt(argv['heartbeat-ms'], '--heartbeat-ms', 1, MAX_TIMER_MS);
  const endOfWaveTimeoutMs = positiveInt(argv['end-of-wave-timeout-ms'], '--end-of-wave-timeout-ms', 1, MAX_TIMER_MS);
  const stagingBytes = positiveInt(argv['staging-mb'], '--staging-mb') * 2 ** 20;
  const given = (argv['run-dir'] as string | undefined) || env.WAVEBUS_RUN_DIR || '';
  const runDir = given || path.join(os.tmpdir(), `wavebus-agent-rank${identity.globalRank}-${process.pid}`);
  checkRunDirFits(runDir, identity.localRank, argv['run-dir'] ? '--run-dir' : env.WAVEBUS_RUN_DIR ? 'WAVEBUS_RUN_DIR' : 'the default run dir');
  const curve = loadClientKeys(argv['curve-server-key'] as string | undefined, argv['curve-key'] as string | undefined);
  const log = createLogger(`wavebus-agent-rank${identity.globalRank}`);
  return { identity, coordinator, heartbeatMs, runDir, ownRunDir: !given, endOfWaveTimeoutMs, stagingBytes, curve, log };
}

export const command: CommandModule = {
  command: 'agent',
  describe: 'Run the per-rank agent; last-PP ranks join the wave bus',
  builder: (y) => {
    for (const [f, o] of Object.entries(identityOptions)) y.option(f, o);
    for (const [f, o] of Object.entries(snapshotOptions)) y.option(f, o);
    return y
      .option('coordinator', { type: 'string', describe: `HOST:PORT of the coordinator (default $WAVEBUS_COORDINATOR, else $MASTER_ADDR:\${WAVEBUS_PORT:-${DEFAULT_BUS_PORT}})` })
      .option('heartbeat-ms', { type: 'string', default: String(DEFAULT_HEARTBEAT_MS), describe: 'heartbeat period; a coordinator silent for 3 periods is lost' })
      .option('run-dir', { type: 'string', describe: 'directory for the engine-client socket and mailbox (default $WAVEBUS_RUN_DIR)' })
      .option('end-of-wave-timeout-ms', { type: 'string', default: '50', describe: 'longest an engine waits at end_of_wave for a wave vector that has not arrived' })
      .option('staging-mb', { type: 'string', default: '1024', describe: 'host staging bound for KV dump copies' })
      .option('curve-server-key', { type: 'string', describe: 'CURVE: the coordinator\'s public key file (its NAME.pub); needs --curve-key' })
      .option('curve-key', { type: 'string', describe: 'CURVE: this agent\'s key pair file (NAME.key from `wavebus keys`); its public key must be on the coordinator\'s allow-list' });
  },
  handler: async (argv) => {
    const a = setupAgent(argv as Record<string, unknown>, process.env);
    const { identity, log } = a;
    const snapshot = resolveSnapshotConfig(process.env, snapshotFlagsFromArgv(argv as Record<string, unknown>), (m: string) => log.warn(m));
    const agent = new Agent({
      identity,
      runDir: a.runDir,
      coordinator: a.coordinator,
      heartbeatMs: a.heartbeatMs,
      endOfWaveTimeoutMs: a.endOfWaveTimeoutMs,
      stagingBytes: a.stagingBytes,
      curve: a.curve,
      snapshot,
      serveRoots: { snapshots: path.join(snapshot.cacheRoot, 'snapshots') },
      logger: log,
    });
    const signal = waitForSignal();
    await agent.start();
    log.info({ rank: identity.globalRank, lastPp: identity.isLastPp, runDir: a.runDir, snapshots: snapshot.enabled }, 'agent started');
    log.info({ signal: await signal }, 'stopping');
    await agent.stop();
    if (a.ownRunDir) fs.rmSync(a.runDir, { recursive: true, force: true });
    process.exit(0);
  },
};
