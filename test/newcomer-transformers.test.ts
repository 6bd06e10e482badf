// A newcomer on a real engine (docs/transformers.md, "A first run, step by step"), as a test: the
// page's command block, read from the page, run line by line in a fresh directory with a fresh
// $HOME. `wavebus` is on the PATH as the README's set-up puts it there (`npm link` of this clone,
// into a prefix of the test's own), `python3` is Debian's, `examples/` is linked in and `clients/`
// copied (pip builds ./clients/python in its own tree). The venv is made fresh by the page's own
// lines from the machine's pip indexes: nothing of the suite's .venv-torch2 is used. The only
// change to a line: the bus port, when 29600 is taken. Each step's check is what the page says the
// newcomer sees; the page written at the end is loaded in headless Chromium. A line of the block
// without a check here fails the test, so the page and this test cannot drift apart.
import { spawn, spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { CHROMIUM, count, loadPage } from './chromium';
import { blocks, commandsOf, readerPath } from './doc-commands';
import { CLI, ROOT, cleanup, freePortPair, readManifests, tmpDir, waitFor } from './helpers';

// The fresh venv is most of it: 5 minutes on the loaded 2-vCPU VM (docs/transformers.md states it).
jest.setTimeout(1500000);
afterAll(cleanup);

const PAGE = 'docs/transformers.md';
const HEADING = '## A first run, step by step';
const DOC_PORT = 29600;

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}

interface Step {
  check: (r: Ran, dir: string) => void;
  /** Run again (every second, at most `againMs`) while it returns true: what a person does with a job still starting. */
  again?: (r: Ran) => boolean;
}

interface Report { req_id: string; detect_wave: number }
type Manifest = { arm_wave: number; incident_type: string; req_id: string; completed_ranks: number[]; expected_ranks: number[]; missing_ranks: number[] };

const AGAIN_MS = 180000;
/** What the walk saw along the way, for the later checks. */
const seen = { waveWhenTurnedOn: -1 };

const reports = (dir: string, type: string): Report[] => {
  const d = path.join(dir, 'runtime', 'report', type);
  return fs.existsSync(d) ? fs.readdirSync(d).filter((f) => f.endsWith('.json')).map((f) => JSON.parse(fs.readFileSync(path.join(d, f), 'utf8'))) : [];
};
const manifests = (dir: string, type: string): Manifest[] => {
  const d = path.join(dir, 'runtime', 'report', 'kv_cache');
  return fs.existsSync(d) ? readManifests<Manifest>(d).filter((m) => m.incident_type === type) : [];
};
/** A dump complete from both TP ranks, each rank's folder holding one .pt per layer. */
function bothRanks(dir: string, type: string, m: Manifest): void {
  expect({ req: m.req_id, expected: m.expected_ranks, completed: [...m.completed_ranks].sort(), missing: m.missing_ranks }).toEqual({ req: m.req_id, expected: [0, 1], completed: [0, 1], missing: [] });
  const reqDir = path.join(dir, 'runtime', 'report', 'kv_cache', type, m.req_id);
  const wave = fs.readdirSync(reqDir).find((w) => fs.existsSync(path.join(reqDir, w, 'manifest.json')))!;
  for (const rank of ['dp0_tp0_pp0_cp0', 'dp0_tp1_pp0_cp0']) {
    expect(fs.readdirSync(path.join(reqDir, wave, rank)).filter((f) => f.endsWith('.pt')).sort()).toEqual(['model.layers.0.self_attn.pt', 'model.layers.1.self_attn.pt']);
  }
}

