// Fuzzing: garbage and mutated frames on every socket (bench/fuzz.ts TARGETS, a few thousand per
// socket here; the 100 000-frame run is `wavebus bench fuzz`), the model's kinds checked against
// the proto, the bugs the fuzz found, and random
// edits of a hot-reloaded JSONC config. Flags and environment variables: test/fuzz-flags.test.ts.
import * as fs from 'fs';
import * as path from 'path';
import { Dealer, Subscriber, XPublisher } from 'zeromq';
import { fuzz, Mutator, TARGETS } from '../bench/fuzz';
import { sendWhenRoom } from '../bench/lib/fuzz-agent';
import { AGENT_BODIES } from '../bench/lib/fuzz-coordinator';
import { DIRECT_BODIES } from '../bench/lib/fuzz-direct';
import { coversOneof, oneofMembers, perKind } from '../bench/lib/fuzz-kinds';
import { requestStatus } from '../src/bus/coordinator';
import { decodeAgentMessage, encodeAgentMessage } from '../src/bus/frames';
import { DEFAULT_MAX_FRAME_BYTES } from '../src/bus/constants';
import { PROTOCOL_VERSION } from '../src/bus/protocol-version';
import { configJson } from '../src/guard/config';
import { ConfigFollower } from '../src/guard/reload';
import { configFromText } from '../src/guard/startup';
import { agentEndpoint } from '../src/paths';
import { FileServer } from '../src/agent/file-server';
import { openBeneath, openBeneathSync } from '../src/artifacts/safe-fs';
import { createLogger } from '../src/log';
import { cleanup, freePortPair, spawnWavebus, tmpDir, waitFor } from './helpers';

jest.setTimeout(180000);
afterEach(cleanup);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A Node stack frame or an internal error class in a process's output. */
function stackTrace(s: string): string | undefined {
  const m = /^ {4}at .+$/m.exec(s) ?? /\\n {4}at .+?\\n/.exec(s) ?? /\b(TypeError|RangeError|ReferenceError|SyntaxError: Unexpected)\b.*$/m.exec(s);
  return m?.[0];
}

test("the rogue PUB waits for room at its high-water mark instead of failing the run (zeromq.js's XPUB rejects with EAGAIN)", async () => {
  const port = await freePortPair();
  const pub = new XPublisher({ linger: 0, sendHighWaterMark: 4, noDrop: true });
  const sub = new Subscriber({ receiveHighWaterMark: 4 });
  try {
    await pub.bind(`tcp://127.0.0.1:${port}`);
    sub.connect(`tcp://127.0.0.1:${port}`);
    sub.subscribe('');
    await pub.receive(); // the subscription
    const body = Buffer.alloc(256 * 1024); // larger than the socket buffers: the queue fills
    // A plain send fails once the subscriber lags: the failure the bench saw.
    let refused: unknown;
    let queued = 0;
    while (!refused && queued < 200) await pub.send([Buffer.from('t'), body]).then(() => queued++, (e) => (refused = e));
    expect((refused as { code?: string }).code).toBe('EAGAIN');
    let got = 0;
    const reader = (async () => {
      for await (const [topic] of sub) {
        if (topic.toString() === 'end') return;
        got++;
        await sleep(1); // a slow agent
      }
    })();
    for (let i = 0; i < 100; i++) await sendWhenRoom(pub, [Buffer.from('t'), body]);
    await sendWhenRoom(pub, [Buffer.from('end'), Buffer.alloc(0)]);
    await reader;
    expect(got).toBe(queued + 100); // nothing dropped: those queued before the refusal and every one after
  } finally {
    pub.close();
    sub.close();
  }
});

