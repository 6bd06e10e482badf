// The `wavebus` command line. Each subcommand lives in src/commands/<name>.ts and exports
// CommandModule objects (`command`, plus e.g. hidden helpers); they are discovered here so that
// adding one touches one file.
import * as fs from 'fs';
import * as path from 'path';
import yargs, { CommandModule } from 'yargs';
import { WavebusError } from './errors';

function loadCommands(): CommandModule[] {
  const dir = path.join(__dirname, 'commands');
  const ext = path.extname(__filename); // .js when built, .ts under ts-jest
  return fs
    .readdirSync(dir)
    .filter((f) => f.endsWith(ext) && !f.endsWith('.d.ts'))
    .sort()
    .flatMap((f) => Object.values(require(path.join(dir, f)) as Record<string, unknown>))
    .filter((c): c is CommandModule => typeof c === 'object' && c !== null && 'command' in c && 'handler' in c);
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
    .fail((msg, err) => {
      if (err) {
        const code = err instanceof WavebusError ? ` [${err.code}]` : '';
        process.stderr.write(`wavebus: ${err.message}${code}\n`);
      } else {
        process.stderr.write(`wavebus: ${msg}\nRun with --help for usage.\n`);
      }
      process.exit(2);
    });
  for (const c of loadCommands()) parser.command(c);
  await parser.parseAsync();
}
