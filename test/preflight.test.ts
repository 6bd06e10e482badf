// `npm test`'s pretest (scripts/test-preflight.js): on a machine without the suite's Debian
// packages it installs them with apt-get when it runs as root, and otherwise stops at once with one
// message naming them and the command that installs them. Its list is the only list: .ci/run
// installs what `--print-packages` prints, then runs the README's test command.
import { spawnSync, type SpawnSyncOptions } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { ROOT, cleanup, tmpDir } from './helpers';

afterAll(cleanup);

const PREFLIGHT = path.join(ROOT, 'scripts', 'test-preflight.js');
const isRoot = process.getuid?.() === 0;
// A PATH holding only node (and what a test adds): cc, make, protoc, ip, sbatch, munge and chromium
// cannot be found (python3 is looked up at /usr/bin first, so the Python packages are found).
const LACKING = 'gcc g++ make protobuf-compiler iproute2 slurm-wlm munge chromium';

function binWithNode(): string {
  const bin = tmpDir();
  fs.chmodSync(bin, 0o755);
  fs.symlinkSync(process.execPath, path.join(bin, 'node'));
  return bin;
}

function preflight(env: NodeJS.ProcessEnv, extra: SpawnSyncOptions = {}): { status: number | null; stderr: string } {
  const r = spawnSync(process.execPath, [PREFLIGHT], { env, ...extra });
  return { status: r.status, stderr: String(r.stderr) };
}

function expectNamed(stderr: string, sudo: string) {
  expect(stderr).toContain(`lacks: ${LACKING}\n`);
  expect(stderr).toContain(`  ${sudo}apt-get update && ${sudo}apt-get install -y --no-install-recommends ${LACKING}\n`);
  expect(stderr.split('\n').filter(Boolean).length).toBeLessThanOrEqual(4);
}

test('not root: one message naming the missing packages and the sudo command that installs them', () => {
  const bin = binWithNode();
  // As root here, the check runs as nobody (uid 65534); elsewhere the test already runs as a plain user.
  const r = preflight({ PATH: bin }, isRoot ? { uid: 65534, gid: 65534, cwd: '/' } : {});
  expect(r.status).toBe(1);
  expectNamed(r.stderr, 'sudo ');
  expect(r.stderr).toContain('(npm test does this itself when it runs as root)');
});

test('WAVEBUS_PREFLIGHT_INSTALL=0 names them without installing, even as root', () => {
  const bin = binWithNode();
  const calls = path.join(bin, 'apt-get.calls');
  // An apt-get that only records it was called: it must not be.
  fs.writeFileSync(path.join(bin, 'apt-get'), `#!/bin/sh\necho "$@" >> ${calls}\n`, { mode: 0o755 });
  const r = preflight({ PATH: bin, WAVEBUS_PREFLIGHT_INSTALL: '0' });
  expect(r.status).toBe(1);
  expectNamed(r.stderr, 'sudo ');
  expect(fs.existsSync(calls)).toBe(false);
});

test('as root it runs apt-get update, then apt-get install of exactly the missing packages, then checks again', () => {
  const bin = binWithNode();
  const calls = path.join(bin, 'apt-get.calls');
  // apt-get here records its arguments and installs nothing, so the re-check still finds them
  // missing: the real apt-get is not run by tests (it needs the network and the dpkg lock).
  fs.writeFileSync(path.join(bin, 'apt-get'), `#!/bin/sh\necho "$DEBIAN_FRONTEND $@" >> ${calls}\n`, { mode: 0o755 });
  const r = preflight({ PATH: bin });
  expect(r.status).toBe(1);
  if (isRoot) {
    expect(fs.readFileSync(calls, 'utf8')).toBe(`noninteractive update -q\nnoninteractive install -y -q --no-install-recommends ${LACKING}\n`);
    expect(r.stderr).toContain(`installing the Debian packages this machine lacks: ${LACKING}\n`);
    expectNamed(r.stderr.slice(r.stderr.indexOf('wavebus tests need')), '');
  } else {
    expect(fs.existsSync(calls)).toBe(false);
    expectNamed(r.stderr, 'sudo ');
  }
});

test('an apt-get that fails stops the run naming the packages still missing', () => {
  const bin = binWithNode();
  fs.writeFileSync(path.join(bin, 'apt-get'), '#!/bin/sh\nexit 100\n', { mode: 0o755 });
  const r = preflight({ PATH: bin });
  expect(r.status).toBe(1);
  expect(r.stderr).toContain(`lacks: ${LACKING}\n`);
});

test('one list: --print-packages prints every package; .ci/run installs that list and runs the README test command', () => {
  const r = spawnSync(process.execPath, [PREFLIGHT, '--print-packages'], { encoding: 'utf8' });
  expect(r.status).toBe(0);
  const packages = r.stdout.trim().split(' ');
  expect(packages).toEqual(expect.arrayContaining(['python3-torch', 'slurm-wlm', 'munge', 'chromium', 'g++', 'make', 'protobuf-compiler']));
  const ci = fs.readFileSync(path.join(ROOT, '.ci', 'run'), 'utf8');
  expect(ci).toContain('packages=$(node scripts/test-preflight.js --print-packages)');
  expect(ci).toMatch(/apt-get install -y -q --no-install-recommends \$packages/);
  // No second list of package names in .ci/run.
  for (const p of packages.filter((x) => x.startsWith('python3-') || x === 'slurm-wlm')) expect(ci).not.toContain(p);
  const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
  const testCommand = /^(npm [a-z: ]+?)\s+#.*tests?\b/m.exec(readme.split('```sh')[1])?.[1];
  expect(testCommand).toBe('npm test');
  expect(ci.trimEnd().split('\n').pop()).toBe(testCommand);
});

test('install scripts: every dependency package-lock.json marks as having one is named in allowScripts (run or denied)', () => {
  const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8'));
  const lock = JSON.parse(fs.readFileSync(path.join(ROOT, 'package-lock.json'), 'utf8'));
  const withScripts = Object.entries(lock.packages as Record<string, { hasInstallScript?: boolean }>)
    .filter(([where, p]) => where !== '' && p.hasInstallScript)
    .map(([where]) => where.slice(where.lastIndexOf('node_modules/') + 'node_modules/'.length));
  expect(withScripts.length).toBeGreaterThan(0);
  expect([...new Set(withScripts)].sort()).toEqual(Object.keys(pkg.allowScripts).sort());
  // zeromq's finds or builds its libzmq binding: the bus needs it.
  expect(pkg.allowScripts.zeromq).toBe(true);
});
