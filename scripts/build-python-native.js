#!/usr/bin/env node
// Builds the Python client's optional C fast path (clients/python/wavebus_client/_native.c) in
// place, for the interpreter the tests and benches run (/usr/bin/python3, else python3), named with
// its EXT_SUFFIX (git-ignored). package.json's "install" runs it after node-gyp, and the tests'
// preflight before the suite. Without a compiler or the interpreter's headers (Debian: python3-dev)
// it warns and exits 0: the client then runs its numpy path (docs/python-client.md, "The native path").
'use strict';
const { spawnSync } = require('child_process');
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const pkg = path.join(root, 'clients', 'python', 'wavebus_client');
const source = path.join(pkg, '_native.c');
const python = process.env.WAVEBUS_PYTHON || (fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3');

function warn(why) {
  process.stderr.write(`wavebus: the Python client's native path was not built (${why}); it runs its numpy path instead\n`);
  return false;
}

/** Compiles _native.c for `python`; true when built. Never throws. */
function build() {
  const q = spawnSync(python, ['-c', 'import sysconfig, json; print(json.dumps([sysconfig.get_paths()["include"], sysconfig.get_config_var("EXT_SUFFIX")]))'], { encoding: 'utf8', timeout: 60000 });
  if (q.status !== 0) return warn(`${python} did not answer: ${(q.stderr || q.error?.message || '').trim().slice(-300)}`);
  const [include, suffix] = JSON.parse(q.stdout.trim());
  if (!suffix || !/^[\w.-]+\.so$/.test(suffix)) return warn(`${python} gave an unusable EXT_SUFFIX ${JSON.stringify(suffix)}`);
  const out = path.join(pkg, `_native${suffix}`);
  if (!fs.existsSync(path.join(include, 'Python.h'))) {
    fs.rmSync(out, { force: true }); // never a stale build of older sources
    return warn(`no ${path.join(include, 'Python.h')}: install python3-dev`);
  }
  const tmp = `${out}.${process.pid}.tmp`;
  const cc = process.env.CC || 'cc';
  const r = spawnSync(cc, ['-O2', '-shared', '-fPIC', `-I${include}`, source, '-o', tmp], { encoding: 'utf8', timeout: 120000 });
  if (r.status !== 0) {
    fs.rmSync(tmp, { force: true });
    fs.rmSync(out, { force: true });
    return warn(`${cc} failed: ${(r.stderr || r.error?.message || '').trim().slice(-500)}`);
  }
  fs.renameSync(tmp, out); // whole or not at all: a process importing it meanwhile sees the old one or the new
  return true;
}

module.exports = { build };
if (require.main === module) {
  try {
    build();
  } catch (e) {
    warn(e.message);
  }
}
