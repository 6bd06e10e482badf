// pendingDump's answers over a real mailbox file: an unanswered question is asked once per wave
// (not once per finished request), keeps blocks only until that wave ends, and while the vectors
// stall a wave without a vector is given up, not asked (docs/faults.md, "A dead coordinator").
import * as path from 'path';
import { MailboxReader, MailboxWriter } from '../src/client/mailbox';
import { PendingDumps } from '../src/client/pending-dumps';
import { VectorStall } from '../src/client/vector-stall';
import { cleanup, ROOT, runPython, tmpDir } from './helpers';

afterAll(cleanup);

function setup(answer: (wave: number) => string[] | undefined) {
  const file = path.join(tmpDir('wavebus-pending-'), 'mailbox');
  const writer = MailboxWriter.create(file);
  const reader = MailboxReader.open(file);
  const asked: number[] = [];
  const stall = new VectorStall(reader);
  const pending = new PendingDumps(reader, async (w) => (asked.push(w), answer(w)), stall);
  return { writer, reader, asked, stall, pending, close: () => (reader.close(), writer.close()) };
}

test('an unanswered question is asked once for its wave, keeps every finished request until that wave ends, then stalled waves are given up without asking', async () => {
  const m = setup(() => undefined);
  try {
    m.writer.publish({ wave: 20, configDue: false, dumpDue: false }, 21);
    m.pending.ended(20);
    // Wave 21's vector is not there: asked once, unknown, so every request is kept this step.
    expect(await Promise.all(['a', 'b', 'c'].map((r) => m.pending.check(r)))).toEqual([true, true, true]);
    expect(m.asked).toEqual([21]);
    expect(m.stall.active()).toBe(true);
    // Wave 21 ended without its vector: 22 is not asked about (the vectors stall), it is given up.
    m.pending.ended(21);
    expect(await m.pending.check('a')).toBe(false);
    expect(m.asked).toEqual([21]);
    expect(m.pending.forfeitedTo).toBe(22);
    // A vector arrives: the stall is over, a later wave without one is asked again.
    m.writer.publish({ wave: 23, configDue: false, dumpDue: true }, 24);
    expect(m.stall.active()).toBe(false);
    m.pending.ended(22);
    expect(await m.pending.check('a')).toBe(true); // 23 has dump_due and its answer is unknown
    expect(m.asked).toEqual([21, 23]);
  } finally {
    m.close();
  }
});

test('a restarted coordinator (a new epoch in the mailbox) ends the stall even when the floor goes down', async () => {
  const m = setup((w) => (w === 31 ? undefined : []));
  try {
    m.writer.setEpoch(7);
    m.writer.publish({ wave: 30, configDue: false, dumpDue: false }, 31);
    m.pending.ended(30);
    expect(await m.pending.check('x')).toBe(true);
    expect(m.stall.active()).toBe(true);
    m.writer.setEpoch(8);
    m.writer.publish({ wave: 2, configDue: false, dumpDue: false }, 3);
    expect(m.stall.active()).toBe(false);
    m.pending.ended(31);
    expect(await m.pending.check('x')).toBe(false); // 32 asked: nothing due
    expect(m.asked).toEqual([31, 32]);
  } finally {
    m.close();
  }
});

test("the step's answer is settled by its first finished request (no vector read again), and a wave decided mid-step or ended unsettles it", async () => {
  const m = setup((w) => (w === 23 ? ['c'] : []));
  try {
    let reads = 0;
    const dueBits = m.reader.dueBits.bind(m.reader);
    m.reader.dueBits = (w: number) => (reads++, dueBits(w)); // the real read, counted
    m.writer.publish({ wave: 20, configDue: false, dumpDue: false }, 21);
    m.writer.publish({ wave: 21, configDue: false, dumpDue: false }, 22);
    m.writer.publish({ wave: 22, configDue: false, dumpDue: false }, 23);
    m.pending.ended(20);
    expect(m.pending.check('a')).toBe(false);
    expect(reads).toBe(2); // waves 21 and 22, decided, nothing due
    expect(['b', 'c', 'd'].map((r) => m.pending.check(r))).toEqual([false, false, false]);
    expect(reads).toBe(2); // settled: the others compare the floor, the last ended wave and the epoch only
    // Wave 23 decided mid-step with a dump due: the floor moved, the vectors are read again and 23 asked.
    m.writer.publish({ wave: 23, configDue: false, dumpDue: true }, 24);
    expect(await m.pending.check('c')).toBe(true);
    expect(await m.pending.check('a')).toBe(false);
    expect(m.asked).toEqual([23]);
    // The wave ends: the key moves again, and with nothing due the next step settles once more.
    m.writer.publish({ wave: 24, configDue: false, dumpDue: false }, 25);
    m.pending.ended(23);
    const before = reads;
    expect(m.pending.check('a')).toBe(false);
    expect(m.pending.check('b')).toBe(false);
    expect(reads - before).toBe(1); // wave 24, read once
    expect(m.asked).toEqual([23]);
  } finally {
    m.close();
  }
});

