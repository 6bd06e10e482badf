// The npm package as a user gets it: `npm pack` of this checkout, installed into an empty project
// (its install script builds the native addon from the packed sources), then the README's first
// command, `npx wavebus demo`, run from that project. Offline: the project's lockfile pins
// wavebus's dependencies at this repository's package-lock.json versions, and npm reads their
// tarballs from a copy of the local npm cache (the one `npm install` here filled), in the test's dir.
import { spawnSync, type SpawnSyncReturns } from 'child_process';
import { createHash } from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { ROOT, cleanup, tmpDir } from './helpers';

afterAll(cleanup);

interface PackResult {
  filename: string;
  size: number;
  entryCount: number;
  files: Array<{ path: string }>;
}

interface LockEntry {
  dev?: boolean;
  devOptional?: boolean;
  [k: string]: unknown;
}

const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8'));

function ok(r: SpawnSyncReturns<string>, what: string): string {
  if (r.status !== 0) throw new Error(`${what} exited ${r.status} ${r.signal ?? ''}:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

/** An empty project that depends on the tarball alone, with wavebus's production dependencies locked as here. */
function writeProject(project: string, tarball: string): void {
  const spec = `file:${path.relative(project, tarball)}`;
  const lock = JSON.parse(fs.readFileSync(path.join(ROOT, 'package-lock.json'), 'utf8')) as { packages: Record<string, LockEntry> };
  // The repository's root dependencies are wavebus's: in the project they hoist to the same node_modules/ paths.
  const deps = Object.entries(lock.packages).filter(([k, v]) => k !== '' && !v.dev && !v.devOptional);
  const integrity = `sha512-${createHash('sha512').update(fs.readFileSync(tarball)).digest('base64')}`;
  const wavebus = { version: pkg.version, resolved: spec, integrity, hasInstallScript: true, license: pkg.license, dependencies: pkg.dependencies, bin: pkg.bin, engines: pkg.engines };
  const manifest = { name: 'empty-project', version: '1.0.0', private: true, dependencies: { wavebus: spec }, allowScripts: { [spec]: true, zeromq: true, protobufjs: false } };
  fs.writeFileSync(path.join(project, 'package.json'), JSON.stringify(manifest, null, 2));
  const packages = { '': { name: manifest.name, version: manifest.version, dependencies: manifest.dependencies }, 'node_modules/wavebus': wavebus, ...Object.fromEntries(deps) };
  fs.writeFileSync(path.join(project, 'package-lock.json'), JSON.stringify({ name: manifest.name, version: manifest.version, lockfileVersion: 3, requires: true, packages }, null, 2));
}

test('the packed tarball holds no tests, installs into an empty project (building the addon), and `npx wavebus demo` runs there', () => {
  const dir = tmpDir('wavebus-package-');
  const home = path.join(dir, 'home');
  fs.mkdirSync(home);
  // npm's cache and logs under the test's dir: a copy of the local cache, which holds the dependencies' tarballs.
  const userCache = ok(spawnSync('npm', ['config', 'get', 'cache'], { encoding: 'utf8' }), 'npm config get cache').trim();
  const cache = path.join(dir, 'npm-cache');
  if (!fs.existsSync(path.join(userCache, '_cacache'))) throw new Error(`no npm cache at ${userCache}/_cacache: run \`npm install\` in the repository first`);
  fs.cpSync(path.join(userCache, '_cacache'), path.join(cache, '_cacache'), { recursive: true });
  const env = { ...process.env, HOME: home, npm_config_cache: cache, npm_config_logs_dir: path.join(dir, 'npm-logs'), npm_config_update_notifier: 'false', npm_config_audit: 'false', npm_config_fund: 'false' };

  // --ignore-scripts: `prepare` (tsc) is the build npm test's pretest has just made.
  const pack = (JSON.parse(ok(spawnSync('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', dir], { cwd: ROOT, env, encoding: 'utf8', timeout: 60000 }), 'npm pack')) as PackResult[])[0];
  const files = pack.files.map((f) => f.path);
  expect(files.filter((f) => /^(dist\/)?test\//.test(f) || /^bench\/.*\.ts$/.test(f) || f.endsWith('.map'))).toEqual([]);
  for (const f of ['bin/wavebus.js', 'dist/src/index.js', 'dist/src/index.d.ts', 'dist/src/cli.js', 'dist/proto/errors.json', 'dist/bench/overhead.js', 'dist/bench/lib/flags.js', 'bench/seed_guard.py', 'binding.gyp', 'README.md']) expect(files).toContain(f);
  // Every tracked file of the folders users build from or run ships.
  const tracked = ok(spawnSync('git', ['ls-files', 'native', 'proto', 'clients/python', 'examples', 'dashboards', 'docs', 'launch'], { cwd: ROOT, encoding: 'utf8' }), 'git ls-files').trim().split('\n');
  expect(tracked.length).toBeGreaterThan(80);
  expect(tracked.filter((f) => !files.includes(f))).toEqual([]);
  // 614 files, 1.07 MB at the change that set `files` (README.md); the suite shipped made it 1321 files, 2.2 MB.
  expect(pack.entryCount).toBeLessThan(800);
  expect(pack.size).toBeLessThan(1.5e6);

  const project = path.join(dir, 'project');
  fs.mkdirSync(project);
  writeProject(project, path.join(dir, pack.filename));
  const install = spawnSync('npm', ['ci', '--offline'], { cwd: project, env, encoding: 'utf8', timeout: 150000 });
  if (install.status !== 0 && /ENOTCACHED/.test(install.stderr)) throw new Error(`npm ci --offline: a dependency is not in the local npm cache ${userCache} (run \`npm install\` in the repository first):\n${install.stderr}`);
  ok(install, 'npm ci --offline of the packed tarball');
  const installed = path.join(project, 'node_modules', 'wavebus');
  expect(fs.existsSync(path.join(installed, 'build', 'Release', 'wavebus_native.node'))).toBe(true); // built by its install script
  // ...and the Python client's native path beside its sources (scripts/build-python-native.js; python3-dev is on the preflight's list).
  expect(fs.readdirSync(path.join(installed, 'clients', 'python', 'wavebus_client')).filter((f) => /^_native.*\.so$/.test(f)).length).toBe(1);
  expect(fs.existsSync(path.join(installed, 'test'))).toBe(false);
  expect(fs.realpathSync(ok(spawnSync('npx', ['-c', 'command -v wavebus'], { cwd: project, env, encoding: 'utf8' }), 'npx -c').trim())).toBe(fs.realpathSync(path.join(installed, 'bin', 'wavebus.js')));

  const demo = spawnSync('npx', ['wavebus', 'demo'], { cwd: project, env, encoding: 'utf8', timeout: 120000 });
  expect([demo.status, demo.stdout]).toEqual([0, expect.stringContaining('demo OK')]);
  expect(demo.stdout).toContain(`report:    ${path.join(project, 'wavebus-demo', 'report.html')}\n`);
  expect(fs.readFileSync(path.join(project, 'wavebus-demo', 'report.html'), 'utf8')).toContain('class="banner ok" id="verify-banner"');

  // `wavebus bench` ships: every benchmark built here is listed, and one runs from the package.
  const built = fs.readdirSync(path.join(ROOT, 'dist', 'bench')).filter((f) => f.endsWith('.js')).map((f) => f.slice(0, -3));
  const help = ok(spawnSync('npx', ['wavebus', 'bench', '--help'], { cwd: project, env, encoding: 'utf8', timeout: 60000 }), 'wavebus bench --help');
  expect([...help.matchAll(/^ {2}([\w-]+) {2,}/gm)].map((m) => m[1]).sort()).toEqual(built.sort());
  const bench = ok(spawnSync('npx', ['wavebus', 'bench', 'detectors', '--requests', '64', '--steps', '50', '--json'], { cwd: project, env, encoding: 'utf8', timeout: 60000 }), 'wavebus bench detectors');
  expect(JSON.parse(bench.trim().split('\n').pop()!)).toMatchObject({ bench: 'detectors', requests: 64, cpu_us_per_step: expect.any(Number) });
}, 240000);
