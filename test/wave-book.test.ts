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
