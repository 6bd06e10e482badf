// `wavebus demo --engine transformers`: the whole product on Hugging Face transformers' continuous
// batching (TP=2 under torchrun, the torch 2.x venv), run as a user runs it. It must pass, end with
// the page (report.html) naming the incidents the real faults caused, and its dump check (each
// dumped K/V against the engine's own pages) must notice a single flipped byte.
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { checkTransformersDump } from '../src/tools/demo-transformers';
import { cleanup, runWavebus, tmpDir } from './helpers';
import { torch2 } from './torch2';

jest.setTimeout(300000);
afterAll(cleanup);

test('demo --engine transformers (TP=2) verifies every artifact and ends with the page naming its incidents', () => {
  torch2(); // the venv is there (npm test's preflight); a clear error if not
  const out = path.join(tmpDir('wavebus-demo-hf-'), 'demo');
  const r = runWavebus(['demo', '--engine', 'transformers', '--tp', '2', '--steps', '64', '--out', out], { timeout: 280000 });
  expect({ code: r.code, tail: r.code === 0 ? '' : `${r.stdout.slice(-3000)}${r.stderr.slice(-3000)}` }).toEqual({ code: 0, tail: '' });
  expect(r.stdout).toContain('demo OK');
  const reportDir = path.join(out, 'runtime', 'report');
  const reports = (t: string) => fs.readdirSync(path.join(reportDir, t)).filter((f) => f.endsWith('.json')).map((f) => JSON.parse(fs.readFileSync(path.join(reportDir, t, f), 'utf8')));
  // The real faults: greedy loops (token_repeat), the NaN in req-1's rows at step 5, the LM head noise from step 40.
  expect(reports('logits_finite').map((x) => [x.req_id, x.detect_wave])).toEqual([['req-1', 5]]);
  expect(reports('token_repeat').length).toBeGreaterThan(0);
  const garbled = reports('garbled');
  expect(garbled.length).toBeGreaterThan(0);
  for (const g of garbled) expect(g.detect_wave).toBeGreaterThan(40);
  expect(fs.existsSync(path.join(reportDir, 'spec_acceptance'))).toBe(false);
  expect(r.stdout).toMatch(/input snapshots by rank: rank0=\d+ rank1=\d+/);
  // The page: written, verified, and naming every incident (type and request).
  expect(r.stdout).toContain(`report:    ${path.join(out, 'report.html')}\n`);
  const page = fs.readFileSync(path.join(out, 'report.html'), 'utf8');
  expect(page).toContain('class="banner ok" id="verify-banner"');
  for (const t of ['token_repeat', 'logits_finite', 'garbled']) {
    expect(page).toContain(t);
    for (const x of reports(t)) expect(page).toContain(x.req_id);
  }
  // The dump check reads the dump against the engine's pages: one flipped byte is found.
  const kv = path.join(reportDir, 'kv_cache', 'logits_finite', 'req-1');
  const wave = fs.readdirSync(kv).find((d) => d.startsWith('wave_'))!;
  const waveDir = path.join(kv, wave);
  expect(checkTransformersDump(waveDir, path.join(out, 'engine'))).toEqual([]);
  const rankDir = path.join(waveDir, 'dp0_tp1_pp0_cp0');
  const file = path.join(rankDir, fs.readdirSync(rankDir).find((f) => f.endsWith('.pt') && f.startsWith('model.layers.'))!);
  const flip = spawnSync(torch2().python, ['-c', "import sys, torch\nd = torch.load(sys.argv[1], weights_only=True)\nd['v'].view(torch.int32).view(-1)[0] ^= 1\ntorch.save(d, sys.argv[1])", file], { encoding: 'utf8' });
  expect(flip.stderr).toBe('');
  expect(checkTransformersDump(waveDir, path.join(out, 'engine'))).toEqual([`${waveDir}: dp0_tp1_pp0_cp0/${path.basename(file)}: v differs from the engine's pages`]);
});
