// A ZeroMQ peer written with Node's built-ins only (ZMTP 3.0, NULL mechanism), so that a second,
// unprivileged uid can run it without the project's node_modules. Prints one JSON line per event.
//   node zmtp-peer.js dealer HOST PORT FILE...   connect as a DEALER, send each FILE as one message
//                                                (a FILE may repeat), exit once every byte is sent
//   node zmtp-peer.js xsub HOST PORT FILE...     connect as an XSUB and send each FILE's bytes as one
//                                                subscription (byte 1, then the topic); hold the
//                                                connection until stdin closes or the PUB drops it
//   node zmtp-peer.js xsub-many HOST PORT COUNT BYTES   connect as an XSUB and send COUNT distinct
//                                                random subscriptions of BYTES bytes each; hold the
//                                                connection until stdin closes or the PUB drops it
//   node zmtp-peer.js pub HOST PORT EVERY_MS FILE   bind as a PUB and send the recorded frames in
//                                                FILE (JSON: [[topic base64, body base64], ...]) to
//                                                every subscriber whose handshake is done (its
//                                                greeting and READY arrived), over and over, one
//                                                every EVERY_MS, until stdin closes
//   node zmtp-peer.js pub-plain HOST PORT EVERY_MS FILE   the same, but speaking PLAIN as the
//                                                server: it admits any user and password, and says
//                                                what each subscriber gave ("plain-hello")
//   node zmtp-peer.js pub-no-ready HOST PORT EVERY_MS FILE   the same, but each subscriber gets a
//                                                message where the PUB's READY should be: a ZMTP
//                                                protocol error for libzmq, which then ends that
//                                                endpoint instead of reconnecting
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const net = require('net');

const [mode, host, port, ...rest] = process.argv.slice(2);
const say = (o) => process.stdout.write(`${JSON.stringify(o)}\n`);

function greeting(asServer, mechanism = 'NULL') {
  const g = Buffer.alloc(64);
  g[0] = 0xff;
  g[9] = 0x7f;
  g[10] = 3; // ZMTP 3.0
  g.write(mechanism, 12, 'latin1');
  g[32] = asServer ? 1 : 0;
  return g;
}

function ready(socketType) {
  const name = Buffer.from('Socket-Type', 'latin1');
  const value = Buffer.from(socketType, 'latin1');
  const len = Buffer.alloc(4);
  len.writeUInt32BE(value.length);
  const body = Buffer.concat([Buffer.from([5]), Buffer.from('READY', 'latin1'), Buffer.from([name.length]), name, len, value]);
  return Buffer.concat([Buffer.from([0x04, body.length]), body]);
}

/** A short command frame: its name, then `body`. */
function command(name, body = Buffer.alloc(0)) {
  const b = Buffer.concat([Buffer.from([name.length]), Buffer.from(name, 'latin1'), body]);
  return Buffer.concat([Buffer.from([0x04, b.length]), b]);
}

/** The whole command frames after the peer's 64-byte greeting in `buf`: [{ name, data }], and the bytes they took. */
function commandsIn(buf) {
  const out = [];
  let at = 64;
  while (buf.length >= at + 2 && (buf[at] & 0x04) !== 0 && (buf[at] & 0x02) === 0) {
    const size = buf[at + 1];
    if (buf.length < at + 2 + size) break;
    const body = buf.subarray(at + 2, at + 2 + size);
    out.push({ name: body.subarray(1, 1 + body[0]).toString('latin1'), data: body.subarray(1 + body[0]) });
    at += 2 + size;
  }
  return out;
}

/** One frame; `more`: another frame of the same message follows. */
function frame(bytes, more = false) {
  const m = more ? 0x01 : 0x00;
  if (bytes.length <= 255) return Buffer.concat([Buffer.from([m, bytes.length]), bytes]);
  const head = Buffer.alloc(9);
  head[0] = 0x02 | m; // 8-byte size
  head.writeBigUInt64BE(BigInt(bytes.length), 1);
  return Buffer.concat([head, bytes]);
}

/** The peer's greeting (64 bytes) and then one whole command frame (its READY) have arrived. */
function handshakeDone(buf) {
  if (buf.length < 66) return false;
  const flags = buf[64];
  if ((flags & 0x04) === 0) return false; // not a command: never READY
  const long = (flags & 0x02) !== 0;
  if (long && buf.length < 73) return false;
  const size = long ? Number(buf.readBigUInt64BE(65)) : buf[65];
  return buf.length >= 64 + (long ? 9 : 2) + size;
}

