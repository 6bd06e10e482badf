// Issue 45 item 2: a bus token another user could swap. A token file not of this user, or in a
// directory another user owns or a group or everybody may write, is refused (ERR_PATH_UNTRUSTED)
// by every reader (launch, coordinator, agents, tools); the launcher hands its coordinator and
// agents the token on a pipe, so a coordinator it restarts never reads the path again.
import * as fs from 'fs';
import * as path from 'path';
import { BusToken, createTokenFile, TOKEN_FILE_NAME } from '../src/bus/auth';
import { requestStatus } from '../src/bus/status-client';
import { argsOf, childrenOf } from './procs';
import { cleanup, cleanupUsers, CLI, describeAsRoot, freePortPair, otherUser, runWavebus, spawnWavebus, tmpDir, waitFor } from './helpers';

jest.setTimeout(180000);

afterAll(async () => {
  await cleanup();
  cleanupUsers();
});

function codeOf(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    return `${(e as { code?: string }).code}: ${(e as Error).message}`;
  }
  return undefined;
}

describeAsRoot('a bus token another user could have swapped', () => {
  test('BusToken.load refuses a token file of another uid, and one in a directory another uid owns or others may write', () => {
    const user = otherUser('tok');
    const mine = tmpDir('wavebus-tok-');
    const good = createTokenFile(mine);
    expect(BusToken.load(good, '--bus-token-file')).toBeInstanceOf(BusToken);
    // The swap: the file is theirs (root used to take it).
    const theirsDir = tmpDir('wavebus-tok-');
    const theirs = createTokenFile(theirsDir);
    fs.chownSync(theirs, user.uid, user.gid);
    expect(codeOf(() => BusToken.load(theirs, '--bus-token-file'))).toMatch(new RegExp(`^ERR_PATH_UNTRUSTED: --bus-token-file ${theirs}: owned by uid ${user.uid} \\(${user.name}\\), not by this user`));
    // The file is ours but the directory is theirs: they could swap it at any time.
    const dirOfTheirs = tmpDir('wavebus-tok-');
    const f = createTokenFile(dirOfTheirs);
    fs.chownSync(dirOfTheirs, user.uid, user.gid);
    expect(codeOf(() => BusToken.load(f, '--bus-token-file'))).toMatch(/^ERR_PATH_UNTRUSTED: --bus-token-file .*: directory .* is owned by uid \d+ \(wbttok/);
    fs.chownSync(dirOfTheirs, 0, 0);
    // Group- or world-writable, sticky bit or not.
    for (const mode of [0o770, 0o777, 0o1777]) {
      fs.chmodSync(dirOfTheirs, mode);
      expect(codeOf(() => BusToken.load(f, '--bus-token-file'))).toMatch(/^ERR_PATH_UNTRUSTED: --bus-token-file .*(is writable by every user without the sticky bit|\(mode 0(770|1777)\) is writable by (its group|every user))/);
    }
    fs.chmodSync(dirOfTheirs, 0o755);
    expect(BusToken.load(f, '--bus-token-file')).toBeInstanceOf(BusToken);
  });

  test('launch --bus-token-dir, the coordinator, an agent and wavebus status refuse what another user owns', async () => {
    const user = otherUser('tok');
    const dir = tmpDir('wavebus-tokcli-');
    const theirDir = path.join(dir, 'theirs');
    fs.mkdirSync(theirDir, { mode: 0o755 });
    fs.chownSync(theirDir, user.uid, user.gid);
    const l = runWavebus(['launch', '--bus-token-dir', theirDir, '--', 'true']);
    expect(l.code).toBe(2);
    expect(l.stderr).toContain(`--bus-token-dir ${theirDir}: directory ${theirDir} is owned by uid ${user.uid} (${user.name})`);
    expect(l.stderr).toContain('[ERR_PATH_UNTRUSTED]');
    expect(fs.readdirSync(theirDir)).toEqual([]);
    const open = path.join(dir, 'open');
    fs.mkdirSync(open);
    fs.chmodSync(open, 0o1777);
    expect(runWavebus(['launch', '--bus-token-dir', open, '--', 'true']).stderr).toMatch(/--bus-token-dir .*open \(mode 01777\) is writable by every user.*\[ERR_PATH_UNTRUSTED\]/);

    const tokDir = tmpDir('wavebus-tokcli-');
    const planted = createTokenFile(tokDir);
    fs.chownSync(planted, user.uid, user.gid);
    const port = await freePortPair();
    const want = new RegExp(`--bus-token-file ${planted}: owned by uid ${user.uid} .*\\[ERR_PATH_UNTRUSTED\\]`);
    for (const args of [
      ['status', '--coordinator', `127.0.0.1:${port}`, '--bus-token-file', planted],
      ['coordinator', '--port', String(port), '--world-size', '1', '--bus-token-file', planted, '--runtime-config-path', path.join(dir, 'none.json')],
      ['agent', '--coordinator', `127.0.0.1:${port}`, '--rank', '0', '--world-size', '1', '--bus-token-file', planted],
    ]) {
      const r = runWavebus(args, { env: { ...process.env, WAVEBUS_BUS_TOKEN_FILE: '' } });
      expect({ cmd: args[0], failed: r.code !== 0, err: want.test(r.stderr) ? 'refused' : r.stderr }).toEqual({ cmd: args[0], failed: true, err: 'refused' });
    }
  });

  test('a coordinator restarted by launch takes the token from the launcher, not from the path: swapped meanwhile, the agents stay with it', async () => {
    const dir = tmpDir('wavebus-tokrestart-');
    const tokDir = path.join(dir, 'tok');
    fs.mkdirSync(tokDir, { mode: 0o700 });
    const port = await freePortPair();
    const stop = path.join(dir, 'stop');
    const launch = spawnWavebus([
      'launch', '--nproc-per-node', '1', '--port', String(port), '--bus-token-dir', tokDir, '--ready-timeout-ms', '120000',
      '--runtime-config-path', path.join(dir, 'cfg', 'runtime_config.json'),
      '--', process.execPath, CLI, 'sim', '--steps', '100000', '--step-ms', '40', '--stop-file', stop, '--result-dir', path.join(dir, 'ranks'),
    ], { env: { ...process.env, WAVEBUS_LOG_LEVEL: 'warn' } });
    const tokenFile = path.join(tokDir, TOKEN_FILE_NAME);
    await waitFor(() => fs.existsSync(tokenFile), 'the token file', 30000);
    const keep = path.join(tmpDir('wavebus-tokkeep-'), 'bus.token');
    fs.copyFileSync(tokenFile, keep);
    const token = BusToken.load(keep, 'kept');
    const ready = async (epochNot?: number) =>
      waitFor(async () => {
        const s = await requestStatus({ host: '127.0.0.1', port }, 1000, undefined, token).catch(() => undefined);
        return s && s.ready && s.epoch !== epochNot ? s : undefined;
      }, 'the job to be ready', 120000, 100);
    const before = await ready();
    // The launcher restarts a coordinator only once it has seen the job ready itself and started the
    // command; one killed before that fails the launch (as it should at startup). This test's status
    // poll can see ready first, so wait for the command, the launcher's child after its sidecars.
    await waitFor(() => childrenOf(launch.child.pid!).some((p) => argsOf(p).includes('sim')), 'the launcher to start the command', 60000, 50);
    // Swap the file for another token (as another user did in a directory of theirs), then kill -9
    // the coordinator: launch starts it again.
    fs.rmSync(tokenFile);
    createTokenFile(tokDir);
    // The launcher's own coordinator (its child): a pattern over all of /proc can match another
    // coordinator still winding down from an earlier test (the port is a substring of many command
    // lines); killed instead, it would leave this test waiting for a restart that never comes.
    const coords = childrenOf(launch.child.pid!).filter((p) => argsOf(p).includes('coordinator'));
    expect(coords).toHaveLength(1);
    const coord = coords[0];
    const argv = argsOf(coord);
    expect(argv.join(' ')).toContain(`--port ${port} `);
    expect(argv).toContain('--bus-token-fd');
    expect(argv.join(' ')).not.toContain(tokenFile);
    process.kill(Number(coord), 'SIGKILL');
    // Ready again with the launcher's token: the agent (which holds it too) synced with the new coordinator.
    // On a timeout, what the launcher said (its restarts, the agents' warnings) goes with the error.
    const after = await ready(before.epoch).catch((e: Error) => {
      throw new Error(`${e.message}; the launcher said:\n${launch.stderr().slice(-6000)}`);
    });
    expect(after.epoch).not.toBe(before.epoch);
    expect(launch.stderr()).toMatch(/the coordinator was killed by SIGKILL; starting it again/);
    fs.writeFileSync(stop, '');
    const { code } = await launch.exited;
    expect(code).toBe(0);
  });
});
