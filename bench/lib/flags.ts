// The one parser of every bench's flags (`wavebus bench <name> [flags]`). Each bench module
// exports `summary`, `flags` (this record) and `run(args)` taking what parseBenchFlags returns,
// so the command line prints a bench's help without running it, refuses an unknown flag or a
// stray word naming it, and checks numbers through src/commands/flags.ts like every command.
import yargs from 'yargs';
import { ConfigError } from '../../src/errors';
import { intFlag, lastOf, nonEmpty, numberFlag } from '../../src/commands/flags';

export interface BenchFlag {
  /** int: plain decimal digits; number: a decimal (fractions, exponents). */
  type: 'int' | 'number' | 'string' | 'boolean';
  default?: number | string | boolean;
  describe: string;
  /** Bounds of int and number flags (default: int >= 1, number >= 0). */
  min?: number;
  max?: number;
  /** The values a string flag takes. */
  choices?: readonly string[];
}
export type BenchFlags = Record<string, BenchFlag>;

type ValueOf<T extends BenchFlag> = T['type'] extends 'int' | 'number' ? number : T['type'] extends 'boolean' ? boolean : string;
/** A bench's parsed flags: a flag without a default is undefined when not given. */
export type BenchArgs<F extends BenchFlags> = {
  [K in keyof F]: F[K] extends { default: number | string | boolean } ? ValueOf<F[K]> : ValueOf<F[K]> | undefined;
} & { json: boolean };

export interface BenchModule<F extends BenchFlags = BenchFlags> {
  summary: string;
  flags: F;
  run(args: BenchArgs<F>): Promise<Record<string, unknown>>;
}

/** Taken by every bench: the result is always one JSON line; `wavebus bench all --json` passes it on. */
const COMMON: BenchFlags = {
  json: { type: 'boolean', default: true, describe: 'print the result as one JSON line (always; taken so that every bench has the same command line)' },
};

export function parseBenchFlags<F extends BenchFlags>(bench: string, flags: F, argv: string[]): BenchArgs<F> {
  const all: BenchFlags = { ...COMMON, ...flags };
  const y = yargs(argv)
    .help(false)
    .version(false)
    .strict()
    .exitProcess(false)
    .parserConfiguration({ 'camel-case-expansion': false })
    .fail((msg, err) => {
      throw err ?? new ConfigError(`bench ${bench}: ${asGiven(msg, argv)} (\`wavebus bench ${bench} --help\` lists its flags)`);
    });
  // Numbers are read as text and checked here: yargs' own number type takes "1e3", "0x10", "" (NaN).
  for (const [k, f] of Object.entries(all)) y.option(k, { type: f.type === 'boolean' ? 'boolean' : 'string' });
  const a = y.parseSync() as Record<string, unknown> & { _: unknown[] };
  if (a._.length > 0) throw new ConfigError(`bench ${bench}: unexpected argument ${JSON.stringify(String(a._[0]))} (flags only; \`wavebus bench ${bench} --help\` lists them)`);
  try {
    return valuesOf(all, a) as BenchArgs<F>;
  } catch (e) {
    throw e instanceof ConfigError ? new ConfigError(`bench ${bench}: ${e.message}`, e.code) : e;
  }
}

/**
 * yargs names an unknown flag without its dashes, and `--no-x` as `x`: quote each one as it was
 * typed, so the message shows what to correct.
 */
function asGiven(msg: string, argv: string[]): string {
  const m = /^Unknown arguments?: (.+)$/.exec(msg);
  if (!m) return msg;
  const typed = m[1].split(', ').map((name) => {
    const t = argv.find((a) => [`--${name}`, `--no-${name}`, `-${name}`].includes(a.split('=')[0]));
    return t ? t.split('=')[0] : name;
  });
  return `unknown flag${typed.length > 1 ? 's' : ''} ${typed.join(', ')}`;
}

function valuesOf(all: BenchFlags, a: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, f] of Object.entries(all)) {
    const raw = lastOf(a[k]);
    const flag = `--${k}`;
    if (raw === undefined) out[k] = f.default;
    else if (f.type === 'int') out[k] = intFlag(raw, flag, f.min ?? 1, f.max);
    else if (f.type === 'number') out[k] = numberFlag(raw, flag, f.min ?? 0, f.max);
    else if (f.type === 'boolean') out[k] = Boolean(raw);
    else {
      const s = nonEmpty(raw, flag);
      if (f.choices && !f.choices.includes(s)) throw new ConfigError(`${flag}: expected one of ${f.choices.join(', ')}, got ${JSON.stringify(s)}`);
      out[k] = s;
    }
  }
  return out;
}

/** `wavebus bench <name> --help`: the bench's summary and every flag with its default. */
export function benchHelp(bench: string, mod: Pick<BenchModule, 'summary' | 'flags'>): string {
  const rows = Object.entries({ ...mod.flags, ...COMMON }).map(([k, f]) => {
    const name = f.type === 'boolean' ? (f.default === true ? `--${k} / --no-${k}` : `--${k}`) : `--${k} <${f.choices ? f.choices.join('|') : f.type}>`;
    const def = f.default === undefined ? '' : ` (default: ${JSON.stringify(f.default)})`;
    return [name, `${f.describe}${def}`];
  });
  const w = Math.max(...rows.map(([n]) => n.length));
  return [`wavebus bench ${bench} [flags]`, '', mod.summary, '', 'Flags:', ...rows.map(([n, d]) => `  ${n.padEnd(w)}  ${d}`), ''].join('\n');
}
