// Issue 28 item 4: roots in a directory another local user can write. A real second uid plants a
// link, a setgid directory and its own runtime dir in a shared (sticky, world-writable) directory;
// every write refuses what it planted, naming the path and its owner, nothing is written where it
// points, what we create carries our group, and another user's files are never served.
import * as fs from 'fs';
import * as path from 'path';
import pino from 'pino';
import { Agent } from '../src/agent/agent';
import { FileServer, listBundleFiles } from '../src/agent/file-server';
import { checkLocalRoots } from '../src/agent/roots';
import { Bundle } from '../src/artifacts/bundle';
import { writeDumpSkipped } from '../src/artifacts/freespace';
import { Tensor } from '../src/artifacts/tensor';
import type { CoordinatorMsg } from '../src/bus/frames';
import { Coordinator } from '../src/bus/coordinator';
import { WavebusClient } from '../src/client/client';
import { defaultConfig } from '../src/guard/config';
import { Guard } from '../src/guard/guard';
import { ConfigFollower } from '../src/guard/reload';
import { writeReport, type IncidentReport } from '../src/guard/reports';
import { checkStartupPaths, parseStartupOptions } from '../src/guard/startup';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { ShmSegment } from '../src/memory';
import { cleanup, cleanupUsers, describeAsRoot, freePortPair, otherUser, runAs, runWavebus, tmpDir, waitFor, type OtherUser } from './helpers';

const quiet = createLogger('shared-dir-test', 'silent');
const POOL_BYTES = 32 * 4 * 2 * 8 * 2;

afterAll(async () => {
  await cleanup();
  cleanupUsers();
});

/** A root-owned directory every user may write, sticky like /tmp: `<base>/shared`. */
function sharedDir(mode = 0o1777): { base: string; shared: string } {
  const base = tmpDir('wavebus-shared-');
  fs.chmodSync(base, 0o755);
  const shared = path.join(base, 'shared');
  fs.mkdirSync(shared);
  fs.chmodSync(shared, mode);
  return { base, shared };
}

/** The error `f` throws (it must throw). */
function refusal(f: () => unknown): Error & { code?: string } {
  try {
    f();
  } catch (e) {
    return e as Error & { code?: string };
  }
  throw new Error('expected a refusal');
}

async function asyncRefusal(f: () => Promise<unknown>): Promise<Error & { code?: string }> {
  try {
    await f();
  } catch (e) {
    return e as Error & { code?: string };
  }
  throw new Error('expected a refusal');
}

const owner = (u: OtherUser) => `owned by uid ${u.uid} (${u.name})`;

function report(type: string): IncidentReport {
  return { ts: new Date().toISOString(), incident_type: type, req_id: 'req-1', rank: 0, dp_rank: 0, detect_wave: 3, dump_attempted: false, dump_arm_wave: null, dump_count: 0, dump_max_times: 1, dump_dir: null, detail: {} };
}

async function writeDump(dir: string): Promise<void> {
  const b = Bundle.begin(dir);
  await b.writeTensor('model.layers.0.self_attn.k', 'npy', Tensor.fromBuffer('uint8', [64], Buffer.alloc(64, 7)));
  await b.commit({ name: 'dump.json', value: { schema: 1 } });
}

/** Every directory and file under `dir` (itself included): path, gid, mode. */
function walkModes(dir: string): { p: string; gid: number; mode: number; dir: boolean }[] {
  const st = fs.lstatSync(dir);
  const out = [{ p: dir, gid: st.gid, mode: st.mode & 0o7777, dir: st.isDirectory() }];
  if (st.isDirectory()) for (const n of fs.readdirSync(dir)) out.push(...walkModes(path.join(dir, n)));
  return out;
}

