// The bus's send queue (src/bus/send-queue.ts) on real zeromq.js sockets: in order, and on a socket
// whose sends never wait (`immediate`), each message sent inside push() with failures still reported.
import { Dealer, Publisher, Subscriber } from 'zeromq';
import { SendQueue } from '../src/bus/send-queue';

test('an immediate queue on a PUB sends every message inside push(), in order', async () => {
  const pub = new Publisher({ linger: 0, sendTimeout: 0 });
  await pub.bind('tcp://127.0.0.1:0');
  const sub = new Subscriber({ linger: 0 });
  sub.subscribe('t');
  sub.connect(pub.lastEndpoint!);
  const got: string[] = [];
  const reading = (async () => {
    for await (const [, body] of sub) got.push(body.toString());
  })().catch(() => undefined);
  const errors: unknown[] = [];
  const q = new SendQueue(pub, (e) => errors.push(e), true);
  const until = async (ok: () => boolean, each?: () => void) => {
    for (const end = Date.now() + 10000; !ok(); await new Promise((r) => setTimeout(r, 20))) {
      if (Date.now() > end) throw new Error('timed out');
      each?.();
    }
  };
  try {
    // A subscription takes a moment to reach the PUB: publish until one arrives.
    await until(() => got.length > 0, () => q.push(['t', Buffer.from('hello')]));
    await new Promise((r) => setTimeout(r, 100));
    got.length = 0;
    for (let i = 0; i < 200; i++) q.push(['t', Buffer.from(String(i))]);
    expect(q.length).toBe(0); // nothing was left for later
    await until(() => got.length >= 200);
    expect(got).toEqual(Array.from({ length: 200 }, (_, i) => String(i)));
    expect(errors).toEqual([]);
    await q.idle();
  } finally {
    sub.close();
    pub.close();
    await reading;
  }
  // a closed socket: dropped, never thrown
  expect(() => q.push(['t', Buffer.from('late')])).not.toThrow();
});

test('a send that fails is reported to its own callback, else to the queue\'s', async () => {
  // A DEALER with no peer and sendTimeout 0 cannot queue anything: EAGAIN, at once.
  const dealer = new Dealer({ linger: 0, sendTimeout: 0 });
  const errors: unknown[] = [];
  const own: unknown[] = [];
  try {
    for (const immediate of [true, false]) {
      const q = new SendQueue(dealer, (e) => errors.push(e), immediate);
      q.push(Buffer.from('a'));
      q.push(Buffer.from('b'), (e) => own.push(e));
      await q.idle();
      await new Promise((r) => setImmediate(r));
    }
    expect(errors).toHaveLength(2);
    expect(own).toHaveLength(2);
    for (const e of [...errors, ...own]) expect((e as { code?: string }).code).toBe('EAGAIN');
  } finally {
    dealer.close();
  }
});
