// One rank of a job whose device memory is the CUDA runtime test double: coordinator, agent and
// TypeScript client in this process (run with WAVEBUS_CUDART naming the double, so the agent's
// CUDA backend loads it; the double writes its report when this process exits). Uses dist/.
//   node job.js <spec.json>   prints one JSON line: what the client and the dump saw.
// spec: { root, regions: [{ name, handle (hex), nbytes, dtype, shape, role, layer?, kv? }],
//         deadRegions?: [same], blocks, reqId, snapshot?: { region, dtype, shape }, cudaStagingBytes?,
//         python?: [argv] (the engine is this Python process instead of the TS client; it steps
//         waves 1..3 itself and prints one JSON line, returned as out.python) }
'use strict';
const fs = require('fs');
const path = require('path');
const { spawn } = require('child_process');
const dist = path.join(__dirname, '..', '..', 'dist', 'src');
const { Agent } = require(path.join(dist, 'agent', 'agent'));
const { Coordinator } = require(path.join(dist, 'bus', 'coordinator'));
const { WavebusClient } = require(path.join(dist, 'client', 'client'));
const { Guard } = require(path.join(dist, 'guard', 'guard'));
const { parseStartupOptions } = require(path.join(dist, 'guard', 'startup'));
const { resolveIdentity } = require(path.join(dist, 'launch', 'identity'));
const { resolveSnapshotConfig } = require(path.join(dist, 'snapshot', 'config'));
const { freePortPair } = require(path.join(dist, 'bus', 'ports'));

async function until(fn, what, ms = 20000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

const region = (r) => ({
  name: r.name,
  kind: 'cuda',
  cudaIpcHandle: Buffer.from(r.handle, 'hex'),
  device: 0,
  offset: r.offset ?? 0,
  nbytes: r.nbytes,
  dtype: r.dtype,
  shape: r.shape,
  role: r.role,
  ...(r.layer ? { layer: r.layer, kv: r.kv } : {}),
});

// The manual dump's wave directory and its manifest, once the coordinator has settled it.
async function finish(out, startup, spec) {
  const reqDir = path.join(startup.dumpDir, 'manual_trigger', spec.reqId);
  await until(() => fs.existsSync(reqDir) && fs.readdirSync(reqDir).length > 0, 'the manual dump');
  out.waveDir = path.join(reqDir, fs.readdirSync(reqDir)[0]);
  const mf = path.join(out.waveDir, 'manifest.json');
  out.manifest = await until(() => {
    const m = fs.existsSync(mf) && JSON.parse(fs.readFileSync(mf, 'utf8'));
    return m && (m.complete || Object.keys(m.failed_ranks ?? {}).length > 0) ? m : undefined;
  }, 'the manifest');
}

// Spawned, not run synchronously: this process must keep answering the client's socket.
function runPython(argv, env) {
  return new Promise((resolve, reject) => {
    const p = spawn(argv[0], argv.slice(1), { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d) => (stdout += d));
    p.stderr.on('data', (d) => (stderr += d));
    p.on('exit', (code) => {
      if (code !== 0) return reject(new Error(`python exited ${code}: ${stderr}`));
      const lines = stdout.trim().split('\n');
      resolve(JSON.parse(lines[lines.length - 1]));
    });
  });
}

async function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const root = spec.root;
  const startup = parseStartupOptions(JSON.stringify({ runtime_config: { dump: { manual_dump: 1, free_headroom_bytes: 0 } } }), {}, root);
  const guard = new Guard({ startup, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 } });
  const port = await freePortPair();
  const coordinator = new Coordinator({ port, layout: { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 }, heartbeatMs: 300, dumpAckTimeoutMs: 10000, policy: guard });
  await coordinator.start();
  const runDir = path.join(root, 'run');
  const env = { RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1', WAVEBUS_TP: '1' };
  const snapshot = resolveSnapshotConfig({ WAVEBUS_CACHE_ROOT: root, ...(spec.snapshot ? { WAVEBUS_SNAPSHOT_ENABLE: '1' } : {}) });
  const agent = new Agent({ identity: resolveIdentity(env), runDir, coordinator: { host: '127.0.0.1', port }, heartbeatMs: 300, endOfWaveTimeoutMs: 5000, snapshot, roots: { dumps: startup.dumpDir }, cudaStagingBytes: spec.cudaStagingBytes });
  await agent.start();
  const out = { registerErrors: {}, dumpRoot: startup.dumpDir };
  if (spec.python) {
    out.python = await runPython(spec.python, { ...process.env, WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0', WAVEBUS_JOB_ROOT: root, WAVEBUS_JOB_DUMP_ROOT: startup.dumpDir });
    await agent.drain();
    await finish(out, startup, spec);
    await agent.stop();
    await coordinator.stop();
    guard.close();
    process.stdout.write(JSON.stringify(out) + '\n');
    return;
  }
  const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
  await until(() => client.featureFlags() !== 0, 'the bus to be active');
  for (const r of spec.regions) await client.register(region(r));
  // A region the agent cannot open is refused with the reason; the agent carries on.
  for (const r of spec.deadRegions ?? []) {
    await client.register(region(r)).catch((e) => (out.registerErrors[r.name] = { code: e.code, message: e.message }));
  }
  const step = { reqId: spec.reqId, newTokenIds: [1], newTokenLogprobs: [], newTokenRanks: [], draftLen: 0, accepted: 0, blockIds: spec.blocks, finished: false, freed: false, promptLen: 8, numOutputTokens: 1 };
  for (let w = 1; w <= 3; w++) {
    await client.waveHead(w, { wave: w - 1, requests: [step], nonFinite: [] });
    await client.endOfWave(w);
  }
  await agent.drain();
  await finish(out, startup, spec);
  if (spec.snapshot) {
    const ctx = { compilationHash: 'graph-cuda', globalStep: 1, isPrompt: true, reqIds: [spec.reqId], positions: [0], rowRequest: [0] };
    const res = await client.beforeForward(ctx, [spec.snapshot]);
    out.snapshotCallDir = res.callDir;
  }
  out.agentStats = agent.stats;
  await client.close();
  await agent.stop();
  await coordinator.stop();
  guard.close();
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`${e.stack}\n`);
    process.exit(1);
  },
);
