// `wavebus bench soak [--agents 8] [--waves 1000] [--dump-every 100] [--pace-ms 1] --json`
// (the documented full run: `--agents 64 --waves 10000`, a few minutes on 2 cores).
//
// A coordinator process and N agent processes on loopback run for many waves with a manual KV
// dump every --dump-every waves. This process plays the engine: one client per rank, each with a
// tiny KV pool in shared memory (so every dump really writes and verifies files, which are then
// removed), TP0's client sends each wave head, every client ends every wave. Reports lost waves
// (an end_of_wave that timed out: must be 0), dumps done, and RSS / open fds of the coordinator
// and the agents after warm-up and at the end (must stay flat).
import { spawn, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import yargs from 'yargs';
import { requestStatus } from '../src/bus/coordinator';
import { WavebusClient } from '../src/client/client';
import { inspectTree } from '../src/tools/inspect';
import { ShmSegment } from '../src/memory';
import { agentEndpoint, mailboxPath, packageRoot } from '../src/paths';
import { freePortPair } from '../src/bus/ports';

const BLOCKS = 4;
const SHAPE = [BLOCKS, 16, 1, 64]; // float16: 2 KiB per block
const REGION_BYTES = SHAPE.reduce((a, b) => a * b, 1) * 2;
const REQ = 'soak-req-0';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));



interface Usage {
  rssKb: number;
  fds: number;
}

function usage(pid: number): Usage {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const rssKb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
  return { rssKb, fds: fs.readdirSync(`/proc/${pid}/fd`).length };
}

function summarize(start: Usage[], end: Usage[]): Record<string, number> {
  const ratio = end.map((e, i) => e.rssKb / Math.max(1, start[i].rssKb));
  const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
  return {
    rss_start_mb_mean: +(sum(start.map((u) => u.rssKb)) / start.length / 1024).toFixed(1),
    rss_end_mb_mean: +(sum(end.map((u) => u.rssKb)) / end.length / 1024).toFixed(1),
    rss_ratio_max: +Math.max(...ratio).toFixed(3),
    fds_start_max: Math.max(...start.map((u) => u.fds)),
    fds_end_max: Math.max(...end.map((u) => u.fds)),
    fds_growth_max: Math.max(...end.map((u, i) => u.fds - start[i].fds)),
  };
}

export async function run(argv: string[]): Promise<Record<string, unknown>> {
  const a = yargs(argv)
    .option('agents', { type: 'number', default: 8 })
    .option('waves', { type: 'number', default: 1000 })
    .option('dump-every', { type: 'number', default: 100 })
    .option('pace-ms', { type: 'number', default: 1 })
    .option('bound-ms', { type: 'number', default: 1000, describe: "agents' end_of_wave bound (a wave later than this is lost)" })
    .option('json', { type: 'boolean', default: false })
    .strict(false)
    .parseSync();
  return soak({ agents: a.agents, waves: a.waves, dumpEvery: a['dump-every'], paceMs: a['pace-ms'], boundMs: a['bound-ms'] });
}

