// `wavebus report DIR [-o FILE.html]`: one self-contained page of a tree; `wavebus report
// --compare A B`: compare's difference table and heatmap as a page (docs/report.md). Exit 0 when
// everything verified (compare: within tolerance), 1 when the page shows failures, 2 on usage errors.
import * as path from 'path';
import type { CommandModule } from 'yargs';
import { numberFlag } from './flags';
import { writeReport } from '../tools/report';
import { writeComparePage } from '../tools/report/compare-page';
import { loadVocabulary } from '../tools/report/vocab';

function usage(msg: string): never {
  process.stderr.write(`wavebus report: ${msg}\n`);
  process.exit(2);
}

export const command: CommandModule = {
  command: 'report [dir]',
  describe: 'Write one self-contained HTML page of a tree (incidents, timeline, completeness, KV dumps, verification); --compare A B: a difference page',
  builder: (y) =>
    y
      .positional('dir', { type: 'string', describe: 'an aggregated tree, a runtime dir, or the demo output' })
      .option('out', { alias: 'o', type: 'string', describe: 'the page to write (default DIR/report.html; with --compare, compare-report.html)' })
      .option('compare', { type: 'string', array: true, describe: 'A B: two captures, as `wavebus compare A B`' })
      .option('vocab', { type: 'string', describe: 'token text: a JSON list of tokens, {"id": "token"}, or a tokenizer.json (shown only where report.save_sensitive_info kept ids)' })
      .option('atol', { type: 'string', default: '0', describe: 'with --compare: absolute tolerance' })
      .option('rtol', { type: 'string', default: '0', describe: 'with --compare: relative tolerance' })
      .option('assemble-tp', { type: 'boolean', default: false, describe: 'with --compare: join KV dump TP shards first' }),
  handler: (argv) => {
    const out = argv.out as string | undefined;
    if (out !== undefined && !/\.html?$/.test(out)) usage(`--out ${JSON.stringify(out.slice(0, 200))}: expected a .html file name`);
    const compare = argv.compare as string[] | undefined;
    if (compare !== undefined) {
      if (compare.length !== 2) usage(`--compare takes two captures (A B), got ${compare.length}`);
      if (argv.dir !== undefined) usage('give either DIR or --compare A B, not both');
      let r;
      try {
        r = writeComparePage(compare[0], compare[1], out ?? 'compare-report.html', { atol: numberFlag(argv.atol, '--atol', 0), rtol: numberFlag(argv.rtol, '--rtol', 0), assembleTp: Boolean(argv['assemble-tp']) });
      } catch (e) {
        usage((e as Error).message);
      }
      process.stdout.write(`${path.resolve(r.file)}\n`);
      process.exit(r.ok ? 0 : 1);
    }
    if (argv.dir === undefined) usage('name a DIR (or --compare A B)');
    const dir = String(argv.dir);
    let r;
    try {
      const vocab = argv.vocab === undefined ? undefined : loadVocabulary(String(argv.vocab));
      r = writeReport(dir, { out: out ?? path.join(dir, 'report.html'), vocab });
    } catch (e) {
      usage((e as Error).message);
    }
    for (const f of r.failures.slice(0, 20)) process.stderr.write(`wavebus report: ${f}\n`);
    if (r.failures.length > 20) process.stderr.write(`wavebus report: … ${r.failures.length - 20} more on the page\n`);
    process.stdout.write(`${r.file}\n`);
    process.exit(r.failures.length ? 1 : 0);
  },
};
