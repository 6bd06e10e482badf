// Run directories and shared memory against a hostile local user (a real second uid): planted
// directories and links are refused or never used, a named --run-dir is private whatever the
// umask, and processes killed with SIGKILL leave nothing in /dev/shm (issue 13, items 3 and 4).
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { MailboxWriter } from '../src/client/mailbox';
import { removeShmSegments, newShmPrefix } from '../src/launch/run-dir';
import { MAX_ROWS } from '../src/sim/rank';
import { childrenOf, cmdline } from './procs';
import { CLI, cleanup, cleanupUsers, freePort, freePortPair, describeAsRoot, otherUser, runAs, runWavebus, spawnTracked, spawnWavebus, tmpDir, waitFor, type OtherUser } from './helpers';

jest.setTimeout(180000);

afterAll(async () => {
  await cleanup();
  cleanupUsers();
});

const AGENT_ENV: NodeJS.ProcessEnv = { ...process.env, RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' };
delete AGENT_ENV.WAVEBUS_RUN_DIR;

function modeOf(p: string): string {
  return (fs.lstatSync(p).mode & 0o7777).toString(8);
}

/** A root-owned file with no content: what an agent writing through a planted link would fill. */
function preciousFile(dir: string): string {
  const f = path.join(dir, 'precious');
  fs.writeFileSync(f, '');
  fs.chmodSync(f, 0o644);
  return f;
}

/** A directory root owns (0711) holding one the other user owns, where that user makes things. */
function attackerArea(user: OtherUser): { base: string; att: string } {
  const base = tmpDir('wavebus-rundir-');
  fs.chmodSync(base, 0o711);
  const att = path.join(base, 'att');
  fs.mkdirSync(att);
  fs.chownSync(att, user.uid, user.gid);
  return { base, att };
}

/**
 * The other user plants world-writable directories at `nameFor(pid)` for the next `count` pids
 * (what an attacker does to meet a `<name>-<pid>` run dir). Returns the ones that user owns.
 */
function plantForNextPids(user: OtherUser, nameFor: (pid: number) => string, count: number): { from: number; planted: string[] } {
  const last = Number(fs.readFileSync('/proc/sys/kernel/ns_last_pid', 'utf8'));
  const names = Array.from({ length: count }, (_, i) => nameFor(last + 1 + i));
  runAs(user, 'sh', ['-c', 'umask 000; mkdir -m 777 "$@" 2>/dev/null; true', 'plant', ...names]);
  return { from: last + 1, planted: names.filter((n) => fs.existsSync(n) && fs.lstatSync(n).uid === user.uid) };
}

function unplant(names: string[], keep?: string): void {
  for (const n of names) if (n !== keep) fs.rmSync(n, { recursive: true, force: true });
}

test("an agent's own run dir in $TMPDIR is gone once the tests' cleanup stopped it (SIGTERM first, SIGKILL only after a grace)", async () => {
  // A private TMPDIR outside the helpers' temp dirs: cleanup() removes those, this one the test does.
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-agent-tmpdir-'));
  const left = () => fs.readdirSync(tmp).filter((n) => n.startsWith('wavebus-agent-rank0-'));
  try {
    spawnWavebus(['agent', '--coordinator', `127.0.0.1:${await freePort()}`], { env: { ...AGENT_ENV, TMPDIR: tmp } });
    await waitFor(() => left().some((d) => fs.existsSync(path.join(tmp, d, 'mailbox-local0'))), "the agent's mailbox in its run dir");
    await cleanup();
    expect(left()).toEqual([]);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

describeAsRoot('run directories against another local user', () => {
  let user: OtherUser;
  beforeAll(() => {
    user = otherUser('rundir');
  });

  test('a launcher never uses a directory planted at a predictable name: its run dir is fresh, ours and 0700', async () => {
    const port = await freePortPair();
    const out = path.join(tmpDir(), 'out');
    const me = os.userInfo().username.replace(/[^A-Za-z0-9._-]/g, '_');
    const { from, planted } = plantForNextPids(user, (pid) => `/dev/shm/wavebus-${me}-${pid}`, 1000);
    const r = spawnWavebus(['launch', '--ready-timeout-ms', '120000', '--port', String(port), '--', 'sh', '-c', `stat -c '%u %a %n' "$WAVEBUS_RUN_DIR" > ${out}`]);
    const mine = `/dev/shm/wavebus-${me}-${r.child.pid}`;
    unplant(planted, mine); // the others may meet another user's launcher; only ours matters
    try {
      expect(r.child.pid! - from).toBeLessThan(1000); // the attack covered this launcher's pid
      expect(planted).toContain(mine);
      const { code } = await r.exited;
      expect({ code, stderr: code === 0 ? '' : r.stderr() }).toEqual({ code: 0, stderr: '' });
      const [uid, mode, dir] = fs.readFileSync(out, 'utf8').trim().split(' ');
      expect({ uid: Number(uid), mode }).toEqual({ uid: process.geteuid!(), mode: '700' });
      expect(dir).not.toBe(mine);
      expect(dir).toMatch(/^\/dev\/shm\/wavebus-[A-Za-z0-9]{6}$/);
      expect(fs.readdirSync(mine)).toEqual([]); // no socket or mailbox went into the planted dir
    } finally {
      unplant([mine]);
    }
  });

  test('an agent without --run-dir makes an unpredictable private dir, not the planted wavebus-agent-rank0-<pid>', async () => {
    const tmp = os.tmpdir();
    const { from, planted } = plantForNextPids(user, (pid) => path.join(tmp, `wavebus-agent-rank0-${pid}`), 1000);
    const a = spawnWavebus(['agent', '--coordinator', `127.0.0.1:${await freePort()}`], { env: { ...AGENT_ENV, WAVEBUS_LOG_LEVEL: 'info' } });
    const mine = path.join(tmp, `wavebus-agent-rank0-${a.child.pid}`);
    unplant(planted, mine);
    try {
      expect(a.child.pid! - from).toBeLessThan(1000);
      expect(planted).toContain(mine);
      const started = await waitFor(() => /"runDir":"([^"]+)"/.exec(a.stdout() + a.stderr())?.[1], 'the agent to start');
      expect(started).not.toBe(mine);
      expect(path.basename(started)).toMatch(/^wavebus-agent-rank0-[A-Za-z0-9]{6}$/);
      expect({ uid: fs.lstatSync(started).uid, mode: modeOf(started) }).toEqual({ uid: process.geteuid!(), mode: '700' });
      expect(fs.readdirSync(mine)).toEqual([]);
      a.child.kill('SIGTERM');
      expect((await a.exited).code).toBe(0);
      expect(fs.existsSync(started)).toBe(false); // removed: we created it
    } finally {
      unplant([mine]);
    }
  });

  test("a --run-dir another user made (0777, with a mailbox link to root's file) is refused, naming --run-dir; the file is unchanged", () => {
    const { base, att } = attackerArea(user);
    const precious = preciousFile(base);
    const dir = path.join(att, 'run');
    const planted = runAs(user, 'sh', ['-c', `umask 000; mkdir -m 777 ${dir} && ln -s ${precious} ${dir}/mailbox-local0`]);
    expect(planted.code).toBe(0);
    const agent = runWavebus(['agent', '--coordinator', '127.0.0.1:1', '--run-dir', dir], { env: AGENT_ENV, timeout: 60000 });
    expect(agent.code).not.toBe(0);
    expect(agent.stderr).toContain(`--run-dir ${dir}: exists and belongs to another user (owner uid ${user.uid}, mode 0777)`);
    const launch = runWavebus(['launch', '--port', '1', '--run-dir', dir, '--', 'true'], { timeout: 60000 });
    expect(launch.code).not.toBe(0);
    expect(launch.stderr).toContain(`--run-dir ${dir}: exists and belongs to another user`);
    expect(fs.statSync(precious).size).toBe(0);
    expect(fs.lstatSync(path.join(dir, 'mailbox-local0')).isSymbolicLink()).toBe(true); // not ours to remove
  });

  test('a mailbox path that is a link (or a hard link) is refused; the linked file is unchanged', () => {
    const dir = tmpDir();
    const precious = preciousFile(dir);
    const link = path.join(dir, 'mailbox-local0');
    fs.symlinkSync(precious, link);
    expect(() => MailboxWriter.create(link)).toThrow(/is a symbolic link; refusing to follow it/);
    fs.unlinkSync(link);
    fs.linkSync(precious, link);
    expect(() => MailboxWriter.create(link)).toThrow(/is not a mailbox of ours .*2 links/);
    expect(fs.statSync(precious).size).toBe(0);
    fs.unlinkSync(link);
    const w = MailboxWriter.create(link);
    try {
      expect(modeOf(link)).toBe('600');
      MailboxWriter.create(link).close(); // a successor agent takes its own file over
    } finally {
      w.close({ unlink: true });
    }
  });

  test('an existing --run-dir with mode 0755, or owned by another user, or a link, is refused naming --run-dir and what was found', () => {
    const { att } = attackerArea(user);
    const open = tmpDir();
    const wide = path.join(open, 'wide');
    fs.mkdirSync(wide, { mode: 0o755 });
    fs.chmodSync(wide, 0o755);
    const theirs = path.join(att, 'theirs');
    expect(runAs(user, 'mkdir', ['-m', '700', theirs]).code).toBe(0);
    const link = path.join(open, 'link');
    const target = path.join(open, 'target');
    fs.mkdirSync(target, { mode: 0o700 });
    fs.symlinkSync(target, link);
    const cases: [string, string][] = [
      [wide, `--run-dir ${wide}: exists with owner uid ${process.geteuid!()}, mode 0755; a run dir must be a directory owned by uid ${process.geteuid!()} (you) with mode 0700`],
      [theirs, `--run-dir ${theirs}: exists and belongs to another user (owner uid ${user.uid}, mode 0700)`],
      [link, `--run-dir ${link}: is a symbolic link`],
    ];
    for (const [dir, message] of cases) {
      const r = runWavebus(['agent', '--coordinator', '127.0.0.1:1', '--run-dir', dir], { env: AGENT_ENV, timeout: 60000 });
      expect({ dir, code: r.code === 0 ? 0 : 'failed', named: r.stderr.includes(message) }).toEqual({ dir, code: 'failed', named: true });
    }
    expect(fs.readdirSync(target)).toEqual([]);
    expect(modeOf(wide)).toBe('755'); // refused, not "fixed"
  });

  test('`wavebus agent --run-dir D` under umask 000 makes D 0700 and its mailbox 0600, and removes only what it made', async () => {
    const parent = tmpDir();
    const dir = path.join(parent, 'made');
    const a = spawnTracked('sh', ['-c', `umask 000; exec "${process.execPath}" "${CLI}" agent --coordinator 127.0.0.1:${await freePort()} --run-dir ${dir}`], { env: AGENT_ENV });
    await waitFor(() => fs.existsSync(path.join(dir, 'agent-local0.sock')) || a.child.exitCode !== null, 'the agent socket');
    expect({ dir: modeOf(dir), mailbox: modeOf(path.join(dir, 'mailbox-local0')) }).toEqual({ dir: '700', mailbox: '600' });
    a.child.kill('SIGTERM');
    expect((await a.exited).code).toBe(0);
    expect(fs.existsSync(dir)).toBe(false);
    // One that was already there (ours, 0700) stays.
    fs.mkdirSync(dir, { mode: 0o700 });
    const b = spawnWavebus(['agent', '--coordinator', `127.0.0.1:${await freePort()}`, '--run-dir', dir], { env: AGENT_ENV });
    await waitFor(() => fs.existsSync(path.join(dir, 'agent-local0.sock')), 'the second agent socket');
    b.child.kill('SIGTERM');
    expect((await b.exited).code).toBe(0);
    expect(fs.existsSync(dir)).toBe(true);
  });

  test('a file or link at the agent socket path is refused, not unlinked', async () => {
    const dir = tmpDir();
    const sock = path.join(dir, 'agent-local0.sock');
    fs.symlinkSync('/etc/hostname', sock);
    const r = runWavebus(['agent', '--coordinator', '127.0.0.1:1', '--run-dir', dir], { env: AGENT_ENV, timeout: 60000 });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain(`agent socket ${sock}: something else is there (a symbolic link); refusing to remove it`);
    expect(fs.lstatSync(sock).isSymbolicLink()).toBe(true);
  });
});

// ---------------------------------------------------------------- shared memory of dead processes

/** /dev/shm entries a sim or launched job of this test can make (old and new naming alike). */
function simShmEntries(): Set<string> {
  return new Set(fs.readdirSync('/dev/shm').filter((n) => /^wavebus-(sim-|[0-9a-f]{12}-)/.test(n)));
}

/**
 * The rank has passed the job's start barrier and steps: its input buffers (MAX_ROWS int32 ids and
 * int64 positions at the end of its segment) hold a batch. A rank killed before the barrier fails
 * the job's start instead (the job then kills every rank), which is not what these tests kill.
 */
function stepping(name: string): boolean {
  const buf = fs.readFileSync(path.join('/dev/shm', name));
  return buf.subarray(buf.length - MAX_ROWS * 12).some((b) => b !== 0);
}

const SIM = ['sim', '--steps', '100000', '--step-ms', '20', '--layers', '2', '--num-blocks', '64'];

describeAsRoot('shared memory of killed processes', () => {
  test('kill -9 of `wavebus sim` (and of one of its ranks) leaves no new /dev/shm entries', async () => {
    const before = simShmEntries();
    const fresh = () => [...simShmEntries()].filter((n) => !before.has(n));
    // TMPDIR of the test's own: the job's lockstep dir cannot outlive a SIGKILL of the job otherwise.
    const s = spawnWavebus([...SIM, '--detached', '--nproc-per-node', '2', '--result-dir', path.join(tmpDir(), 'res')], { env: { ...process.env, TMPDIR: tmpDir() } });
    const made = await waitFor(() => (fresh().length === 2 ? fresh() : undefined), 'both ranks to create their segments', 60000);
    await waitFor(() => made.every(stepping), 'both ranks to pass the start barrier and step', 60000);
    // A rank killed alone: the sim job removes its segment.
    const ranks = await waitFor(() => (childrenOf(s.child.pid!).length === 2 ? childrenOf(s.child.pid!) : undefined), 'the rank processes');
    process.kill(ranks[0], 'SIGKILL');
    await waitFor(() => fresh().length === 1, 'the killed rank\'s segment to go', 30000);
    // The job itself killed: its surviving rank sees the IPC channel close, unlinks and exits.
    s.child.kill('SIGKILL');
    await s.exited;
    try {
      await waitFor(() => fresh().length === 0, `no segment left of ${made.join(', ')}`, 30000);
    } finally {
      for (const pid of ranks) if (cmdline(pid).includes('sim-rank')) process.kill(pid, 'SIGKILL');
    }
  });

  test('kill -9 of the engine under `wavebus launch` leaves no new /dev/shm entries once the launcher sees it', async () => {
    const before = simShmEntries();
    const fresh = () => [...simShmEntries()].filter((n) => !before.has(n));
    const port = await freePortPair();
    const r = spawnWavebus(['launch', '--ready-timeout-ms', '120000', '--port', String(port), '--', process.execPath, CLI, ...SIM, '--result-dir', path.join(tmpDir(), 'res')], { env: { ...process.env, TMPDIR: tmpDir() } });
    const made = await waitFor(() => (fresh().length === 1 ? fresh() : undefined), 'the rank to create its segment', 150000);
    expect(made[0]).toMatch(/^wavebus-[0-9a-f]{12}-sim-r0$/);
    const sim = childrenOf(r.child.pid!).find((p) => / sim --steps/.test(cmdline(p)));
    expect(sim).toBeDefined();
    const ranks = childrenOf(sim!);
    // The whole engine at once (job and rank): nothing of it survives to clean up after itself.
    for (const p of [sim!, ...ranks]) process.kill(p, 'SIGKILL');
    const { code } = await r.exited;
    expect(code).toBe(137);
    expect(fresh()).toEqual([]);
  });

  test('a Python engine killed with SIGKILL under a launch prefix: its segment carries the prefix, and the launcher rule removes it', async () => {
    const prefix = newShmPrefix();
    const py = spawnTracked('/usr/bin/python3', ['-c', [
      'import sys, time, torch',
      'from wavebus_client.shm import shm_tensor',
      't, region = shm_tensor("wbtest-rundir-in", [4], torch.int64)',
      'print(region.shm_name, flush=True)',
      'time.sleep(600)',
    ].join('\n')], { env: { ...process.env, WAVEBUS_SHM_PREFIX: prefix, PYTHONPATH: path.join(__dirname, '..', 'clients', 'python') } });
    const name = await waitFor(() => py.stdout().trim(), 'the Python segment');
    expect(name).toBe(`/${prefix}wbtest-rundir-in`);
    py.child.kill('SIGKILL');
    await py.exited;
    expect(fs.existsSync(`/dev/shm${name}`)).toBe(true); // SIGKILL ran no atexit
    expect(removeShmSegments(prefix)).toEqual([name.slice(1)]);
    expect(fs.existsSync(`/dev/shm${name}`)).toBe(false);
  });
});
