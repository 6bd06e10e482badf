// A ZeroMQ DEALER written with Node's built-ins only (ZMTP 3.0, NULL mechanism), so that a second,
// unprivileged uid can run it without the project's node_modules: it connects to HOST:PORT, sends
// each FILE given as one message, prints one JSON line per event, and exits when every byte is sent.
// Usage: node zmtp-dealer.js HOST PORT FILE... (a FILE may repeat: the message is sent again).
'use strict';
const fs = require('fs');
const net = require('net');

const [host, port, ...files] = process.argv.slice(2);

function greeting() {
  const g = Buffer.alloc(64);
  g[0] = 0xff;
  g[9] = 0x7f;
  g[10] = 3; // ZMTP 3.0
  g[11] = 0;
  g.write('NULL', 12, 'latin1');
  return g; // as-server 0, filler zeros
}

function ready() {
  const name = Buffer.from('Socket-Type', 'latin1');
  const value = Buffer.from('DEALER', 'latin1');
  const len = Buffer.alloc(4);
  len.writeUInt32BE(value.length);
  const body = Buffer.concat([Buffer.from([5]), Buffer.from('READY', 'latin1'), Buffer.from([name.length]), name, len, value]);
  return Buffer.concat([Buffer.from([0x04, body.length]), body]);
}

function frame(bytes) {
  if (bytes.length <= 255) return Buffer.concat([Buffer.from([0x00, bytes.length]), bytes]);
  const head = Buffer.alloc(9);
  head[0] = 0x02; // last frame, 8-byte size
  head.writeBigUInt64BE(BigInt(bytes.length), 1);
  return Buffer.concat([head, bytes]);
}

const sock = net.connect(Number(port), host, () => {
  process.stdout.write(`${JSON.stringify({ event: 'connected' })}\n`);
  sock.write(greeting());
  sock.write(ready());
  let sent = 0;
  for (const f of files) {
    const bytes = fs.readFileSync(f);
    sock.write(frame(bytes));
    sent += bytes.length;
  }
  // Every byte handed to the kernel, then a clean close.
  sock.end(() => {
    process.stdout.write(`${JSON.stringify({ event: 'sent', messages: files.length, bytes: sent })}\n`);
  });
});
sock.on('data', () => undefined);
sock.on('error', (e) => {
  process.stdout.write(`${JSON.stringify({ event: 'error', error: String(e.message) })}\n`);
  process.exitCode = 1;
});
sock.on('close', () => process.stdout.write(`${JSON.stringify({ event: 'closed' })}\n`));