if (mode === 'dealer') {
  const files = rest;
  const sock = net.connect(Number(port), host, () => {
    say({ event: 'connected' });
    sock.write(greeting(false));
    sock.write(ready('DEALER'));
    let sent = 0;
    for (const f of files) {
      const bytes = fs.readFileSync(f);
      sock.write(frame(bytes));
      sent += bytes.length;
    }
    // Every byte handed to the kernel, then a clean close.
    sock.end(() => say({ event: 'sent', messages: files.length, bytes: sent }));
  });
  sock.on('data', () => undefined);
  sock.on('error', (e) => {
    say({ event: 'error', error: String(e.message) });
    process.exitCode = 1;
  });
} else if (mode === 'xsub') {
  const sock = net.connect(Number(port), host, () => {
    say({ event: 'connected' });
    sock.write(greeting(false));
    sock.write(ready('XSUB'));
    let sent = 0;
    for (const f of rest) {
      const topic = fs.readFileSync(f);
      sock.write(frame(Buffer.concat([Buffer.from([1]), topic])));
      sent += topic.length;
    }
    sock.write(Buffer.alloc(0), () => say({ event: 'sent', subscriptions: rest.length, bytes: sent }));
  });
  sock.on('data', () => undefined);
  sock.on('error', (e) => say({ event: 'error', error: String(e.message) }));
  sock.on('close', () => {
    say({ event: 'closed' });
    process.exit(0);
  });
  process.stdin.on('end', () => sock.destroy());
  process.stdin.resume();
} else if (mode === 'xsub-many') {
  const [count, bytes] = rest.map(Number);
  const sock = net.connect(Number(port), host, () => {
    say({ event: 'connected' });
    sock.write(greeting(false));
    sock.write(ready('XSUB'));
    for (let i = 0; i < count; i++) {
      const sub = Buffer.alloc(1 + bytes);
      sub[0] = 1;
      crypto.randomFillSync(sub, 1);
      sock.write(frame(sub));
    }
    sock.write(Buffer.alloc(0), () => say({ event: 'sent', subscriptions: count, bytes: count * bytes }));
  });
  sock.on('data', () => undefined);
  sock.on('error', (e) => say({ event: 'error', error: String(e.message) }));
  sock.on('close', () => {
    say({ event: 'closed' });
    process.exit(0);
  });
  process.stdin.on('end', () => sock.destroy());
  process.stdin.resume();
} else if (mode === 'pub' || mode === 'pub-no-ready' || mode === 'pub-plain') {
  const everyMs = Number(rest[0]);
  const frames = JSON.parse(fs.readFileSync(rest[1], 'utf8')).map(([t, b]) => Buffer.concat([frame(Buffer.from(t, 'base64'), true), frame(Buffer.from(b, 'base64'))]));
  const peers = new Set();
  let next = 0;
  let sent = 0;
  const server = net.createServer((sock) => {
    const plain = mode === 'pub-plain';
    sock.write(greeting(true, plain ? 'PLAIN' : 'NULL'));
    // pub-no-ready: a message where the READY command belongs (libzmq: a protocol error, always).
    if (!plain) sock.write(mode === 'pub-no-ready' ? frames[0] : ready('PUB'));
    let got = Buffer.alloc(0);
    let welcomed = false;
    // PLAIN (RFC 24): the client's HELLO (user, password) gets WELCOME, its INITIATE gets READY.
    const plainDone = () => {
      for (const c of commandsIn(got)) {
        if (c.name === 'HELLO' && !welcomed) {
          const user = c.data.subarray(1, 1 + c.data[0]);
          const password = c.data.subarray(2 + c.data[0], 2 + c.data[0] + c.data[1 + c.data[0]]);
          say({ event: 'plain-hello', user: user.toString('latin1'), password: password.toString('latin1') });
          sock.write(command('WELCOME'));
          welcomed = true;
        } else if (c.name === 'INITIATE') {
          sock.write(ready('PUB'));
          return true;
        }
      }
      return false;
    };
    // Frames go to a subscriber once its handshake is done: its 64-byte greeting, then its READY
    // command (a real PUB never sends a message earlier; libzmq takes one as a protocol error).
    sock.on('data', (d) => {
      if (peers.has(sock)) return; // its subscriptions: every frame goes to it anyway
      got = Buffer.concat([got, d]);
      if (plain ? plainDone() : handshakeDone(got)) {
        peers.add(sock);
        say({ event: 'subscriber-ready' });
      }
    });
    sock.on('error', (e) => say({ event: 'subscriber-error', error: String(e.message) }));
    sock.on('close', () => {
      peers.delete(sock);
      say({ event: 'subscriber-gone', bytesFromIt: got.length, sent });
    });
    say({ event: 'subscriber', from: sock.remotePort });
    if (mode === 'pub-no-ready') say({ event: 'sent-no-ready' });
  });
  server.listen(Number(port), host, () => say({ event: 'bound' }));
  server.on('error', (e) => {
    say({ event: 'error', error: String(e.message) });
    process.exit(1);
  });
  const timer = setInterval(() => {
    if (peers.size === 0) return;
    for (const p of peers) p.write(frames[next]);
    next = (next + 1) % frames.length;
    sent++;
    if (sent % 20 === 0) say({ event: 'replayed', frames: sent });
  }, everyMs);
  process.stdin.on('end', () => {
    clearInterval(timer);
    for (const p of peers) p.destroy();
    server.close();
  });
  process.stdin.resume();
} else {
  say({ event: 'error', error: `unknown mode ${mode}` });
  process.exit(2);
}
