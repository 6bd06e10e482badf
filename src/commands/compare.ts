// `wavebus compare A B`: two captures tensor by tensor. Exit 0 when everything pairs up and is
// within tolerance, 1 when something differs, 2 on usage errors or unreadable inputs.
import { numberFlag } from './flags';
import type { CommandModule } from 'yargs';
import { compareCaptures, jsonSafe, type TensorComparison } from '../tools/compare';
import { writeHeatmap } from '../tools/heatmap';

const num = (v: number | undefined) => (v === undefined ? '-' : Number.isNaN(v) ? 'nan' : !Number.isFinite(v) ? 'inf' : v === 0 ? '0' : v.toPrecision(4));

function line(t: TensorComparison): string {
  switch (t.status) {
    case 'only_in_a':
      return `ONLY-A   ${t.key}  ${t.dtype_a}[${t.shape_a}]`;
    case 'only_in_b':
      return `ONLY-B   ${t.key}  ${t.dtype_b}[${t.shape_b}]`;
    case 'shape_mismatch':
      return `SHAPE    ${t.key}  [${t.shape_a}] vs [${t.shape_b}]`;
    default: {
      const dt = t.dtype_a === t.dtype_b ? `${t.dtype_a}` : `${t.dtype_a}/${t.dtype_b}`;
      const tag = t.status === 'differs' ? 'DIFFERS ' : t.status === 'within_tolerance' ? 'CLOSE   ' : 'EQUAL   ';
      const first = t.first_diff_index ? `  first [${t.first_diff_index.join(', ')}]: ${num(t.first_diff_values?.[0])} vs ${num(t.first_diff_values?.[1])}` : '';
      const nan = t.nan_mismatched ? `  nan_mismatched=${t.nan_mismatched}` : '';
      return `${tag} ${t.key}  ${dt}[${t.shape_a}]  max_abs=${num(t.max_abs_diff)}  max_rel=${num(t.max_rel_diff)}  mismatched=${t.mismatched}/${t.numel}${nan}${first}`;
    }
  }
}

export const command: CommandModule = {
  command: 'compare <a> <b>',
  describe: 'Compare two captures (snapshot calls, KV dumps, rank dirs, tensor files) tensor by tensor',
  builder: (y) =>
    y
      .positional('a', { type: 'string', demandOption: true, describe: 'first capture: a tensor file, a bundle dir or a tree' })
      .positional('b', { type: 'string', demandOption: true, describe: 'second capture' })
      .option('atol', { type: 'string', default: '0', describe: 'absolute tolerance' })
      .option('rtol', { type: 'string', default: '0', describe: 'relative tolerance: |a-b| <= atol + rtol*|b| (numpy.isclose)' })
      .option('assemble-tp', { type: 'boolean', default: false, describe: 'join KV dump TP shards along the head dim (tp_rank order) before comparing' })
      .option('json', { type: 'boolean', default: false, describe: 'print one JSON document' })
      .option('all', { type: 'boolean', default: false, describe: 'list equal tensors too' })
      .option('heatmap', { type: 'string', describe: 'write a heatmap: FILE.png or FILE.html (rows: tensors, columns: heads)' }),
  handler: (argv) => {
    const tol = (flag: string, raw: unknown): number => {
      try {
        return numberFlag(raw, `--${flag}`, 0);
      } catch (e) {
        process.stderr.write(`wavebus compare: ${(e as Error).message}\n`);
        process.exit(2);
      }
    };
    const atol = tol('atol', argv.atol);
    const rtol = tol('rtol', argv.rtol);
    const heatmap = argv.heatmap as string | undefined;
    if (heatmap !== undefined && !/\.(png|html?)$/.test(heatmap)) {
      process.stderr.write(`wavebus compare: --heatmap: ${JSON.stringify(heatmap)}: expected a .png or .html file name\n`);
      process.exit(2);
    }
    let r;
    try {
      r = compareCaptures(String(argv.a), String(argv.b), { atol, rtol, assembleTp: Boolean(argv['assemble-tp']) });
    } catch (e) {
      process.stderr.write(`wavebus compare: ${(e as Error).message}\n`);
      process.exit(2);
    }
    if (r.tensors.length === 0) {
      process.stderr.write(`wavebus compare: no tensors found in ${r.a} or ${r.b}\n`);
      process.exit(2);
    }
    if (heatmap) writeHeatmap(heatmap, r);
    if (argv.json) {
      process.stdout.write(`${JSON.stringify(jsonSafe(r), null, 2)}\n`);
    } else {
      for (const t of r.tensors) if (argv.all || t.status !== 'equal') process.stdout.write(`${line(t)}\n`);
      const s = r.summary;
      process.stdout.write(
        `${r.tensors.length} tensor(s): ${s.equal} equal, ${s.within_tolerance} within tolerance, ${s.differs} differ, ${s.shape_mismatch} shape mismatch, ${s.only_in_a} only in A, ${s.only_in_b} only in B${heatmap ? `; heatmap: ${heatmap}` : ''}\n`,
      );
    }
    process.exit(r.ok ? 0 : 1);
  },
};
