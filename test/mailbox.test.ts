// The wave-vector mailbox across real processes: a node writer, a Python reader that follows
// only the byte layout in docs/native.md, and concurrent writes checked for torn reads.
import * as fs from 'fs';
import * as path from 'path';
import { NativeError } from '../src/errors';
import { MAILBOX_LAYOUT, MailboxFeature, MailboxReader, MailboxWriter } from '../src/client/mailbox';
import { addonPath } from '../src/native';
import { cleanup, runPython, spawnTracked, tmpDir, waitFor } from './helpers';

// A mailbox path on tmpfs, as the agent uses (/dev/shm), else a temp dir.
function mailboxPath(tag: string): string {
  const dir = fs.existsSync('/dev/shm') ? fs.mkdtempSync('/dev/shm/wavebus-test-') : tmpDir();
  dirs.push(dir);
  return path.join(dir, `mailbox-${tag}`);
}
const dirs: string[] = [];

afterAll(async () => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
  await cleanup();
});

// The documented layout, read the way the Python client does (mmap + struct, seqlock retry).
const PY_READER = `
import json, mmap, struct, sys
path = sys.argv[1]
HDR = struct.Struct('<8sIIQQ')     # magic, version, slots, features, epoch (then padding to 64)
SLOT = struct.Struct('<QQIII')     # seq, wave, config_due, dump_due, snapshot_due (then padding to 64)
with open(path, 'rb') as f:
    m = mmap.mmap(f.fileno(), 64 + 8 * 64, prot=mmap.PROT_READ)
magic, version, slots, features, epoch = HDR.unpack_from(m, 0)
def read(wave):
    off = 64 + 64 * (wave % slots)
    while True:
        s1 = struct.unpack_from('<Q', m, off)[0]
        if s1 & 1:
            continue
        _, w, c, d, s = SLOT.unpack_from(m, off)
        if struct.unpack_from('<Q', m, off)[0] != s1:
            continue
        if s1 == 0 or w != wave:
            return None
        return {'wave': w, 'configDue': c, 'dumpDue': d, 'snapshotDue': s}
waves = [int(x) for x in sys.argv[2].split(',')]
print(json.dumps({'magic': magic.decode(), 'version': version, 'slots': slots, 'features': features,
                  'epoch': epoch, 'size': m.size(), 'reads': [read(w) for w in waves]}))
`;

