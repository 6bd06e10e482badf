// scripts/gpu-check.sh on a host without a GPU (CI): it runs up to the point where CUDA is absent,
// says so in one SKIP line and exits 3, distinct from PASS (0), FAIL (1) and setup errors (2).
import { spawnSync } from 'child_process';
import * as path from 'path';
import { PYTHON, ROOT } from './helpers';

const SCRIPT = path.join(ROOT, 'scripts', 'gpu-check.sh');

test('without a CUDA device the check stops cleanly with SKIP and exit code 3', () => {
  const r = spawnSync('bash', [SCRIPT], { env: { ...process.env, PYTHON, CUDA_VISIBLE_DEVICES: '' }, encoding: 'utf8', timeout: 120000 });
  expect(r.stderr).toBe('');
  expect(r.stdout).toMatch(/^SKIP: no CUDA device \(torch\.cuda\.is_available\(\) is False; torch \S+ cuda \S+\)\n$/);
  expect(r.status).toBe(3);
});

test('a python without torch is a setup error (exit 2), not a skip', () => {
  const r = spawnSync('bash', [SCRIPT], { env: { ...process.env, PYTHON: '/bin/false' }, encoding: 'utf8', timeout: 60000 });
  expect(r.stdout).toBe('SETUP: /bin/false cannot import torch (set PYTHON)\n');
  expect(r.status).toBe(2);
});
