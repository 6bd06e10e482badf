// `wavebus bench <name>`: runs bench/<name>.ts (built to dist/bench/<name>.js) and prints its
// result as one JSON line. Benchmarks compare against a baseline measured in the same run.
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import type { CommandModule } from 'yargs';
import { ConfigError } from '../errors';
import { benchHelp, parseBenchFlags, type BenchModule } from '../../bench/lib/flags';

function benchDir(): string {
  // dist/src/commands -> dist/bench ; src/commands (ts-jest) -> bench
  return path.resolve(__dirname, '..', '..', 'bench');
}

export function listBenches(): string[] {
  const ext = path.extname(__filename);
  if (!fs.existsSync(benchDir())) return [];
  return fs
    .readdirSync(benchDir())
    .filter((f) => f.endsWith(ext) && !f.endsWith('.d.ts'))
    .map((f) => f.slice(0, -ext.length))
    .sort();
}

function loadBench(name: string): BenchModule {
  const names = listBenches();
  if (!names.includes(name)) {
    throw new ConfigError(`unknown bench '${name}'; available: ${names.join(', ') || '(none built)'}`);
  }
  return require(path.join(benchDir(), name)) as BenchModule;
}

/** Runs bench `name` with its command-line flags, parsed and checked by the one bench flag parser. */
export async function runBench(name: string, argv: string[]): Promise<Record<string, unknown>> {
  const mod = loadBench(name);
  return mod.run(parseBenchFlags(name, mod.flags, argv));
}

const isHelp = (a: string) => a === '--help' || a === '-h';

/** `wavebus bench --help`: every bench with its one-line summary. */
function benchList(): string {
  const names = listBenches();
  const width = Math.max(...names.map((n) => n.length));
  const rows = names.map((n) => `  ${n.padEnd(width)}  ${loadBench(n).summary}`);
  return [
    'wavebus bench <name> [flags]',
    '',
    'Run a benchmark and print its result as one JSON line (with the commit, date and load it ran at).',
    '`wavebus bench <name> --help` lists the flags of one; `wavebus bench all [--json]` runs every one in turn with its defaults.',
    '',
    'Benchmarks:',
    ...rows,
    '',
  ].join('\n');
}

/** The commit this checkout is at (with "+dirty" when it has changes), or null outside git. */
function commitOf(dir: string): string | null {
  const head = spawnSync('git', ['-C', dir, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' });
  if (head.status !== 0) return null;
  const dirty = spawnSync('git', ['-C', dir, 'status', '--porcelain', '--untracked-files=no'], { encoding: 'utf8' });
  return head.stdout.trim() + (dirty.stdout.trim() ? '+dirty' : '');
}

const load = () => os.loadavg().map((x) => Math.round(x * 100) / 100);

/**
 * Where and when a figure came from, on every result line: docs must name the commit and date of
 * each figure, and the load average says how much the machine was shared while it ran.
 */
export function benchProvenance(started: Date, loadBefore: number[]): Record<string, unknown> {
  return {
    commit: commitOf(path.resolve(__dirname, '..', '..')),
    started: started.toISOString(),
    seconds: Math.round((Date.now() - started.getTime()) / 100) / 10,
    cpus: os.cpus().length,
    load_before: loadBefore,
    load_after: load(),
  };
}

export const command: CommandModule = {
  command: 'bench [name] [args..]',
  describe: 'Run a benchmark and print one JSON line; `wavebus bench --help` lists them, `wavebus bench <name> --help` its flags',
  // Help is the bench's own (yargs' would describe only `bench` itself), so every flag after the
  // name goes to the bench untouched and --help is answered here.
  builder: (y) =>
    y
      .help(false)
      .positional('name', { type: 'string', describe: 'benchmark name, or "all" for every one in turn' })
      .positional('args', { type: 'string', array: true, describe: "the benchmark's flags, e.g. --agents 8" })
      .strict(false)
      .parserConfiguration({ 'unknown-options-as-args': true }),
  handler: async (argv) => {
    const name = argv.name === undefined ? undefined : String(argv.name);
    const rest = ((argv.args as string[] | undefined) ?? []).map(String);
    // yargs still reads --help / -h into argv.help (its option is global), even with its help off.
    const help = argv.help === true || rest.some(isHelp);
    if (name === undefined || isHelp(name) || (name === 'all' && help)) {
      process.stdout.write(benchList());
      process.exit(0);
    }
    if (help) {
      process.stdout.write(benchHelp(name, loadBench(name)));
      process.exit(0);
    }
    if (name === 'all' && rest.some((a) => a !== '--json')) {
      throw new ConfigError(`bench all: takes only --json (every bench runs with its defaults), got ${JSON.stringify(rest.find((a) => a !== '--json'))}`);
    }
    const names = name === 'all' ? listBenches() : [name];
    for (const n of names) {
      const started = new Date();
      const loadBefore = load();
      const result = await runBench(n, rest);
      process.stdout.write(`${JSON.stringify({ bench: n, ...result, provenance: benchProvenance(started, loadBefore) })}\n`);
    }
    process.exit(0);
  },
};
