// `wavebus demo`: the whole product on one machine, on loopback, in well under a minute.
import type { CommandModule } from 'yargs';
import { runDemo } from '../tools/demo';
import { parseBusPort } from '../bus/endpoints';
import { intFlag } from './flags';
import { DEFAULT_TENSOR_FORMAT, TENSOR_FORMATS, type TensorFormat } from '../artifacts/tensor-format';


export const command: CommandModule = {
  command: 'demo',
  describe: 'Run a simulated TP job with faults injected, then check and summarise every artifact',
  builder: (y) =>
    y
      .option('out', { type: 'string', default: 'wavebus-demo', describe: 'everything goes under it: DIR/runtime/..., DIR/snapshots/...' })
      .option('tp', { type: 'string', default: '4' })
      .option('pp', { type: 'string', default: '1' })
      .option('dp', { type: 'string', default: '1' })
      .option('hosts', { type: 'string', default: '1', describe: 'simulated hosts (one `wavebus launch` each)' })
      .option('steps', { type: 'string', default: '100' })
      .option('format', { choices: TENSOR_FORMATS, default: DEFAULT_TENSOR_FORMAT, describe: 'KV dump and snapshot format' })
      .option('runtime-config', { type: 'string', describe: 'use this runtime_config.json instead of the demo one' })
      .option('port', { type: 'string', describe: 'bus base port (default: a free one)' })
      .option('engine', { choices: ['sim', 'torch', 'transformers'] as const, default: 'sim' as const, describe: "sim: the simulator; torch: examples/torch-engine, a real TP transformer (torch 2.x's torchrun from the torch 2.x venv, else python3-torch with a torchrun stand-in); transformers: Hugging Face transformers' continuous batching under torchrun (the torch 2.x venv)" }),
  handler: async (argv) => {
    const res = await runDemo({
      out: String(argv.out),
      tp: intFlag(argv.tp, '--tp', 1),
      pp: intFlag(argv.pp, '--pp', 1),
      dp: intFlag(argv.dp, '--dp', 1),
      hosts: intFlag(argv.hosts, '--hosts', 1),
      steps: intFlag(argv.steps, '--steps', 40),
      format: argv.format as TensorFormat,
      runtimeConfig: argv['runtime-config'] as string | undefined,
      port: argv.port === undefined ? undefined : parseBusPort(argv.port, '--port'),
      engine: argv.engine as 'sim' | 'torch' | 'transformers',
    });
    process.exit(res.ok ? 0 : 1);
  },
};
