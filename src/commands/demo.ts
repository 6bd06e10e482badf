// `wavebus demo`: the whole product on one machine, on loopback, in well under a minute.
import type { CommandModule } from 'yargs';
import { runDemo } from '../tools/demo';
import { ConfigError } from '../errors';

function int(v: unknown, flag: string, min: number): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < min) throw new ConfigError(`${flag} must be an integer >= ${min}, got '${String(v)}'`);
  return n;
}

export const command: CommandModule = {
  command: 'demo',
  describe: 'Run a simulated TP job with faults injected, then check and summarise every artifact',
  builder: (y) =>
    y
      .option('out', { type: 'string', default: 'wavebus-demo', describe: 'everything goes under it: DIR/runtime/..., DIR/snapshots/...' })
      .option('tp', { type: 'number', default: 4 })
      .option('pp', { type: 'number', default: 1 })
      .option('dp', { type: 'number', default: 1 })
      .option('hosts', { type: 'number', default: 1, describe: 'simulated hosts (one `wavebus launch` each)' })
      .option('steps', { type: 'number', default: 100 })
      .option('format', { choices: ['pt', 'npy', 'safetensors'] as const, default: 'pt' as const, describe: 'KV dump and snapshot format' })
      .option('runtime-config', { type: 'string', describe: 'use this runtime_config.json instead of the demo one' })
      .option('port', { type: 'number', describe: 'bus base port (default: a free one)' })
      .option('engine', { choices: ['sim', 'torch'] as const, default: 'sim' as const, describe: 'sim: the simulator; torch: examples/torch-engine, a real TP transformer (python3-torch)' }),
  handler: async (argv) => {
    const res = await runDemo({
      out: String(argv.out),
      tp: int(argv.tp, '--tp', 1),
      pp: int(argv.pp, '--pp', 1),
      dp: int(argv.dp, '--dp', 1),
      hosts: int(argv.hosts, '--hosts', 1),
      steps: int(argv.steps, '--steps', 40),
      format: argv.format as 'pt',
      runtimeConfig: argv['runtime-config'] as string | undefined,
      port: argv.port as number | undefined,
      engine: argv.engine as 'sim' | 'torch',
    });
    process.exit(res.ok ? 0 : 1);
  },
};
