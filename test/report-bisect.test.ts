// `wavebus report` shows the bisect results saved in the tree: real probe trees (the torch engine's
// module tree as two PP stages, test/python/probe_pp.py, healthy and with a spoiled stage boundary),
// the real `wavebus bisect --out <tree>/bisect/NAME.json`, and the page opened in headless Chromium:
// the first module and its rank read from the DOM, a malformed result shown as a failure naming
// its file, and the recorder line of the Job section. A tree without results says so.
import * as fs from 'fs';
import * as path from 'path';
import { spawnSync } from 'child_process';
import { CHROMIUM, count, loadPage } from './chromium';
import { cleanup, PYTHON, ROOT, runWavebus, tmpDir } from './helpers';
import { generatedTree } from './report-trees';

jest.setTimeout(300000);

const work = tmpDir('wavebus-report-bisect-');
const probes = path.join(work, 'probes');
const tree = path.join(work, 'tree');

beforeAll(() => {
  if (!CHROMIUM) throw new Error('these tests need Debian chromium (apt-get install chromium)');
  for (const [name, extra] of [['pp', []], ['ppbad', ['--corrupt-boundary']]] as const) {
    const r = spawnSync(PYTHON, [path.join(ROOT, 'test', 'python', 'probe_pp.py'), path.join(probes, name), ...extra], { encoding: 'utf8', timeout: 120000 });
    if (r.status !== 0) throw new Error(`probe_pp.py ${name}: exit ${r.status}\n${r.stderr}`);
  }
  generatedTree(tree, { tp: 2, dp: 1, incidents: 1, hosts: 1 });
});
afterAll(() => cleanup());

const textOf = (dom: string, id: string) => new RegExp(`id="${id}"[^>]*>([^<]*)<`).exec(dom)?.[1];

test('bisect --out writes the --json document whole, 0640, making <tree>/bisect/; exit codes stay', () => {
  const [a, b] = [path.join(probes, 'ppbad', 'pp2'), path.join(probes, 'ppbad', 'pp1')];
  const file = path.join(tree, 'bisect', 'boundary.json');
  const r = runWavebus(['bisect', a, b, '--out', file]);
  expect(r.stderr).toBe('');
  expect(r.code).toBe(1); // a module out of tolerance, as without --out
  expect(r.stdout).toContain('FIRST OUT OF TOLERANCE: model.layers.1 input 0'); // the text report still printed
  expect(fs.statSync(file).mode & 0o777).toBe(0o640);
  const json = runWavebus(['bisect', a, b, '--json']);
  expect(json.code).toBe(1);
  expect(fs.readFileSync(file, 'utf8')).toBe(json.stdout);
  expect(fs.readdirSync(path.join(tree, 'bisect'))).toEqual(['boundary.json']); // no temp file left

  const ok = runWavebus(['bisect', path.join(probes, 'pp', 'pp2'), path.join(probes, 'pp', 'pp1'), '--json', '--out', path.join(tree, 'bisect', 'healthy.json')]);
  expect(ok.code).toBe(0);
  expect(fs.readFileSync(path.join(tree, 'bisect', 'healthy.json'), 'utf8')).toBe(ok.stdout);

  const bad = runWavebus(['bisect', a, b, '--out', path.join(work, 'result.txt')]);
  expect(bad.code).toBe(2);
  expect(bad.stderr).toContain('--out');
  expect(bad.stderr).toContain('expected a .json file name');
  expect(fs.existsSync(path.join(work, 'result.txt'))).toBe(false);
  const nowhere = runWavebus(['bisect', a, b, '--out', path.join(work, 'made', 'x.json')]);
  expect(fs.existsSync(path.join(work, 'made', 'x.json'))).toBe(true);
  fs.writeFileSync(path.join(work, 'a-file'), 'x');
  const blocked = runWavebus(['bisect', a, b, '--out', path.join(work, 'a-file', 'x.json')]);
  expect(nowhere.code).toBe(1); // the folder was made
  expect(blocked.code).toBe(2);
  expect(blocked.stderr).toContain(`--out "${path.join(work, 'a-file', 'x.json')}"`);
});

