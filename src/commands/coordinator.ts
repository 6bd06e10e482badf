// `wavebus coordinator`: run the wave-bus coordinator beside global rank 0 until SIGINT/SIGTERM.
import { TokenHasher } from '../guard/token-hash';
import { checkPathLength, flagOrEnv, intFlag, msFlag, portFlag } from './flags';
import type { CommandModule } from 'yargs';
import { artifactModeOption, parseArtifactMode } from '../artifacts/artifact-mode';
import { Coordinator } from '../bus/coordinator';
import { DEFAULT_BUS_PORT, DEFAULT_HEARTBEAT_MS, DEFAULT_LOOKAHEAD_WAVES, MAX_DECIDE_AHEAD } from '../bus/constants';
import { loadServerKeys } from '../bus/curve';
import { loadBusToken } from '../bus/auth';
import { parseBusPort } from '../bus/endpoints';
import { ConfigError } from '../errors';
import { identityFlagsFromArgv, identityOptions, resolveLayout } from '../launch/identity';
import { createLogger } from '../log';
import { Guard } from '../guard/guard';
import { checkStartupPaths, guardOptions, parseStartupOptions } from '../guard/startup';
import { keepFreedMemory } from '../malloc-tuning';

const LAYOUT_FLAGS = ['world-size', 'tp', 'pp', 'dp', 'cp'];

/** Resolves on the first SIGINT/SIGTERM; keeps the process alive until then (signal handlers alone do not). */
export function waitForSignal(): Promise<NodeJS.Signals> {
  const keepAlive = setInterval(() => undefined, 1 << 30);
  return new Promise((resolve) => {
    const on = (sig: NodeJS.Signals) => () => {
      clearInterval(keepAlive);
      resolve(sig);
    };
    process.once('SIGINT', on('SIGINT'));
    process.once('SIGTERM', on('SIGTERM'));
  });
}

