// Rank identity: who this process is in the job (global/local rank, node, TP/PP/DP/CP
// coordinates), resolved from flags, then torchrun's environment, then Slurm's. The layout model
// it fills in (WorldLayout, RankIdentity, rank coordinates) is src/layout.ts.
import { isSet, lastOf, strictInt } from '../commands/flags';
import * as os from 'os';
import type { Options } from 'yargs';
import { boundedLayout, identityError, rankCoordinates, type RankIdentity, type WorldLayout } from '../layout';

export interface IdentityFlags {
  rank?: number;
  localRank?: number;
  worldSize?: number;
  localWorldSize?: number;
  nodeRank?: number;
  masterAddr?: string;
  tp?: number;
  pp?: number;
  dp?: number;
  cp?: number;
}

/** Which launcher a value came from; values from different launchers are not mixed where it matters. */
type Family = 'flag' | 'torchrun' | 'slurm' | 'wavebus' | 'default';

interface Sourced<T> {
  value: T;
  /** The flag or variable name, e.g. `--rank`, `RANK`, `SLURM_PROCID`, or `default`. */
  from: string;
  family: Family;
}

/** Parse an integer from a flag or variable; `min` is 0 for ranks, 1 for sizes. */
function parseInt0(raw: unknown, from: string, min: 0 | 1): number {
  const what = min === 0 ? 'a non-negative integer' : 'a positive integer';
  if (typeof raw === 'number') {
    if (Number.isSafeInteger(raw) && raw >= min) return raw;
    throw identityError(`${from}=${String(raw)} is not ${what}`);
  }
  const n = strictInt(raw);
  if (n === undefined || n < min) throw identityError(`${from}='${String(raw)}' is not ${what}`);
  return n;
}

interface Candidate {
  flag?: number | string;
  flagName?: string;
  env: Array<[name: string, family: Family]>;
}

/** The first source that is set: the flag, then each variable in order. */
function pick(env: NodeJS.ProcessEnv, c: Candidate, min: 0 | 1): Sourced<number> | undefined {
  if (c.flag !== undefined && c.flagName) {
    return { value: parseInt0(c.flag, c.flagName, min), from: c.flagName, family: 'flag' };
  }
  for (const [name, family] of c.env) {
    const v = env[name];
    if (isSet(v)) return { value: parseInt0(v, name, min), from: name, family };
  }
  return undefined;
}

/**
 * Slurm's per-node task counts: "4(x2),3" means nodes 0-1 run 4 tasks, node 2 runs 3.
 * Returns the count for `nodeId`, or undefined when it cannot be told.
 */
export function slurmTasksOnNode(spec: string, nodeId: number, varName = 'SLURM_TASKS_PER_NODE'): number {
  const counts: number[] = [];
  for (const piece of spec.split(',')) {
    const m = /^\s*(\d+)(?:\(x(\d+)\))?\s*$/.exec(piece);
    if (!m) throw identityError(`${varName}='${spec}' is not a Slurm task count list like "4(x2),3"`);
    const n = Number(m[1]);
    const times = m[2] === undefined ? 1 : Number(m[2]);
    for (let i = 0; i < times && counts.length <= nodeId; i++) counts.push(n);
    if (counts.length > nodeId) break;
  }
  if (nodeId >= counts.length) {
    throw identityError(`${varName}='${spec}' lists fewer nodes than SLURM_NODEID=${nodeId}+1`);
  }
  if (counts[nodeId] < 1) throw identityError(`${varName}='${spec}' gives node ${nodeId} no tasks`);
  return counts[nodeId];
}

/** First host of a Slurm node list: "gpu[03-05,09],cpu1" → "gpu03". */
export function firstSlurmHost(nodelist: string): string | undefined {
  const s = nodelist.trim();
  if (s === '') return undefined;
  const m = /^([^,[\]]*)(?:\[([^\]]*)\])?/.exec(s);
  if (!m || m[1] === '' && m[2] === undefined) return undefined;
  if (m[2] === undefined) return m[1];
  const first = m[2].split(',')[0].split('-')[0];
  return first === '' ? undefined : `${m[1]}${first}`;
}

const SIZE_FLAGS = ['tp', 'pp', 'dp', 'cp'] as const;
type SizeName = (typeof SIZE_FLAGS)[number];

function pickWorldSize(env: NodeJS.ProcessEnv, flags: IdentityFlags): Sourced<number> | undefined {
  return pick(env, { flag: flags.worldSize, flagName: '--world-size', env: [['WORLD_SIZE', 'torchrun'], ['SLURM_NTASKS', 'slurm']] }, 1);
}

