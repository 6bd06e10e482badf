// Opens COUNT TCP connections to HOST:PORT that never send a byte (Node's built-ins only, so a
// second, unprivileged uid can run it), and holds them until stdin closes. Prints one JSON line
// once every connection was answered (connected, or refused), and one when stdin closes:
// how many connected, how many the server closed, how many are still open.
// Usage: node idle-connections.js HOST PORT COUNT
'use strict';
const net = require('net');

const [host, port, count] = process.argv.slice(2);
const n = Number(count);
const socks = new Set();
let connected = 0;
let failed = 0;
let closedByServer = 0;
let settled = 0;
const say = (event) => process.stdout.write(`${JSON.stringify({ event, connected, failed, closedByServer, open: socks.size })}\n`);
const settle = () => {
  if (++settled === n) say('opened');
};
for (let i = 0; i < n; i++) {
  const s = net.connect(Number(port), host);
  let up = false;
  s.on('connect', () => {
    up = true;
    connected++;
    socks.add(s);
    settle();
  });
  s.on('error', () => undefined);
  s.on('close', () => {
    if (up) {
      if (socks.delete(s)) closedByServer++;
    } else {
      failed++;
      settle();
    }
  });
}
process.stdin.on('end', () => {
  say('done');
  for (const s of socks) s.destroy();
  socks.clear();
});
process.stdin.resume();
