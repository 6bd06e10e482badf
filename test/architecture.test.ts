// The module map in docs/architecture.md matches the tree: every file under src/ is named there,
// in its folder's rows, and every file the map names exists. Folder patterns (`*.ts`, `<name>.ts`)
// cover a whole folder. And the import rule: every import of src/**/*.ts goes down the layers of
// docs/architecture.md ("Layers: which folder may import which"), but for the exceptions below.
import * as fs from 'fs';
import * as path from 'path';
import { ROOT } from './helpers';

function sourceFiles(dir: string, rel = ''): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) out.push(...sourceFiles(dir, r));
    else if (e.name.endsWith('.ts')) out.push(r);
  }
  return out;
}

/** The text of a `## ` section, up to the next one. */
function sectionOf(doc: string, heading: string): string {
  const at = doc.indexOf(heading);
  expect(at).toBeGreaterThanOrEqual(0);
  const next = doc.indexOf('\n## ', at + heading.length);
  return doc.slice(at, next < 0 ? undefined : next);
}

/** Rows of the module map: folder (carried down from the row above when blank) and the files it names. */
function mapEntries(): { named: Set<string>; wholeFolders: Set<string> } {
  const doc = fs.readFileSync(path.join(ROOT, 'docs', 'architecture.md'), 'utf8');
  const section = sectionOf(doc, '## Module map (src/)');
  const table = section.split('\n').filter((l) => l.startsWith('| ') && !l.startsWith('| folder') && !l.startsWith('|---'));
  const named = new Set<string>();
  const wholeFolders = new Set<string>();
  let folder = '';
  for (const row of table) {
    const cells = row.split('|').map((c) => c.trim());
    const f = /`([^`]*)`/.exec(cells[1])?.[1];
    if (f !== undefined) folder = f === 'src/' ? '' : f.replace(/\/$/, '');
    for (const [, name] of cells[2].matchAll(/`([^`]+)`/g)) {
      const file = folder ? `${folder}/${name}` : name;
      if (name.endsWith('*.ts') || name === '<name>.ts') wholeFolders.add(path.posix.dirname(file));
      else named.add(file);
    }
  }
  return { named, wholeFolders };
}

test('docs/architecture.md names every source file, and only files that exist', () => {
  const files = sourceFiles(path.join(ROOT, 'src'));
  const { named, wholeFolders } = mapEntries();
  const covered = (f: string) => named.has(f) || wholeFolders.has(path.posix.dirname(f));
  expect(files.filter((f) => !covered(f))).toEqual([]);
  expect([...named].filter((f) => !f.includes('*') && !fs.existsSync(path.join(ROOT, 'src', f)))).toEqual([]);
});

test('no source file is at the top of src/ that belongs to a role folder', () => {
  // Cross-cutting modules only: each process and concept lives in its folder.
  const top = fs.readdirSync(path.join(ROOT, 'src')).filter((f) => f.endsWith('.ts')).sort();
  expect(top).toEqual(['cli.ts', 'errors.ts', 'index.ts', 'layout.ts', 'log.ts', 'malloc-tuning.ts', 'memory.ts', 'messages.ts', 'metrics.ts', 'native.ts', 'paths.ts', 'prng.ts', 'proto.ts', 'shm-layouts.ts']);
});

