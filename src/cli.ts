// The `wavebus` command line. Each subcommand lives in src/commands/<name>.ts and exports
// CommandModule objects (`command`, plus e.g. hidden helpers); they are discovered here so that
// adding one touches one file.
import * as fs from 'fs';
import * as path from 'path';
import yargs, { CommandModule } from 'yargs';
import { ConfigError, WavebusError } from './errors';

const commandsIn = (file: string): CommandModule[] =>
  Object.values(require(file) as Record<string, unknown>).filter((c): c is CommandModule => typeof c === 'object' && c !== null && 'command' in c && 'handler' in c);

/** A command's name: the first word of its `command` string ('bench <name> [args..]' → 'bench'). */
const nameOf = (c: CommandModule): string => String(c.command).split(' ')[0];

/**
 * The commands to register. Loading every command's modules (the agent, the coordinator, the
 * guard, the simulator) costs a large part of a short command's run, so when the first word
 * names a command file that defines it (`wavebus aggregate` → commands/aggregate), only that
 * file is loaded; anything else (--help, a typo, a command of another file) loads them all.
 */
function loadCommands(first: string | undefined): CommandModule[] {
  const dir = path.join(__dirname, 'commands');
  const ext = path.extname(__filename); // .js when built, .ts under ts-jest
  if (first !== undefined && /^[a-z][a-z-]*$/.test(first)) {
    const file = path.join(dir, `${first}${ext}`);
    if (fs.existsSync(file)) {
      const mine = commandsIn(file);
      if (mine.some((c) => nameOf(c) === first)) return mine;
    }
  }
  return fs
    .readdirSync(dir)
    .filter((f) => f.endsWith(ext) && !f.endsWith('.d.ts'))
    .sort()
    .flatMap((f) => commandsIn(path.join(dir, f)));
}

/** How every command-line error ends: one line naming what was wrong, exit 2. */
function fail(msg: string | null, err?: Error): never {
  if (err) {
    const code = err instanceof WavebusError ? ` [${err.code}]` : '';
    process.stderr.write(`wavebus: ${err.message}${code}\n`);
  } else {
    process.stderr.write(`wavebus: ${msg}\nRun with --help for usage.\n`);
  }
  process.exit(2);
}

export async function main(argv: string[]): Promise<void> {
  const parser = yargs(argv)
    .scriptName('wavebus')
    .usage('$0 <command> [options]\n\nDebugging sidecar for multi-host LLM inference jobs.')
    .strict()
    .demandCommand(1, 'Name a command; `wavebus --help` lists them.')
    .recommendCommands()
    .help()
    .alias('h', 'help')
    .wrap(Math.min(110, process.stdout.columns || 100))
    .fail(fail);
  // A flag given twice takes its last value, as in most CLIs (yargs would make an array of it and
  // hand a path-taking option a list). Only declared scalar options: arrays (--agent-arg),
  // positionals and the command after `--` keep every value.
  parser.middleware((args) => {
    const o = (parser as unknown as { getOptions(): Record<'array' | 'string' | 'number' | 'boolean', string[]> }).getOptions();
    const arrays = new Set(o.array);
    const camel = (k: string) => k.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());
    for (const k of [...o.string, ...o.number, ...o.boolean]) {
      const v = args[k];
      if (arrays.has(k) || !Array.isArray(v)) continue;
      const last = v[v.length - 1];
      for (const key of new Set([k, camel(k)])) if (Array.isArray(args[key])) args[key] = last;
    }
    // A switch given a value (--detached=0x10) is refused by name: yargs would read it as false.
    const switches = new Set(o.boolean);
    const end = argv.indexOf('--');
    for (const token of end < 0 ? argv : argv.slice(0, end)) {
      const m = /^--(?:no-)?([^=]+)=(.*)$/s.exec(token);
      if (m && switches.has(m[1]) && m[2] !== 'true' && m[2] !== 'false') {
        fail(null, new ConfigError(`--${m[1]}: a switch takes no value or =true / =false, got ${JSON.stringify(m[2].slice(0, 60))}`));
      }
    }
  }, true);
  for (const c of loadCommands(argv[0])) parser.command(c);
  await parser.parseAsync();
}
