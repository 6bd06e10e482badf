// `wavebus launch` flags: parsed and checked against each other (world = nnodes * nproc-per-node =
// tp * pp * dp * cp) into LaunchOptions. Errors name the flag or variable.
import * as fs from 'fs';
import * as path from 'path';
import { ConfigError } from '../errors';
import { checkSecretDirPath } from '../artifacts/secret-file';
import { loadCurveDirClient, type CurveClientKeys } from '../bus/curve';
import { HostPort, isLoopback, parseBusPort, parseHostPort } from '../bus/endpoints';
import { DEFAULT_BUS_PORT } from '../bus/constants';
import { boundedLayout, type WorldLayout } from '../layout';
import { flagOrEnv, intFlag, lastOf, nonEmpty } from '../commands/flags';

export interface LaunchOptions {
  nnodes: number;
  nodeRank: number;
  nprocPerNode: number;
  masterAddr: string;
  /** Bus base port: coordinator PUB on port, ROUTER on port + 1. */
  port: number;
  /** Where agents and tools reach the coordinator (its PUB port). */
  coordinator: HostPort;
  layout: WorldLayout;
  runDir?: string;
  /** Where a one-host job's fresh bus token is written (default the run dir). */
  busTokenDir?: string;
  metricsPort?: number;
  insecure: boolean;
  readyTimeoutMs: number;
  graceMs: number;
  coordinatorArgs: string[];
  agentArgs: string[];
  command: string[];
  /** After the command exits, keep the agents and coordinator serving files (aggregation) this long; 0 = stop at once. */
  lingerMs?: number;
  /** --curve-dir: CURVE keys for the coordinator, agents and readiness polling (docs/security.md). */
  curveDir?: string;
  /** Client keys loaded from curveDir (the launcher polls the coordinator with them). */
  curve?: CurveClientKeys;
}

export function launchError(message: string): ConfigError {
  return new ConfigError(message, 'ERR_LAUNCH');
}


export function given(v: unknown): boolean {
  return v !== undefined && v !== null && String(v) !== '';
}

function parseIntArg(raw: unknown, name: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  return intFlag(lastOf(raw), name, min, max, { code: 'ERR_LAUNCH' });
}

function stringList(v: unknown): string[] {
  if (v === undefined || v === null) return [];
  return (Array.isArray(v) ? v : [v]).map((x) => String(x));
}

const SIZES = ['tp', 'pp', 'dp', 'cp'] as const;

/**
 * Validate the launch flags (yargs argv, with the command under argv['--']) against each
 * other: world = nnodes * nproc-per-node = tp * pp * dp * cp. Errors name the flags.
 */