test('messages.ts is a leaf: it imports no other module, so no import circle runs through it', () => {
  // The decoded message shapes are used by every process; a module they import from would import them back.
  const src = fs.readFileSync(path.join(ROOT, 'src', 'messages.ts'), 'utf8');
  expect([...src.matchAll(/from\s+'([^']+)'/g)].map((m) => m[1])).toEqual([]);
});

// ---------------------------------------------------------------- the import rule

/**
 * Imports that go up a layer, each allowed on purpose (docs/architecture.md lists the same, with
 * the same reasons). Everything else must point to a lower layer or stay in its own folder.
 */
const UPWARD_EXCEPTIONS: ReadonlyArray<[from: string, to: string]> = [
  // Types only: the interface the coordinator asks its policy through belongs to the coordinator.
  ['guard/guard.ts', 'bus/policy.ts'],
  // decideAheadWaves: the guard arms for the waves the bus decides ahead; one formula for both.
  ['guard/guard.ts', 'bus/constants.ts'],
  // The coordinator serves its reports to aggregate with the agents' link-safe chunked file server.
  ['bus/coordinator-files.ts', 'agent/file-server.ts'],
  // The one numeric flag parser lives with the commands; it imports only the errors.
  ['launch/identity.ts', 'commands/flags.ts'],
  ['launch/options.ts', 'commands/flags.ts'],
  // The engine client counts a reply's repeated fields with the bus's census before decoding it
  // (one set of limits for every socket); the census imports only protobufjs.
  ['client/transport.ts', 'bus/wire-census.ts'],
];

/** The layer table of docs/architecture.md: unit (`bus/` or `paths.ts`) → layer. */
function layerTable(doc: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const row of sectionOf(doc, '## Layers: which folder may import which').split('\n')) {
    const m = /^\| (\d+) \| (.*) \|$/.exec(row);
    if (!m) continue;
    for (const [, unit] of m[2].matchAll(/`([^`]+)`/g)) out.set(unit, Number(m[1]));
  }
  return out;
}

/** The unit a path under src/ belongs to: its top folder (`bus/`), or the file at the top (`paths.ts`). */
function unitOf(rel: string): string {
  const slash = rel.indexOf('/');
  return slash < 0 ? rel : rel.slice(0, slash + 1);
}

/** Every relative module a source file imports: import/export ... from, bare import, import(), require(). */
function importsOf(text: string): string[] {
  const out: string[] = [];
  const re = /(?:^|[\s;])(?:import|export)\s[^;]*?\sfrom\s*'([^']+)'|(?:^|[\s;])import\s*'([^']+)'|\bimport\(\s*'([^']+)'\s*\)|\brequire\(\s*'([^']+)'\s*\)/g;
  for (const m of text.matchAll(re)) {
    const spec = m[1] ?? m[2] ?? m[3] ?? m[4];
    if (spec.startsWith('.')) out.push(spec);
  }
  return out;
}

/**
 * The imports that break the rule: from a unit to one on the same or a higher layer (a unit's
 * files import each other freely), unless listed in `exceptions`; and any file whose unit has no
 * layer. `files`: path under src/ → its text.
 */
function importViolations(files: Map<string, string>, layers: Map<string, number>, exceptions: ReadonlyArray<[string, string]> = UPWARD_EXCEPTIONS): string[] {
  const bad: string[] = [];
  const allowed = new Set(exceptions.map(([a, b]) => `${a} -> ${b}`));
  for (const [rel, text] of files) {
    const from = unitOf(rel);
    if (!layers.has(from)) {
      bad.push(`${rel}: its unit ${from} has no layer in docs/architecture.md`);
      continue;
    }
    for (const spec of importsOf(text)) {
      let target = path.posix.normalize(path.posix.join(path.posix.dirname(rel), spec));
      if (target.startsWith('..')) continue; // outside src/ (proto/errors.json, package.json)
      if (!target.endsWith('.ts') && !target.endsWith('.json')) target = files.has(`${target}/index.ts`) ? `${target}/index.ts` : `${target}.ts`;
      const to = unitOf(target);
      if (to === from) continue;
      const lf = layers.get(from)!;
      const lt = layers.get(to);
      if (lt !== undefined && lt < lf) continue;
      if (allowed.has(`${rel} -> ${target}`)) continue;
      bad.push(`${rel} imports ${spec} (${from} on layer ${lf} -> ${to} on layer ${lt ?? 'none'})`);
    }
  }
  return bad.sort();
}

function srcTexts(): Map<string, string> {
  const files = new Map<string, string>();
  for (const f of sourceFiles(path.join(ROOT, 'src'))) files.set(f, fs.readFileSync(path.join(ROOT, 'src', f), 'utf8'));
  return files;
}

describe('the import rule (docs/architecture.md, "Layers")', () => {
  const doc = () => fs.readFileSync(path.join(ROOT, 'docs', 'architecture.md'), 'utf8');

  test('every import of src/**/*.ts goes down the layers, but for the listed exceptions', () => {
    const layers = layerTable(doc());
    expect(layers.size).toBeGreaterThan(10);
    expect(importViolations(srcTexts(), layers)).toEqual([]);
  });

  test('every exception is still needed, and is in the docs\' list of exceptions', () => {
    const layers = layerTable(doc());
    const files = srcTexts();
    const exceptions = sectionOf(doc(), '## Layers: which folder may import which');
    for (const [i, [from, to]] of UPWARD_EXCEPTIONS.entries()) {
      const without = UPWARD_EXCEPTIONS.filter((_, k) => k !== i);
      expect(importViolations(files, layers, without).some((v) => v.startsWith(`${from} imports`))).toBe(true);
      expect(exceptions).toContain(`\`${from}\``);
      expect(exceptions).toContain(`\`${to}\``);
    }
  });

  test('the checker catches a forbidden import: a synthetic layout.ts that imports the bus, a client file that reaches the CLI', () => {
    const layers = layerTable(doc());
    const files = srcTexts();
    files.set('layout.ts', `${files.get('layout.ts')}\nimport { DEFAULT_PORT } from './bus/constants';\n`);
    files.set('client/extra.ts', "import type { Options } from 'yargs';\nconst flags = require('../commands/flags');\nexport * from './client';\n");
    expect(importViolations(files, layers)).toEqual([
      'client/extra.ts imports ../commands/flags (client/ on layer 7 -> commands/ on layer 13)',
      'layout.ts imports ./bus/constants (layout.ts on layer 1 -> bus/ on layer 9)',
    ]);
    // same layer, another unit: refused too (log.ts and metrics.ts stand side by side)
    expect(importViolations(new Map([['log.ts', "import { x } from './metrics';"]]), layers)).toEqual(['log.ts imports ./metrics (log.ts on layer 1 -> metrics.ts on layer 1)']);
    // a folder with no layer is named
    expect(importViolations(new Map([['newfolder/x.ts', '']]), layers)).toEqual(['newfolder/x.ts: its unit newfolder/ has no layer in docs/architecture.md']);
  });

  test('the engine client\'s imports reach neither the launcher nor the CLI', () => {
    const files = srcTexts();
    const seen = new Set<string>();
    const toVisit = [...files.keys()].filter((f) => f.startsWith('client/'));
    while (toVisit.length > 0) {
      const f = toVisit.pop()!;
      if (seen.has(f)) continue;
      seen.add(f);
      for (const spec of importsOf(files.get(f) ?? '')) {
        const t = path.posix.normalize(path.posix.join(path.posix.dirname(f), spec));
        const ts = files.has(`${t}/index.ts`) ? `${t}/index.ts` : `${t}.ts`;
        if (files.has(ts)) toVisit.push(ts);
      }
    }
    expect([...seen].filter((f) => f.startsWith('launch/') || f.startsWith('commands/'))).toEqual([]);
    expect(seen.has('layout.ts')).toBe(true);
  });
});
