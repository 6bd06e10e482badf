// `wavebus demo` is the first command a newcomer runs: it must pass, and it must notice when an
// artifact is wrong. Runs the built CLI as a user would.
import * as fs from 'fs';
import * as path from 'path';
import { checkDumpContents } from '../src/demo';
import { inspectTree } from '../src/inspect';
import { cleanup, runWavebus, tmpDir } from './helpers';

afterAll(cleanup);

test('demo (TP=4, one host) writes and verifies every artifact', () => {
  const out = path.join(tmpDir(), 'demo');
  const r = runWavebus(['demo', '--out', out, '--steps', '80'], { timeout: 120000 });
  expect(r.stdout).toContain('demo OK');
  expect(r.code).toBe(0);
  for (const t of ['token_repeat', 'logits_finite', 'garbled', 'spec_acceptance']) {
    expect(r.stdout).toMatch(new RegExp(`${t}\\s+\\d+`));
    expect(fs.readdirSync(path.join(out, 'runtime', 'report', t)).length).toBeGreaterThan(0);
  }
  expect(r.stdout).toMatch(/input snapshots by rank: rank0=\d+ rank1=\d+ rank2=\d+ rank3=\d+/);
  const kv = inspectTree(path.join(out, 'runtime', 'report', 'kv_cache'), { verify: true });
  expect(kv.problems).toEqual([]);
  // The content check catches a single flipped byte in any dumped block.
  const rankDir = kv.bundles.find((b) => b.kind === 'kv_dump')!;
  expect(checkDumpContents(rankDir, kv.root, 4)).toEqual([]);
  const file = path.join(kv.root, rankDir.dir, rankDir.files[0].name);
  const bytes = fs.readFileSync(file);
  bytes[Math.floor(bytes.length / 2)] ^= 0x10; // inside the K or V tensor bytes
  fs.writeFileSync(file, bytes);
  expect(checkDumpContents(rankDir, kv.root, 4).join('\n')).toMatch(/bytes differ/);
  expect(inspectTree(kv.root, { verify: true }).problems.join('\n')).toMatch(/checksum/);
});

test('demo with two simulated hosts and PP=2 dumps from the last PP stage only', () => {
  const out = path.join(tmpDir(), 'demo2');
  const r = runWavebus(['demo', '--out', out, '--tp', '2', '--pp', '2', '--hosts', '2', '--steps', '80', '--format', 'npy'], { timeout: 120000 });
  expect(r.stdout).toContain('demo OK');
  expect(r.code).toBe(0);
  expect(r.stdout).toContain('every one from ranks [2, 3]');
  const dirs = inspectTree(path.join(out, 'runtime', 'report', 'kv_cache')).bundles.filter((b) => b.kind === 'kv_dump');
  expect(new Set(dirs.map((d) => d.ranks[0]))).toEqual(new Set([2, 3]));
});

test('demo refuses an --out that holds someone else\'s files', () => {
  const out = tmpDir();
  fs.writeFileSync(path.join(out, 'precious.txt'), 'keep me');
  const r = runWavebus(['demo', '--out', out]);
  expect(r.code).not.toBe(0);
  expect(r.stderr).toMatch(/--out .* is not a wavebus demo directory/);
  expect(fs.readFileSync(path.join(out, 'precious.txt'), 'utf8')).toBe('keep me');
});
