// clients/python as a package: `pip install` offline into a venv over Debian's python3 (its
// --system-site-packages give zmq, protobuf, setuptools), imported from outside the repository, with
// its native path (wavebus_client._native) built by pip.
import * as path from 'path';
import * as fs from 'fs';
import { spawnSync } from 'child_process';
import { cleanup, PYTHON, ROOT, tmpDir } from './helpers';

afterAll(cleanup);

test('pip install ./clients/python works offline; the import and `-m wavebus_client --version` work from elsewhere', () => {
  const venv = path.join(tmpDir('wavebus-venv-'), 'v');
  const run = (cmd: string, args: string[], cwd: string) => spawnSync(cmd, args, { cwd, encoding: 'utf8', timeout: 120000 });
  let r = run(PYTHON, ['-m', 'venv', '--system-site-packages', venv], '/');
  expect(r.status).toBe(0);
  r = run(path.join(venv, 'bin', 'pip'), ['install', '--no-index', '--no-build-isolation', path.join(ROOT, 'clients', 'python')], '/');
  // setuptools builds in the source tree (build/, *.egg-info, both git-ignored): remove them.
  for (const d of ['build', 'wavebus_client.egg-info']) fs.rmSync(path.join(ROOT, 'clients', 'python', d), { recursive: true, force: true });
  if (r.status !== 0) throw new Error(r.stdout + r.stderr);
  const outside = tmpDir('wavebus-outside-');
  r = run(path.join(venv, 'bin', 'python'), ['-c', 'import wavebus_client, sys; print(wavebus_client.__file__); print(wavebus_client.__version__)'], outside);
  expect(r.status).toBe(0);
  expect(r.stdout).toContain(path.join(venv, 'lib'));
  // The subpackage is installed too (pyproject lists it): the transformers integration's layout module.
  r = run(path.join(venv, 'bin', 'python'), ['-c', 'import wavebus_client.integrations.transformers_cache as m; print(m.__file__)'], outside);
  expect({ status: r.status, err: r.stderr }).toEqual({ status: 0, err: '' });
  expect(r.stdout).toContain(path.join(venv, 'lib'));
  // The native path (setup.py's optional extension) is built by pip where a compiler and the headers are (here: python3-dev).
  r = run(path.join(venv, 'bin', 'python'), ['-c', 'from wavebus_client import native, _native; print(_native.__file__); print(native.load() is _native)'], outside);
  expect({ status: r.status, err: r.stderr }).toEqual({ status: 0, err: '' });
  expect(r.stdout.trim().split('\n')).toEqual([expect.stringContaining(path.join(venv, 'lib')), 'True']);
  r = run(path.join(venv, 'bin', 'python'), ['-m', 'wavebus_client', '--version'], outside);
  expect(r.status).toBe(0);
  const version = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')).version;
  expect(r.stdout.trim()).toMatch(new RegExp(`^wavebus_client ${version.replace(/\./g, '\\.')} \\(client protocol \\d+\\)$`));
}, 150000);