function layoutFrom(env: NodeJS.ProcessEnv, flags: IdentityFlags, world: Sourced<number> | undefined): WorldLayout {
  const sizes = {} as Record<SizeName, Sourced<number> | undefined>;
  for (const k of SIZE_FLAGS) {
    sizes[k] = pick(env, { flag: flags[k], flagName: `--${k}`, env: [[`WAVEBUS_${k.toUpperCase()}`, 'wavebus']] }, 1);
  }
  const anyGiven = SIZE_FLAGS.some((k) => sizes[k] !== undefined);
  if (!anyGiven) {
    // No parallel sizes at all: the whole world is one tensor-parallel group.
    const w = world?.value ?? 1;
    return { worldSize: w, tp: w, pp: 1, dp: 1, cp: 1 };
  }
  const v = (k: SizeName) => sizes[k]?.value ?? 1;
  const product = v('tp') * v('pp') * v('dp') * v('cp');
  if (world !== undefined && product !== world.value) {
    const origins = SIZE_FLAGS.map((k) => `${k} from ${sizes[k]?.from ?? 'default 1'}`).join(', ');
    throw identityError(
      `tp(${v('tp')})*pp(${v('pp')})*dp(${v('dp')})*cp(${v('cp')})=${product} != ${world.from}(${world.value}) [${origins}]`,
    );
  }
  return { worldSize: world?.value ?? product, tp: v('tp'), pp: v('pp'), dp: v('dp'), cp: v('cp') };
}

/** World size and TP/PP/DP/CP sizes; their product must equal the world size. */
export function resolveLayout(env: NodeJS.ProcessEnv, flags: IdentityFlags = {}): WorldLayout {
  const world = pickWorldSize(env, flags);
  return boundedLayout(layoutFrom(env, flags, world), world?.from ?? 'tp*pp*dp*cp');
}

/** Refuse to combine a rank from one launcher with a size from another (e.g. torchrun RANK with SLURM_NTASKS). */
function checkSameLauncher(rank: Sourced<number> | undefined, size: Sourced<number> | undefined, flagPair: string): void {
  if (!rank || !size) return;
  const envFamilies: Family[] = ['torchrun', 'slurm'];
  if (envFamilies.includes(rank.family) && envFamilies.includes(size.family) && rank.family !== size.family) {
    throw identityError(
      `${rank.from}=${rank.value} comes from ${rank.family} but ${size.from}=${size.value} comes from ${size.family}; ` +
        `refusing to mix launchers: set both from one launcher, or pass ${flagPair}`,
    );
  }
}

function resolveMasterAddr(env: NodeJS.ProcessEnv, flags: IdentityFlags): string {
  if (flags.masterAddr !== undefined && flags.masterAddr !== '') return flags.masterAddr;
  if (isSet(env.MASTER_ADDR)) return env.MASTER_ADDR.trim();
  if (isSet(env.SLURM_LAUNCH_NODE_IPADDR)) return env.SLURM_LAUNCH_NODE_IPADDR.trim();
  const first = isSet(env.SLURM_JOB_NODELIST) ? firstSlurmHost(env.SLURM_JOB_NODELIST) : undefined;
  return first ?? '127.0.0.1';
}

/**
 * This process's identity. Sources in priority: flags, torchrun's variables
 * (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK/NODE_RANK, MASTER_ADDR), Slurm's
 * (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NODEID, SLURM_NTASKS_PER_NODE /
 * SLURM_TASKS_PER_NODE); sizes from WAVEBUS_TP/PP/DP/CP.
 */
