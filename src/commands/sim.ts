// `wavebus sim`: the simulated multi-rank engine (run it under `wavebus launch`), and the hidden
// `wavebus sim-rank` that each of its rank processes runs.
import type { CommandModule } from 'yargs';
import { ConfigError } from '../errors';
import { parseFaults } from '../sim/faults';
import { runSimJob } from '../sim/job';
import { runSimRank, type SimRankOptions } from '../sim/rank';
import { flagOrEnv, intFlag, msFlag, nonEmpty } from './flags';


export const command: CommandModule = {
  command: 'sim',
  describe: 'Run the simulated multi-rank engine on this host (start it under `wavebus launch`)',
  builder: (y) =>
    y
      .option('nproc-per-node', { type: 'string', describe: 'ranks on this host (default $WAVEBUS_NPROC_PER_NODE or 1)' })
      .option('nnodes', { type: 'string', describe: 'hosts in the job (default $WAVEBUS_NNODES or 1)' })
      .option('node-rank', { type: 'string', describe: 'this host (default $WAVEBUS_NODE_RANK or 0)' })
      .option('steps', { type: 'string', default: '100', describe: 'engine steps (waves)' })
      .option('stop-file', { type: 'string', describe: 'stop stepping once this file exists (--steps is then at most)' })
      .option('step-times', { type: 'boolean', default: false, describe: 'write when each step ended (stepEndsAt in rank<g>.json)' })
      .option('step-ms', { type: 'string', default: '10', describe: 'wall time per step; 0 = as fast as possible' })
      .option('requests', { type: 'string', default: '8', describe: 'requests in the workload' })
      .option('speculative', { type: 'string', default: '2', describe: 'speculative tokens per step (0 = off)' })
      .option('layers', { type: 'string', default: '4' })
      .option('num-blocks', { type: 'string', default: '256' })
      .option('block-size', { type: 'string', default: '16' })
      .option('kv-heads', { type: 'string', default: '8', describe: 'KV heads in total (split over TP)' })
      .option('head-dim', { type: 'string', default: '64' })
      .option('dtype', { choices: ['bfloat16', 'float16', 'float32'] as const, default: 'bfloat16' as const })
      .option('faults', { type: 'string', describe: 'faults to inject: inline JSON or a file' })
      .option('compute-us', { type: 'string', default: '0', describe: 'busy CPU time per step standing in for the forward' })
      .option('forward-ms', { type: 'string', default: '0', describe: 'idle wait per step standing in for a forward on the accelerator' })
      .option('tp-lockstep', { type: 'boolean', default: true, describe: 'TP ranks step together, as the forward\'s all-reduce keeps a real TP group (--no-tp-lockstep: each rank alone)' })
      .option('detached', { type: 'boolean', default: false, describe: 'run without wavebus (a baseline)' })
      .option('weights', { type: 'boolean', default: false, describe: 'register synthetic weights (one shard per layer) for each rank\'s fingerprint (registerWeights)' })
      .option('start-at', { type: 'string', describe: 'wall-clock ms for step 1 (align hosts)' })
      .option('result-dir', { type: 'string', demandOption: true, describe: 'where each rank writes rank<g>.json' }),
  handler: async (argv) => {
    const env = process.env;
    // Each error names where the value came from: the flag, else the variable `wavebus launch` set.
    const from: Record<string, string> = {};
    const fromFlagOrEnv = (flag: string, v: unknown, name: string, def: number, min = 1): number => {
      const given = flagOrEnv(v, flag, env, name);
      from[flag] = given?.from ?? flag;
      return given ? intFlag(given.raw, given.from, min) : def;
    };
    const nproc = fromFlagOrEnv('--nproc-per-node', argv['nproc-per-node'], 'WAVEBUS_NPROC_PER_NODE', 1);
    const nnodes = fromFlagOrEnv('--nnodes', argv.nnodes, 'WAVEBUS_NNODES', 1);
    const nodeRank = fromFlagOrEnv('--node-rank', argv['node-rank'], 'WAVEBUS_NODE_RANK', 0, 0);
    if (nodeRank >= nnodes) throw new ConfigError(`${from['--node-rank']} ${nodeRank} must be < ${from['--nnodes']} ${nnodes}`);
    const res = await runSimJob({
      nnodes,
      nodeRank,
      nprocPerNode: nproc,
      masterAddr: env.MASTER_ADDR ?? '127.0.0.1',
      steps: intFlag(argv.steps, '--steps'),
      stopFile: argv['stop-file'] === undefined ? undefined : String(argv['stop-file']),
      stepTimes: argv['step-times'] === true,
      stepMs: msFlag(argv['step-ms'], '--step-ms', 0),
      requests: intFlag(argv.requests, '--requests'),
      speculative: intFlag(argv.speculative, '--speculative', 0),
      geometry: {
        layers: intFlag(argv.layers, '--layers'),
        numBlocks: intFlag(argv['num-blocks'], '--num-blocks'),
        blockSize: intFlag(argv['block-size'], '--block-size'),
        totalKvHeads: intFlag(argv['kv-heads'], '--kv-heads'),
        headDim: intFlag(argv['head-dim'], '--head-dim'),
        dtype: argv.dtype as 'bfloat16',
      },
      faults: parseFaults(argv.faults as string | undefined),
      resultDir: nonEmpty(argv['result-dir'], '--result-dir'),
      startAt: argv['start-at'] === undefined ? undefined : intFlag(argv['start-at'], '--start-at', 0),
      computeUs: intFlag(argv['compute-us'], '--compute-us', 0),
      forwardMs: msFlag(argv['forward-ms'], '--forward-ms', 0),
      detached: Boolean(argv.detached),
      weights: argv.weights === true,
      tpLockstep: argv['tp-lockstep'] !== false,
    });
    const failed = res.exits.filter((e) => e.code !== 0);
    process.stdout.write(`${JSON.stringify({ ranks: res.ranks.length, failed })}\n`);
    process.exit(failed.length > 0 ? 1 : 0);
  },
};

/** Hidden: one rank of `wavebus sim`, forked with an IPC channel for the start barrier. */
export const rankCommand: CommandModule = {
  command: 'sim-rank',
  describe: false,
  builder: (y) => y.option('options', { type: 'string', demandOption: true }),
  handler: async (argv) => {
    const opts = JSON.parse(String(argv.options)) as SimRankOptions;
    // The job that forked us is gone (killed, SIGKILL included): stop too, and unlink our
    // segment on the way out (runSimRank's exit handler) instead of running on as an orphan.
    process.on('disconnect', () => {
      process.stderr.write('sim rank: the sim job is gone; exiting\n');
      process.exit(1);
    });
    await runSimRank(opts, () =>
      new Promise<number | undefined>((resolve) => {
        if (!process.send) return resolve(undefined);
        process.once('message', (m: any) => resolve(typeof m?.go === 'number' ? m.go : undefined));
        process.send({ ready: true });
      }),
    );
    process.exit(0);
  },
};
