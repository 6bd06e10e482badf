// `wavebus report`: the page of a real job's tree (the in-process harness), opened in real headless
// Chromium: no console errors, the incident count, the grid's cells and the timeline's marks as
// in the tree; a flipped byte and a missing rank both shown as errors; report fields escaped; the
// --compare page; a generated tree of 64 ranks and 100 incidents. Screenshots are kept under
// test-artifacts/ (ignored by git).
import * as fs from 'fs';
import * as path from 'path';
import { CHROMIUM, count, loadPage, screenshot } from './chromium';
import { cleanup, ROOT, runWavebus, tmpDir } from './helpers';
import { generatedTree, realJobTree, type JobTree } from './report-trees';
import { RecorderRing } from '../src/agent/recorder-ring';
import { flushRing, writeCrash } from '../src/agent/recorder-flush';
import { resolveIdentity } from '../src/launch/identity';
import { runPython } from './helpers';

jest.setTimeout(300000);

const ARTIFACTS = path.join(ROOT, 'test-artifacts');
const work = tmpDir('wavebus-report-');
let tree: JobTree;

beforeAll(async () => {
  if (!CHROMIUM) throw new Error('these tests need Debian chromium (apt-get install chromium)');
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  tree = await realJobTree();
});
afterAll(() => cleanup());

/** Files named like `re` under dir, relative paths. */
function find(dir: string, re: RegExp): string[] {
  const out: string[] = [];
  const walk = (d: string): void => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (re.test(e.name)) out.push(path.relative(dir, p));
    }
  };
  walk(dir);
  return out.sort();
}
const rankDirsOf = (root: string) => find(root, /^dump\.json$/).map((f) => path.dirname(f));
const textOf = (dom: string, id: string) => new RegExp(`id="${id}"[^>]*>([^<]*)<`).exec(dom)?.[1];

