// One receiver per host (docs/bus.md "One receiver per host"): one agent of the
// replica holds the receiver lock, follows the whole wave stream and writes every local mailbox;
// the others follow only the waves with work and still copy every dump. Killed mid-run (kill -9),
// the receiver's lock goes with it: another agent takes the role over within a heartbeat, the
// engine's waits stay bounded, and the restarted agent comes back without the role.
import * as fs from 'fs';
import * as path from 'path';
import { spawnSync } from 'child_process';
import { HostFanout, receiverLockPath } from '../src/agent/host-receiver';
import { MailboxReader, MailboxWriter } from '../src/client/mailbox';
import { encodeBusFrame } from '../src/bus/frames';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { mailboxPath } from '../src/paths';
import { wholeDumpAfter } from './dump-waits';
import { tmpDir } from './helpers';
import { jobStarter, sleep } from './sim-job';

jest.setTimeout(180000);

const startJob = jobStarter();

const RECEIVER = 'host receiver: this agent follows';
const LANES_ONLY = 'lanes-only: another local agent is the host receiver';
const TAKES_OVER = 'host receiver gone: this agent takes over';

describe('the host receiver, piece by piece', () => {
  test("a receiver writes the local mailboxes its replica owns, whatever the placement (each header names its rank)", () => {
    const quiet = createLogger('test-hostrx', 'silent');
    // TP 2, DP 2 over 2 hosts, placed cyclically (Slurm --distribution=cyclic): this host holds
    // global ranks 0 and 2 as local ranks 0 and 1. Rank 2 is replica 1: not rank 0's to write.
    const cyclic = tmpDir('wavebus-hostrx-cyclic-');
    const id = (g: number, l: number) => resolveIdentity({ RANK: String(g), LOCAL_RANK: String(l), WORLD_SIZE: '4', LOCAL_WORLD_SIZE: '2', WAVEBUS_TP: '2', WAVEBUS_DP: '2' });
    const mine = MailboxWriter.create(mailboxPath(cyclic, 0), 0);
    const theirs = MailboxWriter.create(mailboxPath(cyclic, 1), 2);
    expect(theirs.ownerRank).toBe(2);
    const r1 = MailboxReader.open(mailboxPath(cyclic, 1));
    const fan0 = new HostFanout(cyclic, id(0, 0), quiet);
    expect(fan0.tryTake()).toBe(true);
    fan0.publish({ wave: 5, configDue: false, dumpDue: true, snapshotDue: false }, 6);
    expect(r1.read(5)).toBeUndefined(); // replica 1's mailbox: never written by replica 0's receiver
    expect(r1.floor()).toBe(0);
    expect(fan0.attached).toBe(0);
    // Replica 1's receiver on the same host (its own lock) would be rank 2's own agent: no peer of replica 1 here.
    const fan2 = new HostFanout(cyclic, id(2, 1), quiet);
    expect(fan2.tryTake()).toBe(true);
    fan2.publish({ wave: 5, configDue: false, dumpDue: false, snapshotDue: false }, 6);
    expect(fan2.attached).toBe(0);
    // Block placement (ranks 0 and 1 on this host, both replica 0): the peer is written.
    const block = tmpDir('wavebus-hostrx-block-');
    const peer = MailboxWriter.create(mailboxPath(block, 1), 1);
    const rb = MailboxReader.open(mailboxPath(block, 1));
    const fanB = new HostFanout(block, id(0, 0), quiet);
    expect(fanB.tryTake()).toBe(true);
    fanB.publish({ wave: 5, configDue: false, dumpDue: true, snapshotDue: false }, 6);
    expect(rb.read(5)).toMatchObject({ wave: 5, dumpDue: 1 });
    expect(fanB.attached).toBe(1);
    // A mailbox whose creator named no rank is not written (retried on every wave until it does).
    const anon = tmpDir('wavebus-hostrx-anon-');
    const unnamed = MailboxWriter.create(mailboxPath(anon, 1));
    expect(unnamed.ownerRank).toBeUndefined();
    const ra = MailboxReader.open(mailboxPath(anon, 1));
    const fanA = new HostFanout(anon, id(0, 0), quiet);
    expect(fanA.tryTake()).toBe(true);
    fanA.publish({ wave: 5, configDue: false, dumpDue: true, snapshotDue: false }, 6);
    expect(ra.read(5)).toBeUndefined();
    for (const f of [fan0, fan2, fanB, fanA]) f.close();
    for (const x of [r1, rb, ra]) x.close();
    for (const w of [mine, theirs, peer, unnamed]) w.close();
  });

  test('heads with work go out under X, plain heads under W', () => {
    expect(encodeBusFrame(1, 1, 'head', { epoch: 1, seq: 1, wave: 2 }, true)[0]).toBe('r0.W');
    expect(encodeBusFrame(1, 1, 'head', { epoch: 1, seq: 1, wave: 2, dumpDue: true }, true, 3)[0]).toBe('r3.X');
    expect(encodeBusFrame(1, 1, 'head', { epoch: 1, seq: 1, wave: 2, captures: [{}] }, false)[0]).toBe('r0.X');
  });

  test('the receiver lock is exclusive across processes and dropped when its holder dies; attach never resets a mailbox', () => {
    const dir = tmpDir('wavebus-hostrx-');
    const lock = receiverLockPath(dir, 0);
    // Another process takes the lock and dies holding it.
    const child = spawnSync(process.execPath, ['-e', `const m=require(${JSON.stringify(path.resolve(__dirname, '../dist/client/mailbox'))});const fd=m.MailboxWriter.holdLock(${JSON.stringify(lock)});process.stdout.write(String(fd));`]);
    expect(Number(child.stdout.toString())).toBeGreaterThanOrEqual(0);
    const fd = MailboxWriter.holdLock(lock);
    expect(fd).toBeGreaterThanOrEqual(0); // the dead holder's lock went with it
    expect(MailboxWriter.holdLock(lock)).toBe(-1); // held (another open of the file conflicts)
    fs.closeSync(fd);
    const again = MailboxWriter.holdLock(lock);
    expect(again).toBeGreaterThanOrEqual(0);
    fs.closeSync(again);

    // Attach: nothing to attach to yet; a file that is not a mailbox is refused, never written.
    expect(() => MailboxWriter.attach(mailboxPath(dir, 1))).toThrow(/ENOENT|no such file/i);
    fs.writeFileSync(path.join(dir, 'junk'), Buffer.alloc(8192, 1), { mode: 0o600 });
    expect(() => MailboxWriter.attach(path.join(dir, 'junk'))).toThrow(/not a ready wavebus mailbox/);
    expect(fs.readFileSync(path.join(dir, 'junk')).every((b) => b === 1)).toBe(true);
    fs.symlinkSync(path.join(dir, 'junk'), path.join(dir, 'link'));
    expect(() => MailboxWriter.attach(path.join(dir, 'link'))).toThrow(/symbolic link/);

    // A fan-out writes its peer's vectors and leaves the peer's own features alone.
    const own = MailboxWriter.create(mailboxPath(dir, 1), 1);
    own.setFeatures(5);
    const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '2', LOCAL_WORLD_SIZE: '2', WAVEBUS_TP: '2' });
    const fan = new HostFanout(dir, identity, createLogger('test-hostrx', 'silent'));
    fan.publish({ wave: 3, configDue: false, dumpDue: false, snapshotDue: false }, 4); // not the receiver: nothing written
    const r = MailboxReader.open(mailboxPath(dir, 1));
    expect(r.floor()).toBe(0);
    expect(fan.tryTake()).toBe(true);
    fan.publish({ wave: 3, configDue: false, dumpDue: true, snapshotDue: false }, 4);
    expect(r.read(3)).toMatchObject({ wave: 3, dumpDue: 1 });
    expect(r.floor()).toBe(4);
    expect(r.features()).toBe(5);
    fan.close();
    expect(MailboxWriter.holdLock(lock)).not.toBe(-1); // close gave the role up
    r.close();
    own.close();
  });
});

