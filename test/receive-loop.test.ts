// The one receive loop of every long-lived bus socket (src/bus/receive-loop.ts), on real ZeroMQ
// sockets: a handler that throws is handed to onError (a tool's client fails what waits on it) and
// the loop goes on with the next message; closing the socket ends the loop.
import { Dealer, Router } from 'zeromq';
import { receiveLoop } from '../src/bus/receive-loop';
import { freePortPair } from '../src/bus/ports';
import { waitFor } from './helpers';

test('a throwing handler reaches onError and never ends the loop; close ends it', async () => {
  const port = await freePortPair();
  const router = new Router({ linger: 0 });
  await router.bind(`tcp://127.0.0.1:${port}`);
  const dealer = new Dealer({ linger: 0 });
  dealer.connect(`tcp://127.0.0.1:${port}`);
  const handled: string[] = [];
  const errors: string[] = [];
  let running = true;
  const loop = receiveLoop(router, { role: 'ROUTER', what: 'a test message', running: () => running, onError: (e) => errors.push((e as Error).message) }, (parts) => {
    const text = parts[1].toString();
    if (text === 'bad') throw new Error(`cannot handle ${text}`);
    handled.push(text);
  });
  try {
    for (const m of ['one', 'bad', 'two']) await dealer.send(m);
    await waitFor(() => handled.length === 2, 'both good messages handled');
    expect(handled).toEqual(['one', 'two']);
    expect(errors).toEqual(['cannot handle bad']);
  } finally {
    running = false;
    dealer.close();
    router.close();
  }
  await expect(loop).resolves.toBeUndefined();
});
