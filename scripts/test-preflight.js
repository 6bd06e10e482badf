#!/usr/bin/env node
// `npm test` runs this first (package.json "pretest"): it stops at once, with one message naming
// what to install, when this machine lacks what the suite needs, instead of letting dozens of
// tests fail one by one. Then it rebuilds dist/ and the native addon so spawned CLI processes run
// the current sources, never a stale build.
'use strict';
const { spawnSync } = require('child_process');
const path = require('path');

const root = path.resolve(__dirname, '..');
const python = require('fs').existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

/** [Debian package, how to check it] */
const needs = [
  ['python3', () => ok(python, ['-c', 'pass'])],
  ['python3-numpy', () => ok(python, ['-c', 'import numpy'])],
  ['python3-torch', () => ok(python, ['-c', 'import torch'])],
  ['python3-zmq', () => ok(python, ['-c', 'import zmq'])],
  ['python3-protobuf', () => ok(python, ['-c', 'import google.protobuf'])],
  ['python3-venv', () => ok(python, ['-c', 'import ensurepip, venv'])],
  ['python3-setuptools', () => ok(python, ['-c', 'import setuptools'])],
  ['gcc', () => ok('cc', ['--version'])],
  ['protobuf-compiler', () => ok('protoc', ['--version'])],
  ['iproute2', () => ok('ip', ['-V'])],
  // test/slurm.test.ts starts a one-node cluster of its own: slurmctld, slurmd, the clients, munged.
  ['slurm-wlm', () => ['slurmctld', 'slurmd', 'sbatch', 'srun', 'sinfo', 'scancel'].every(installed)],
  ['munge', () => ['munged', 'mungekey', 'munge'].every(installed)],
  // test/report.test.ts opens the report pages in headless Chromium.
  ['chromium', () => installed('chromium')],
];

/** True when `program` is on PATH or in /usr/sbin or /sbin (daemons live there; a non-login PATH may lack them). */
function installed(program) {
  const dirs = (process.env.PATH || '').split(':').concat(['/usr/sbin', '/sbin']).filter(Boolean);
  return dirs.some((d) => require('fs').existsSync(path.join(d, program)));
}

function ok(cmd, args) {
  const r = spawnSync(cmd, args, { stdio: 'ignore', timeout: 60000 });
  return r.status === 0;
}

const missing = needs.filter(([, check]) => !check()).map(([pkg]) => pkg);
if (missing.length > 0) {
  process.stderr.write(
    `wavebus tests need Debian packages that this machine lacks: ${missing.join(' ')}\n` +
      `install them, then run npm test again:\n` +
      `  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing.join(' ')}\n` +
      `(.ci/run does this itself when it runs as root)\n`,
  );
  process.exit(1);
}

function step(what, cmd, args) {
  const r = spawnSync(cmd, args, { cwd: root, stdio: 'inherit' });
  if (r.status !== 0) {
    process.stderr.write(`wavebus tests: ${what} failed (exit ${r.status ?? r.signal}); the suite would test a stale build\n`);
    process.exit(1);
  }
}

// dist/ is rebuilt from nothing: a file whose source moved or went away must not linger there.
require('fs').rmSync(path.join(root, 'dist'), { recursive: true, force: true });
step('building dist/ (tsc)', process.execPath, [path.join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json']);
// npm names its own node-gyp to the scripts it runs; `build` is incremental (make), quick when nothing changed.
const gyp = process.env.npm_config_node_gyp;
if (gyp) step('building the native addon (node-gyp build)', process.execPath, [gyp, 'build']);
