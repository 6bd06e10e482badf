// pendingDump's answers over a real mailbox file: an unanswered question is asked once per wave
// (not once per finished request), keeps blocks only until that wave ends, and while the vectors
// stall a wave without a vector is given up, not asked (docs/faults.md, "A dead coordinator").
import * as path from 'path';
import { MailboxReader, MailboxWriter } from '../src/client/mailbox';
import { PendingDumps } from '../src/client/pending-dumps';
import { VectorStall } from '../src/client/vector-stall';
import { cleanup, tmpDir } from './helpers';

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
