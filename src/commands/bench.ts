// `wavebus bench <name>`: runs bench/<name>.ts (built to dist/bench/<name>.js) and prints its
// result as one JSON line. Benchmarks compare against a baseline measured in the same run.
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import type { CommandModule } from 'yargs';
import { ConfigError } from '../errors';

interface BenchModule {
  run(argv: string[]): Promise<Record<string, unknown>>;
}

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

export async function runBench(name: string, argv: string[]): Promise<Record<string, unknown>> {
  const names = listBenches();
  if (!names.includes(name)) {
    throw new ConfigError(`unknown bench '${name}'; available: ${names.join(', ') || '(none built)'}`);
  }
  const mod = require(path.join(benchDir(), name)) as BenchModule;
  return mod.run(argv);
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
  command: 'bench <name> [args..]',
  describe: 'Run a benchmark and print one JSON line (bus, dump, overhead, detectors, aggregate, soak, auth, all)',
  builder: (y) =>
    y
      .positional('name', { type: 'string', describe: 'benchmark name, or "all" for every one in turn' })
      .positional('args', { type: 'string', array: true, describe: 'options for the benchmark, e.g. --agents 8' })
      .strict(false)
      .parserConfiguration({ 'unknown-options-as-args': true }),
  handler: async (argv) => {
    const name = String(argv.name);
    const rest = ((argv.args as string[] | undefined) ?? []).map(String);
    const names = name === 'all' ? listBenches() : [name];
    for (const n of names) {
      const started = new Date();
      const loadBefore = load();
      const result = await runBench(n, name === 'all' ? rest.filter((a) => a === '--json') : rest);
      process.stdout.write(`${JSON.stringify({ bench: n, ...result, provenance: benchProvenance(started, loadBefore) })}\n`);
    }
    process.exit(0);
  },
};