test('garbage and mutated frames on every socket: no crash, no hang, every frame accounted for', async () => {
  const r = await fuzz({ frames: 1500, seed: 7, oversized: true });
  expect(r.problems).toEqual([]);
  expect(r.crashes).toBe(0);
  expect(r.hung).toBe(false);
  expect(r.accounted).toBe(true);
  expect(r.sockets).toEqual(TARGETS.map((t) => t.name));
  const res = r.results;
  // The garbage really exercised the decoders: several drop reasons on each socket.
  for (const s of ['coordinator_router', 'coordinator_router_token', 'coordinator_router_curve', 'coordinator_hello', 'agent_sub', 'agent_sub_token']) {
    expect(Object.keys(res[s].dropped).length).toBeGreaterThanOrEqual(4);
  }
  expect(res.coordinator_router_token.dropped.no_mac).toBeGreaterThan(0);
  expect(res.coordinator_router_token.dropped.bad_mac).toBeGreaterThan(0);
  expect(res.agent_sub_token.dropped['r0.no_mac']).toBeGreaterThan(0);
  expect(res.agent_sub_token.dropped['r1.bad_mac']).toBeGreaterThan(0);
  expect(res.coordinator_hello.replies!.got.refused).toBeGreaterThan(0);
  expect(res.coordinator_curve_refusals.refused).toEqual({ handshake_failed: 20, unknown_key: 20 });
  expect(res.coordinator_files_curve.replies!.got.relay).toBeGreaterThan(100);
  expect(res.agent_client.replies!.got.answered).toBeGreaterThan(0);
  expect(res.agent_sub_curve.refused).toEqual({ plain: 1, wrong_server_key: 1 });
  // the agent's direct file socket: garbage dropped by reason, files served, strangers refused
  const direct = res.agent_direct_files;
  expect(Object.keys(direct.dropped).length).toBeGreaterThanOrEqual(4);
  expect(direct.dropped.unexpected).toBeGreaterThan(0);
  expect(direct.replies!.got.fileChunk).toBeGreaterThan(50);
  expect(direct.replies!.got.fileList).toBeGreaterThan(10);
  expect(direct.served_bytes).toBeGreaterThan(2 ** 20);
  expect(direct.refused).toEqual({ handshake_failed: 11, unknown_key: 11 });
  expect(direct.oversized).toBe('peer dropped');
}, 600000);

test('the fuzz model names every body kind of the proto: a kind missing from a table stops it, naming the kind', () => {
  expect(oneofMembers('AgentMessage', 'body')).toEqual(expect.arrayContaining(['hello', 'relay', 'fileServe']));
  expect(Object.keys(AGENT_BODIES).sort()).toEqual(oneofMembers('AgentMessage', 'body').sort());
  expect(Object.keys(DIRECT_BODIES).sort()).toEqual(oneofMembers('CoordinatorMessage', 'body').sort());
  const { fileServe: _dropped, ...partial } = DIRECT_BODIES;
  expect(() => perKind('CoordinatorMessage', 'body', partial, 'a test table')).toThrow(/a test table must list every CoordinatorMessage\.body member.*; missing fileServe$/);
  expect(() => perKind('CoordinatorMessage', 'body', { ...DIRECT_BODIES, bogus: 'served' }, 'a test table')).toThrow(/not in the proto: bogus/);
  expect(() => coversOneof('ClientRequest', 'body', ['hello', 'ping'], 'a test')).toThrow(/the a test corpus has no valid ClientRequest\.body of kind register, waveHead, endOfWave, beforeForward, close, dueDumps/);
});

// ---------------------------------------------------------------- what the fuzz found

test('a client request whose oneof ends in another body is answered, never taken as a one-way wave head', async () => {
  const run = tmpDir('wavebus-fuzz-oneof-');
  const port = await freePortPair();
  const a = spawnWavebus(['agent', '--coordinator', `127.0.0.1:${port}`, '--rank', '0', '--world-size', '1', '--run-dir', path.join(run, 'r')], { env: { ...process.env, WAVEBUS_LOG_LEVEL: 'warn' } });
  await waitFor(() => fs.existsSync(agentEndpoint(path.join(run, 'r'), 0).slice('ipc://'.length)), 'the agent socket', 20000);
  const d = new Dealer({ linger: 0, receiveTimeout: 5000 });
  d.connect(agentEndpoint(path.join(run, 'r'), 0));
  try {
    // id 0, wave_head {wave 8}, then ping (field 8) / due_dumps (field 9); or a garbled due_dumps (a varint) before it: never a one-way head
    for (const hex of ['080022020808408080808010', '0800220208084200', '0800220208084a020807', '480022020808']) {
      await d.send(Buffer.from(hex, 'hex'));
      const [reply] = await d.receive();
      expect(reply.length).toBeGreaterThan(0);
    }
  } finally {
    d.close();
  }
  expect(a.child.exitCode).toBeNull();
});

