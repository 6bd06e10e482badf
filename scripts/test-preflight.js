#!/usr/bin/env node
// `npm test` runs this first (package.json "pretest"). It checks that this machine has what the
// suite needs (the Debian packages below, the ONE list of them: .ci/run installs it too, through
// --print-packages). Run as root, it installs what is missing itself with apt-get, so `npm test`
// passes on a fresh Debian machine with nothing installed by hand; otherwise (or with
// WAVEBUS_PREFLIGHT_INSTALL=0) it stops at once with one message naming what to install, instead
// of letting dozens of tests fail one by one. Then it rebuilds dist/ and the native addon so
// spawned CLI processes run the current sources, never a stale build, and makes (or reuses) the
// torch 2.x venv (scripts/torch2-venv.js) the transformers tests run in.
'use strict';
const { spawnSync } = require('child_process');
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const python = () => (fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3');

/** [Debian package, how to check it]: everything the build (npm install) and the tests need. */
const needs = [
  ['python3', () => ok(python(), ['-c', 'pass'])],
  ['python3-numpy', () => ok(python(), ['-c', 'import numpy'])],
  ['python3-torch', () => ok(python(), ['-c', 'import torch'])],
  ['python3-zmq', () => ok(python(), ['-c', 'import zmq'])],
  ['python3-protobuf', () => ok(python(), ['-c', 'import google.protobuf'])],
  ['python3-venv', () => ok(python(), ['-c', 'import ensurepip, venv'])],
  ['python3-setuptools', () => ok(python(), ['-c', 'import setuptools'])],
  ['python3-pip', () => ok(python(), ['-m', 'pip', '--version'])],
  // The Python client's native path (scripts/build-python-native.js) compiles against its headers.
  ['python3-dev', () => ok(python(), ['-c', 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'])],
  // node-gyp builds the native addon (npm install, and `npm test`'s rebuild) with these.
  ['gcc', () => ok('cc', ['--version'])],
  ['g++', () => ok('c++', ['--version'])],
  ['make', () => ok('make', ['--version'])],
  ['protobuf-compiler', () => ok('protoc', ['--version'])],
  ['iproute2', () => ok('ip', ['-V'])],
  // test/slurm.test.ts starts a one-node cluster of its own: slurmctld, slurmd, the clients, munged.
  ['slurm-wlm', () => ['slurmctld', 'slurmd', 'sbatch', 'srun', 'sinfo', 'scancel'].every(installed)],
  ['munge', () => ['munged', 'mungekey', 'munge'].every(installed)],
  // Page tests (test/report.test.ts) open the report pages in headless Chromium.
  ['chromium', () => installed('chromium')],
];

/** True when `program` is on PATH or in /usr/sbin or /sbin (daemons live there; a non-login PATH may lack them). */
function installed(program) {
  const dirs = (process.env.PATH || '').split(':').concat(['/usr/sbin', '/sbin']).filter(Boolean);
  return dirs.some((d) => fs.existsSync(path.join(d, program)));
}

function ok(cmd, args) {
  const r = spawnSync(cmd, args, { stdio: 'ignore', timeout: 60000 });
  return r.status === 0;
}

const missingNow = () => needs.filter(([, check]) => !check()).map(([pkg]) => pkg);

if (process.argv.includes('--print-packages')) {
  process.stdout.write(needs.map(([pkg]) => pkg).join(' ') + '\n');
  process.exit(0);
}

/** apt-get, as root, non-interactive; false when it could not run or failed. */
function apt(args) {
  const r = spawnSync('apt-get', args, { stdio: 'inherit', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } });
  if (r.error) process.stderr.write(`wavebus tests: could not run apt-get: ${r.error.message}\n`);
  return r.status === 0;
}

let missing = missingNow();
const mayInstall = typeof process.getuid === 'function' && process.getuid() === 0 && process.env.WAVEBUS_PREFLIGHT_INSTALL !== '0';
if (missing.length > 0 && mayInstall) {
  process.stderr.write(`wavebus tests: installing the Debian packages this machine lacks: ${missing.join(' ')}\n`);
  if (apt(['update', '-q']) && apt(['install', '-y', '-q', '--no-install-recommends', ...missing])) missing = missingNow();
}
if (missing.length > 0) {
  const sudo = mayInstall ? '' : 'sudo ';
  process.stderr.write(
    `wavebus tests need Debian packages that this machine lacks: ${missing.join(' ')}\n` +
      `install them, then run npm test again:\n` +
      `  ${sudo}apt-get update && ${sudo}apt-get install -y --no-install-recommends ${missing.join(' ')}\n` +
      (mayInstall ? '' : `(npm test does this itself when it runs as root)\n`),
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
fs.rmSync(path.join(root, 'dist'), { recursive: true, force: true });
step('building dist/ (tsc)', process.execPath, [path.join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json']);
// npm names its own node-gyp to the scripts it runs; `build` is incremental (make), quick when nothing changed.
const gyp = process.env.npm_config_node_gyp;
if (gyp) step('building the native addon (node-gyp build)', process.execPath, [gyp, 'build']);
// The Python client's native path, from the current _native.c (python3-dev is checked above).
if (!require('./build-python-native').build()) {
  process.stderr.write('wavebus tests: building the Python client\'s native path failed; the suite would test a stale or absent build\n');
  process.exit(1);
}

// The torch 2.x venv the transformers tests run in (scripts/torch2-venv.js): made from this
// machine's local pip indexes the first time, reused while its stamp matches.
try {
  require('./torch2-venv').ensure();
} catch (e) {
  process.stderr.write(`wavebus tests: ${e.message}\n`);
  process.exit(1);
}