describe('one receiver per host on a job of real processes', () => {
  test('lanes-only agents copy every dump; kill -9 of the receiver mid-run: another takes over, waits stay bounded, the restarted agent comes back lanes-only', async () => {
    const world = 3;
    // Requests arrive two a step and a few hold the 64 blocks at a time: some are running for as
    // long as the test lasts (6 requests all ended near wave 100, and a dump asked after that on a
    // slow machine found no target).
    const job = await startJob({ world, steps: 4000, stepMs: 30, requests: 4000, ackTimeoutMs: 3000, boundMs: 200, untilStopped: true, simArgs: ['--num-blocks', '64'], agentEnv: { WAVEBUS_LOG_LEVEL: 'info' } });
    const roleOf = (g: number) => {
      const e = job.agents[g].stderr();
      return e.includes(RECEIVER) ? 'receiver' : e.includes(LANES_ONLY) ? 'lanes' : 'unknown';
    };
    await job.until(() => job.agents.every((_, g) => roleOf(g) !== 'unknown'), 'every agent to say its role', 20000);
    const roles = job.agents.map((_, g) => roleOf(g));
    expect(roles.filter((r) => r === 'receiver')).toHaveLength(1);
    const victim = roles.indexOf('receiver');

    // Dumps copied by every rank: the lanes-only ones get their lanes, the receiver writes their vectors.
    await job.waitWave(10);
    const first = await wholeDumpAfter(() => job.manifests(), 0, 1, (n) => job.manualDump(n), (fn, what, ms) => job.until(fn, what, ms, 100), 30000);
    expect(first.completed_ranks).toEqual([0, 1, 2]);

    const before = (await job.status()).wave;
    job.agents[victim].child.kill('SIGKILL');
    await job.agents[victim].exited;
    // Wrapped: an heir of rank 0 is a found one (waitFor takes a falsy value for "not yet").
    const { heir } = await job.until(() => {
      const g = job.agents.findIndex((a, i) => i !== victim && a.stderr().includes(TAKES_OVER));
      return g >= 0 ? { heir: g } : undefined;
    }, 'another agent to take the receiver role over', 10000);
    expect(heir).not.toBe(victim);
    await sleep(300); // the engine steps without the victim's agent for a while
    job.startAgent(victim);
    await job.until(() => roleOf(victim) !== 'unknown', 'the restarted agent to say its role', 20000);
    expect(roleOf(victim)).toBe('lanes');
    await job.until(async () => (await job.status()).liveRanks.length === world, 'every rank live again', 20000, 100);

    // A victim that heads the stream (rank 0) relays no wave head while it is down: the waves
    // resume once its engine is back on the restarted agent, not necessarily by the time it is live.
    const resumed = await job.until(async () => {
      const w = (await job.status()).wave;
      return w > before ? w : undefined;
    }, 'the waves to go on past the kill', 20000, 100);
    expect(resumed).toBeGreaterThan(before);
    const later = await wholeDumpAfter(() => job.manifests(), resumed, 2, (n) => job.manualDump(n), (fn, what, ms) => job.until(fn, what, ms, 100), 40000);
    expect(later.completed_ranks).toEqual([0, 1, 2]);

    const results = await job.engineResults();
    for (const r of results) {
      // Every missed vector cost at most the bound: the engine went on.
      expect(r.wallMs).toBeLessThan(r.steps * (job.o.stepMs + 50) + r.endOfWaveTimeouts * ((job.o.boundMs ?? 200) + 50) + 30000);
    }
  });
});
