// artifacts/atomic-write.ts: the one way a small file is replaced whole.
import * as fs from 'fs';
import * as path from 'path';
import { atomicTempName, writeFileAtomic, writeJsonAtomic } from '../src/artifacts/atomic-write';
import { inspectTree } from '../src/tools/inspect';
import { cleanup, tmpDir } from './helpers';

afterAll(() => cleanup());

describe('writeFileAtomic', () => {
  test('temp names are dot-named beside the file, carry the pid and are unpredictable', () => {
    const f = '/some/dir/manifest.json';
    const names = new Set(Array.from({ length: 50 }, () => atomicTempName(f)));
    expect(names.size).toBe(50);
    for (const n of names) expect(n).toMatch(new RegExp(`^/some/dir/\\.manifest\\.json\\.tmp-${process.pid}-[0-9a-f]{16}$`));
  });

  test('writes the data with the given mode, creates parents only when asked, leaves no temp file', () => {
    const d = tmpDir();
    const f = path.join(d, 'a', 'b', 'x.json');
    expect(() => writeFileAtomic(f, 'x', { mode: 0o600 })).toThrow(/ENOENT/);
    writeJsonAtomic(f, { k: [1, 2] }, { mode: 0o600, dirMode: 0o700 });
    expect(fs.readFileSync(f, 'utf8')).toBe('{\n  "k": [\n    1,\n    2\n  ]\n}\n');
    expect(fs.statSync(f).mode & 0o777).toBe(0o600);
    expect(fs.statSync(path.dirname(f)).mode & 0o777).toBe(0o700);
    expect(fs.readdirSync(path.dirname(f))).toEqual(['x.json']);
  });

  test('a link at the final name is replaced, its target untouched', () => {
    const d = tmpDir();
    const victim = path.join(d, 'victim');
    fs.writeFileSync(victim, 'precious');
    const f = path.join(d, 'out.json');
    fs.symlinkSync(victim, f);
    writeFileAtomic(f, 'new', { mode: 0o644 });
    expect(fs.lstatSync(f).isSymbolicLink()).toBe(false);
    expect(fs.readFileSync(f, 'utf8')).toBe('new');
    expect(fs.readFileSync(victim, 'utf8')).toBe('precious');
  });

  test('a failed rename leaves the old content and no temp file', () => {
    const d = tmpDir();
    const f = path.join(d, 'busy');
    fs.mkdirSync(f);
    fs.writeFileSync(path.join(f, 'inside'), 'old');
    expect(() => writeFileAtomic(f, 'new', { mode: 0o644 })).toThrow(/EISDIR|ENOTEMPTY|EEXIST/);
    expect(fs.readdirSync(d)).toEqual(['busy']);
    expect(fs.readFileSync(path.join(f, 'inside'), 'utf8')).toBe('old');
  });

  test('wavebus inspect lists a temp file a crash left behind as incomplete', () => {
    const d = tmpDir();
    const left = atomicTempName(path.join(d, 'manifest.json'));
    fs.writeFileSync(left, '{');
    expect(inspectTree(d).incomplete).toEqual([path.basename(left)]);
  });
});
