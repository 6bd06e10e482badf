// A newcomer's walk (docs/walkthrough.md), as a test: the page's command block, read from the page,
// run line by line in a fresh directory with a fresh $HOME, `wavebus` on the PATH as the README's
// set-up puts it there (`npm link` of this clone, built by `npm install`), `python3` the one with
// torch, and `examples/` and `clients/` linked in as the page says. The only change to a line: the bus port, when 29600 is taken. Each
// step's check is what the page says the newcomer sees. A line of the block without a check here
// fails the test, so the page and this test cannot drift apart.
import { spawn, spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { blocks, commandsOf, readerPath } from './doc-commands';
import { CLI, PYTHON, ROOT, cleanup, freePortPair, tmpDir, waitFor } from './helpers';

jest.setTimeout(600000);
afterAll(cleanup);

const PAGE = 'docs/walkthrough.md';
const DOC_PORT = 29600;

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}

interface Step {
  /** What the step must show; `dir` is the walk's directory. */
  check: (r: Ran, dir: string) => void;
  /** Checked once before the step's first try (after any wait for what the page says appears). */
  before?: (dir: string) => void;
  /** Run again (a few times) while it returns true: what a person does with a job still starting. */
  again?: (r: Ran) => boolean;
}

/** The checks, by the line's first words (after the port is set). */
const STEPS: Array<[RegExp, Step]> = [
  [/^wavebus demo$/, { check: (r, d) => {
    expect(r.stdout).toMatch(/^demo OK/m);
    expect(fs.statSync(path.join(d, 'wavebus-demo', 'report.html')).size).toBeGreaterThan(1000);
  } }],
  // the background demo: checked at `wait`
  [/^wavebus demo --engine torch .*&$/, { check: () => undefined }],
  [/^wavebus status /, {
    // the token the demo put beside its output (launch --bus-token-dir), 0600
    before: (d) => expect(fs.statSync(path.join(d, 'wavebus-demo', 'bus.token')).mode & 0o777).toBe(0o600),
    again: (r) => r.code !== 0 || /never joined/.test(r.stdout) || !/^1 +0 +0 +1 +yes /m.test(r.stdout),
    check: (r) => {
      expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
      expect(r.stdout).toMatch(/layout DP1 x PP1 x TP2 \(2 ranks\)/);
      expect(r.stdout).toMatch(/^0 +0 +0 +0 +yes /m);
      expect(r.stdout).toMatch(/^1 +0 +0 +1 +yes /m);
      expect(r.stdout).toMatch(/^incidents: /m);
    },
  }],
  [/^wavebus capture .*--next --wait/, { check: (r) => {
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
    expect(r.stdout).toMatch(/^armed capture-\d+/m);
    expect(r.stdout).toMatch(/^rank 0 wave \d+: .+call\d+$/m);
    expect(r.stdout).toMatch(/^rank 1 wave \d+: .+call\d+$/m);
  } }],
  [/^wait$/, { check: () => undefined }], // the background demo's own check runs there
  [/^wavebus report wavebus-demo -o incident\.html$/, { check: (r, d) => {
    expect(r.code).toBe(0);
    const html = fs.readFileSync(path.join(d, 'incident.html'), 'utf8');
    for (const type of ['garbled', 'logits_finite', 'token_repeat']) expect(html).toContain(type);
    expect(html).toMatch(/req-1/); // the request the NaN was planted for
    expect(html).toMatch(/rank ?[01]/);
  } }],
  [/^SNAP=/, { check: (r) => expect(r.code).toBe(0) }],
  [/^CALL=/, { check: (r) => expect(r.code).toBe(0) }],
  [/^python3 examples\/torch-engine\/replay\.py .*--probe tp1$/, { check: (r, d) => {
    expect({ code: r.code, stderr: r.stderr.slice(-2000) }).toMatchObject({ code: 0 });
    expect(fs.readdirSync(path.join(d, 'tp1'))).toEqual(['rank0']);
  } }],
  [/^python3 examples\/torch-engine\/replay\.py .*--fault weight:1:layers\.1\.up$/, { check: (r, d) => {
    expect({ code: r.code, stderr: r.stderr.slice(-2000) }).toMatchObject({ code: 0 });
    expect(fs.readdirSync(path.join(d, 'bad')).sort()).toEqual(['rank0', 'rank1']);
  } }],
  [/^wavebus bisect bad tp1$/, { check: (r) => {
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 1, stderr: '' }); // 1: a module is out of tolerance
    expect(r.stdout).toMatch(/^FIRST OUT OF TOLERANCE: model\.layers\.1\.mlp\.up_proj$/m);
    expect(r.stdout).toMatch(/^ {2}rank\(s\) 1 /m);
  } }],
];

