// The simulated engine's job launcher: starts this host's ranks as processes with the
// environment torchrun gives its workers, holds them at a start barrier, and collects results.
import { fork, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { ConfigError } from '../errors';
import { shmNameFor, simShmTag, unlinkQuietly, type SimRankOptions, type SimRankResult } from './rank';
import { makeRunDir, releaseRunDir } from '../launch/run-dir';

export interface SimJobOptions extends Omit<SimRankOptions, 'startAt' | 'lockstepDir'> {
  /** TP ranks step in lockstep (tp-barrier.ts), as a real group's all-reduce keeps them; default true. */
  tpLockstep?: boolean;
  nnodes: number;
  nodeRank: number;
  nprocPerNode: number;
  masterAddr: string;
  /** Wall-clock ms for step 1 on every host; default: shortly after every local rank is ready. */
  startAt?: number;
  env?: NodeJS.ProcessEnv;
}

export interface SimJobResult {
  ranks: SimRankResult[];
  exits: { rank: number; code: number | null; signal: string | null }[];
}

function cliPath(): string {
  return path.resolve(__dirname, '..', '..', '..', 'bin', 'wavebus.js');
}

export async function runSimJob(opts: SimJobOptions): Promise<SimJobResult> {
  const world = opts.nnodes * opts.nprocPerNode;
  if (opts.nodeRank >= opts.nnodes) throw new ConfigError(`--node-rank ${opts.nodeRank} must be < --nnodes ${opts.nnodes}`);
  const env = opts.env ?? process.env;
  const { nnodes, nodeRank, nprocPerNode, masterAddr, env: _env, startAt: _s, tpLockstep, ...given } = opts;
  // The ranks' lockstep sockets: a private dir of the job's own (run-dir.ts), removed below and on
  // any other way out but SIGKILL (the process exits while ranks still run).
  const lockstep = tpLockstep === false ? undefined : makeRunDir('wavebus-sim-tp-', os.tmpdir());
  const lockstepDir = lockstep?.path;
  const removeLockstep = () => lockstep && releaseRunDir(lockstep);
  process.once('exit', removeLockstep);
  // The job names the ranks' segments so it can remove the one of a rank that dies (SIGKILL included).
  const rankOpts: SimRankOptions = { ...given, shmTag: given.shmTag ?? simShmTag(env), lockstepDir };
  try {
    return await runRanks(opts, rankOpts, env, world);
  } finally {
    removeLockstep();
    process.off('exit', removeLockstep);
  }
}

async function runRanks(opts: SimJobOptions, rankOpts: SimRankOptions, env: NodeJS.ProcessEnv, world: number): Promise<SimJobResult> {
  const { nodeRank, nprocPerNode, masterAddr } = opts;
  const children: { rank: number; child: ChildProcess }[] = [];
  const ready: Promise<void>[] = [];
  const exits: Promise<{ rank: number; code: number | null; signal: string | null }>[] = [];
  for (let local = 0; local < nprocPerNode; local++) {
    const rank = nodeRank * nprocPerNode + local;
    const child = fork(cliPath(), ['sim-rank', '--options', JSON.stringify(rankOpts)], {
      env: {
        ...env,
        RANK: String(rank),
        LOCAL_RANK: String(local),
        WORLD_SIZE: String(world),
        LOCAL_WORLD_SIZE: String(nprocPerNode),
        GROUP_RANK: String(nodeRank),
        NODE_RANK: String(nodeRank),
        MASTER_ADDR: masterAddr,
      },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    children.push({ rank, child });
    ready.push(
      new Promise((resolve, reject) => {
        child.once('message', (m: any) => (m?.ready ? resolve() : reject(new Error(`rank ${rank}: unexpected message`))));
        child.once('exit', (code) => reject(new Error(`sim rank ${rank} exited with code ${code} before it was ready`)));
      }),
    );
    exits.push(
      new Promise((resolve) =>
        child.on('exit', (code, signal) => {
          unlinkQuietly(shmNameFor(rankOpts.shmTag!, rank));
          resolve({ rank, code, signal });
        }),
      ),
    );
  }
  const forward = (sig: NodeJS.Signals): void => children.forEach((c) => c.child.kill(sig));
  process.on('SIGTERM', forward);
  process.on('SIGINT', forward);
  try {
    await Promise.all(ready);
  } catch (e) {
    forward('SIGKILL');
    await Promise.all(exits);
    throw e;
  }
  const startAt = opts.startAt ?? Date.now() + 100;
  for (const c of children) c.child.send({ go: startAt });
  const done = await Promise.all(exits);
  process.off('SIGTERM', forward);
  process.off('SIGINT', forward);
  const ranks: SimRankResult[] = [];
  for (const c of children) {
    const p = path.join(opts.resultDir, `rank${c.rank}.json`);
    if (fs.existsSync(p)) ranks.push(JSON.parse(fs.readFileSync(p, 'utf8')) as SimRankResult);
  }
  return { ranks, exits: done };
}
