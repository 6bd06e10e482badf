// Issue 45 item 4: JSON files of artifact trees get a nesting limit (src/artifacts/json-file.ts,
// the one reader of report, trace, inspect, aggregate and bisect). A 5000-deep report took
// `wavebus report` down with a stack overflow (exit 2, no page); now that file costs its own
// section only, and the page or the tool names it and says why.
import * as fs from 'fs';
import * as path from 'path';
import { jsonTooDeepAt, MAX_ARTIFACT_JSON_DEPTH, parseArtifactJson } from '../src/artifacts/json-file';
import { cleanup, runWavebus, tmpDir } from './helpers';
import { generatedTree } from './report-trees';

afterAll(() => cleanup());

const deep = (n: number) => `${'{"a":'.repeat(n)}1${'}'.repeat(n)}`;

function findFiles(dir: string, re: RegExp): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true, recursive: true } as any) as unknown as fs.Dirent[]) {
    const p = path.join((e as any).parentPath ?? (e as any).path, e.name);
    if (e.isFile() && re.test(e.name)) out.push(p);
  }
  return out.sort();
}

test('the limit: 64 levels read, 65 refused with the offset; brackets inside strings do not count', () => {
  expect(parseArtifactJson(deep(MAX_ARTIFACT_JSON_DEPTH))).toBeDefined();
  expect(() => parseArtifactJson(deep(MAX_ARTIFACT_JSON_DEPTH + 1))).toThrow(/^nested deeper than 64 arrays and objects \(at byte offset 320\); not read$/);
  expect(jsonTooDeepAt(JSON.stringify({ s: '['.repeat(1000), t: '\\"{{{{'.repeat(100) }))).toBe(-1);
  expect(jsonTooDeepAt(`[${'[]'.repeat(10000)}]`)).toBe(-1); // wide is fine
});

test('report, trace and inspect on a tree with a 5000-deep report, timeline and dump.json: each file named and skipped, the rest read', () => {
  const root = tmpDir('wavebus-deepjson-');
  generatedTree(root, { tp: 2, dp: 1, incidents: 3, hosts: 1 });
  const reports = findFiles(root, /^report_.*\.json$/);
  expect(reports).toHaveLength(3);
  const hostile = reports[1];
  const doc = JSON.parse(fs.readFileSync(hostile, 'utf8'));
  fs.writeFileSync(hostile, JSON.stringify(doc).replace('"detail":{', `"deep":${deep(5000)},"detail":{`));
  const timeline = findFiles(root, /^rank1\.json$/)[0];
  fs.writeFileSync(timeline, JSON.stringify(JSON.parse(fs.readFileSync(timeline, 'utf8'))).replace('"entries":[]', `"entries":[],"deep":${deep(5000)}`));
  const dumpJson = findFiles(root, /^dump\.json$/)[0];
  fs.writeFileSync(dumpJson, fs.readFileSync(dumpJson, 'utf8').replace('"block_ids":', `"deep":${deep(5000)},"block_ids":`));
  const rel = (p: string) => path.relative(root, p);
  const why = 'nested deeper than 64 arrays and objects';

  const out = path.join(root, 'page.html');
  const r = runWavebus(['report', root, '-o', out]);
  expect(r.stdout.trim()).toBe(out);
  expect(r.code).toBe(1); // the verification failures, not a crash
  expect(r.stderr).toContain(`wavebus report: ${rel(hostile)}: ${why}`);
  expect(r.stderr).toContain(`wavebus report: ${rel(timeline)}: ${why}`);
  expect(r.stderr).toMatch(new RegExp(`${rel(dumpJson).replace(/[.]/g, '\\.')}: unreadable JSON \\(${why}`));
  const html = fs.readFileSync(out, 'utf8');
  expect(html).toContain('id="incident-count">2<'); // the other two incidents are on the page
  expect(html).toContain(`${rel(hostile)}: ${why}`); // in the Verification section

  const t = runWavebus(['trace', root, '-o', path.join(root, 'job.trace.json')]);
  expect(t.code).toBe(0);
  expect(t.stderr).toContain(`wavebus trace: skipped ${rel(timeline)}: ${why}`);
  expect(t.stdout).toMatch(/events, 1 rank\(s\)/); // rank 0's timeline is in

  const i = runWavebus(['inspect', root]);
  expect(i.stdout + i.stderr).toContain(`${rel(dumpJson)}: unreadable JSON (${why}`);
});