export function resolveIdentity(env: NodeJS.ProcessEnv, flags: IdentityFlags = {}): RankIdentity {
  const world = pickWorldSize(env, flags);
  const rank = pick(env, { flag: flags.rank, flagName: '--rank', env: [['RANK', 'torchrun'], ['SLURM_PROCID', 'slurm']] }, 0);
  checkSameLauncher(rank, world, '--rank and --world-size');
  const layout = boundedLayout(layoutFrom(env, flags, world), world?.from ?? 'tp*pp*dp*cp');

  if (rank === undefined && layout.worldSize > 1) {
    throw identityError(`no global rank for a world of ${layout.worldSize}: set --rank, RANK (torchrun) or SLURM_PROCID (Slurm)`);
  }
  const globalRank = rank?.value ?? 0;
  const worldFrom = world?.from ?? 'tp*pp*dp*cp (no WORLD_SIZE set)';
  if (globalRank >= layout.worldSize) {
    throw identityError(`${rank?.from ?? 'rank'}=${globalRank} is not below the world size ${worldFrom}(${layout.worldSize})`);
  }

  // Node rank: torchrun's GROUP_RANK and NODE_RANK must agree when both are set.
  if (flags.nodeRank === undefined && isSet(env.GROUP_RANK) && isSet(env.NODE_RANK)) {
    const g = parseInt0(env.GROUP_RANK, 'GROUP_RANK', 0);
    const n = parseInt0(env.NODE_RANK, 'NODE_RANK', 0);
    if (g !== n) throw identityError(`GROUP_RANK=${g} and NODE_RANK=${n} disagree; unset one or pass --node-rank`);
  }
  const nodeId = pick(env, { flag: flags.nodeRank, flagName: '--node-rank', env: [['GROUP_RANK', 'torchrun'], ['NODE_RANK', 'torchrun'], ['SLURM_NODEID', 'slurm']] }, 0);

  let localWorld = pick(env, { flag: flags.localWorldSize, flagName: '--local-world-size', env: [['LOCAL_WORLD_SIZE', 'torchrun'], ['SLURM_NTASKS_PER_NODE', 'slurm']] }, 1);
  if (localWorld === undefined && isSet(env.SLURM_TASKS_PER_NODE)) {
    const slurmNode = isSet(env.SLURM_NODEID) ? parseInt0(env.SLURM_NODEID, 'SLURM_NODEID', 0) : 0;
    localWorld = { value: slurmTasksOnNode(env.SLURM_TASKS_PER_NODE, slurmNode), from: 'SLURM_TASKS_PER_NODE', family: 'slurm' };
  }
  const local = pick(env, { flag: flags.localRank, flagName: '--local-rank', env: [['LOCAL_RANK', 'torchrun'], ['SLURM_LOCALID', 'slurm']] }, 0);
  checkSameLauncher(local, localWorld, '--local-rank and --local-world-size');

  // Without a local world size, assume one node holds the whole world.
  const localWorldSize = localWorld?.value ?? layout.worldSize;
  if (localWorldSize > layout.worldSize) {
    throw identityError(`${localWorld?.from}=${localWorldSize} exceeds the world size ${worldFrom}(${layout.worldSize})`);
  }
  const localRank = local?.value ?? globalRank % localWorldSize;
  if (localRank >= localWorldSize) {
    throw identityError(`${local?.from ?? 'local rank'}=${localRank} is not below the local world size ${localWorld?.from ?? 'world size'}(${localWorldSize})`);
  }
  const nodeRank = nodeId?.value ?? Math.floor(globalRank / localWorldSize);

  return {
    ...layout,
    globalRank,
    localRank,
    localWorldSize,
    nodeRank,
    masterAddr: resolveMasterAddr(env, flags),
    ...rankCoordinates(globalRank, layout),
    host: os.hostname(),
  };
}

// Strings, not numbers: yargs turns 'abc' into NaN and loses what the user typed; we parse
// ourselves so the error can quote it.
export const identityOptions: { [flag: string]: Options } = {
  rank: { type: 'string', describe: 'global rank (default: $RANK, $SLURM_PROCID)' },
  'local-rank': { type: 'string', describe: 'rank on this node (default: $LOCAL_RANK, $SLURM_LOCALID)' },
  'world-size': { type: 'string', describe: 'number of ranks in the job (default: $WORLD_SIZE, $SLURM_NTASKS)' },
  'local-world-size': { type: 'string', describe: 'ranks on this node (default: $LOCAL_WORLD_SIZE, $SLURM_NTASKS_PER_NODE)' },
  'node-rank': { type: 'string', describe: 'index of this node (default: $GROUP_RANK, $NODE_RANK, $SLURM_NODEID)' },
  'master-addr': { type: 'string', describe: 'address of the rank-0 host (default: $MASTER_ADDR, Slurm launch node, 127.0.0.1)' },
  tp: { type: 'string', describe: 'tensor-parallel size (default: $WAVEBUS_TP; the world size when no size is given)' },
  pp: { type: 'string', describe: 'pipeline-parallel size (default: $WAVEBUS_PP or 1)' },
  dp: { type: 'string', describe: 'data-parallel size (default: $WAVEBUS_DP or 1)' },
  cp: { type: 'string', describe: 'context-parallel size (default: $WAVEBUS_CP or 1)' },
};

/** IdentityFlags from parsed yargs argv; numbers are validated here, naming the flag. */
export function identityFlagsFromArgv(argv: Record<string, unknown>): IdentityFlags {
  const out: IdentityFlags = {};
  const num = (flag: string, min: 0 | 1): number | undefined => {
    const v = lastOf(argv[flag]);
    if (v === undefined || v === null || v === '') return undefined;
    return parseInt0(v, `--${flag}`, min);
  };
  out.rank = num('rank', 0);
  out.localRank = num('local-rank', 0);
  out.worldSize = num('world-size', 1);
  out.localWorldSize = num('local-world-size', 1);
  out.nodeRank = num('node-rank', 0);
  out.tp = num('tp', 1);
  out.pp = num('pp', 1);
  out.dp = num('dp', 1);
  out.cp = num('cp', 1);
  const ma = lastOf(argv['master-addr']);
  if (ma !== undefined && ma !== null && String(ma).trim() !== '') out.masterAddr = String(ma).trim();
  for (const k of Object.keys(out) as Array<keyof IdentityFlags>) if (out[k] === undefined) delete out[k];
  return out;
}