/** `bash -c` in the walk's dir and environment; `pre` replays the variables set so far. */
function bash(line: string, dir: string, env: NodeJS.ProcessEnv, pre: string[]): { done: Promise<Ran>; pid?: number } {
  const child = spawn('bash', ['-c', [...pre, line].join('\n')], { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (b) => (stdout += b));
  child.stderr.on('data', (b) => (stderr += b));
  const done = new Promise<Ran>((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })));
  return { done, pid: child.pid };
}

test('the walk from an incident to an answer runs as written, each step showing what the page says', async () => {
  const block = blocks(ROOT, PAGE).find((b) => b.lang === 'sh');
  expect(block).toBeDefined();
  const lines = commandsOf(block!).map((c) => c.text);
  // Every line has its check, and every check its line.
  const unchecked = lines.filter((l) => !STEPS.some(([re]) => re.test(l)));
  expect(unchecked).toEqual([]);
  expect(STEPS.filter(([re]) => !lines.some((l) => re.test(l))).map(([re]) => String(re))).toEqual([]);

  const dir = tmpDir('wavebus-walk-');
  const home = tmpDir('wavebus-walk-home-');
  const bin = tmpDir('wavebus-walk-bin-');
  fs.symlinkSync(PYTHON, path.join(bin, 'python3'));
  for (const d of ['examples', 'clients']) fs.symlinkSync(path.join(ROOT, d), path.join(dir, d));
  // `wavebus` as the README's set-up links it (`npm link`, into a prefix of the test's own).
  const PATH = readerPath(ROOT, tmpDir('wavebus-walk-prefix-'), `${bin}:${path.dirname(process.execPath)}:/usr/bin:/bin`);
  const env: NodeJS.ProcessEnv = { PATH, HOME: home, LANG: 'C.UTF-8', WAVEBUS_LOG_LEVEL: 'warn' };
  expect(fs.realpathSync(spawnSync('bash', ['-c', 'command -v wavebus'], { env, encoding: 'utf8' }).stdout.trim())).toBe(fs.realpathSync(CLI));
  const port = (await freePortPair()) ;
  const pre: string[] = [];
  let background: { line: string; done: Promise<Ran>; pid?: number } | undefined;
  const timings: string[] = [];
  try {
    for (const doc of lines) {
      const line = port === DOC_PORT ? doc : doc.replaceAll(String(DOC_PORT), String(port));
      const step = STEPS.find(([re]) => re.test(doc))![1];
      const t0 = Date.now();
      if (line.endsWith('&')) {
        background = { line, ...bash(line.slice(0, -1), dir, env, pre) };
        continue;
      }
      if (line === 'wait') {
        const r = await background!.done;
        expect({ line: background!.line, code: r.code, ok: /^demo OK/m.test(r.stdout), tail: r.code === 0 ? '' : `${r.stdout.slice(-1500)}${r.stderr.slice(-1500)}` }).toEqual({ line: background!.line, code: 0, ok: true, tail: '' });
        // The job's bus token (launch --bus-token-dir) lived beside the demo's output only while it ran.
        expect(fs.existsSync(path.join(dir, 'wavebus-demo', 'bus.token'))).toBe(false);
        background = undefined;
        timings.push(`${line}: ${Date.now() - t0} ms`);
        continue;
      }
      if (step.before) await waitFor(() => { step.before!(dir); return true; }, `what \`${line}\` needs`, 60000, 250);
      let r = await bash(line, dir, env, pre).done;
      if (step.again) {
        // A person runs it again while the job is still starting (at most 60 s).
        const until = Date.now() + 60000;
        while (step.again(r) && Date.now() < until) {
          await new Promise((res) => setTimeout(res, 1000));
          r = await bash(line, dir, env, pre).done;
        }
      }
      try {
        step.check(r, dir);
      } catch (e) {
        throw new Error(`${PAGE}: \`${line}\` did not show what the page says:\n${(e as Error).message}\nstdout: ${r.stdout.slice(-2000)}\nstderr: ${r.stderr.slice(-2000)}`);
      }
      if (/^[A-Z_]+=/.test(line)) pre.push(line);
      timings.push(`${line.slice(0, 60)}: ${Date.now() - t0} ms`);
    }
  } finally {
    if (background?.pid !== undefined) {
      try {
        process.kill(-background.pid, 'SIGTERM');
      } catch {
        /* gone */
      }
      await waitFor(() => background!.done, 'the background demo to stop', 30000).catch(() => process.kill(-background!.pid!, 'SIGKILL'));
    }
    process.stdout.write(`${timings.join('\n')}\n`);
  }
});
