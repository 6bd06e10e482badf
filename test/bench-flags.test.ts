// `wavebus bench`'s flags, parsed for every bench by bench/lib/flags.ts: `bench --help` lists the
// benches, `bench <name> --help` prints that bench's own flags (from the flags it exports) and
// exits 0, an unknown flag or a stray word is refused naming it, a bad number is refused naming
// its flag, all before anything runs. The real CLI (dist/, built by tsc) is spawned; no bench runs.
import * as fs from 'fs';
import * as path from 'path';
import type { BenchFlags } from '../bench/lib/flags';
import { ROOT, runWavebus } from './helpers';

jest.setTimeout(120000);

const BENCHES = fs
  .readdirSync(path.join(ROOT, 'bench'))
  .filter((f) => f.endsWith('.ts'))
  .map((f) => f.slice(0, -3))
  .sort();
// eslint-disable-next-line @typescript-eslint/no-var-requires
const flagsOf = (b: string) => (require(path.join(ROOT, 'bench', b)) as { flags: BenchFlags }).flags;
// A regression that let a bench run instead of refusing fails on this timeout, not after minutes.
const bench = (args: string[]) => runWavebus(['bench', ...args], { timeout: 30000 });

test('every bench is found', () => {
  expect(BENCHES).toEqual(expect.arrayContaining(['aggregate', 'auth', 'bus', 'detectors', 'dump', 'fuzz', 'overhead', 'soak']));
});

test('bench --help lists every bench and exits 0', () => {
  for (const args of [['--help'], [], ['all', '--help']]) {
    const r = bench(args);
    expect({ args, code: r.code }).toEqual({ args, code: 0 });
    for (const b of BENCHES) expect(r.stdout).toMatch(new RegExp(`^  ${b} `, 'm'));
  }
});

describe.each(BENCHES)('bench %s', (b) => {
  const flags = flagsOf(b);

  test('--help prints every flag with its description and exits 0', () => {
    for (const help of b === 'auth' ? ['--help', '-h'] : ['--help']) {
      const r = bench([b, help]);
      expect(r.code).toBe(0);
      expect(r.stdout).toContain(`wavebus bench ${b} [flags]`);
      for (const [k, f] of Object.entries<BenchFlags[string] | undefined>({ ...flags, json: undefined })) {
        expect(r.stdout).toMatch(new RegExp(`^  --${k}\\b`, 'm'));
        if (f) expect(r.stdout).toContain(f.describe);
      }
    }
  });

  test('an unknown flag or a stray word is refused, naming it', () => {
    let r = bench([b, '--frobnicate', '3']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(new RegExp(`bench ${b}: unknown flag --frobnicate\\b`));
    // A misspelled negation is quoted as typed, not as yargs reads it.
    r = bench([b, '--no-frobnicate']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(new RegExp(`bench ${b}: unknown flag --no-frobnicate\\b`));
    r = bench([b, '1000']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(new RegExp(`bench ${b}: .*1000`));
  });

  test('a bad number is refused, naming the flag', () => {
    const numeric = Object.entries(flags).filter(([, f]) => f.type === 'int' || f.type === 'number');
    expect(numeric.length).toBeGreaterThan(0);
    for (const [k, f] of numeric) {
      for (const bad of [f.type === 'int' ? '1.5' : 'abc']) {
        const r = bench([b, `--${k}`, bad, ...(b === 'aggregate' && k === 'runs' ? ['--netns'] : [])]);
        expect({ k, bad, code: r.code, stderr: r.stderr }).toEqual({ k, bad, code: 2, stderr: expect.stringContaining(`bench ${b}: --${k}: expected`) });
      }
    }
  });
});

test('bench all takes only --json; aggregate refuses a flag of its other mode', () => {
  let r = bench(['all', '--frames', '3']);
  expect(r.code).toBe(2);
  expect(r.stderr).toContain('bench all: takes only --json');
  r = bench(['aggregate', '--runs', '2']);
  expect(r.code).toBe(2);
  expect(r.stderr).toContain('bench aggregate: --runs applies with --netns only');
  r = bench(['aggregate', '--netns', '--rounds', '2']);
  expect(r.code).toBe(2);
  expect(r.stderr).toContain('bench aggregate: --rounds applies without --netns only');
});