test("the page's Bisect section: first module and rank from the DOM, the healthy result, the module table", async () => {
  const doc = JSON.parse(fs.readFileSync(path.join(tree, 'bisect', 'boundary.json'), 'utf8'));
  const out = path.join(work, 'page.html');
  const r = runWavebus(['report', tree, '-o', out]);
  expect(r.stderr).toBe('');
  expect(r.code).toBe(0);
  const page = await loadPage(out);
  expect(page.console).toEqual([]);
  expect(page.dom).toContain('class="banner ok"');
  expect(textOf(page.dom, 'bisect-count')).toBe('2');
  expect(count(page.dom, '<details class="bisect"')).toBe(2);
  // Results by file name: boundary.json, then healthy.json.
  const [boundary, healthy] = page.dom.split('<details class="bisect"').slice(1);
  expect(boundary).toContain('data-file="bisect/boundary.json"');
  expect(boundary).toContain('<span class="bisect-first mono">model.layers.1 input 0</span>');
  expect(boundary).toContain('<span class="bisect-ranks">1</span>');
  expect(doc.first).toMatchObject({ module: 'model.layers.1', io: 'input', ranks: [1] });
  expect(boundary).toContain(`${path.join(probes, 'ppbad', 'pp2')} (tp=1 pp=2, ranks 0,1, call 0)`);
  expect(boundary).toContain(`${path.join(probes, 'ppbad', 'pp1')} (tp=1, ranks 0, call 0)`);
  expect(boundary).toMatch(/<th>largest difference at<\/th><td class="mono">\[3, /); // the row spoiled by probe_pp.py
  expect(boundary).toMatch(/<th>first non-finite value in A<\/th><td>none<\/td>/);
  // One table row per module, the first out marked, those before it within tolerance.
  expect(count(boundary, '<tr class="bmod ')).toBe(doc.modules.length);
  expect(count(boundary, '<tr class="bmod first fail">')).toBe(1);
  const firstRow = doc.modules.findIndex((m: { key: string }) => m.key === doc.first.key);
  expect(count(boundary.split('<tr class="bmod first fail">')[0], '<tr class="bmod ok">')).toBe(firstRow);
  expect(healthy).toContain('data-file="bisect/healthy.json"');
  expect(healthy).toContain('no module out of tolerance');
  expect(healthy).not.toContain('bmod first');
  // The link to each result resolves from the page.
  expect(page.dom).toContain('href="tree/bisect/boundary.json"');
  // Recorder flushes: this tree holds none, and the Job section says so and how to turn it on.
  expect(page.dom).toContain('<p id="recorder-flushes" data-count="0">');
  expect(textOf(page.dom, 'recorder-flushes')).toMatch(/^none in this tree/);
});

test('a malformed result is a red failure naming the file; strings are escaped; none: the section says so', async () => {
  const bad = path.join(work, 'bad-tree');
  fs.cpSync(tree, bad, { recursive: true });
  fs.writeFileSync(path.join(bad, 'bisect', 'broken.json'), '{"a": ');
  const doc = JSON.parse(fs.readFileSync(path.join(bad, 'bisect', 'boundary.json'), 'utf8'));
  fs.writeFileSync(path.join(bad, 'bisect', 'shape.json'), JSON.stringify({ ...doc, modules: [{ ...doc.modules[0], max_abs_diff: 'lots' }] }));
  doc.first.module = '<img src=x onerror="document.title=1">';
  doc.a.root = '<script>document.title="pwned"</script>';
  fs.writeFileSync(path.join(bad, 'bisect', 'evil.json'), JSON.stringify(doc));
  fs.symlinkSync(path.join(bad, 'bisect', 'healthy.json'), path.join(bad, 'bisect', 'link.json'));
  const out = path.join(work, 'bad.html');
  const r = runWavebus(['report', bad, '-o', out]);
  expect(r.code).toBe(1);
  expect(r.stderr).toContain('bisect/broken.json');
  const page = await loadPage(out);
  expect(page.console).toEqual([]);
  expect(page.dom).toContain('class="banner bad"');
  const failures = /<ul id="verify-failures">([\s\S]*?)<\/ul>/.exec(page.dom)?.[1] ?? '';
  expect(failures).toMatch(/<li class="fail">bisect\/broken\.json: [^<]*JSON[^<]*<\/li>/);
  expect(failures).toContain('<li class="fail">bisect/shape.json: not a wavebus bisect result (modules[0].max_abs_diff is not a number)</li>');
  const section = /<section id="bisect">([\s\S]*?)<\/section>/.exec(page.dom)?.[1] ?? '';
  expect(section).toContain('bisect/broken.json');
  // evil.json is well-formed: shown, escaped, and nothing of it runs; the link is not followed.
  expect(textOf(page.dom, 'bisect-count')).toBe('3');
  expect(section).not.toContain('link.json');
  expect(page.dom).toMatch(/<title>wavebus report: [^<]*<\/title>/);
  expect(page.dom).not.toContain('pwned</title>');
  expect(section).toContain('&lt;script&gt;document.title="pwned"&lt;/script&gt; (tp=1 pp=2');
  expect(page.dom).not.toMatch(/<img/i);
  expect(count(page.dom, /<script/i)).toBe(1); // the page's own
  expect(section).toContain('&lt;img src=x onerror=');

  const none = path.join(work, 'none-tree');
  generatedTree(none, { tp: 2, dp: 1, incidents: 1, hosts: 1 });
  const noneOut = path.join(work, 'none.html');
  expect(runWavebus(['report', none, '-o', noneOut]).code).toBe(0);
  const nonePage = await loadPage(noneOut);
  expect(textOf(nonePage.dom, 'bisect-none')).toBe('no bisect results in this tree (see docs/bisect.md)');
});