async function expectCode(fn: () => unknown, code: string, msg?: RegExp): Promise<void> {
  let err: unknown;
  try {
    await fn();
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(NativeError);
  expect((err as NativeError).code).toBe(code);
  if (msg) expect((err as NativeError).message).toMatch(msg);
}

describe('mailbox', () => {
  test('layout constants', () => {
    expect(MAILBOX_LAYOUT).toEqual({ headerBytes: 64, slotBytes: 64, slots: 8, fileBytes: 576, magic: 'WBMBOX01', version: 2 });
  });

  test('publish / read in one process: ring of 8, overwritten waves read as undefined', () => {
    const p = mailboxPath('ring');
    const w = MailboxWriter.create(p);
    const r = MailboxReader.open(p);
    expect(fs.statSync(p).size).toBe(576);
    expect(r.read(0)).toBeUndefined(); // empty slot
    w.publish({ wave: 3, configDue: 1, dumpDue: 0 });
    expect(r.read(3)).toEqual({ wave: 3, configDue: 1, dumpDue: 0, snapshotDue: 0 });
    expect(r.read(11)).toBeUndefined(); // same slot, other wave
    w.publish({ wave: 11, configDue: false, dumpDue: 2 });
    expect(r.read(11)).toEqual({ wave: 11, configDue: 0, dumpDue: 2, snapshotDue: 0 });
    expect(r.read(3)).toBeUndefined(); // overwritten by wave 11
    for (let wave = 100; wave < 116; wave++) w.publish({ wave, configDue: wave % 2, dumpDue: true });
    for (let wave = 100; wave < 108; wave++) expect(r.read(wave)).toBeUndefined();
    for (let wave = 108; wave < 116; wave++) expect(r.read(wave)).toEqual({ wave, configDue: wave % 2, dumpDue: 1, snapshotDue: 0 });
    const big = 2 ** 40 + 5;
    w.publish({ wave: big, configDue: 0, dumpDue: 0xffffffff });
    expect(r.read(big)?.dumpDue).toBe(0xffffffff);

    w.setFeatures(MailboxFeature.BUS_ACTIVE | MailboxFeature.SNAPSHOTS);
    w.setEpoch(1234567);
    expect(r.features()).toBe(9);
    expect(r.epoch()).toBe(1234567);
    r.close();
    w.close({ unlink: true });
    expect(fs.existsSync(p)).toBe(false);
  });

  test('a Python reader following the documented layout reads what the writer published', () => {
    const p = mailboxPath('py');
    const w = MailboxWriter.create(p);
    w.setFeatures(MailboxFeature.BUS_ACTIVE | MailboxFeature.HOT_RELOAD | MailboxFeature.DETECTORS);
    w.setEpoch(987654321012);
    w.publish({ wave: 40, configDue: 1, dumpDue: 3 });
    w.publish({ wave: 41, configDue: 0, dumpDue: 0 });
    w.publish({ wave: 50, configDue: 7, dumpDue: 1, snapshotDue: 0 });
    const out = JSON.parse(runPython(PY_READER, [p, '40,41,50,42,33']));
    expect(out).toEqual({
      magic: 'WBMBOX01',
      version: 2,
      slots: 8,
      features: 7,
      epoch: 987654321012,
      size: 576,
      reads: [
        { wave: 40, configDue: 1, dumpDue: 3, snapshotDue: 0 },
        { wave: 41, configDue: 0, dumpDue: 0, snapshotDue: 0 },
        { wave: 50, configDue: 7, dumpDue: 1, snapshotDue: 0 },
        null, // wave 42: slot 2 holds wave 50
        null, // wave 33: slot 1 holds wave 41
      ],
    });
    w.close();
  });

  test('writer in a child process, reader here: concurrent publishes never read torn', async () => {
    const p = mailboxPath('torn');
    const total = 200000;
    // Each wave's fields are a function of the wave, so a torn read shows as a mismatch.
    const script = `
      const n = require(${JSON.stringify(addonPath())});
      const w = n.MailboxWriter.create(${JSON.stringify(p)});
      w.setEpoch(77);
      process.stdout.write('ready\\n');
      for (let wave = 0; wave < ${total}; wave++) w.publish(wave, wave % 65536, (wave * 2654435761) % 4294967296, wave % 3);
      w.setFeatures(15);
      w.close();`;
    const child = spawnTracked(process.execPath, ['-e', script]);
    await waitFor(() => child.stdout().includes('ready') || child.child.exitCode !== null, 'the writer child to start');
    expect(child.stderr()).toBe('');
    const r = MailboxReader.open(p);
    expect(r.epoch()).toBe(77);
    let mismatches = 0;
    let done = false;
    void child.exited.then(() => (done = true));
    let wave = 0;
    while (!done) {
      for (let k = 0; k < 2000; k++) {
        wave = (wave + 1 + (k % 5)) % total;
        const v = r.read(wave);
        if (v === undefined) continue;
        if (v.wave !== wave || v.configDue !== wave % 65536 || v.dumpDue !== (wave * 2654435761) % 4294967296 || v.snapshotDue !== wave % 3) mismatches++;
      }
      await new Promise((res) => setImmediate(res));
    }
    expect((await child.exited).code).toBe(0);
    expect(mismatches).toBe(0);
    // After the writer finished, the last 8 waves are all there.
    for (let w = total - 8; w < total; w++) expect(r.read(w)).toEqual({ wave: w, configDue: w % 65536, dumpDue: (w * 2654435761) % 4294967296, snapshotDue: w % 3 });
    expect(r.features()).toBe(15);
    r.close();
  });

  test('waitFor sleeps until a writer in another process publishes the wave; bound, overwritten and close are answered', async () => {
    const p = mailboxPath('wait');
    // The child creates the file, then publishes waves 6 and 7 when told to (one line on stdin each).
    const script = `
      const n = require(${JSON.stringify(addonPath())});
      const w = n.MailboxWriter.create(${JSON.stringify(p)});
      process.stdout.write('ready\\n');
      let next = 6;
      process.stdin.on('data', () => { w.publish(next, 0, next === 7 ? 3 : 0, 0); next++; process.stdout.write('published\\n'); });
      process.stdin.on('end', () => w.close());`;
    const child = spawnTracked(process.execPath, ['-e', script], { stdio: ['pipe', 'pipe', 'pipe'] });
    await waitFor(() => child.stdout().includes('ready') || child.child.exitCode !== null, 'the writer child to start');
    const r = MailboxReader.open(p);
    const published = () => fs.readFileSync(p).readUInt32LE(32); // the futex word
    const before = published();

    // Nothing published: the bound runs out.
    expect(await r.waitFor(6, 50)).toBe('timeout');
    // Asleep when the other process publishes: woken by it, long before a 20 s bound.
    const t0 = Date.now();
    const pending = r.waitFor(6, 20000);
    await new Promise((res) => setTimeout(res, 100));
    child.child.stdin!.write('go\n');
    expect(await pending).toEqual({ wave: 6, configDue: 0, dumpDue: 0, snapshotDue: 0 });
    expect(Date.now() - t0).toBeLessThan(20000);
    expect(published()).toBe(before + 1);
    // Already there: answered at once.
    child.child.stdin!.write('go\n');
    await waitFor(() => child.stdout().split('published').length === 3, 'the second publish');
    expect(await r.waitFor(7, 20000)).toEqual({ wave: 7, configDue: 0, dumpDue: 3, snapshotDue: 0 });
    // A slot that already holds a later wave: the one asked for will never come.
    const mine = MailboxWriter.create(mailboxPath('wait-over'));
    const r2 = MailboxReader.open(mine.path);
    mine.publish({ wave: 21, configDue: 0, dumpDue: 0 });
    expect(await r2.waitFor(13, 20000)).toBe('overwritten');
    // close() while a wait sleeps: the wait still ends (at its bound), the mapping is not pulled from under it.
    const sleeping = r2.waitFor(30, 100);
    r2.close();
    expect(await sleeping).toBe('timeout');
    mine.close();

    await expectCode(() => r.waitFor(-1, 10), 'ERR_INVALID_ARG', /wave must be a non-negative safe integer/);
    await expectCode(() => r.waitFor(1, 1.5), 'ERR_INVALID_ARG', /timeoutMs must be a non-negative integer/);
    r.close();
    await expectCode(() => r.waitFor(1, 10), 'ERR_CLOSED', /is closed/);
    child.child.stdin!.end();
    expect((await child.exited).code).toBe(0);
  });

  test('a writer that died mid-update (slot left odd) reads as a wave not yet arrived, never as an error', async () => {
    const p = mailboxPath('died');
    const w = MailboxWriter.create(p);
    const r = MailboxReader.open(p);
    w.publish({ wave: 3, configDue: 0, dumpDue: 1 });
    expect(r.read(3)).toEqual({ wave: 3, configDue: 0, dumpDue: 1, snapshotDue: 0 });
    // What a writer killed between its two seq stores leaves: slot 3's seq odd.
    const fd = fs.openSync(p, 'r+');
    const seq = Buffer.alloc(8);
    fs.readSync(fd, seq, 0, 8, 64 + 64 * 3);
    seq.writeBigUInt64LE(seq.readBigUInt64LE(0) + 1n);
    fs.writeSync(fd, seq, 0, 8, 64 + 64 * 3);
    fs.closeSync(fd);
    expect(r.read(3)).toBeUndefined();
    expect(await r.waitFor(3, 30)).toBe('timeout');
    // A restarted writer steps past the odd count; the wave can be published again.
    w.close();
    const w2 = MailboxWriter.create(p);
    w2.publish({ wave: 3, configDue: 1, dumpDue: 0 });
    expect(r.read(3)).toEqual({ wave: 3, configDue: 1, dumpDue: 0, snapshotDue: 0 });
    w2.close();
    r.close();
  });

  test('64-bit words read in u32 halves: header words past 2^32, and a seq whose low half wrapped, read as written', () => {
    const p = mailboxPath('halves');
    const w = MailboxWriter.create(p);
    const r = MailboxReader.open(p);
    w.setFeatures(2 ** 40 + 5);
    w.setEpoch(2 ** 33 + 1);
    w.setFloor(2 ** 35 + 2);
    expect([r.features(), r.epoch(), r.floor()]).toEqual([2 ** 40 + 5, 2 ** 33 + 1, 2 ** 35 + 2]);
    const wave = 2 ** 35 + 3; // slot 3, below nothing: found by its own vector
    w.publish({ wave, configDue: 0, dumpDue: 4 });
    expect(r.read(wave)).toEqual({ wave, configDue: 0, dumpDue: 4, snapshotDue: 0 });
    // The slot's seq at 2^32 (low half 0, even): written, not a never-written slot.
    const fd = fs.openSync(p, 'r+');
    const seq = Buffer.alloc(8);
    seq.writeBigUInt64LE(2n ** 32n);
    fs.writeSync(fd, seq, 0, 8, 64 + 64 * 3);
    expect(r.read(wave)).toEqual({ wave, configDue: 0, dumpDue: 4, snapshotDue: 0 });
    expect(r.dueBits(wave)).toBe(2); // DUE_DUMP
    // Seq 0 is a slot never written: the wave is not there (below the floor: implied, nothing due).
    seq.writeBigUInt64LE(0n);
    fs.writeSync(fd, seq, 0, 8, 64 + 64 * 3);
    fs.closeSync(fd);
    expect(r.read(wave)).toBeUndefined();
    expect(r.read(2 ** 35 + 1)).toEqual({ wave: 2 ** 35 + 1, configDue: 0, dumpDue: 0, snapshotDue: 0, implied: true });
    w.close();
    r.close();
  });

  test('a restarted writer takes over the file; an existing reader sees emptied slots, then new waves', () => {
    const p = mailboxPath('restart');
    const w1 = MailboxWriter.create(p);
    w1.publish({ wave: 5, configDue: 1, dumpDue: 1 });
    w1.setFeatures(1);
    const r = MailboxReader.open(p);
    expect(r.read(5)?.dumpDue).toBe(1);
    w1.close();
    const w2 = MailboxWriter.create(p);
    expect(r.read(5)).toBeUndefined();
    expect(r.features()).toBe(0);
    w2.publish({ wave: 5, configDue: 0, dumpDue: 2 });
    expect(r.read(5)).toEqual({ wave: 5, configDue: 0, dumpDue: 2, snapshotDue: 0 });
    w2.close();
    r.close();
  });

  test('the floor: a wave below it that no slot holds has nothing due (implied), read and waited for, in TS and Python', async () => {
    const w = MailboxWriter.create(mailboxPath('floor'));
    const r = MailboxReader.open(w.path);
    expect(r.floor()).toBe(0);
    expect(r.read(1)).toBeUndefined(); // nothing decided yet
    // A snapshot of a fresh coordinator: nothing decided, nothing due up to wave 1.
    w.setFloor(2);
    expect(r.read(1)).toEqual({ wave: 1, configDue: 0, dumpDue: 0, snapshotDue: 0, implied: true });
    expect(r.read(2)).toBeUndefined(); // not decided yet: it needs its vector
    // The head of wave 1 publishes wave 2 (a dump due) and raises the floor after it.
    w.publish({ wave: 2, configDue: 0, dumpDue: 1 }, 3);
    expect(r.read(2)).toEqual({ wave: 2, configDue: 0, dumpDue: 1, snapshotDue: 0 }); // the slot wins
    // A skipped wave: the head of wave 4 publishes wave 5; wave 4 (never published) is implied.
    w.publish({ wave: 5, configDue: 1, dumpDue: 0 }, 6);
    expect(r.read(4)).toEqual({ wave: 4, configDue: 0, dumpDue: 0, snapshotDue: 0, implied: true });
    // A slot overwritten by a later wave is never implied: the agent decides.
    w.publish({ wave: 13, configDue: 0, dumpDue: 0 }, 14);
    expect(r.read(5)).toBeUndefined();
    // A wait is ended by a floor that rises past the wave, as by its vector.
    const waiting = r.waitFor(20, 20000);
    await new Promise((res) => setTimeout(res, 50));
    w.publish({ wave: 21, configDue: 0, dumpDue: 0 }, 22);
    expect(await waiting).toEqual({ wave: 20, configDue: 0, dumpDue: 0, snapshotDue: 0, implied: true });
    // The Python client's reader sees the same.
    const py = runPython(
      `import json, sys; sys.path.insert(0, ${JSON.stringify(path.resolve(__dirname, '..', 'clients', 'python'))})
from wavebus_client import mailbox as mb
m = mb.Mailbox(sys.argv[1])
def v(x):
    return None if x is None else [x.wave, x.dump_due, x.implied]
print(json.dumps({'floor': m.floor, 'r21': v(m.read_wave(21)), 'r19': v(m.read_wave(19)), 'r22': v(m.read_wave(22)), 'r5': v(m.read_wave(5)),
                  'w18': v(m.wait_wave(18, 5.0)) if m.can_wait else [18, False, True]}))`,
      [w.path],
    );
    expect(JSON.parse(py)).toEqual({ floor: 22, r21: [21, false, false], r19: [19, false, true], r22: null, r5: null, w18: [18, false, true] });
    r.close();
    w.close();
  });

  test('errors: not a mailbox, missing file, closed, bad values', async () => {
    const dir = tmpDir();
    const junk = path.join(dir, 'junk');
    fs.writeFileSync(junk, 'x'.repeat(1000));
    await expectCode(() => MailboxWriter.create(junk), 'ERR_MAILBOX_FORMAT', /is not a wavebus mailbox; refusing to overwrite/);
    expect(fs.readFileSync(junk, 'utf8')).toBe('x'.repeat(1000));
    await expectCode(() => MailboxReader.open(junk), 'ERR_MAILBOX_FORMAT', /not a version-2 wavebus mailbox/);
    const short = path.join(dir, 'short');
    fs.writeFileSync(short, 'WBMBOX01');
    await expectCode(() => MailboxReader.open(short), 'ERR_MAILBOX_FORMAT', /at least 576 bytes/);
    await expectCode(() => MailboxReader.open(path.join(dir, 'missing')), 'ERR_MAILBOX_OPEN', /No such file/);
    await expectCode(() => MailboxWriter.create(path.join(dir, 'no', 'such', 'dir')), 'ERR_MAILBOX_OPEN', /No such file/);
    await expectCode(() => MailboxWriter.create(dir), 'ERR_MAILBOX_OPEN');

    const p = mailboxPath('errs');
    const w = MailboxWriter.create(p);
    const r = MailboxReader.open(p);
    await expectCode(() => w.publish({ wave: -1, configDue: 0, dumpDue: 0 }), 'ERR_INVALID_ARG', /wave vector\.wave must be a non-negative safe integer/);
    await expectCode(() => w.publish({ wave: 1, configDue: 2 ** 32, dumpDue: 0 }), 'ERR_INVALID_ARG', /wave vector\.configDue must be an unsigned 32-bit integer/);
    await expectCode(() => r.read(1.5), 'ERR_INVALID_ARG', /wave must be a non-negative safe integer/);
    await expectCode(() => w.setFeatures(-1), 'ERR_INVALID_ARG', /features/);
    w.close();
    r.close();
    await expectCode(() => w.publish({ wave: 1, configDue: 0, dumpDue: 0 }), 'ERR_CLOSED', /is closed/);
    await expectCode(() => r.read(1), 'ERR_CLOSED', /is closed/);
    await expectCode(() => r.features(), 'ERR_CLOSED');
  });
});
