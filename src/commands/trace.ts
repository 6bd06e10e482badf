// `wavebus trace DIR -o job.trace.json`: a Chrome trace event file of a tree (docs/report.md).
import * as path from 'path';
import type { CommandModule } from 'yargs';
import { writeTrace } from '../tools/trace';

export const command: CommandModule = {
  command: 'trace <dir>',
  describe: 'Write a Chrome trace event file (Perfetto, chrome://tracing) of a tree: a track per rank with waves, waits, late vectors, dumps, captures and incidents; the coordinator\'s config changes',
  builder: (y) =>
    y
      .positional('dir', { type: 'string', demandOption: true, describe: 'an aggregated tree, a runtime dir, or the demo output' })
      .option('out', { alias: 'o', type: 'string', default: 'job.trace.json', describe: 'the trace file to write' }),
  handler: (argv) => {
    const out = String(argv.out);
    // A trace is JSON: a name without .json is a slip (a path meant for something else), refused.
    if (!/\.json$/.test(out)) {
      process.stderr.write(`wavebus trace: --out ${JSON.stringify(out.slice(0, 200))}: expected a .json file name\n`);
      process.exit(2);
    }
    let r;
    try {
      r = writeTrace(String(argv.dir), out);
    } catch (e) {
      process.stderr.write(`wavebus trace: ${(e as Error).message}\n`);
      process.exit(2);
    }
    for (const s of r.skipped) process.stderr.write(`wavebus trace: skipped ${s}\n`);
    if (r.ranks === 0) process.stderr.write(`wavebus trace: no rank timeline (timeline/rank<g>.json) under ${String(argv.dir)}: the trace has incidents and config changes only\n`);
    process.stdout.write(`${path.resolve(r.file)}: ${r.events} events, ${r.ranks} rank(s)\n`);
  },
};