/** The checks, by the line's first words (before the port is set). */
const STEPS: Array<[RegExp, Step]> = [
  [/^python3 -m venv hf-venv$/, { check: (r, d) => {
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
    expect(fs.existsSync(path.join(d, 'hf-venv', 'bin', 'pip'))).toBe(true);
  } }],
  [/^hf-venv\/bin\/pip install .*\.\/clients\/python$/, { check: (r, d) => {
    expect({ code: r.code, tail: r.code === 0 ? '' : r.stderr.slice(-3000) }).toEqual({ code: 0, tail: '' });
    // torch 2, transformers 5 and the client, all from the venv (the client from the copy in the walk's dir, installed).
    const v = spawnSync(path.join(d, 'hf-venv', 'bin', 'python'), ['-c', 'import torch, transformers, wavebus_client, os; print(torch.__version__, transformers.__version__, os.path.dirname(wavebus_client.__file__))'], { encoding: 'utf8', cwd: '/' });
    expect(v.stdout).toMatch(/^2\.\S+ 5\.\S+ \S+\/hf-venv\/lib\/python3[.\d]*\/site-packages\/wavebus_client\n$/);
  } }],
  [/^export PATH=\$PWD\/hf-venv\/bin:\$PATH$/, { check: (r) => expect(r.code).toBe(0) }],
  [/^python examples\/transformers-engine\/make_model\.py model$/, { check: (r, d) => {
    expect({ code: r.code, tail: r.code === 0 ? '' : r.stderr.slice(-3000) }).toEqual({ code: 0, tail: '' });
    expect(JSON.parse(fs.readFileSync(path.join(d, 'model', 'config.json'), 'utf8')).num_hidden_layers).toBe(2);
  } }],
  // The background jobs: checked at their `wait`.
  [/^wavebus launch .*--runtime-config-hot-reload .*--out out .*&$/, { check: () => undefined }],
  [/^wavebus status --coordinator 127\.0\.0\.1:29600 --bus-token-file bus\.token$/, {
    // Again while the job starts, and while the engine still loads the model (the replica's wave is 0).
    again: (r) => r.code !== 0 || !(replicaWave(r.stdout) > 0),
    check: (r) => {
      expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
      expect(r.stdout).toMatch(/layout DP1 x PP1 x TP2 \(2 ranks\)/);
      expect(r.stdout).toMatch(/^0 +0 +0 +0 +yes /m);
      expect(r.stdout).toMatch(/^1 +0 +0 +1 +yes /m);
      expect(r.stdout).toMatch(/^config v1 from \S+\/runtime\/config\/runtime_config\.json \(hot reload on\)$/m);
      expect(r.stdout).toMatch(/^incidents: none$/m); // nothing on yet
      seen.waveWhenTurnedOn = replicaWave(r.stdout);
    },
  }],
  [/^echo .*token_repeat.* > runtime\/config\/runtime_config\.json$/, { check: (r) => expect(r.code).toBe(0) }],
  [/^wait$/, { check: () => undefined }], // the background job's own check runs there
  [/^wavebus launch (?!.*--runtime-config-hot-reload).*--out out2 .*&$/, { check: () => undefined }],
  [/^wavebus dump --coordinator 127\.0\.0\.1:29600 --bus-token-file bus\.token --all --wait$/, {
    // Again while the job starts (no token, no coordinator yet). While the engine loads the model
    // the armed dump waits for its first steps: never "sent no wave head" (it failed so until 2026-12-07).
    again: (r) => r.code !== 0 && /no coordinator answered|bus\.token/.test(r.stdout + r.stderr),
    check: (r) => {
      expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
      expect(r.stdout).toMatch(/^armed dump-\d+: a manual dump of every running request/m);
      const done = r.stdout.match(/^complete: \S+manual_trigger\/req-\d\/wave_\d+\/manifest\.json$/gm) ?? [];
      expect(done.length).toBeGreaterThanOrEqual(1);
    },
  }],
  [/^wavebus report runtime -o incident\.html$/, { check: (r, d) => {
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
    expect(fs.statSync(path.join(d, 'incident.html')).size).toBeGreaterThan(1000);
  } }],
];

/** The replica's wave in `wavebus status`'s table (the row under `replica  wave`). */
function replicaWave(table: string): number {
  const m = /^replica +wave .*\n(\d+) +(\d+) /m.exec(table);
  return m ? Number(m[2]) : -1;
}

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

/** The checks at each `wait`, in order: what the job in the background must have left. */
const AFTER_WAIT: Array<(dir: string) => void> = [
  (d) => {
    // The detector was turned on live: every token_repeat incident came after the wave the status showed.
    const found = reports(d, 'token_repeat');
    expect(found.length).toBeGreaterThanOrEqual(1);
    for (const x of found) expect(x.detect_wave).toBeGreaterThan(seen.waveWhenTurnedOn);
    const dumps = manifests(d, 'token_repeat');
    expect(dumps.length).toBe(1); // dump.auto_max_times 1
    bothRanks(d, 'token_repeat', dumps[0]);
    expect(found.map((x) => x.req_id)).toContain(dumps[0].req_id);
  },
  (d) => {
    const dumps = manifests(d, 'manual_trigger');
    expect(dumps.length).toBeGreaterThanOrEqual(1);
    for (const m of dumps) bothRanks(d, 'manual_trigger', m);
  },
];

