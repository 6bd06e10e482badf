// An agent's record of the waves (src/agent/wave-book.ts): bounded, keeping the newest waves.
import { WaveBook, WAVE_HISTORY } from '../src/agent/wave-book';

test('the book keeps the WAVE_HISTORY highest waves, whatever order they arrive in', () => {
  const book = new WaveBook();
  const waves = Array.from({ length: 300 }, (_, i) => i + 1);
  // mostly in order, with some going backwards (an engine that restarted its waves)
  const order = [...waves.slice(0, 150), 20, 5, ...waves.slice(150)];
  for (const w of order) {
    book.ended.add(w); // the agent notes ended waves; arrive() trims both sets
    book.arrive(w);
  }
  const kept = waves.filter((w) => book.has(w));
  expect(kept).toEqual(waves.slice(-WAVE_HISTORY));
  expect([...book.ended].sort((a, b) => a - b)).toEqual(waves.slice(-WAVE_HISTORY));
  expect(book.known(10)).toBe(false); // forgotten, and above no floor
  book.arrive(301, 290);
  expect(book.known(10)).toBe(true); // below the floor: decided
});

test('a waiter wakes when its wave arrives or falls below the floor, and times out otherwise', async () => {
  const book = new WaveBook();
  const a = book.waitFor(5, 5000);
  const b = book.waitFor(9, 5000);
  const c = book.waitFor(50, 20);
  book.arrive(5);
  expect(await a).toBe(true);
  book.setFloor(10);
  expect(await b).toBe(true);
  expect(await c).toBe(false);
});

test("a lanes-only agent's waits end on what the host receiver wrote: decided with nothing due; a wave with work waits for its head", async () => {
  // The mailbox the receiver writes, as the agent reads it (vector-writes.ts decidedNothingDue).
  const mailbox = new Map<number, 'nothing' | 'due'>();
  const book = new WaveBook();
  book.followMailbox((w) => mailbox.get(w) === 'nothing');
  expect(book.known(7)).toBe(false);
  mailbox.set(7, 'nothing');
  expect(book.known(7)).toBe(true); // no head of its own ever comes for a plain wave

  // A wait started before the receiver wrote ends soon after it does, long before the bound.
  const t0 = Date.now();
  const waiting = book.waitFor(8, 10000);
  setTimeout(() => mailbox.set(8, 'nothing'), 30);
  await expect(waiting).resolves.toBe(true);
  expect(Date.now() - t0).toBeLessThan(5000);

  // A wave with work is not decided by the mailbox: its head (with its lanes) ends the wait.
  mailbox.set(9, 'due');
  const work = book.waitFor(9, 10000);
  await new Promise((r) => setTimeout(r, 20));
  let settled = false;
  void work.then(() => (settled = true));
  await new Promise((r) => setTimeout(r, 20));
  expect(settled).toBe(false);
  book.arrive(9, 10);
  await expect(work).resolves.toBe(true);

  // Nothing written at all: the bound ends the wait (false), and no poll is left running.
  await expect(book.waitFor(20, 50)).resolves.toBe(false);
  book.close();
});
