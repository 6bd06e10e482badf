// What the launcher hands to each process it starts: the coordinator's and each agent's
// arguments, the agents' dump root, and the environment of the user's command.
import { Parser } from 'yargs/helpers';
import { curveDirFiles } from '../bus/curve';
import { dumpRootOf, effectiveStartupConfig, parseStartupOptions } from '../guard/startup';
import type { WorldLayout } from '../layout';
import { given, type LaunchOptions } from './options';

/** Global rank of local rank `l` on this node (torchrun's rule: nodes hold consecutive blocks). */
export function globalRankOfLocal(opts: LaunchOptions, localRank: number): number {
  return opts.nodeRank * opts.nprocPerNode + localRank;
}

function layoutArgs(l: WorldLayout): string[] {
  return ['--tp', String(l.tp), '--pp', String(l.pp), '--dp', String(l.dp), '--cp', String(l.cp)];
}

/** Arguments of `wavebus coordinator` (after the script path). */
export function coordinatorArgv(opts: LaunchOptions, bindHost: string): string[] {
  const a = ['coordinator', '--host', bindHost, '--port', String(opts.port), '--world-size', String(opts.layout.worldSize), ...layoutArgs(opts.layout)];
  if (opts.metricsPort !== undefined) a.push('--metrics-port', String(opts.metricsPort));
  if (opts.insecure) a.push('--insecure');
  if (opts.curveDir !== undefined) {
    const f = curveDirFiles(opts.curveDir);
    a.push('--curve-secret-key', f.serverKey, '--curve-allow', f.allow);
  }
  return [...a, ...opts.coordinatorArgs];
}

/**
 * The KV dump root the coordinator on this host derives from the guard flags among its
 * arguments (the config file's dump.dump_dir, else --runtime-dump-dir, else <report_dir>/kv_cache),
 * read the way `wavebus coordinator` reads them, without writing anything. Agents get it as
 * --dump-root: the only place they write and serve dumps (a bus dump_dir may only narrow it).
 */
export function launchDumpRoot(coordinatorArgs: string[], cwd: string = process.cwd()): string {
  const a = Parser(coordinatorArgs, {
    string: ['additional-config', 'runtime-config-path', 'runtime-report-dir', 'runtime-dump-dir'],
    boolean: ['runtime-config-hot-reload'],
    configuration: { 'duplicate-arguments-array': false, 'camel-case-expansion': false },
  }) as Record<string, unknown>;
  const str = (k: string) => (a[k] === undefined ? undefined : String(a[k]));
  const startup = parseStartupOptions(
    str('additional-config'),
    { runtimeConfigPath: str('runtime-config-path'), runtimeReportDir: str('runtime-report-dir'), runtimeDumpDir: str('runtime-dump-dir') },
    cwd,
  );
  // Computed, never written: the coordinator alone writes the live file at its startup.
  return dumpRootOf(effectiveStartupConfig(startup), startup);
}

/** Arguments of `wavebus agent` for local rank `l` (after the script path). */
export function agentArgv(opts: LaunchOptions, localRank: number, runDir: string, local: { dumpRoot?: string; tokenFile?: string; tokenHashKeyFile?: string } = {}): string[] {
  return [
    'agent',
    '--coordinator', `${opts.coordinator.host}:${opts.coordinator.port}`,
    '--rank', String(globalRankOfLocal(opts, localRank)),
    '--local-rank', String(localRank),
    '--world-size', String(opts.layout.worldSize),
    '--local-world-size', String(opts.nprocPerNode),
    '--node-rank', String(opts.nodeRank),
    ...layoutArgs(opts.layout),
    '--run-dir', runDir,
    ...(local.dumpRoot !== undefined ? ['--dump-root', local.dumpRoot] : []),
    ...(local.tokenFile !== undefined ? ['--bus-token-file', local.tokenFile] : []),
    ...(local.tokenHashKeyFile !== undefined ? ['--token-hash-key-file', local.tokenHashKeyFile] : []),
    ...(opts.curveDir !== undefined ? ['--curve-server-key', curveDirFiles(opts.curveDir).serverPub, '--curve-key', curveDirFiles(opts.curveDir).clientKey] : []),
    ...opts.agentArgs,
  ];
}

/** The environment the user's command (and every process it starts) sees. */
export function commandEnv(opts: LaunchOptions, runDir: string, env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {
    ...env,
    WAVEBUS_RUN_DIR: runDir,
    WAVEBUS_COORDINATOR: `${opts.coordinator.host}:${opts.coordinator.port}`,
    WAVEBUS_TP: String(opts.layout.tp),
    WAVEBUS_PP: String(opts.layout.pp),
    WAVEBUS_DP: String(opts.layout.dp),
    WAVEBUS_CP: String(opts.layout.cp),
    WAVEBUS_NNODES: String(opts.nnodes),
    WAVEBUS_NODE_RANK: String(opts.nodeRank),
    WAVEBUS_NPROC_PER_NODE: String(opts.nprocPerNode),
  };
  if (!given(out.MASTER_ADDR)) out.MASTER_ADDR = opts.masterAddr;
  return out;
}