/** One rank under the real guard (dump root `root`, reports in `root`), coordinator, agent and engine client. */
async function oneRankJob(root: string, log: pino.Logger) {
  const home = tmpDir('wavebus-shared-job-');
  const startup = parseStartupOptions(JSON.stringify({ runtime_dump_dir: root, runtime_report_dir: root, runtime_config: { dump: { manual_dump: 1, free_headroom_bytes: 0, auto_cooldown_seconds: 0 } } }), {}, home);
  checkStartupPaths(startup); // a sticky shared root passes: nobody else can replace what we put there
  const guard = new Guard({ startup, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, log });
  const port = await freePortPair();
  const coordinator = new Coordinator({ port, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, heartbeatMs: 100, deadAfterMs: 5000, dumpAckTimeoutMs: 5000, policy: guard, logger: quiet });
  await coordinator.start();
  const runDir = path.join(home, 'run');
  const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
  const agent = new Agent({ identity, runDir, coordinator: { host: '127.0.0.1', port }, heartbeatMs: 100, endOfWaveTimeoutMs: 5000, roots: { dumps: root }, logger: quiet });
  await agent.start();
  const shmName = `/wavebus-shared-${process.pid}-${port}`;
  const seg = ShmSegment.create(shmName, 2 * POOL_BYTES);
  seg.buffer().fill(5);
  const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
  await waitFor(() => client.featureFlags() !== 0, 'the bus to be active');
  for (const [i, kv] of (['k', 'v'] as const).entries()) {
    await client.register({ name: `layers.0.${kv}`, shmName, offset: i * POOL_BYTES, nbytes: POOL_BYTES, dtype: 'bfloat16', shape: [32, 4, 2, 8], role: 'kv_pool', layer: 'layers.0', kv });
  }
  const stop = async () => {
    await client.close();
    await agent.stop();
    await coordinator.stop();
    guard.close();
    seg.close();
    ShmSegment.unlink(shmName);
  };
  return { guard, client, agent, stop };
}