test('a newcomer on transformers: a fresh venv, TP=2 under launch + torchrun, a detector on live with a dump from both ranks, a dump of a default job, the page in Chromium', async () => {
  expect(CHROMIUM).toBeDefined();
  const start = fs.readFileSync(path.join(ROOT, PAGE), 'utf8').split('\n').indexOf(HEADING) + 2;
  const block = blocks(ROOT, PAGE).find((b) => b.lang === 'sh' && b.startLine > start);
  expect(block).toBeDefined();
  const lines = commandsOf(block!).map((c) => c.text);
  const unchecked = lines.filter((l) => !STEPS.some(([re]) => re.test(l)));
  expect(unchecked).toEqual([]);
  expect(STEPS.filter(([re]) => !lines.some((l) => re.test(l))).map(([re]) => String(re))).toEqual([]);

  const dir = tmpDir('wavebus-hf-walk-');
  const home = tmpDir('wavebus-hf-walk-home-');
  fs.symlinkSync(path.join(ROOT, 'examples'), path.join(dir, 'examples'));
  fs.cpSync(path.join(ROOT, 'clients'), path.join(dir, 'clients'), { recursive: true, filter: (src) => !/(__pycache__|\.egg-info|\/build)$/.test(src) });
  const PATH = readerPath(ROOT, tmpDir('wavebus-hf-walk-prefix-'), `${path.dirname(process.execPath)}:/usr/bin:/bin`);
  const env: NodeJS.ProcessEnv = { PATH, HOME: home, LANG: 'C.UTF-8', WAVEBUS_LOG_LEVEL: 'warn', PIP_DISABLE_PIP_VERSION_CHECK: '1' };
  expect(fs.realpathSync(spawnSync('bash', ['-c', 'command -v wavebus'], { env, encoding: 'utf8' }).stdout.trim())).toBe(fs.realpathSync(CLI));
  const port = await freePortPair();
  const pre: string[] = [];
  let background: { line: string; done: Promise<Ran>; pid?: number } | undefined;
  let waits = 0;
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
        expect({ line: background!.line, code: r.code, tail: r.code === 0 ? '' : `${r.stdout.slice(-1500)}${r.stderr.slice(-3000)}` }).toEqual({ line: background!.line, code: 0, tail: '' });
        // The job's bus token (launch --bus-token-dir .) lived beside it only while it ran.
        expect(fs.existsSync(path.join(dir, 'bus.token'))).toBe(false);
        background = undefined;
        AFTER_WAIT[waits++](dir);
        timings.push(`${line}: ${Date.now() - t0} ms`);
        continue;
      }
      let r = await bash(line, dir, env, pre).done;
      let tries = 1;
      if (step.again) {
        const until = Date.now() + AGAIN_MS;
        while (step.again(r) && Date.now() < until) {
          await new Promise((res) => setTimeout(res, 1000));
          r = await bash(line, dir, env, pre).done;
          tries++;
        }
      }
      try {
        step.check(r, dir);
      } catch (e) {
        throw new Error(`${PAGE}: \`${line}\` did not show what the page says:\n${(e as Error).message}\nstdout: ${r.stdout.slice(-2000)}\nstderr: ${r.stderr.slice(-2000)}`);
      }
      if (/^(export )?[A-Z_]+=/.test(line)) pre.push(line);
      timings.push(`${line.slice(0, 60)}: ${Date.now() - t0} ms${tries > 1 ? ` (${tries} tries)` : ''}`);
    }
    expect(waits).toBe(AFTER_WAIT.length);

    // The page, in a real browser: no console error, every file verified, both jobs' dumps and the incident.
    const page = await loadPage(path.join(dir, 'incident.html'));
    expect(page.console).toEqual([]);
    expect(page.dom).toContain('class="banner ok"');
    expect(page.dom).toContain('token_repeat');
    for (const x of reports(dir, 'token_repeat')) expect(page.dom).toContain(x.req_id);
    expect(page.dom).toContain('manual_trigger');
    expect(page.dom).toContain('DP 1 × PP 1 × TP 2 = 2 ranks');
    expect(count(page.dom, /class="cell complete"/)).toBeGreaterThanOrEqual(2 * (1 + manifests(dir, 'manual_trigger').length));
  } finally {
    if (background?.pid !== undefined) {
      try {
        process.kill(-background.pid, 'SIGTERM');
      } catch {
        /* gone */
      }
      await waitFor(() => background!.done, 'the background job to stop', 30000).catch(() => process.kill(-background!.pid!, 'SIGKILL'));
    }
    process.stdout.write(`${timings.join('\n')}\n`);
  }
});
