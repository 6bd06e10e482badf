// `wavebus launch [options] -- <command...>`: run once per host, like torchrun (see docs/launch.md).
import type { CommandModule } from 'yargs';
import { ConfigError, WavebusError } from '../errors';
import { artifactModeOption, parseArtifactMode } from '../artifacts/artifact-mode';
import { identityOptions } from '../launch/identity';
import { guardOptions, parseStartupOptions } from '../guard/startup';
import { launch } from '../launch/launcher';
import { parseLaunchOptions } from '../launch/options';
import { resolveSnapshotConfig, snapshotEnvFromArgv, snapshotFlagsFromArgv, snapshotOptions } from '../snapshot/config';
import { createLogger } from '../log';
import { directFilesSetup } from './direct-files-flags';
import { checkPathLength } from './flags';

export const command: CommandModule = {
  command: 'launch',
  describe: 'Start the coordinator (node 0) and one agent per local rank, then run a command with the wavebus environment',
  builder: (y) =>
    y
      // Everything after `--` is the user's command, kept verbatim (no number parsing).
      .parserConfiguration({ 'populate--': true })
      .usage('$0 launch [options] -- <command...>')
      .options({
        nnodes: { type: 'string', describe: 'number of hosts in the job', defaultDescription: '1' },
        'node-rank': { ...identityOptions['node-rank'], describe: 'index of this host, 0..nnodes-1', defaultDescription: '0' },
        'nproc-per-node': { type: 'string', describe: 'ranks (agents) on this host', defaultDescription: 'tp*pp*dp*cp/nnodes, else 1' },
        'master-addr': { ...identityOptions['master-addr'], describe: 'address of node 0', defaultDescription: '$MASTER_ADDR or 127.0.0.1' },
        port: { type: 'string', describe: 'bus port: coordinator PUB on PORT, ROUTER on PORT+1', defaultDescription: '$WAVEBUS_PORT or 29600' },
        coordinator: { type: 'string', describe: 'HOST:PORT where the coordinator runs (started here when HOST is this host and node-rank is 0)', defaultDescription: 'master-addr:port' },
        tp: identityOptions.tp,
        pp: identityOptions.pp,
        dp: identityOptions.dp,
        cp: identityOptions.cp,
        'run-dir': { type: 'string', describe: 'directory for agent sockets and mailboxes: created 0700 (and removed at the end), or an existing one of yours with mode 0700', defaultDescription: 'a fresh /dev/shm/wavebus-XXXXXX' },
        'bus-token-dir': { type: 'string', describe: "a one-host job's fresh bus token goes to DIR/bus.token (0600, removed at the end) instead of the run dir, for `wavebus status / dump / capture --bus-token-file DIR/bus.token` from outside the job" },
        'metrics-port': { type: 'string', describe: 'coordinator /healthz and /metrics port' },
        insecure: { type: 'boolean', describe: 'allow the coordinator to bind a non-loopback address without CURVE keys (plain text)' },
        'curve-dir': { type: 'string', describe: 'CURVE keys: DIR/coordinator.key (node 0), coordinator.pub, agent.key, and DIR/allowed or agent.pub as the allow-list (see docs/security.md)' },
        'ready-timeout-ms': { type: 'string', describe: 'give up if the job is not ready in this time', defaultDescription: '30000' },
        'grace-ms': { type: 'string', describe: 'after the command exits: time between SIGTERM and SIGKILL for agents and coordinator', defaultDescription: '5000' },
        'coordinator-arg': { type: 'string', array: true, describe: 'extra argument for `wavebus coordinator` (repeatable, verbatim)' },
        'agent-arg': { type: 'string', array: true, describe: 'extra argument for every `wavebus agent` (repeatable, verbatim)' },
        'artifact-mode': artifactModeOption,
        'direct-files': { type: 'string', describe: 'with --curve-dir: agents serve their files to `wavebus aggregate` directly (on|off), passed to every agent as --direct-files', defaultDescription: 'on' },
        'direct-files-host': { type: 'string', describe: 'the address agents of this host serve files on, passed as --direct-files-host', defaultDescription: "this host's address toward the coordinator" },
        'direct-files-port': { type: 'string', describe: 'port base of those sockets (local rank L: PORT + L), passed as --direct-files-port', defaultDescription: 'ephemeral' },
        'linger-ms': { type: 'string', describe: 'after the command exits, keep agents and coordinator serving files this long (for `wavebus aggregate`)', defaultDescription: '0' },
        ...guardOptions,
        ...snapshotOptions,
      })
      .example('$0 launch --nproc-per-node 8 --tp 8 -- python serve.py', 'one host, TP 8')
      .example('$0 launch --nnodes 2 --node-rank $NODE_RANK --nproc-per-node 8 --master-addr $MASTER --tp 8 --pp 2 -- torchrun ...', 'each of two hosts'),
  handler: async (argv) => {
    const opts = parseLaunchOptions(argv as Record<string, unknown>);
    // Runtime guard startup options go to the coordinator; validated here so a bad startup key stops the launch.
    const a = argv as Record<string, unknown>;
    const guardFlags = {
      additionalConfig: a['additional-config'] as string | undefined,
      runtimeConfigPath: a['runtime-config-path'] as string | undefined,
      runtimeConfigHotReload: a['runtime-config-hot-reload'] as boolean | undefined,
      runtimeReportDir: a['runtime-report-dir'] as string | undefined,
      runtimeDumpDir: a['runtime-dump-dir'] as string | undefined,
    };
    const startup = parseStartupOptions(guardFlags.additionalConfig, guardFlags, process.cwd());
    if (startup.overlayError !== null) {
      // Not fatal (the seed falls back to the defaults); the coordinator logs it and shows it in /healthz.
      process.stderr.write(`wavebus launch: warning: ${startup.overlayError}; the runtime guard will use the defaults\n`);
    }
    for (const [flag, key] of [['additional-config', 'additionalConfig'], ['runtime-config-path', 'runtimeConfigPath'], ['runtime-report-dir', 'runtimeReportDir'], ['runtime-dump-dir', 'runtimeDumpDir']] as const) {
      if (flag !== 'additional-config' && guardFlags[key] !== undefined) checkPathLength(String(guardFlags[key]), `--${flag}`);
      if (guardFlags[key] !== undefined) opts.coordinatorArgs.push(`--${flag}=${guardFlags[key]}`);
    }
    if (guardFlags.runtimeConfigHotReload !== undefined) opts.coordinatorArgs.push(`--runtime-config-hot-reload=${guardFlags.runtimeConfigHotReload}`);
    // One mode for every artifact of the job: the coordinator's reports and dump JSON, the agents' dumps and snapshots.
    if (a['artifact-mode'] !== undefined) {
      parseArtifactMode(a['artifact-mode'], '--artifact-mode');
      opts.coordinatorArgs.push(`--artifact-mode=${a['artifact-mode']}`);
      opts.agentArgs.push(`--artifact-mode=${a['artifact-mode']}`);
    }
    // Direct file serving: checked here (a bad value stops the launch), passed to every agent.
    directFilesSetup(a, {}, opts.nprocPerNode - 1);
    for (const flag of ['direct-files', 'direct-files-host', 'direct-files-port']) {
      if (a[flag] !== undefined) opts.agentArgs.push(`--${flag}=${a[flag]}`);
    }
    // Snapshot flags become WAVEBUS_SNAPSHOT_* for the agents and the command; resolved once here.
    resolveSnapshotConfig(process.env, snapshotFlagsFromArgv(a), (m) => process.stderr.write(`wavebus launch: warning: ${m}\n`));
    Object.assign(process.env, snapshotEnvFromArgv(a));
    let code: number;
    try {
      code = await launch(opts, createLogger('launch'));
    } catch (e) {
      if (e instanceof ConfigError || !(e instanceof WavebusError)) throw e;
      // The job failed to come up: not a usage error, so not exit code 2.
      process.stderr.write(`wavebus launch: ${e.message} [${e.code}]\n`);
      code = 1;
    }
    process.exit(code);
  },
};

