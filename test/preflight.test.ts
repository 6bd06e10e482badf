// `npm test` on a machine without the suite's Debian packages stops at once with one message
// naming them and the command that installs them (scripts/test-preflight.js, the "pretest" script).
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { ROOT, cleanup, tmpDir } from './helpers';

afterAll(cleanup);

test('a machine without protoc, ip, Slurm and munge gets one message naming protobuf-compiler, iproute2, slurm-wlm and munge', () => {
  // A PATH holding only node: protoc, ip, sbatch and munge cannot be found (python3 is looked up at /usr/bin first).
  const bin = tmpDir();
  fs.symlinkSync(process.execPath, path.join(bin, 'node'));
  const r = spawnSync(process.execPath, [path.join(ROOT, 'scripts', 'test-preflight.js')], { encoding: 'utf8', env: { PATH: bin } });
  expect(r.status).toBe(1);
  expect(r.stderr).toMatch(/lacks: .*protobuf-compiler iproute2 slurm-wlm munge/);
  expect(r.stderr).toMatch(/apt-get install -y --no-install-recommends .*protobuf-compiler iproute2 slurm-wlm munge/);
  expect(r.stderr.split('\n').filter(Boolean).length).toBeLessThanOrEqual(4);
});
