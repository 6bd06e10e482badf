// `wavebus bisect A B`: the first module where probe tree A leaves reference B. Exit 0 when no
// module is out of tolerance, 1 when one is, 2 on bad input (a missing rank, a module on one side
// only, a bad flag: named) or when --out cannot be written.
import * as path from 'path';
import type { CommandModule } from 'yargs';
import { ConfigError } from '../errors';
import { writeFileAtomic, artifactWrite } from '../artifacts/atomic-write';
import { DEFAULT_ARTIFACT_MODES } from '../artifacts/artifact-mode';
import { intFlag, nonEmpty, numberFlag } from './flags';
import { bisect, formatBisect } from '../tools/bisect';
import { DEFAULT_TOLERANCES, type TolClass, type Tolerance } from '../tools/bisect-compare';
import { jsonSafe } from '../tools/compare';

const CLASSES: Record<string, TolClass> = {
  fp32: 'fp32', float32: 'fp32', fp64: 'fp32', float64: 'fp32',
  bf16: 'bf16', bfloat16: 'bf16',
  fp16: 'fp16', float16: 'fp16',
  fp8: 'fp8', float8_e4m3fn: 'fp8', float8_e5m2: 'fp8',
};

/** `--tol DTYPE=ATOL,RTOL` (repeatable): a dtype class's tolerances, numbers through the project's parser. */
export function parseTolerances(raw: unknown): Partial<Record<TolClass, Tolerance>> {
  const items = raw === undefined ? [] : Array.isArray(raw) ? raw : [raw];
  const out: Partial<Record<TolClass, Tolerance>> = {};
  for (const item of items) {
    const m = /^([a-z0-9_]+)=([^,]*),([^,]*)$/.exec(String(item).trim());
    const cls = m ? CLASSES[m[1]] : undefined;
    if (!m || !cls) {
      throw new ConfigError(`--tol: expected DTYPE=ATOL,RTOL with DTYPE one of fp32, bf16, fp16, fp8 (or float32, bfloat16, float16, float8_e4m3fn, float8_e5m2), got ${JSON.stringify(item)}`);
    }
    out[cls] = { atol: numberFlag(m[2], `--tol ${m[1]} atol`, 0), rtol: numberFlag(m[3], `--tol ${m[1]} rtol`, 0) };
  }
  return out;
}

/** `--out FILE.json`: a name without .json is a slip (a path meant for something else), refused as `wavebus trace` does. */
function outFlag(raw: unknown): string {
  const out = nonEmpty(raw, '--out');
  if (!/\.json$/.test(out)) throw new ConfigError(`--out ${JSON.stringify(out.slice(0, 200))}: expected a .json file name`);
  return path.resolve(out);
}

const defaults = Object.entries(DEFAULT_TOLERANCES).map(([k, t]) => `${k}=${t.atol},${t.rtol}`).join(' ');

export const command: CommandModule = {
  command: 'bisect <a> <b>',
  describe: 'First module where probe tree A (replay.py --probe) leaves reference B: TP shards assembled, per-dtype tolerances, NaN provenance',
  builder: (y) =>
    y
      .positional('a', { type: 'string', demandOption: true, describe: 'probe tree under test (rank<g>/call<N>/ bundles), e.g. the TP=N replay' })
      .positional('b', { type: 'string', demandOption: true, describe: 'reference probe tree, e.g. the TP=1 replay' })
      .option('tol', { type: 'string', array: true, nargs: 1, describe: `DTYPE=ATOL,RTOL, repeatable; |a-b| <= atol + rtol*|b|; defaults ${defaults}` })
      .option('call', { type: 'string', describe: 'the call index to compare when a tree holds several' })
      .option('json', { type: 'boolean', default: false, describe: 'print one JSON document' })
      .option('out', { type: 'string', describe: 'also write the --json document to FILE.json (whole, 0640); <tree>/bisect/<name>.json puts it on `wavebus report <tree>`' }),
  handler: async (argv) => {
    const fail = (e: unknown) => {
      process.stderr.write(`wavebus bisect: ${(e as Error).message}\n`);
      process.exit(2);
    };
    let opts;
    let out: string | undefined;
    try {
      opts = { tolerances: parseTolerances(argv.tol), call: argv.call === undefined ? undefined : intFlag(argv.call, '--call', 0) };
      out = argv.out === undefined ? undefined : outFlag(argv.out);
    } catch (e) {
      return fail(e);
    }
    let r;
    try {
      r = await bisect(String(argv.a), String(argv.b), opts);
    } catch (e) {
      return fail(e);
    }
    const doc = `${JSON.stringify(jsonSafe(r), null, 2)}\n`;
    if (out !== undefined) {
      try {
        // Whole or not at all (a report reading the tree meanwhile never sees half); missing
        // folders (<tree>/bisect/) are made with the artifacts' directory mode.
        writeFileAtomic(out, doc, artifactWrite(DEFAULT_ARTIFACT_MODES));
      } catch (e) {
        return fail(new Error(`--out ${JSON.stringify(out)}: ${(e as Error).message}`));
      }
    }
    process.stdout.write(argv.json ? doc : formatBisect(r));
    process.exit(r.ok ? 0 : 1);
  },
};