describeAsRoot('a second local user attacks roots in a shared directory', () => {
  test('a link planted in a shared dump root (manual_trigger -> a root-owned dir): no dump is armed or written through it, the job runs on, the refusal names the link and its owner', async () => {
    const user = otherUser('shlink');
    const { base, shared } = sharedDir();
    const victim = path.join(base, 'victim'); // stands for /etc/wbtest: root's, not writable by the user
    fs.mkdirSync(victim, { mode: 0o755 });
    const link = path.join(shared, 'manual_trigger');
    expect(runAs(user, 'ln', ['-s', victim, link]).code).toBe(0);
    const lines: Record<string, unknown>[] = [];
    const log = pino({ level: 'info' }, { write: (s: string) => lines.push(JSON.parse(s)) });
    const job = await oneRankJob(shared, log);
    try {
      for (let w = 1; w <= 4; w++) {
        await job.client.waveHead(w, { wave: w - 1, requests: [{ reqId: 'req-1', newTokenIds: [1], newTokenLogprobs: [], newTokenRanks: [], draftLen: 0, accepted: 0, blockIds: [1, 2], finished: false, freed: false, promptLen: 4, numOutputTokens: w }], nonFinite: [] });
        expect((await job.client.endOfWave(w)).error).toBeUndefined();
      }
      const failed = await waitFor(() => lines.find((l) => l.msg === 'dump not armed: cannot write its directory'), 'the refused dump to be logged');
      expect(failed.code).toBe('ERR_PATH_UNTRUSTED');
      expect(failed.err).toContain(`symbolic link ${link} is ${owner(user)}`);
      expect((job.guard.status().incidents as Record<string, Record<string, number>>).manual_trigger).toMatchObject({ dump_failed: 1 });
      // The job goes on: the next wave is answered.
      expect((await job.client.endOfWave(5)).error).toBeUndefined();
    } finally {
      await job.stop();
    }
    // The agent's writers and the report writer refuse the same link the same way.
    const rankDir = path.join(link, 'req-1', 'wave_3', 'dp0_tp0_pp0_cp0');
    const viaBundle = await asyncRefusal(() => writeDump(rankDir));
    expect(viaBundle.code).toBe('ERR_PATH_UNTRUSTED');
    expect(viaBundle.message).toContain(`symbolic link ${link} is ${owner(user)}`);
    const viaSkipped = refusal(() => writeDumpSkipped(rankDir, { reason: 'write_failed', req_id: 'req-1', incident_type: 'manual_trigger', stage: 'drain', rank: 0, wave: 3 }));
    expect(viaSkipped.code).toBe('ERR_PATH_UNTRUSTED');
    const viaReport = refusal(() => writeReport(shared, report('manual_trigger'), new Date()));
    expect(viaReport.code).toBe('ERR_PATH_UNTRUSTED');
    expect(viaReport.message).toContain(link);
    expect(fs.readdirSync(victim)).toEqual([]);
  });

  test('a setgid directory another user plants is refused; under a root-owned setgid shared dir our dirs and files get our group, no setgid bit, 0750/0640, and the user cannot read them', async () => {
    const user = otherUser('shsgid');
    const { base, shared } = sharedDir();
    const planted = path.join(shared, 'token_repeat');
    expect(runAs(user, 'mkdir', [planted]).code).toBe(0);
    expect(runAs(user, 'chmod', ['2777', planted]).code).toBe(0);
    const e = await asyncRefusal(() => writeDump(path.join(planted, 'req-1', 'wave_3', 'dp0_tp0_pp0_cp0')));
    expect(e.code).toBe('ERR_PATH_UNTRUSTED');
    expect(e.message).toContain(`directory ${planted} is ${owner(user)}`);
    expect(fs.readdirSync(planted)).toEqual([]);

    // A shared directory of root's whose group is the user's, setgid: new entries would inherit that group.
    const sg = path.join(base, 'sg');
    fs.mkdirSync(sg);
    fs.chownSync(sg, 0, user.gid);
    fs.chmodSync(sg, 0o3777);
    await writeDump(path.join(sg, 'token_repeat', 'req-1', 'wave_3', 'dp0_tp0_pp0_cp0'));
    const file = writeReport(path.join(sg, 'reports'), report('token_repeat'), new Date());
    const made = [...walkModes(path.join(sg, 'token_repeat')), ...walkModes(path.join(sg, 'reports'))];
    expect(made.length).toBeGreaterThanOrEqual(9);
    for (const m of made) expect({ p: m.p, gid: m.gid, mode: m.mode }).toEqual({ p: m.p, gid: process.getegid!(), mode: m.dir ? 0o750 : 0o640 });
    const dumpFile = path.join(sg, 'token_repeat', 'req-1', 'wave_3', 'dp0_tp0_pp0_cp0', 'dump.json');
    for (const f of [dumpFile, file]) expect(runAs(user, 'cat', [f]).code).not.toBe(0);
  });

  test('a runtime dir another user owns: startup refuses it naming the dir and its owner (the coordinator exits with ERR_PATH_UNTRUSTED); hot reload refuses a config file another user replaced and keeps the old one', async () => {
    const user = otherUser('shrt');
    const { base, shared } = sharedDir();
    const theirs = path.join(shared, 'runtime');
    expect(runAs(user, 'mkdir', ['-p', path.join(theirs, 'config')]).code).toBe(0);
    const configPath = path.join(theirs, 'config', 'runtime_config.json');
    const startup = parseStartupOptions(undefined, { runtimeConfigPath: configPath, runtimeReportDir: path.join(base, 'report') }, base);
    const e = refusal(() => checkStartupPaths(startup));
    expect(e.code).toBe('ERR_PATH_UNTRUSTED');
    expect(e.message).toContain(`runtime config file: directory ${theirs} is ${owner(user)}`);
    // A root dir writable by every user without the sticky bit is refused too, with its owner.
    const open = sharedDir(0o777).shared;
    const e2 = refusal(() => checkLocalRoots({ dumps: path.join(open, 'kv') }, false));
    expect(e2.message).toContain(`--dump-root: directory ${open} (owned by uid 0 (root)) is writable by every user without the sticky bit`);
    const port = await freePortPair();
    const r = runWavebus(['coordinator', '--port', String(port), '--world-size', '1', '--runtime-config-path', configPath], { cwd: base, timeout: 30000 });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain('ERR_PATH_UNTRUSTED');
    expect(r.stderr).toContain(`directory ${theirs} is ${owner(user)}`);
    expect(fs.existsSync(configPath)).toBe(false);

    // Hot reload: our runtime dir, then handed to the user, who replaces the file.
    const ours = path.join(base, 'own', 'config');
    fs.mkdirSync(ours, { recursive: true });
    const file = path.join(ours, 'runtime_config.json');
    fs.writeFileSync(file, '{"detector": {"token_repeat": {"enabled": true, "window": 8}}}');
    const lines: Record<string, unknown>[] = [];
    const log = pino({ level: 'info' }, { write: (s: string) => lines.push(JSON.parse(s)) });
    const f = ConfigFollower.fromFile(file, defaultConfig(), { pollIntervalMs: 0, verifyIntervalMs: 0, log });
    expect(f.current().detector.token_repeat.window).toBe(8);
    fs.chownSync(ours, user.uid, user.gid);
    const evil = path.join(ours, 'evil.json');
    expect(runAs(user, 'sh', ['-c', `printf '%s' '{"detector": {"token_repeat": {"enabled": false}}}' > ${evil} && mv ${evil} ${file}`]).code).toBe(0);
    const p1 = f.poll(1);
    expect(p1.kind).toBe('rejected');
    expect((p1 as { error: Error }).error.message).toContain(`directory ${ours} is ${owner(user)}`);
    expect(f.current().detector.token_repeat).toMatchObject({ enabled: true, window: 8 });
    expect(lines.filter((l) => l.msg === 'runtime config rejected; keeping the last good config').map((l) => l.err)).toEqual([(p1 as { error: Error }).error.message]);
    // The dir is ours again, the file still the user's: refused, naming the file.
    fs.chownSync(ours, 0, 0);
    const p2 = f.poll(2);
    expect(p2.kind).toBe('rejected');
    expect((p2 as { error: Error }).error.message).toContain(`file ${file} is ${owner(user)}`);
    expect(f.current().detector.token_repeat.enabled).toBe(true);
    // Our own edit applies again.
    fs.rmSync(file);
    fs.writeFileSync(file, '{"detector": {"token_repeat": {"enabled": true, "window": 12}}}');
    expect(f.poll(3)).toMatchObject({ kind: 'changed' });
    expect(f.current().detector.token_repeat.window).toBe(12);
  });

  test('files another user puts in a shared dump root are never listed or served', async () => {
    const user = otherUser('shlist');
    const { shared } = sharedDir();
    await writeDump(path.join(shared, 'token_repeat', 'req-1', 'wave_3', 'dp0_tp0_pp0_cp0'));
    expect(runAs(user, 'sh', ['-c', `mkdir -p ${shared}/token_repeat2/req-9/wave_1/dp0_tp0_pp0_cp0 && echo fake > ${shared}/token_repeat2/req-9/wave_1/dp0_tp0_pp0_cp0/dump.json && echo fake > ${shared}/planted.json`]).code).toBe(0);
    const listed = listBundleFiles(shared, '').map((x) => x.path);
    expect(listed.sort()).toEqual(['token_repeat/req-1/wave_3/dp0_tp0_pp0_cp0/dump.json', 'token_repeat/req-1/wave_3/dp0_tp0_pp0_cp0/model.layers.0.self_attn.k.npy']);
    expect(listBundleFiles(shared, 'token_repeat2')).toEqual([]);
    const server = new FileServer(0, () => ({ dumps: shared }), quiet);
    const reply = await server.handle({ epoch: 1, requestId: 1, body: 'fileChunk', fileChunk: { root: 'dumps', path: 'planted.json', offset: 0, length: 100, received: [] } } as unknown as CoordinatorMsg);
    expect((reply.fileChunk as { error?: string }).error).toContain(`'planted.json' is ${owner(user)}, not written by rank 0; not served`);
  });
});
