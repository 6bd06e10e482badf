// `wavebus bench recorder [--forwards N] [--small-kb S] [--large-mb L] [--client python|typescript] --json`
//
// The flight recorder's per-forward cost, on the engine's side: the Python client's before_forward
// (or, with --client typescript, the TypeScript client's awaited beforeForward)
// for one input of S KiB (a small batch) and of L MiB (a large one, e.g. a KV cache registered as
// an input), against an agent with WAVEBUS_RECORD_FORWARDS=4 and, in the same run, against the
// same agent without the recorder (before_forward returns at once: the baseline). Each mode is a
// real agent (this process) and a real engine process (Python, or Node with the built client)
// mapping a POSIX shm input region.
// Reported per size: µs per forward with and without, the difference (the recorder's cost), and
// the copy's GB/s. No message is sent per forward in either mode.
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { Agent } from '../src/agent/agent';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { packageRoot } from '../src/paths';
import type { BenchArgs, BenchFlags } from './lib/flags';

export const summary = "The flight recorder's cost per forward in the engine (one copy of the inputs into the ring), small and large inputs, against the same run without it.";
export const flags = {
  forwards: { type: 'int', default: 200, describe: 'timed forwards per size and mode (after 20 untimed)' },
  'small-kb': { type: 'int', default: 64, describe: 'the small batch: KiB of input per forward' },
  'large-mb': { type: 'int', default: 64, max: 1024, describe: 'the large batch: MiB of input per forward' },
  client: { type: 'string', default: 'python', choices: ['python', 'typescript'], describe: 'the engine client that records' },
} satisfies BenchFlags;

const PY = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

const ENGINE = `import json, sys, time, torch
from wavebus_client import Client
from wavebus_client.shm import shm_tensor, release
run_dir, n, sizes = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
c = Client.connect(env={"WAVEBUS_RUN_DIR": run_dir, "LOCAL_RANK": "0"})
bufs = {}
for s in sizes:
    t, r = shm_tensor(f"wbbench-rec-{s}", [s // 8], torch.int64, region_name=f"in{s}")
    t.copy_(torch.arange(s // 8))
    bufs[s] = (t, r)
    c.register(r)
c.hello()
out = {}
for s in sizes:
    t = bufs[s][0]
    ctx = {"compilation_hash": "bench", "global_step": 1, "req_ids": ["r"], "positions": [0]}
    for i in range(20):
        c.before_forward(ctx, [t])
    t0 = time.perf_counter()
    for i in range(n):
        ctx["global_step"] = i + 2
        c.before_forward(ctx, [t])
    out[s] = (time.perf_counter() - t0) / n * 1e6
print(json.dumps({"us": out, "recorded": c.stats.get("recorded", 0)}))
c.close()
for t, r in bufs.values():
    release(r)
`;

// The same loop in a Node engine, through the built TypeScript client (dist/). The baseline awaits
// beforeForward too: an already settled promise when the recorder is off.
const TS_ENGINE = `const dist = process.argv[1];
const { WavebusClient } = require(dist + '/src/client/client.js');
const { ShmSegment } = require(dist + '/src/memory.js');
(async () => {
  const [, , runDir, n, sizesArg] = process.argv;
  const sizes = sizesArg.split(',').map(Number);
  const c = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
  const segs = sizes.map((s) => [\`/wbbench-rects-\${process.pid}-\${s}\`, s]);
  for (const [name, s] of segs) {
    const seg = ShmSegment.create(name, s);
    new BigInt64Array(seg.buffer().buffer, seg.buffer().byteOffset, s / 8).forEach((_, i, a) => (a[i] = BigInt(i)));
    await c.register({ name: 'in' + s, shmName: name, nbytes: s, dtype: 'int64', shape: [s / 8], role: 'input' });
  }
  const out = {};
  for (const s of sizes) {
    const ctx = { compilationHash: 'bench', globalStep: 1, reqIds: ['r'], positions: [0] };
    const inputs = [{ region: 'in' + s, dtype: 'int64', shape: [s / 8] }];
    for (let i = 0; i < 20; i++) await c.beforeForward(ctx, inputs);
    const t0 = performance.now();
    for (let i = 0; i < Number(n); i++) {
      ctx.globalStep = i + 2;
      await c.beforeForward(ctx, inputs);
    }
    out[s] = ((performance.now() - t0) / Number(n)) * 1000;
  }
  console.log(JSON.stringify({ us: out, recorded: c.stats.recorded }));
  await c.close();
  for (const [name] of segs) ShmSegment.unlink(name);
})().catch((e) => { console.error(e); process.exit(1); });
`;

function runEngine(client: string, runDir: string, n: number, sizes: number[]): Promise<{ us: Record<string, number>; recorded: number }> {
  return new Promise((resolve, reject) => {
    const argv = client === 'typescript'
      ? [process.execPath, ['-e', TS_ENGINE, path.join(packageRoot(), 'dist'), runDir, String(n), sizes.join(',')]] as const
      : [PY, ['-c', ENGINE, runDir, String(n), sizes.join(',')]] as const;
    const child = spawn(argv[0], [...argv[1]], { env: { ...process.env, PYTHONPATH: path.join(packageRoot(), 'clients', 'python') }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (b) => (out += b));
    child.stderr.on('data', (b) => (err = (err + b).slice(-4000)));
    child.on('exit', (code) => (code === 0 ? resolve(JSON.parse(out.trim().split('\n').pop()!)) : reject(new Error(`bench recorder: the engine exited ${code}: ${err}`))));
  });
}

async function mode(client: string, recorder: boolean, n: number, sizes: number[]): Promise<{ us: Record<string, number>; recorded: number }> {
  const runDir = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-bench-recorder-'));
  const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
  const maxBytes = 4 * (Math.max(...sizes) + 4096);
  const agent = new Agent({ identity, runDir, logger: createLogger('bench-recorder', 'error'), roots: { dumps: path.join(runDir, 'dumps') }, ...(recorder ? { recorder: { forwards: 4, maxBytes } } : {}) });
  await agent.start();
  try {
    return await runEngine(client, runDir, n, sizes);
  } finally {
    await agent.stop();
    fs.rmSync(runDir, { recursive: true, force: true });
  }
}

export async function run(args: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  const sizes = [args['small-kb'] * 1024, args['large-mb'] * 2 ** 20];
  const client = String(args.client);
  const off = await mode(client, false, args.forwards, sizes);
  const on = await mode(client, true, args.forwards, sizes);
  if (on.recorded !== 2 * (args.forwards + 20) || off.recorded !== 0) throw new Error(`bench recorder: recorded ${on.recorded} forwards with the recorder, ${off.recorded} without`);
  const round = (x: number) => Math.round(x * 10) / 10;
  const per = (s: number, name: string) => {
    const a = off.us[String(s)];
    const b = on.us[String(s)];
    return { [`${name}_bytes`]: s, [`${name}_off_us`]: round(a), [`${name}_on_us`]: round(b), [`${name}_cost_us`]: round(b - a), [`${name}_copy_GBps`]: round(s / ((b - a) * 1e3)) };
  };
  return { bench: 'recorder', client, forwards: args.forwards, slots: 4, ...per(sizes[0], 'small'), ...per(sizes[1], 'large') };
}
