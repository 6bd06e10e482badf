// `wavebus agent`: one per rank. Last-PP ranks join the wave bus; other ranks follow the config
// file (later features hang off the same process). Thin on purpose: flags → identity → AgentBus.
import type { CommandModule } from 'yargs';
import { AgentBus, type SnapshotReplyMsg, type WaveEvent } from '../bus/agent-bus';
import { DEFAULT_BUS_PORT, DEFAULT_HEARTBEAT_MS } from '../bus/coordinator';
import { parseBusPort, parseHostPort, type HostPort } from '../bus/endpoints';
import { identityFlagsFromArgv, identityOptions, resolveIdentity, type RankIdentity } from '../identity';
import { createLogger, type Logger } from '../log';
import { positiveInt, waitForSignal } from './coordinator';

/** --coordinator, else $WAVEBUS_COORDINATOR, else <master addr>:<$WAVEBUS_PORT or 29600>. */
export function coordinatorAddress(raw: unknown, env: NodeJS.ProcessEnv, identity: RankIdentity): HostPort {
  if (raw !== undefined && raw !== '') return parseHostPort(String(raw), '--coordinator');
  if (env.WAVEBUS_COORDINATOR) return parseHostPort(env.WAVEBUS_COORDINATOR, 'WAVEBUS_COORDINATOR');
  const port = env.WAVEBUS_PORT ? parseBusPort(env.WAVEBUS_PORT, 'WAVEBUS_PORT') : DEFAULT_BUS_PORT;
  return { host: identity.masterAddr, port };
}

export interface AgentSetup {
  identity: RankIdentity;
  coordinator: HostPort;
  heartbeatMs: number;
  runDir?: string;
  log: Logger;
  /** Present only on last-PP ranks. */
  bus?: AgentBus;
}

/** Everything `wavebus agent` builds from its flags and environment; throws ConfigError naming the flag. */
export function setupAgent(argv: Record<string, unknown>, env: NodeJS.ProcessEnv): AgentSetup {
  const identity = resolveIdentity(env, identityFlagsFromArgv(argv));
  const coordinator = coordinatorAddress(argv.coordinator, env, identity);
  const heartbeatMs = positiveInt(argv['heartbeat-ms'], '--heartbeat-ms');
  const runDir = (argv['run-dir'] as string | undefined) || env.WAVEBUS_RUN_DIR || undefined;
  const log = createLogger(`wavebus-agent-rank${identity.globalRank}`);
  const bus = identity.isLastPp ? new AgentBus({ coordinator, identity, heartbeatMs, logger: log }) : undefined;
  return { identity, coordinator, heartbeatMs, runDir, log, bus };
}

export const command: CommandModule = {
  command: 'agent',
  describe: 'Run the per-rank agent; last-PP ranks join the wave bus',
  builder: (y) => {
    for (const [f, o] of Object.entries(identityOptions)) y.option(f, o);
    return y
      .option('coordinator', { type: 'string', describe: `HOST:PORT of the coordinator (default $WAVEBUS_COORDINATOR, else $MASTER_ADDR:\${WAVEBUS_PORT:-${DEFAULT_BUS_PORT}})` })
      .option('heartbeat-ms', { type: 'string', default: String(DEFAULT_HEARTBEAT_MS), describe: 'heartbeat period; a coordinator silent for 3 periods is lost' })
      .option('run-dir', { type: 'string', describe: 'directory for the engine-client socket and mailbox (default $WAVEBUS_RUN_DIR)' });
  },
  handler: async (argv) => {
    const a = setupAgent(argv as Record<string, unknown>, process.env);
    const { identity, log, bus } = a;
    const signal = waitForSignal();
    if (bus) {
      bus.on('wave', (w: WaveEvent) => log.debug({ wave: w.head.wave, seq: w.head.seq, config: w.config?.version, dumps: w.dump?.jobs.map((j: { jobId: string }) => j.jobId) }, 'wave'));
      bus.on('snapshot', (s: SnapshotReplyMsg) => log.debug({ epoch: s.epoch, seq: s.seq, wave: s.wave }, 'snapshot'));
      await bus.start();
    } else {
      log.info(
        { rank: identity.globalRank, ppRank: identity.ppRank, pp: identity.pp },
        'not a last-PP rank: does not join the wave bus; follows the config file',
      );
    }
    log.info({ signal: await signal }, 'stopping');
    await bus?.stop();
    process.exit(0);
  },
};
