#!/usr/bin/env node
// The suite's torch 2.x venv (.venv-torch2/ in the repository, git-ignored): torch 2.x CPU,
// transformers, accelerate, safetensors, numpy, pyzmq, protobuf and wavebus_client (editable, from
// clients/python). `npm test`'s preflight calls ensure(); tests find its python and torchrun through
// test/torch2.ts. Everything comes from this machine's configured pip indexes (`pip config list`:
// a local wheel index) with the public index switched off, so nothing is fetched from the internet.
// A stamp file records what was installed; a venv whose stamp matches and whose imports work is
// reused as it is (about a second), anything else is made again from nothing.
'use strict';
const { spawnSync } = require('child_process');
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const VENV = process.env.WAVEBUS_TORCH2_VENV || path.join(root, '.venv-torch2');
const STAMP = 'wavebus-venv.json';
/** What the suite needs from the venv; torch is held to 2.x (the machine's constraints may cap it further). */
const PACKAGES = ['torch>=2,<3', 'transformers>=5,<6', 'accelerate', 'safetensors', 'numpy', 'pyzmq', 'protobuf'];
/** Local indexes only: the configured ones, the public index replaced (no internet here, and pip would wait out its retries). */
const INDEX_ARGS = ['--index-url', 'file:///opt/pypi/simple', '--extra-index-url', 'file:///opt/pypi-more/simple', '--find-links', '/opt/wheels'];
const CHECK = 'import torch, transformers, accelerate, safetensors, numpy, zmq, google.protobuf, wavebus_client, wavebus_client.wavebus_pb2 as pb;' +
  'assert torch.__version__.split(".")[0] == "2", torch.__version__;' +
  'assert "block_stride" in pb.Region.DESCRIPTOR.fields_by_name;' +
  'import os; assert os.path.realpath(os.path.dirname(wavebus_client.__file__)) == os.path.realpath(os.environ["WB_CLIENT"]), wavebus_client.__file__;' +
  'print(torch.__version__, transformers.__version__)';

const basePython = () => (fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3');
const venvPython = () => path.join(VENV, 'bin', 'python');

/** What the stamp must say: the package list, the index arguments, the client's pyproject. */
function wanted() {
  const pyproject = fs.readFileSync(path.join(root, 'clients', 'python', 'pyproject.toml'));
  return { packages: PACKAGES, index: INDEX_ARGS, client: crypto.createHash('sha256').update(pyproject).digest('hex') };
}

function valid() {
  let stamp;
  try {
    stamp = JSON.parse(fs.readFileSync(path.join(VENV, STAMP), 'utf8'));
  } catch {
    return false;
  }
  if (JSON.stringify(stamp.wanted) !== JSON.stringify(wanted())) return false;
  const r = spawnSync(venvPython(), ['-c', CHECK], { encoding: 'utf8', timeout: 120000, env: { ...process.env, WB_CLIENT: path.join(root, 'clients', 'python', 'wavebus_client') } });
  return r.status === 0;
}

function run(what, cmd, args) {
  const r = spawnSync(cmd, args, { cwd: root, stdio: ['ignore', 'inherit', 'pipe'], encoding: 'utf8', env: { ...process.env, PIP_DISABLE_PIP_VERSION_CHECK: '1' } });
  if (r.status !== 0) {
    // pip warns once per missing index page; keep only what says why it failed.
    const err = (r.stderr || '').split('\n').filter((l) => !/is ignored: it is neither a file nor a directory/.test(l)).join('\n');
    throw new Error(`torch 2 venv: ${what} failed (exit ${r.status ?? r.signal}):\n${err.slice(-3000)}`);
  }
}

/** Make (or reuse) the venv; returns { python, torchrun, seconds, reused }. Throws with what failed. */
function ensure(log = (m) => process.stderr.write(m + '\n')) {
  const t0 = Date.now();
  if (valid()) return { python: venvPython(), torchrun: path.join(VENV, 'bin', 'torchrun'), seconds: (Date.now() - t0) / 1000, reused: true };
  log(`wavebus tests: making the torch 2.x venv ${VENV} from this machine's local pip indexes (about a minute) ...`);
  fs.rmSync(VENV, { recursive: true, force: true });
  run('python3 -m venv', basePython(), ['-m', 'venv', VENV]);
  run('pip install', venvPython(), ['-m', 'pip', 'install', '-q', ...INDEX_ARGS, ...PACKAGES]);
  run('pip install -e clients/python', venvPython(), ['-m', 'pip', 'install', '-q', ...INDEX_ARGS, '-e', path.join(root, 'clients', 'python')]);
  fs.writeFileSync(path.join(VENV, STAMP), JSON.stringify({ wanted: wanted(), made: new Date().toISOString() }, null, 2) + '\n');
  if (!valid()) throw new Error(`torch 2 venv: ${VENV} was made but its imports fail: ${venvPython()} -c '${CHECK}'`);
  const seconds = (Date.now() - t0) / 1000;
  log(`wavebus tests: torch 2.x venv ready in ${seconds.toFixed(0)} s`);
  return { python: venvPython(), torchrun: path.join(VENV, 'bin', 'torchrun'), seconds, reused: false };
}

module.exports = { ensure, VENV };

if (require.main === module) {
  try {
    const r = ensure();
    process.stdout.write(`${r.python} (${r.reused ? 'reused' : 'made'} in ${r.seconds.toFixed(1)} s)\n`);
  } catch (e) {
    process.stderr.write(`${e.message}\n`);
    process.exit(1);
  }
}
