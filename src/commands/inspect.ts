// `wavebus inspect DIR`: list the bundles under DIR, verify them, exit non-zero on any problem.
import type { CommandModule } from 'yargs';
import { inspectTree } from '../tools/inspect';

export const command: CommandModule = {
  command: 'inspect <dir>',
  describe: 'List bundles (KV dumps, snapshots, dump waves, aggregates) under DIR; --verify checks every checksum; exits 1 on any missing rank or file, or corruption',
  builder: (y) =>
    y
      .positional('dir', { type: 'string', demandOption: true })
      .option('verify', { type: 'boolean', default: false, describe: 'recompute every file checksum' })
      .option('json', { type: 'boolean', default: false, describe: 'print one JSON document' }),
  handler: (argv) => {
    const r = inspectTree(String(argv.dir), { verify: Boolean(argv.verify) });
    if (argv.json) {
      process.stdout.write(`${JSON.stringify(r, null, 2)}\n`);
    } else {
      for (const b of r.bundles) {
        const dtypes = b.dtypes.join(',');
        const shapes = [...new Set(b.tensors.map((t) => `[${t.shape.join(',')}]`))].slice(0, 3).join(' ');
        process.stdout.write(`${b.kind.padEnd(10)} ${b.dir}  ranks=${b.ranks.join(',') || '-'}  files=${b.files.length}  bytes=${b.bytes}${dtypes ? `  dtypes=${dtypes}` : ''}${shapes ? `  shapes=${shapes}` : ''}${b.problems.length ? '  PROBLEM' : ''}\n`);
      }
      for (const i of r.incomplete) process.stdout.write(`incomplete ${i} (a writer was interrupted; never under a final name)\n`);
      const bad = r.bundles.filter((b) => b.problems.length > 0).length;
      if (bad > 0) process.stdout.write(`${bad} bundle(s) with problems\n`);
      for (const p of r.problems) process.stderr.write(`wavebus inspect: ${p}\n`);
      process.stdout.write(`${r.bundles.length} bundle(s), ${r.problems.length} problem(s)\n`);
    }
    process.exit(r.problems.length > 0 ? 1 : 0);
  },
};