export function parseLaunchOptions(argv: Record<string, unknown>, env: NodeJS.ProcessEnv = process.env): LaunchOptions {
  const command = stringList(argv['--']);
  if (command.length === 0 || command[0] === '') {
    throw launchError('no command to run: give it after --, e.g. `wavebus launch --nproc-per-node 8 -- python serve.py`');
  }

  const nnodes = given(argv.nnodes) ? parseIntArg(argv.nnodes, '--nnodes', 1) : 1;
  const nodeRank = given(argv['node-rank']) ? parseIntArg(argv['node-rank'], '--node-rank', 0) : 0;
  if (nodeRank >= nnodes) throw launchError(`--node-rank ${nodeRank} must be below --nnodes ${nnodes}`);

  // Flag, else variable (src/commands/flags.ts); in launch an empty flag counts as not given.
  const setting = (k: string, variable: string) => flagOrEnv(given(argv[k]) ? argv[k] : undefined, `--${k}`, env, variable);

  // Parallel sizes: flag, then WAVEBUS_<SIZE>; remember where each came from for the error.
  const size: Record<string, { value: number; from: string } | undefined> = {};
  for (const k of SIZES) {
    const envName = `WAVEBUS_${k.toUpperCase()}`;
    const set = setting(k, envName);
    if (set) size[k] = { value: parseIntArg(set.raw, set.from, 1), from: set.from };
  }
  const anySize = SIZES.some((k) => size[k] !== undefined);
  const sizeProduct = SIZES.reduce((p, k) => p * (size[k]?.value ?? 1), 1);

  let nprocPerNode: number;
  if (given(argv['nproc-per-node'])) {
    nprocPerNode = parseIntArg(argv['nproc-per-node'], '--nproc-per-node', 1);
  } else if (anySize) {
    if (sizeProduct % nnodes !== 0) {
      throw launchError(`tp*pp*dp*cp=${sizeProduct} ranks cannot be split evenly over --nnodes ${nnodes}; pass --nproc-per-node`);
    }
    nprocPerNode = sizeProduct / nnodes;
  } else {
    nprocPerNode = 1;
  }
  const worldSize = nnodes * nprocPerNode;

  let layout: WorldLayout;
  if (!anySize) {
    layout = { worldSize, tp: worldSize, pp: 1, dp: 1, cp: 1 };
  } else {
    const v = (k: string) => size[k]?.value ?? 1;
    if (sizeProduct !== worldSize) {
      const terms = SIZES.map((k) => `${size[k]?.from ?? k}(${v(k)})`).join('*');
      throw launchError(
        `${terms}=${sizeProduct} != --nnodes(${nnodes})*--nproc-per-node(${nprocPerNode})=${worldSize}; ` +
          `the parallel sizes must multiply to the number of ranks`,
      );
    }
    layout = { worldSize, tp: v('tp'), pp: v('pp'), dp: v('dp'), cp: v('cp') };
  }
  boundedLayout(layout, '--nnodes*--nproc-per-node');

  const masterFrom = setting('master-addr', 'MASTER_ADDR');
  const masterAddr = masterFrom ? String(masterFrom.raw).trim() : '127.0.0.1';
  const portFrom = setting('port', 'WAVEBUS_PORT');
  let port = portFrom ? parseBusPort(portFrom.raw, portFrom.from) : DEFAULT_BUS_PORT;
  let coordinator: HostPort = { host: masterAddr, port };
  if (given(argv.coordinator)) {
    coordinator = parseHostPort(String(lastOf(argv.coordinator)), '--coordinator');
    if (given(argv.port) && coordinator.port !== port) {
      throw launchError(`--port ${port} and --coordinator ${coordinator.host}:${coordinator.port} name different bus ports; give one of them`);
    }
    port = coordinator.port;
  }
  // Several nodes with the default loopback master cannot work across hosts. An explicit
  // loopback address is respected: that is how several "nodes" are simulated on one host.
  const explicitAddr = masterFrom !== undefined || given(argv.coordinator);
  if (nnodes > 1 && !explicitAddr && isLoopback(coordinator.host)) {
    throw launchError(
      `--nnodes ${nnodes}: no --master-addr, MASTER_ADDR or --coordinator, and the default ${coordinator.host} is loopback, ` +
        'which other hosts cannot reach; pass --master-addr (or --coordinator HOST:PORT) with the address of node 0',
    );
  }

  const runDir = given(argv['run-dir']) ? path.resolve(String(lastOf(argv['run-dir']))) : undefined;
  const busTokenDir = given(argv['bus-token-dir']) ? tokenDirFlag(argv['bus-token-dir']) : undefined;
  const metricsPort = given(argv['metrics-port']) ? parseIntArg(argv['metrics-port'], '--metrics-port', 0, 65535) : undefined;
  const readyTimeoutMs = given(argv['ready-timeout-ms']) ? parseIntArg(argv['ready-timeout-ms'], '--ready-timeout-ms', 1) : 30000;
  const graceMs = given(argv['grace-ms']) ? parseIntArg(argv['grace-ms'], '--grace-ms', 0) : 5000;
  const curveDir = given(argv['curve-dir']) ? path.resolve(String(lastOf(argv['curve-dir']))) : undefined;
  const curve = curveDir !== undefined ? loadCurveDirClient(curveDir) : undefined;

  return {
    nnodes,
    nodeRank,
    nprocPerNode,
    masterAddr,
    port,
    coordinator,
    layout,
    runDir,
    ...(busTokenDir !== undefined ? { busTokenDir } : {}),
    metricsPort,
    insecure: argv.insecure === true,
    readyTimeoutMs,
    graceMs,
    coordinatorArgs: stringList(argv['coordinator-arg']),
    agentArgs: stringList(argv['agent-arg']),
    lingerMs: given(argv['linger-ms']) ? parseIntArg(argv['linger-ms'], '--linger-ms', 0) : 0,
    command,
    ...(curveDir !== undefined ? { curveDir, curve } : {}),
  };
}

/** --bus-token-dir: an existing directory, reached without a link (the token is written into it, 0600). */
function tokenDirFlag(raw: unknown): string {
  const dir = path.resolve(nonEmpty(lastOf(raw), '--bus-token-dir'));
  const shown = JSON.stringify(dir.length > 200 ? `${dir.slice(0, 200)}...` : dir);
  let st: fs.Stats;
  try {
    st = fs.lstatSync(dir);
  } catch (e) {
    throw new ConfigError(`--bus-token-dir ${shown}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message} (an existing directory)`);
  }
  if (!st.isDirectory()) throw new ConfigError(`--bus-token-dir ${shown}: not a directory (a link is not followed)`);
  // Whoever owns or may write it could swap the token for one of theirs (ERR_PATH_UNTRUSTED).
  checkSecretDirPath(dir, '--bus-token-dir');
  return dir;
}
