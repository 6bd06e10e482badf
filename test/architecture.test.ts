// The module map in docs/architecture.md matches the tree: every file under src/ is named there,
// in its folder's rows, and every file the map names exists. Folder patterns (`*.ts`, `<name>.ts`)
// cover a whole folder.
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

/** Rows of the module map: folder (carried down from the row above when blank) and the files it names. */
function mapEntries(): { named: Set<string>; wholeFolders: Set<string> } {
  const doc = fs.readFileSync(path.join(ROOT, 'docs', 'architecture.md'), 'utf8');
  const section = doc.slice(doc.indexOf('## Module map (src/)'));
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
  expect(top).toEqual(['cli.ts', 'errors.ts', 'index.ts', 'layout.ts', 'log.ts', 'malloc-tuning.ts', 'memory.ts', 'messages.ts', 'metrics.ts', 'native.ts', 'paths.ts', 'prng.ts', 'proto.ts']);
});

test('messages.ts is a leaf: it imports no other module, so no import circle runs through it', () => {
  // The decoded message shapes are used by every process; a module they import from would import them back.
  const src = fs.readFileSync(path.join(ROOT, 'src', 'messages.ts'), 'utf8');
  expect([...src.matchAll(/from\s+'([^']+)'/g)].map((m) => m[1])).toEqual([]);
});
