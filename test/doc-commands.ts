// The command lines shown in README.md and docs/*.md, for test/doc-commands.test.ts: every line
// of a `sh` / `bash` / `shell` code block, and the `$ ` lines of a `console` block, with `\`
// continuations joined and `# comments` dropped; and the PATH they run with, set up as the README says.
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';

export interface DocCommand {
  /** The command as one line: continuations joined, blanks collapsed, no trailing comment. */
  text: string;
  /** Where it starts: `docs/x.md:12`. */
  where: string;
  file: string;
}

const SHELL = new Set(['sh', 'bash', 'shell', 'console']);
/** First words that make a line of an untagged block a command (such a block must be tagged). */
export const COMMAND_WORDS = /^(\$ )?(sudo |[A-Z_]+=\S* )*(wavebus|npx|npm|node|python3?|bash|sbatch|srun|torchrun)\s/;

/**
 * The line without its `# comment` (a `#` at the start or after a blank, outside quotes), and the
 * quote still open at its end (a quoted argument may run over several lines).
 */
function stripComment(line: string, openQuote: string | null): { text: string; quote: string | null } {
  let quote = openQuote;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quote) {
      if (c === quote) quote = null;
    } else if (c === "'" || c === '"') {
      quote = c;
    } else if (c === '#' && (i === 0 || /\s/.test(line[i - 1]))) {
      return { text: line.slice(0, i), quote };
    }
  }
  return { text: line, quote };
}

export interface Block {
  lang: string;
  file: string;
  startLine: number; // 1-based line of the first line inside the block
  lines: string[];
}

export function docFiles(root: string): string[] {
  const docs = fs.readdirSync(path.join(root, 'docs')).filter((f) => f.endsWith('.md')).sort();
  return ['README.md', ...docs.map((f) => `docs/${f}`)];
}

export function blocks(root: string, file: string): Block[] {
  const lines = fs.readFileSync(path.join(root, file), 'utf8').split('\n');
  const out: Block[] = [];
  let open: Block | null = null;
  lines.forEach((line, i) => {
    const fence = /^\s*```(\S*)/.exec(line);
    if (fence) {
      if (open) {
        out.push(open);
        open = null;
      } else {
        open = { lang: fence[1], file, startLine: i + 2, lines: [] };
      }
      return;
    }
    open?.lines.push(line);
  });
  return out;
}

export function commandsOf(block: Block): DocCommand[] {
  if (!SHELL.has(block.lang)) return [];
  const out: DocCommand[] = [];
  let acc = '';
  let quote: string | null = null;
  let start = 0;
  block.lines.forEach((raw, i) => {
    let line = raw;
    if (block.lang === 'console' && acc === '') {
      if (!line.startsWith('$ ')) return; // output
      line = line.slice(2);
    }
    const stripped = stripComment(line, quote);
    line = stripped.text.trimEnd();
    quote = stripped.quote;
    if (acc === '') {
      if (line.trim() === '') return;
      start = block.startLine + i;
    }
    if (quote !== null) {
      acc += line + ' '; // inside a quoted argument: the command goes on
      return;
    }
    if (line.endsWith('\\')) {
      acc += line.slice(0, -1) + ' ';
      return;
    }
    acc += line;
    out.push({ text: acc.trim().replace(/\s+/g, ' '), where: `${block.file}:${start}`, file: block.file });
    acc = '';
  });
  if (acc !== '') out.push({ text: acc.trim().replace(/\s+/g, ' '), where: `${block.file}:${start}`, file: block.file });
  return out;
}

/** Every command of every doc, in order. */
export function docCommands(root: string): DocCommand[] {
  return docFiles(root).flatMap((f) => blocks(root, f).flatMap(commandsOf));
}

/** Shell words, quotes removed (enough for the docs: no escapes inside quotes). */
export function words(text: string): string[] {
  const out: string[] = [];
  const re = /'([^']*)'|"([^"]*)"|(\S+)/g;
  let m: RegExpExecArray | null;
  while ((m = re.exec(text))) out.push(m[1] ?? m[2] ?? m[3]);
  return out;
}

export interface WavebusCall {
  /** The subcommand (`bench` calls: `bench <name>` when a name is given). */
  command: string[];
  /** Every `--flag` named before a bare `--` (synopsis brackets and `|` choices stripped). */
  flags: string[];
}

/**
 * The wavebus invocations in a command line: `wavebus X`, `npx wavebus X`, `node bin/wavebus.js X`,
 * after any `VAR=value` and `sudo`, in each part of `&&`, `|` and `>`.
 */
export function wavebusCalls(text: string): WavebusCall[] {
  const parts: string[][] = [[]];
  for (const w of words(text)) {
    if (w === '&&' || w === '|' || w === '||' || w === ';') parts.push([]);
    else parts[parts.length - 1].push(w);
  }
  const out: WavebusCall[] = [];
  for (let p of parts) {
    while (p.length > 0 && (/^[A-Z_][A-Z0-9_]*=/.test(p[0]) || p[0] === 'sudo')) p = p.slice(1);
    let i: number;
    if (p[0] === 'wavebus') i = 1;
    else if (p[0] === 'npx' && p[1] === 'wavebus') i = 2;
    else if (p[0] === 'node' && p[1] === 'bin/wavebus.js') i = 2;
    else continue;
    const rest = p.slice(i);
    const end = rest.findIndex((w) => w === '--' || w === '>' || w.startsWith('>'));
    const own = end < 0 ? rest : rest.slice(0, end);
    const command = [own[0] ?? ''];
    if (own[0] === 'bench' && own[1] && !own[1].startsWith('-') && !own[1].startsWith('<')) command.push(own[1]);
    const flags = own.flatMap((w) => w.match(/(?<![\w-])--[a-z][a-z0-9-]*/g) ?? []);
    out.push({ command, flags: [...new Set(flags)] });
  }
  return out;
}

/** The flags a `--help` text lists (yargs: `--name`, and `--no-name` for booleans is implied). */
export function helpFlags(help: string): Set<string> {
  return new Set(help.match(/(?<![\w-])--[a-z][a-z0-9-]*/g) ?? []);
}

/**
 * The PATH a reader has after the README's set-up (`npm install && npm link`): `npm link` in the
 * clone, here into a global prefix under `dir` (npm_config_prefix, never the machine's), so that
 * `wavebus` is `<dir>/bin/wavebus` -> `<dir>/lib/node_modules/wavebus` -> the clone, as npm's
 * global bin would hold it. `--ignore-scripts`: the build `npm link` repeats is `npm install`'s,
 * already done (npm test's pretest rebuilds dist/), and rebuilding build/ under a running suite
 * would pull the addon from under other tests. The link's bin comes first: a `wavebus` elsewhere on
 * `inherited` (a global install) is never the one a command finds.
 */
export function readerPath(root: string, dir: string, inherited: string): string {
  const env = { ...process.env, npm_config_prefix: dir, npm_config_cache: path.join(dir, 'npm-cache'), npm_config_logs_dir: path.join(dir, 'npm-logs') };
  const r = spawnSync('npm', ['link', '--ignore-scripts', '--offline', '--no-audit', '--no-fund'], { cwd: root, env, encoding: 'utf8', timeout: 60000 });
  if (r.status !== 0) throw new Error(`npm link (prefix ${dir}) failed: ${r.stdout}${r.stderr}`);
  return `${path.join(dir, 'bin')}:${inherited}`;
}