test('a snapshot request for a rank outside the layout is a counted drop, not a handler failure', async () => {
  const port = await freePortPair();
  const c = spawnWavebus(['coordinator', '--port', String(port), '--world-size', '1', '--runtime-config-path', path.join(tmpDir('wavebus-fuzz-snap-'), 'c.json')], { env: { ...process.env, WAVEBUS_LOG_LEVEL: 'warn' } });
  await waitFor(() => c.stdout().includes('"started"'), 'the coordinator to start', 20000);
  const d = new Dealer({ linger: 0, receiveTimeout: 1000 });
  d.connect(`tcp://127.0.0.1:${port + 1}`);
  try {
    await d.send(encodeAgentMessage({ globalRank: 0, requestId: 1, hello: { identity: { globalRank: 0, worldSize: 1, tpSize: 1, ppSize: 1, dpSize: 1, cpSize: 1 }, protocolVersion: PROTOCOL_VERSION } }));
    await d.send(encodeAgentMessage({ globalRank: 0, requestId: 2, snapshot: { globalRank: 3 } }));
    await expect(d.receive()).rejects.toThrow(); // no reply
    const st = JSON.parse((await requestStatus({ host: '127.0.0.1', port }, 3000)).statusJson);
    expect(st.dropped.rank_out_of_range).toBe(1);
    expect(Object.keys(st.ranks)).toEqual(['0']); // no made-up rank in the table
  } finally {
    d.close();
  }
  expect(c.stderr()).not.toMatch(/failed to handle/);
});

test("a file request for the root itself (path '') is refused as a directory, not answered with an empty chunk", async () => {
  const dir = tmpDir('wavebus-fuzz-root-');
  fs.writeFileSync(path.join(dir, 'a.npy'), 'abc');
  const files = new FileServer(0, () => ({ dumps: dir }), createLogger('fuzz-test', 'silent'));
  for (const length of [0, 10]) {
    const a = (await files.handle({ body: 'fileChunk', epoch: 1, requestId: 1, fileChunk: { root: 'dumps', path: '', offset: 0, length } })) as { fileChunk: Record<string, unknown> };
    expect(a.fileChunk.error).toMatch(/the root itself is a directory, not a regular file/);
  }
  const ok = (await files.handle({ body: 'fileChunk', epoch: 1, requestId: 2, fileChunk: { root: 'dumps', path: 'a.npy', offset: 0, length: 0 } })) as { fileChunk: Record<string, unknown> };
  expect(ok.fileChunk.error).toBeUndefined();
  await expect(openBeneath(dir, '', 'file')).rejects.toThrow(/the root itself is a directory/);
  expect(() => openBeneathSync(dir, '', 'file')).toThrow(/the root itself is a directory/);
  const d = openBeneathSync(dir, '', 'dir'); // the root as a directory is still what a list opens
  fs.closeSync(d.fd);
});

test('wave-head telemetry rows whose token columns do not match their token ids are dropped at decode as bad_telemetry', () => {
  const bad = encodeAgentMessage({ globalRank: 0, waveHead: { wave: 5, telemetry: { wave: 4, requests: [{ reqId: 'r', newTokenIds: [1, 2], newTokenRanks: [0] }] } } });
  const d = decodeAgentMessage(bad, DEFAULT_MAX_FRAME_BYTES);
  expect(d.ok).toBe(false);
  expect(!d.ok && d.reason).toBe('bad_telemetry');
  expect(!d.ok && d.detail).toMatch(/requests\[0\]: 1 newTokenRanks for 2 newTokenIds/);
  const good = encodeAgentMessage({ globalRank: 0, waveHead: { wave: 5, telemetry: { wave: 4, requests: [{ reqId: 'r', newTokenIds: [1, 2], newTokenRanks: [0, 1] }] } } });
  expect(decodeAgentMessage(good, DEFAULT_MAX_FRAME_BYTES).ok).toBe(true);
});