export async function soak(o: { agents: number; waves: number; dumpEvery: number; paceMs: number; boundMs: number }): Promise<Record<string, unknown>> {
  const t0 = Date.now();
  const bin = path.join(packageRoot(), 'bin', 'wavebus.js');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-soak-'));
  const runDir = fs.mkdtempSync(path.join(fs.existsSync('/dev/shm') ? '/dev/shm' : os.tmpdir(), 'wbsoak-'));
  const cfgPath = path.join(dir, 'runtime', 'config', 'runtime_config.json');
  const kvRoot = path.join(dir, 'runtime', 'report', 'kv_cache');
  const cfg = (manual: number) =>
    JSON.stringify({ detector: { logits_finite: { enabled: true, on_trigger: ['report'] } }, dump: { manual_dump: manual, free_headroom_bytes: 0, format: 'npy' } });
  fs.mkdirSync(path.dirname(cfgPath), { recursive: true });
  fs.writeFileSync(cfgPath, cfg(0));
  const port = await freePortPair();
  const env = { ...process.env, WAVEBUS_LOG_LEVEL: process.env.WAVEBUS_LOG_LEVEL ?? 'warn' };
  const procs: ChildProcess[] = [];
  const errs: string[] = [];
  const start = (args: string[]) => {
    const c = spawn(process.execPath, [bin, ...args], { stdio: ['ignore', 'ignore', 'pipe'], env });
    c.stderr!.on('data', (b) => errs.length < 200 && errs.push(String(b).slice(0, 500)));
    procs.push(c);
    return c;
  };
  const n = o.agents;
  const tag = `wbsoak${process.pid}`;
  const segs: ShmSegment[] = [];
  const clients: WavebusClient[] = [];
  let lost = 0;
  let dumpsAsked = 0;
  let dumpsComplete = 0;
  let dumpsIncomplete = 0;
  let bundlesVerified = 0;
  const problems: string[] = [];
  let startUsage: { coordinator: Usage; agents: Usage[] } | undefined;
  let endUsage: { coordinator: Usage; agents: Usage[] } | undefined;
  try {
    const coord = start([
      'coordinator', '--port', String(port), '--world-size', String(n), '--tp', String(n), '--heartbeat-ms', '500',
      '--dump-ack-timeout-ms', '30000', '--runtime-config-path', cfgPath, '--runtime-config-hot-reload',
      // startup writes defaults <- overlay to the live file (seed); later edits of it are the manual dumps
      '--additional-config', JSON.stringify({ runtime_config: JSON.parse(cfg(0)) }),
    ]);
    const agents = Array.from({ length: n }, (_, g) =>
      start([
        'agent', '--coordinator', `127.0.0.1:${port}`, '--rank', String(g), '--local-rank', String(g), '--world-size', String(n),
        '--local-world-size', String(n), '--tp', String(n), '--run-dir', runDir, '--heartbeat-ms', '500',
        '--end-of-wave-timeout-ms', String(o.boundMs), '--staging-mb', '16', '--dump-root', kvRoot,
      ]),
    );
    const readyBy = Date.now() + 60000 + n * 2000;
    for (;;) {
      try {
        if ((await requestStatus({ host: '127.0.0.1', port }, 1000)).ready) break;
      } catch {
        /* not up yet */
      }
      if (Date.now() > readyBy) throw new Error('soak: the bus was not ready in time');
      await sleep(200);
    }
    // The engine: one client per rank with a tiny KV pool (K and V of one layer) in shared memory.
    for (let g = 0; g < n; g++) {
      const name = `/${tag}-r${g}`;
      const seg = ShmSegment.create(name, 2 * REGION_BYTES);
      seg.buffer().fill(g + 1);
      segs.push(seg);
      const c = await WavebusClient.connect({ endpoint: agentEndpoint(runDir, g), mailbox: mailboxPath(runDir, g) });
      for (const [i, kv] of (['k', 'v'] as const).entries()) {
        await c.register({ name: `l0.${kv}`, kind: 'shm', shmName: name, offset: i * REGION_BYTES, nbytes: REGION_BYTES, dtype: 'float16', shape: SHAPE, role: 'kv_pool', layer: 'model.layers.0.self_attn', kv });
      }
      clients.push(c);
    }
    const telemetry = (w: number) => ({
      wave: w - 1,
      requests: [{ reqId: REQ, newTokenIds: [w % 30000], newTokenLogprobs: [-0.5], newTokenRanks: [0], draftLen: 0, accepted: 0, blockIds: [0, 1, 2], finished: false, freed: false, promptLen: 8, numOutputTokens: w }],
      nonFinite: [],
    });
    const warmup = Math.min(200, Math.floor(o.waves / 5));
    const collect = () => {
      // Completed wave dirs are verified, counted and removed, so the disk stays flat.
      for (const t of fs.existsSync(kvRoot) ? fs.readdirSync(kvRoot) : []) {
        const tdir = path.join(kvRoot, t);
        for (const req of fs.readdirSync(tdir)) {
          for (const w of fs.readdirSync(path.join(tdir, req))) {
            const wdir = path.join(tdir, req, w);
            const mf = path.join(wdir, 'manifest.json');
            if (!fs.existsSync(mf)) continue;
            const m = JSON.parse(fs.readFileSync(mf, 'utf8'));
            if (m.complete) {
              const r = inspectTree(wdir, { verify: true });
              if (r.problems.length > 0) problems.push(...r.problems.slice(0, 5));
              bundlesVerified += r.bundles.filter((b) => b.kind === 'kv_dump').length;
              dumpsComplete++;
            } else {
              dumpsIncomplete++;
              if (problems.length < 20) problems.push(`${w}: incomplete (missing ${JSON.stringify(m.missing_ranks)}, failed ${JSON.stringify(m.failed_ranks)})`);
            }
            fs.rmSync(wdir, { recursive: true, force: true });
          }
        }
      }
    };
    const waveStart = Date.now();
    const step = async (w: number) => {
      await clients[0].waveHead(w, telemetry(w));
      if (o.paceMs > 0) await sleep(o.paceMs);
      const ends = await Promise.all(clients.map((c) => c.endOfWave(w)));
      return ends.filter((e) => e.timedOut).length;
    };
    for (let w = 1; w <= o.waves; w++) {
      if (w === warmup) startUsage = { coordinator: usage(coord.pid!), agents: agents.map((x) => usage(x.pid!)) };
      if (w % o.dumpEvery === 0) {
        dumpsAsked++;
        fs.writeFileSync(`${cfgPath}.edit`, cfg(dumpsAsked));
        fs.renameSync(`${cfgPath}.edit`, cfgPath);
        collect();
      }
      lost += await step(w);
    }
    const waveSeconds = (Date.now() - waveStart) / 1000;
    // Keep stepping (not counted) until the last dumps were armed and acked, then collect them.
    const settleBy = Date.now() + 30000;
    for (let w = o.waves + 1; Date.now() < settleBy; w++) {
      const s = JSON.parse((await requestStatus({ host: '127.0.0.1', port }, 3000)).statusJson);
      if ((s.dumps?.pending ?? 0) === 0 && (s.manual_dump_done ?? 0) >= dumpsAsked) break;
      await step(w);
      await sleep(20);
    }
    collect();
    endUsage = { coordinator: usage(coord.pid!), agents: agents.map((x) => usage(x.pid!)) };
    const dead = procs.filter((p) => p.exitCode !== null || p.signalCode !== null).length;
    if (dead > 0) problems.push(`${dead} wavebus process(es) died: ${errs.slice(-3).join(' | ')}`);
    const su = startUsage ?? endUsage;
    return {
      agents: n,
      waves: o.waves,
      waves_per_sec: +(o.waves / waveSeconds).toFixed(1),
      lost_waves: lost,
      dumps_asked: dumpsAsked,
      dumps_complete: dumpsComplete,
      dumps_incomplete: dumpsIncomplete,
      bundles_verified: bundlesVerified,
      coordinator: {
        rss_start_mb: +(su.coordinator.rssKb / 1024).toFixed(1),
        rss_end_mb: +(endUsage.coordinator.rssKb / 1024).toFixed(1),
        rss_ratio: +(endUsage.coordinator.rssKb / Math.max(1, su.coordinator.rssKb)).toFixed(3),
        fds_start: su.coordinator.fds,
        fds_end: endUsage.coordinator.fds,
      },
      agents_usage: summarize(su.agents, endUsage.agents),
      problems,
      seconds: (Date.now() - t0) / 1000,
    };
  } finally {
    for (const c of clients) await c.close().catch(() => undefined);
    for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGTERM');
    await Promise.race([Promise.all(procs.map((p) => (p.exitCode === null && p.signalCode === null ? new Promise((r) => p.once('exit', r)) : undefined))), sleep(10000)]);
    for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    for (const [g, s] of segs.entries()) {
      s.close();
      try {
        ShmSegment.unlink(`/${tag}-r${g}`);
      } catch {
        /* gone */
      }
    }
    fs.rmSync(dir, { recursive: true, force: true });
    fs.rmSync(runDir, { recursive: true, force: true });
  }
}