test("a real job's page: sections, counts read from the DOM match the tree, no console errors", async () => {
  const out = path.join(work, 'job.html');
  const r = runWavebus(['report', tree.root, '-o', out]);
  expect(r.stderr).toBe('');
  expect(r.code).toBe(0);
  expect(r.stdout.trim()).toBe(out);
  const html = fs.readFileSync(out, 'utf8');
  // Its reports hold token ids (save_sensitive_info): the page is as private as they are.
  expect(fs.statSync(out).mode & 0o777).toBe(0o600);
  // Self-contained: nothing is loaded from anywhere (links to the tree's files are relative).
  expect(html).not.toMatch(/(src|href)\s*=\s*["']?(https?:|\/\/)/i);
  expect(html).not.toMatch(/<(img|link|iframe)\b/i);

  const page = await loadPage(out);
  expect(page.console).toEqual([]);
  const reports = find(tree.root, /^report_.*\.json$/);
  expect(reports.length).toBe(2); // one per replica
  expect(textOf(page.dom, 'incident-count')).toBe(String(reports.length));
  expect(count(page.dom, '<details class="incident"')).toBe(reports.length);
  expect(page.dom).toContain('id="verify-banner"');
  expect(page.dom).toContain('class="banner ok"');
  expect(page.dom).toContain('DP 2 × PP 1 × TP 2 = 4 ranks');
  // Grid: 4 ranks × 2 dumps; each dump is its replica's 2 ranks, the other 2 do not copy it.
  const rankDirs = rankDirsOf(tree.root);
  expect(rankDirs.length).toBe(4);
  expect(count(page.dom, /class="cell complete"/)).toBe(rankDirs.length);
  expect(count(page.dom, /class="cell na"/)).toBe(4 * 2 - rankDirs.length);
  expect(count(page.dom, /class="cell (missing|corrupt|skipped)"/)).toBe(0);
  // Timeline: a mark per incident and per dump.
  expect(count(page.dom, 'class="ev incident"')).toBe(reports.length);
  expect(count(page.dom, 'class="ev dump"')).toBe(find(tree.root, /^request_info\.json$/).length);
  // Token ids are in the reports (save_sensitive_info), shown as ids without a vocabulary.
  expect(page.dom).toMatch(/<h4>output_token_ids \(\d+; ids only[^<]*<code>--vocab FILE<\/code>[^<]*\)<\/h4><div class="tokens"><span title="id 101">101<\/span>/);
  // A heatmap per rank dump, and links to its files that resolve from the page.
  expect(count(page.dom, 'class="kvmap"')).toBe(rankDirs.length);
  const hrefs = [...html.matchAll(/href="([^"#]+)"/g)].map((m) => decodeURIComponent(m[1]));
  expect(hrefs.length).toBeGreaterThan(rankDirs.length);
  for (const h of hrefs) expect(fs.existsSync(path.resolve(work, h))).toBe(true);

  await screenshot(out, path.join(ARTIFACTS, 'report-job.png'));
  expect(fs.statSync(path.join(ARTIFACTS, 'report-job.png')).size).toBeGreaterThan(10000);
});

/** Records forwards 1..n into a real ring (the Python client's writer); `die`: dies inside that forward's copy. */
const RING_WRITER = `import os, sys, ctypes, numpy as np
from wavebus_client.recorder import Recorder
from wavebus_client import wavebus_pb2 as pb
path, n, die = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rec = Recorder(path)
bufs = [np.full(16, i + 1, dtype=np.int64) for i in range(n)]
real = ctypes.memmove
for i in range(n):
    if i + 1 == die:
        rec.note("uncaught RuntimeError: boom <b>")
        def dying(dst, src, nb):
            real(dst, src, nb // 2)
            os._exit(9)
        ctypes.memmove = dying
    ctx = pb.ForwardContext(compilation_hash="g", global_step=100 + i, req_ids=["r"], positions=[0] * 16)
    rec.record(ctx, [pb.TensorInput(region="ids", offset=0, dtype="int64", shape=[16])], [(bufs[i].ctypes.data, bufs[i].nbytes)], 10 + i)
`;

test('recorder flushes: incident, crash and user flushes listed with their forwards per rank and the crash summary', async () => {
  const root = path.join(work, 'recorder-tree');
  fs.cpSync(tree.root, root, { recursive: true });
  const snaps = path.join(root, 'snapshots');
  const env = { PYTHONPATH: path.join(ROOT, 'clients', 'python') };
  const id = (rank: number) => resolveIdentity({}, { rank, worldSize: 2, tp: 2, pp: 1 });
  // Ring A: forwards 1..6 (waves 10..15) whole. An incident at dump wave 13 flushes forwards <= wave 13 on both ranks; a user flush writes all.
  const a = RecorderRing.create(path.join(work, 'ring-a'), { forwards: 4, maxBytes: 4 * 4096 });
  runPython(RING_WRITER, [path.join(work, 'ring-a'), '6', '0'], { env });
  const readA = a.read();
  const upTo13 = { ...readA, entries: readA.entries.filter((e) => Number(e.entry.wave) <= 13) };
  for (const r of [0, 1]) await flushRing(upTo13, snaps, 'incident-wave13', 'incident', id(r));
  await flushRing(readA, snaps, 'flush-capture-1', 'user', id(0));
  a.close({ unlink: true });
  // Ring B: the engine dies inside forward 5's copy: forwards 2..4 flushed, 5 left out, crash-rank1.json.
  const b = RecorderRing.create(path.join(work, 'ring-b'), { forwards: 4, maxBytes: 4 * 4096 });
  expect(() => runPython(RING_WRITER, [path.join(work, 'ring-b'), '5', '5'], { env })).toThrow();
  const readB = b.read();
  const crash = await flushRing(readB, snaps, 'crash-run', 'crash', id(1));
  writeCrash(crash, { pid: 4242, code: null, signal: 'SIGKILL', how: 'pid gone' }, readB, id(1), 14);
  b.close({ unlink: true });

  const out = path.join(work, 'recorder.html');
  const r = runWavebus(['report', root, '-o', out]);
  expect(r.stderr).toBe('');
  expect(r.code).toBe(0);
  const page = await loadPage(out);
  expect(page.console).toEqual([]);
  expect(page.dom).toMatch(/id="recorder-flushes" data-count="3"/);
  const rowOf = (kind: string) => new RegExp(`<tr class="recorder-flush" data-kind="${kind}">([\\s\\S]*?)</tr>`).exec(page.dom)?.[1] ?? '';
  const inc = rowOf('incident');
  expect(inc).toContain('snapshots/recorder/incident-wave13');
  expect(inc).toContain('dump wave 13');
  expect(inc).toContain('rank 0: 3-4; rank 1: 3-4');
  expect(rowOf('user')).toContain('rank 0: 3-6');
  const cr = rowOf('crash');
  expect(cr).toContain('rank 1: 2-4');
  expect(cr).toMatch(/crash-rank1\.json<\/a>: signal SIGKILL, last wave 14, <code>RuntimeError<\/code>, left out: forward 5/);
  // The exception's message is not shown (only its type), and nothing from the tree runs.
  expect(page.dom).not.toContain('boom');
  // The flushed forwards are snapshots to inspect, not counted as the job's input snapshots.
  expect(page.dom).toMatch(/<th>recorder flushes<\/th><td>3<\/td>/);
  await screenshot(out, path.join(ARTIFACTS, 'report-recorder.png'));
  // wavebus trace marks the crash on rank 1's track.
  const traceOut = path.join(work, 'recorder.trace.json');
  expect(runWavebus(['trace', root, '-o', traceOut]).code).toBe(0);
  const crashes = JSON.parse(fs.readFileSync(traceOut, 'utf8')).traceEvents.filter((e: any) => e.cat === 'crash');
  expect(crashes).toHaveLength(1);
  expect(crashes[0]).toMatchObject({ name: 'engine crash (SIGKILL)', ph: 'i', args: { last_wave: 14, signal: 'SIGKILL', exception: 'RuntimeError', left_out: [5] } });
});

test('a flipped byte and a missing rank: both in red on the page, the banner says so, exit 1', async () => {
  const bad = path.join(work, 'bad-tree');
  fs.cpSync(tree.root, bad, { recursive: true });
  const dirs = rankDirsOf(bad);
  // Flip one byte of a tensor of the first rank dir; remove the last rank dir (the other replica's).
  const victim = path.join(bad, dirs[0]);
  const tensor = path.join(victim, fs.readdirSync(victim).find((f) => f.endsWith('.pt'))!);
  const bytes = fs.readFileSync(tensor);
  bytes[bytes.length - 5] ^= 0xff;
  fs.writeFileSync(tensor, bytes);
  fs.rmSync(path.join(bad, dirs[dirs.length - 1]), { recursive: true });

  const out = path.join(work, 'bad.html');
  const r = runWavebus(['report', bad, '-o', out]);
  expect(r.code).toBe(1);
  expect(r.stderr).toMatch(/checksum/);
  expect(r.stderr).toMatch(/rank \d+ missing/);
  const page = await loadPage(out);
  expect(page.console).toEqual([]);
  expect(page.dom).toContain('class="banner bad"');
  const failures = /<ul id="verify-failures">([\s\S]*?)<\/ul>/.exec(page.dom)?.[1] ?? '';
  expect(failures).toMatch(/<li class="fail">[^<]*checksum[^<]*<\/li>/);
  expect(failures).toMatch(/<li class="fail">[^<]*rank \d+ missing[^<]*<\/li>/);
  expect(count(page.dom, /class="cell corrupt"/)).toBe(1);
  expect(count(page.dom, /class="cell missing"/)).toBe(1);
  // The reason is on the cell (its tooltip).
  expect(page.dom).toMatch(/class="cell corrupt"[^>]*title="[^"]*checksum/);
  await screenshot(out, path.join(ARTIFACTS, 'report-bad.png'));
});

// Issue 45 item 5: escaping is not the only barrier. The policy admits the page's own script by
// its hash; a script that an escaping bug let through would be refused by Chromium.
test("the page's policy admits its own script by hash only: an inline script that got past escaping does not run, the page's own does", async () => {
  const out = path.join(work, 'csp.html');
  runWavebus(['report', tree.root, '-o', out]);
  const html = fs.readFileSync(out, 'utf8');
  const csp = /<meta http-equiv="Content-Security-Policy" content="([^"]*)">/.exec(html)?.[1] ?? '';
  const scriptSrc = csp.split(';').map((d) => d.trim()).find((d) => d.startsWith('script-src')) ?? '';
  expect(scriptSrc).toMatch(/^script-src 'sha256-[A-Za-z0-9+/]{43}='$/);
  const own = /<script>([\s\S]*?)<\/script>/.exec(html)![1];
  expect(scriptSrc).toContain(require('crypto').createHash('sha256').update(own).digest('base64'));
  // What an escaping bug would let through: a script and an inline handler in the page's body.
  const hurt = path.join(work, 'csp-injected.html');
  fs.writeFileSync(hurt, html.replace('<h1>', `<script>document.title='pwned'</script><img src="data:," onerror="document.title='pwned2'"><h1>`));
  const page = await loadPage(hurt);
  expect(page.dom).not.toMatch(/<title>pwned/);
  // Chromium says why it refused them; nothing else is on the console.
  expect(page.console.length).toBeGreaterThan(0);
  expect(page.console.every((l) => /Content Security Policy/.test(l))).toBe(true);
  // The page's own script ran: it shows the type filter it drives.
  expect(page.dom).toMatch(/<label>type <select id="type-filter">/);
  const clean = await loadPage(out);
  expect(clean.console).toEqual([]);
  expect(clean.dom).toMatch(/<label>type <select id="type-filter">/);
});

test('strings from the tree are escaped: a report field holding <script> does not run', async () => {
  const evil = path.join(work, 'evil-tree');
  fs.cpSync(tree.root, evil, { recursive: true });
  const file = path.join(evil, find(evil, /^report_.*\.json$/)[0]);
  const doc = JSON.parse(fs.readFileSync(file, 'utf8'));
  doc.req_id = `<script>document.title='pwned'</script><img src=x onerror="document.title='pwned2'">`;
  doc.detail['<b onmouseover=alert(1)>key</b>'] = '"><svg onload=alert(1)>';
  doc.incident_type = `x"><script>document.title='pwned3'</script>`;
  fs.writeFileSync(file, JSON.stringify(doc));
  const out = path.join(work, 'evil.html');
  runWavebus(['report', evil, '-o', out]);
  const page = await loadPage(out);
  expect(page.console).toEqual([]);
  expect(page.dom).toMatch(/<title>wavebus report: [^<]*<\/title>/);
  expect(page.dom).not.toContain('pwned</title>');
  expect(count(page.dom, /<script/i)).toBe(1); // the page's own
  expect(page.dom).not.toMatch(/<img|<svg onload|<b onmouseover/i);
  expect(page.dom).toContain('&lt;script&gt;document.title=');
});

test('--compare A B: the per-tensor table and heatmap of two ranks of one dump', async () => {
  const [a, b] = rankDirsOf(tree.root);
  const out = path.join(work, 'compare.html');
  const r = runWavebus(['report', '--compare', path.join(tree.root, a), path.join(tree.root, b), '-o', out]);
  expect(r.code).toBe(1); // two ranks' shards differ
  const cmp = runWavebus(['compare', path.join(tree.root, a), path.join(tree.root, b), '--json']);
  const tensors = JSON.parse(cmp.stdout).tensors as { key: string; status: string }[];
  const page = await loadPage(out);
  expect(page.console).toEqual([]);
  expect(count(page.dom, '<tr class="tensor')).toBe(tensors.length);
  for (const t of tensors) expect(page.dom).toContain(`<tr class="tensor ${t.status}"><th class="mono">${t.key}</th>`);
  expect(count(page.dom, 'class="heat"')).toBeGreaterThanOrEqual(tensors.length);
  expect(runWavebus(['report', '--compare', a]).code).toBe(2);
  expect(runWavebus(['report', tree.root, '-o', 'x.txt']).stderr).toMatch(/--out "x\.txt": expected a \.html/);
});

test('64 ranks and 100 incidents: under 5 MB, within a generous bound, every count on the page', async () => {
  const root = path.join(work, 'scale');
  const g = generatedTree(root, { tp: 8, dp: 8, incidents: 100, hosts: 8 });
  const out = path.join(work, 'scale.html');
  const t0 = Date.now();
  const r = runWavebus(['report', root, '-o', out], { timeout: 120000 });
  const ms = Date.now() - t0;
  expect(r.stderr).toBe('');
  expect(r.code).toBe(0);
  const size = fs.statSync(out).size;
  expect(fs.statSync(out).mode & 0o777).toBe(0o640); // no token ids in this tree
  process.stdout.write(`report of 64 ranks, 100 incidents, ${g.rankDirs} rank dumps: ${ms} ms, ${size} bytes\n`);
  expect(size).toBeLessThan(5 * 1024 * 1024);
  expect(ms).toBeLessThan(60000); // the target (10 s here) is measured in docs/report.md, not asserted
  const page = await loadPage(out, 120000);
  expect(page.console).toEqual([]);
  expect(textOf(page.dom, 'incident-count')).toBe('100');
  expect(count(page.dom, /class="cell complete"/)).toBe(g.rankDirs);
  expect(count(page.dom, /class="cell na"/)).toBe(64 * 100 - g.rankDirs);
  expect(count(page.dom, 'class="ev incident"')).toBe(100);
  expect(count(page.dom, 'class="ev dump"')).toBe(100);
  expect(page.dom).toContain('DP 8 × PP 1 × TP 8 = 64 ranks');
  expect(page.dom).toContain('host7: ranks 56-63');
  await screenshot(out, path.join(ARTIFACTS, 'report-scale.png'));
});

test('token text: with --vocab and save_sensitive_info only; a bad vocabulary is a usage error', () => {
  const vocab = path.join(work, 'vocab.json');
  fs.writeFileSync(vocab, JSON.stringify(Array.from({ length: 200 }, (_, i) => (i === 101 ? '<b>hi</b>' : `t${i}`))));
  const out = path.join(work, 'vocab.html');
  expect(runWavebus(['report', tree.root, '-o', out, '--vocab', vocab]).code).toBe(0);
  const html = fs.readFileSync(out, 'utf8');
  expect(html).toContain(`text from ${vocab}`);
  expect(html).toContain('<span title="id 101">&#60;b&#62;hi&#60;/b&#62;</span><span class="hit" title="id 102">t102</span>');

  // The same tree under a config without save_sensitive_info: ids, no text.
  const off = path.join(work, 'vocab-off');
  fs.cpSync(tree.root, off, { recursive: true });
  const [cfgFile] = find(off, /^runtime_config\.json$/);
  const cfg = JSON.parse(fs.readFileSync(path.join(off, cfgFile), 'utf8'));
  cfg.report.save_sensitive_info = false;
  fs.writeFileSync(path.join(off, cfgFile), JSON.stringify(cfg));
  expect(runWavebus(['report', off, '-o', out, '--vocab', vocab]).code).toBe(0);
  const ids = fs.readFileSync(out, 'utf8');
  expect(ids).toContain('does not set report.save_sensitive_info, so no text is shown');
  expect(ids).toContain('<span title="id 101">101</span>');
  expect(ids).not.toContain('t102');

  fs.writeFileSync(vocab, '{"model": 3}');
  const r = runWavebus(['report', tree.root, '-o', out, '--vocab', vocab]);
  expect(r.code).toBe(2);
  expect(r.stderr).toContain(`--vocab ${vocab}: expected a JSON list of tokens`);
});