test('the Python client does the same: one ask per unanswered wave, stalled waves given up, a new vector ends the stall', () => {
  const file = path.join(tmpDir('wavebus-pending-py-'), 'mailbox');
  const out = runPython(
    [
      'import json, sys',
      'from wavebus_client import mailbox as mb',
      'from wavebus_client.pending import PendingDumps, VectorStall',
      'w = mb.MailboxWriter(sys.argv[1]); box = mb.Mailbox(sys.argv[1])',
      'asked = []',
      'def ask(wave):',
      '    asked.append(wave); return None',
      'stall = VectorStall(lambda: box); pd = PendingDumps(lambda: box, ask, stall)',
      'w.publish(20, floor=21); pd.ended(20)',
      'r = {"first": [pd.check(x) for x in "abc"], "asked1": list(asked), "stalled1": stall.active()}',
      'pd.ended(21); r["second"] = pd.check("a"); r["asked2"] = list(asked); r["forfeited"] = pd.forfeited_to',
      'w.publish(23, dump_due=1, floor=24); r["stalled3"] = stall.active()',
      'pd.ended(22); r["third"] = pd.check("a"); r["asked3"] = list(asked)',
      'print(json.dumps(r))',
    ].join('\n'),
    [file],
    { env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1' } },
  );
  expect(JSON.parse(out.trim().split('\n').pop()!)).toEqual({
    first: [true, true, true], asked1: [21], stalled1: true,
    second: false, asked2: [21], forfeited: 22,
    stalled3: false, third: true, asked3: [21, 23],
  });
});

test('Python: the step\'s answer is settled by its first finished request (no vector read again), and a wave decided mid-step or ended unsettles it', () => {
  const file = path.join(tmpDir('wavebus-pending-py-'), 'mailbox');
  const out = runPython(
    [
      'import json, sys',
      'from wavebus_client import mailbox as mb',
      'from wavebus_client.pending import PendingDumps, VectorStall',
      'w = mb.MailboxWriter(sys.argv[1]); box = mb.Mailbox(sys.argv[1])',
      'asked = []; reads = []',
      'due = {21: ["a"], 22: ["b"], 24: ["c"]}',
      'def ask(wave):',
      '    asked.append(wave); return due.get(wave, [])',
      'read_wave = box.read_wave',
      'def counted(wave):',
      '    reads.append(wave); return read_wave(wave)',
      'box.read_wave = counted  # the real read, counted',
      'stall = VectorStall(lambda: box); pd = PendingDumps(lambda: box, ask, stall)',
      'w.publish(20); w.publish(21, dump_due=1); w.publish(22, dump_due=1, floor=23); pd.ended(20)',
      // "a" is due in 21: pending at once, 22 not asked yet (as before); "b" passes 21 and asks 22.
      'r = {"a": pd.check("a"), "asked_a": list(asked), "b": pd.check("b"), "asked_b": list(asked)}',
      'n = len(reads); r["rest"] = [pd.check(x) for x in ["c", "b", "a", "d"]]; r["reads_rest"] = len(reads) - n',
      // Wave 23 decided mid-step with nothing due, then 24 with a dump: the key moved, read again.
      'w.publish(23, floor=24); r["c23"] = pd.check("c"); w.publish(24, dump_due=1, floor=25)',
      'r["c24"] = pd.check("c"); r["asked24"] = list(asked)',
      'pd.ended(22); r["after22"] = [pd.check(x) for x in ["a", "b", "c"]]; r["asked_end"] = list(asked)',
      'pd.ended(24); n = len(reads); r["after24"] = [pd.check(x) for x in ["a", "c"]]; r["reads24"] = len(reads) - n; r["asked25"] = list(asked)',
      'print(json.dumps(r))',
    ].join('\n'),
    [file],
    { env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1' } },
  );
  expect(JSON.parse(out.trim().split('\n').pop()!)).toEqual({
    a: true, asked_a: [21], b: true, asked_b: [21, 22],
    // "a"'s answer came from 21 with 22 still to ask: not settled; "b"'s from 22, the last decided
    // wave, settles the step: the others compare only.
    rest: [false, true, true, false], reads_rest: 0,
    c23: false, c24: true, asked24: [21, 22, 24],
    after22: [false, false, true], asked_end: [21, 22, 24],
    // Every decided wave ended: wave 25 (not decided, no vector) is read and asked about once, by "a".
    after24: [false, false], reads24: 1, asked25: [21, 22, 24, 25],
  });
});