export const command: CommandModule = {
  command: 'coordinator',
  describe: 'Run the wave-bus coordinator (PUB on --port, ROUTER on --port+1) until SIGINT/SIGTERM',
  builder: (y) => {
    for (const f of LAYOUT_FLAGS) y.option(f, identityOptions[f]);
    for (const [f, o] of Object.entries(guardOptions)) y.option(f, o);
    return y
      .option('host', { type: 'string', default: '127.0.0.1', describe: 'address to bind; non-loopback needs --insecure' })
      .option('port', { type: 'string', describe: `PUB port; the ROUTER binds port+1 (default $WAVEBUS_PORT or ${DEFAULT_BUS_PORT})` })
      .option('lookahead-waves', {
        type: 'string',
        describe: `how many waves ahead each head decides: a late vector has that many forwards to arrive, and a dump is copied that many waves after its detection (default $WAVEBUS_LOOKAHEAD_WAVES or ${DEFAULT_LOOKAHEAD_WAVES}; at most ${MAX_DECIDE_AHEAD} - (pp - 1))`,
      })
      .option('heartbeat-ms', { type: 'string', default: String(DEFAULT_HEARTBEAT_MS), describe: 'heartbeat period; a peer silent for 3 periods is lost' })
      .option('metrics-port', { type: 'string', describe: 'serve /healthz and /metrics on 127.0.0.1:PORT (0 = any free port)' })
      .option('dump-ack-timeout-ms', { type: 'string', default: '10000', describe: 'how long every last-PP rank has to ack a dump job' })
      .option('artifact-mode', artifactModeOption)
      .option('insecure', { type: 'boolean', default: false, describe: 'allow binding a non-loopback --host without encryption' })
      .option('curve-secret-key', { type: 'string', describe: 'CURVE: this coordinator\'s key pair file (NAME.key from `wavebus keys`); needs --curve-allow' })
      .option('token-hash-key-file', { type: 'string', describe: 'report.save_sensitive_info "hashed": the key (0600, 64 hex digits) token ids are hashed with; `wavebus launch` makes one per job (default $WAVEBUS_TOKEN_HASH_KEY_FILE, else a key of this process only)' })
      .option('bus-token-fd', { type: 'string', describe: 'read the bus token from this descriptor (how `wavebus launch` hands it to its coordinator; takes the place of --bus-token-file)' })
      .option('bus-token-file', { type: 'string', describe: 'the launcher\'s bus token file (0600): frames and replies carry its MAC; agent messages without it are dropped (default $WAVEBUS_BUS_TOKEN_FILE)' })
      .option('curve-allow', { type: 'string', describe: 'CURVE: allowed client public keys: a file (one Z85 key per line) or a directory of *.pub' });
  },
  handler: async (argv) => {
    const log = createLogger('wavebus-coordinator');
    const env = process.env;
    const layout = resolveLayout(env, identityFlagsFromArgv(argv as Record<string, unknown>));
    const portFrom = flagOrEnv(argv.port, '--port', env, 'WAVEBUS_PORT');
    const port = portFrom ? parseBusPort(portFrom.raw, portFrom.from) : DEFAULT_BUS_PORT;
    // The runtime guard decides what each wave carries. A malformed startup key stops the start
    // here; a bad runtime_config overlay or config file does not (logged, /healthz, metric).
    for (const flag of ['runtime-config-path', 'runtime-report-dir', 'runtime-dump-dir'] as const) {
      if (argv[flag] !== undefined) checkPathLength(String(argv[flag]), `--${flag}`);
    }
    const startup = parseStartupOptions(
      argv['additional-config'] as string | undefined,
      {
        runtimeConfigPath: argv['runtime-config-path'] as string | undefined,
        runtimeConfigHotReload: argv['runtime-config-hot-reload'] as boolean | undefined,
        runtimeReportDir: argv['runtime-report-dir'] as string | undefined,
        runtimeDumpDir: argv['runtime-dump-dir'] as string | undefined,
      },
      process.cwd(),
    );
    checkStartupPaths(startup);
    const curve = loadServerKeys(argv['curve-secret-key'] as string | undefined, argv['curve-allow'] as string | undefined);
    const busToken = loadBusToken(argv['bus-token-file'], env, argv['bus-token-fd']);
    const artifactModes = parseArtifactMode(argv['artifact-mode'], '--artifact-mode');
    const dumpAckTimeoutMs = msFlag(argv['dump-ack-timeout-ms'], '--dump-ack-timeout-ms');
    // Bounds by the layout are the coordinator's (checkLookahead); here only "an integer".
    const lookaheadFrom = flagOrEnv(argv['lookahead-waves'], '--lookahead-waves', env, 'WAVEBUS_LOOKAHEAD_WAVES');
    const lookaheadWaves = lookaheadFrom ? intFlag(lookaheadFrom.raw, lookaheadFrom.from) : undefined;
    // The guard's dump ledger is the coordinator's too (policy.ledger): one count of every ack.
    const tokenHasher = TokenHasher.fromFlags(argv['token-hash-key-file'], env);
    const guard = new Guard({ startup, layout, dumpAckTimeoutMs, log, artifactModes, tokenHasher });
    const coordinator = new Coordinator({
      host: String(argv.host),
      port,
      layout,
      heartbeatMs: msFlag(argv['heartbeat-ms'], '--heartbeat-ms'),
      lookaheadWaves,
      lookaheadName: lookaheadFrom?.from,
      metricsPort: argv['metrics-port'] !== undefined ? portFlag(argv['metrics-port'], '--metrics-port', 0) : undefined,
      dumpAckTimeoutMs,
      insecure: Boolean(argv.insecure),
      curve,
      busToken,
      logger: log,
      policy: guard,
      // Reports and dump records live on this host: `wavebus aggregate` collects them from here.
      ownFiles: () => ({ reports: startup.reportDir, dumps: guard.dumpRoot() }),
    });
    const signal = waitForSignal();
    await coordinator.start();
    // Relayed file chunks (`wavebus aggregate`): from the first one on, reuse freed memory instead
    // of faulting in fresh pages. Not before: it keeps every freed byte, and a coordinator that
    // never relays (dumps, acks, waves only) would only grow (docs/bus.md, "Memory").
    coordinator.once('relay', () => keepFreedMemory());
    coordinator.on('ready', () => process.stdout.write(`${JSON.stringify({ event: 'ready', epoch: coordinator.epoch })}\n`));
    process.stdout.write(
      `${JSON.stringify({ event: 'started', epoch: coordinator.epoch, pub: coordinator.pubEndpoint, router: coordinator.routerEndpoint, metrics: coordinator.metricsAddress ?? null, curve: coordinator.curve })}\n`,
    );
    log.info({ signal: await signal }, 'stopping');
    await coordinator.stop();
    guard.close();
    process.exit(0);
  },
};