// ---------------------------------------------------------------- JSONC hot reload

const GOOD = `// runtime config
{
  "detector": {
    /* every detector */
    "token_repeat": { "enabled": true, "window": 32, "on_trigger": ["report", "dump_kv"], },
    "logits_finite": { "enabled": false },
    "garbled": { "enabled": true, "surprise_logprob": -5.5, "min_tokens": 16 },
  },
  "dump": { "auto_max_times": 3, "auto_cooldown_seconds": 10, "format": "npy", "free_headroom_bytes": 1024 },
  "report": { "max_per_req": 2, "include_block_ids": false },
}
`;

function mutateText(m: Mutator, text: string): string {
  const at = m.int(text.length + 1);
  const alphabet = '{}[],:"\'/*\n 0123456789-.eEtrufalsn\\xyz_';
  switch (m.int(9)) {
    case 0:
      return text.slice(0, at) + text.slice(at + 1 + m.int(4)); // delete
    case 1:
      return text.slice(0, at) + alphabet[m.int(alphabet.length)] + text.slice(at); // insert
    case 2:
      return text.slice(0, at); // truncate
    case 3: {
      const b = m.int(text.length + 1);
      return text.slice(0, at) + text.slice(Math.min(at, b), Math.max(at, b)) + text.slice(at); // duplicate a slice
    }
    case 4:
      return text.replace(/-?\d+(\.\d+)?/, m.pick(['-1', '1e309', '0.5', '99999999999999999999', '"7"', 'null', 'true', '[]', '{}'])); // wrong value
    case 5:
      return text.replace(/"[a-z_]+"/, m.pick(['"bogus"', '""', '"detector"', '"enabled"'])); // wrong key
    case 6:
      return text.replace(/true|false/, m.pick(['1', '"yes"', 'null', 'tru'])); // wrong type
    case 7:
      // huge values and unknown keys at depth
      return text.replace(/"dump": \{/, m.pick(['"dump": { "auto_max_times": 1e308,', '"dump": { "format": "' + 'n'.repeat(200000) + '",', '"dump": { "zzz_unknown": 1,', '"dump": { "free_headroom_bytes": 99999999999999999999999,']));
    default:
      return m.pick(['', '[]', 'null', '{', '\u0000', '{"dump": {"format": "exe"}}', '{"detector": []}']); // whole-file garbage
  }
}

test('random JSONC edits under hot reload: never a crash, a clear error each time, the last good config stays', () => {
  const dir = tmpDir('wavebus-fuzz-cfg-');
  const file = path.join(dir, 'runtime_config.json');
  fs.writeFileSync(file, GOOD);
  const initial = configFromText(GOOD, file);
  const f = new ConfigFollower(file, initial, { pollIntervalMs: 0, verifyIntervalMs: 0 });
  const m = new Mutator(11);
  let good = initial;
  let rejected = 0;
  let changed = 0;
  for (let i = 0; i < 600; i++) {
    const text = mutateText(m, m.rand() < 0.3 ? GOOD : mutateText(m, GOOD));
    fs.writeFileSync(file, text);
    let expectOk: boolean;
    try {
      configFromText(text, file);
      expectOk = true;
    } catch (e) {
      expectOk = false;
      // A clear error: a ConfigError naming the file (and, for syntax, line:column).
      expect((e as Error).name).not.toMatch(/^(TypeError|RangeError|ReferenceError)$/);
      expect((e as Error).message).toContain(file);
    }
    const r = f.poll(Date.now(), true);
    if (r.kind === 'rejected') {
      rejected++;
      expect(expectOk).toBe(false);
      expect(r.error.message).toContain(file);
      expect(configJson(f.current())).toBe(configJson(good)); // the last good config stays
    } else if (r.kind === 'changed') {
      changed++;
      expect(expectOk).toBe(true);
      good = r.config;
    } else {
      expect(configJson(f.current())).toBe(configJson(good));
    }
  }
  expect(rejected).toBeGreaterThan(100);
  expect(changed).toBeGreaterThan(2);
});

test('a running coordinator under random config edits stays up, reports the rejection and takes the next good file', async () => {
  const dir = tmpDir('wavebus-fuzz-coord-');
  const file = path.join(dir, 'runtime', 'config', 'runtime_config.json');
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, GOOD);
  const port = await freePortPair();
  const c = spawnWavebus(['coordinator', '--port', String(port), '--world-size', '1', '--runtime-config-path', file, '--runtime-config-hot-reload'], {
    env: { ...process.env, WAVEBUS_LOG_LEVEL: 'info' },
  });
  await waitFor(() => c.stdout().includes('"started"'), 'the coordinator to start', 20000);
  // The guard polls the file at wave heads: drive waves as TP0's agent would.
  const d = new Dealer({ linger: 0 });
  d.connect(`tcp://127.0.0.1:${port + 1}`);
  let wave = 1;
  let driving = true;
  const driver = (async () => {
    while (driving) {
      await d.send(encodeAgentMessage({ globalRank: 0, waveHead: { wave: wave++ } }));
      await sleep(40);
    }
  })();
  try {
    const m = new Mutator(23);
    const status = async () => JSON.parse((await requestStatus({ host: '127.0.0.1', port }, 1000)).statusJson);
    for (let i = 0; i < 16; i++) {
      const text = mutateText(m, mutateText(m, GOOD));
      if (i % 4 === 3) {
        // a partial write in place: the first half, a pause (the guard may read it), then the rest
        const fd = fs.openSync(file, 'w');
        fs.writeSync(fd, text.slice(0, text.length >> 1));
        await sleep(150);
        fs.writeSync(fd, text.slice(text.length >> 1));
        fs.closeSync(fd);
      } else {
        fs.writeFileSync(`${file}.edit`, text);
        fs.renameSync(`${file}.edit`, file);
      }
      await sleep(300);
    }
    // A bad edit keeps the config in force and names the field, or the line:column of a syntax error.
    const inForce = (await status()).auto_max_times;
    for (const [text, named] of [
      ['{ "dump": { "auto_max_times": "lots" } }', /dump\.auto_max_times/],
      ['{ "dump": { "auto_max_times": 5 }, "detector": { "garbled": { "surprise_logprob": [] } } }', /detector\.garbled\.surprise_logprob/],
      ['{ "dump": {\n  "auto_max_times": 5,,\n} }', /c(onfig)?\.json:\d+:\d+:/],
    ] as const) {
      fs.writeFileSync(`${file}.edit`, text);
      fs.renameSync(`${file}.edit`, file);
      const st = await waitFor(async () => {
        const x = await status();
        return x.config_error && named.test(x.config_error) ? x : undefined;
      }, `the coordinator to name ${named} in config_error`, 20000, 100);
      expect(st.config_error).toContain(file);
      expect(st.auto_max_times).toBe(inForce);
    }
    fs.writeFileSync(`${file}.edit`, '{ "dump": { "auto_max_times": 77 } } // last good');
    fs.renameSync(`${file}.edit`, file);
    const s = await waitFor(
      async () => {
        const st = JSON.parse((await requestStatus({ host: '127.0.0.1', port }, 1000)).statusJson);
        return st.auto_max_times === 77 ? st : undefined;
      },
      'the coordinator to take the good file',
      20000,
      100,
    );
    expect(s.config_rejections).toBeGreaterThan(0);
    expect(s.config_error).toBeNull();
  } finally {
    driving = false;
    await driver;
    d.close();
  }
  expect(c.child.exitCode).toBeNull();
  expect(stackTrace(c.stderr())).toBeUndefined();
  expect(c.stderr()).toMatch(/runtime config rejected/);
});
