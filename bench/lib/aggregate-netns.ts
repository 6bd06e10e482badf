// `wavebus bench aggregate --netns [--size-mb M] [--runs N] [--relay]`: aggregation across two hosts. Two
// network namespaces joined by a veth pair (10.213.<x>.1 and .2, only inside them): the job
// (coordinator + 4 agents, each its own process, with M MB of rank files; with CURVE each agent
// serves its chunks directly, or through the coordinator with --relay) and the baseline's TCP sender in namespace A;
// `wavebus aggregate --curve-dir` (keys from `wavebus keys`) and the baseline's TCP receiver in
// namespace B, each a process timed from start to exit. Every run measures both, once with the
// allocator tuning (src/malloc-tuning.ts) and once without (WAVEBUS_MALLOC_TUNING=0 for the job and
// the tool, glibc defaults for the baseline), against job processes started that way. Needs root.
// Namespaces, processes and files are removed on the way out, also on a failure or a signal.
import { spawn, spawnSync, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { keepFreedMemory, MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES } from '../../src/malloc-tuning';
import { ConfigError } from '../../src/errors';
import { packageRoot } from '../../src/paths';
import { child, ROLES_SCRIPT, writeSource } from './aggregate-roles';
import { createNetnsPair, netnsExists, removeNetns, type NetnsPair } from './netns';

const RANKS = 4;
const PORTS = { tuned: 29700, untuned: 29710, tcpTuned: 29720, tcpUntuned: 29721 }; // fresh namespaces: all free

interface Timed {
  s: number;
  stdout: string;
  stderr: string;
}

/** Run `args` in namespace `ns` to its exit; the seconds from start to exit. Throws on an exit code not in `ok`. */
function timedIn(ns: string, args: string[], env: NodeJS.ProcessEnv, kids: Set<ChildProcess>, what: string, ok = [0]): Promise<Timed> {
  return new Promise((resolve, reject) => {
    const t = process.hrtime.bigint();
    const p = spawn('ip', ['netns', 'exec', ns, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
    kids.add(p);
    let out = '';
    let err = '';
    p.stdout.on('data', (b) => (out += b.toString()));
    p.stderr.on('data', (b) => (err += b.toString()));
    p.on('error', reject);
    p.on('exit', (code, signal) => {
      const s = Number(process.hrtime.bigint() - t) / 1e9;
      kids.delete(p);
      if (code !== null && ok.includes(code)) resolve({ s, stdout: out, stderr: err });
      else reject(new Error(`${what} exited ${code ?? signal}: ${err.trim().slice(-2000)}`));
    });
  });
}

/** Bytes received so far on namespace `ns`'s end of the veth pair. */
function vethRxBytes(ns: string, dev: string): number {
  const r = spawnSync('ip', ['-n', ns, '-j', '-s', 'link', 'show', 'dev', dev], { encoding: 'utf8' });
  return Number(JSON.parse(r.stdout)[0]?.stats64?.rx?.bytes ?? NaN);
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const r3 = (x: number) => Number(x.toFixed(3));

export interface NetnsOptions {
  sizeMb: number;
  runs: number;
  chunkMb: number;
  window: number;
  /** Every chunk through the coordinator (the path before direct fetch), for comparison. */
  relay: boolean;
}

export async function runNetns({ sizeMb, runs, chunkMb, window, relay }: NetnsOptions): Promise<Record<string, unknown>> {
  const uid = process.getuid?.();
  if (uid !== 0) throw new ConfigError(`bench aggregate --netns needs root (uid ${uid}): it creates two network namespaces and a veth pair`);
  const root = packageRoot(__dirname);
  const cli = path.join(root, 'bin', 'wavebus.js');
  // Applied to this process too (it moves no bytes): tells whether the C library takes it (glibc).
  const tunable = keepFreedMemory({});

  const kids = new Set<ChildProcess>();
  let pair: NetnsPair | undefined;
  const tag = `wbag${process.pid % 100000}`;
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-bench-aggns-'));
  let cleaned = false;
  const cleanup = () => {
    if (cleaned) return;
    cleaned = true;
    for (const k of kids) k.kill('SIGKILL');
    removeNetns(`${tag}a`); // also kills what is left inside (the pair may be half made)
    removeNetns(`${tag}b`);
    fs.rmSync(work, { recursive: true, force: true });
  };
  const onSignal = (sig: NodeJS.Signals) => process.exit(sig === 'SIGINT' ? 130 : 143);
  process.on('exit', cleanup);
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  let result: Record<string, unknown>;
  try {
    pair = createNetnsPair(tag, 64 + (process.pid % 63)); // 10.213.64-126.x: apart from the tests' 0-62
    const net = pair;
    const keys = path.join(work, 'keys');
    for (const name of ['coordinator', 'agent']) {
      const r = spawnSync(process.execPath, [cli, 'keys', '--out', keys, '--name', name], { encoding: 'utf8' });
      if (r.status !== 0) throw new Error(`wavebus keys --name ${name} exited ${r.status}: ${r.stderr}`);
    }
    const srcRoot = path.join(work, 'src');
    const src = writeSource(srcRoot, Math.round(sizeMb * 2 ** 20), RANKS);
    const listFile = path.join(work, 'files.json');
    fs.writeFileSync(listFile, JSON.stringify(src.files));
    const total = src.files.reduce((n, f) => n + fs.statSync(f).size, 0);

    const mallocEnv = { MALLOC_MMAP_THRESHOLD_: String(MMAP_THRESHOLD_BYTES), MALLOC_TRIM_THRESHOLD_: String(TRIM_THRESHOLD_BYTES) };
    const base = { ...process.env };
    delete base.MALLOC_MMAP_THRESHOLD_;
    delete base.MALLOC_TRIM_THRESHOLD_;
    const modes = [
      { name: 'tuned', port: PORTS.tuned, tcpPort: PORTS.tcpTuned, env: { ...base, WAVEBUS_MALLOC_TUNING: '1' }, tcpEnv: tunable ? { ...base, ...mallocEnv } : base },
      { name: 'untuned', port: PORTS.untuned, tcpPort: PORTS.tcpUntuned, env: { ...base, WAVEBUS_MALLOC_TUNING: '0' }, tcpEnv: base },
    ];
    const inA = (args: string[], env: NodeJS.ProcessEnv) => {
      const c = child('ip', ['netns', 'exec', net.a, process.execPath, ROLES_SCRIPT, ...args], env);
      kids.add(c.proc);
      return c.ready;
    };
    await Promise.all(
      modes.flatMap((m) => [
        inA(['job', net.addrA, String(m.port), srcRoot, String(RANKS), keys], m.env),
        inA(['tcp-server', net.addrA, String(m.tcpPort), listFile], m.tcpEnv),
      ]),
    );

    const aggregateArgs = (port: number, out: string, extra: string[] = []) => [
      process.execPath, cli, 'aggregate', '--coordinator', `${net.addrA}:${port}`, '--out', out, '--what', 'dumps',
      '--curve-dir', keys, '--chunk-mb', String(chunkMb), '--window', String(window), '--json', ...(relay ? ['--relay'] : []), ...extra,
    ];
    const perMode: Record<string, { s: number; tcp_s: number; MBps: number; tcp_MBps: number; ratio: number }[]> = { tuned: [], untuned: [] };
    const starts: { aggregate: number[]; node: number[] } = { aggregate: [], node: [] };
    const veth: Record<string, number> = {};
    let files = 0;
    for (let run = 0; run < runs; run++) {
      // The fixed cost of each client, for the reader: a node process that does nothing, and a
      // `wavebus aggregate` (CURVE handshake, listing) whose prefix matches no bundle.
      starts.node.push((await timedIn(net.b, [process.execPath, '-e', '0'], base, kids, 'node -e 0')).s);
      const empty = path.join(work, 'empty');
      // It exits 1 (every rank listed no files); its manifest must show that it got that far.
      const none = await timedIn(net.b, aggregateArgs(PORTS.tuned, empty, ['--prefix', 'no-such-bundle/']), modes[0].env, kids, 'wavebus aggregate (empty prefix)', [0, 1]);
      const listed = (JSON.parse(none.stdout || '{}') as { expected_ranks?: number[]; totals?: { files: number } });
      if (listed.totals?.files !== 0 || listed.expected_ranks?.length !== RANKS) throw new Error(`wavebus aggregate (empty prefix): not a listing of ${RANKS} ranks with no files: ${none.stdout.slice(0, 500)} ${none.stderr.slice(-1000)}`);
      starts.aggregate.push(none.s);
      fs.rmSync(empty, { recursive: true, force: true });
      for (const m of modes) {
        const tcpOut = path.join(work, 'tcp-out');
        const rx0 = vethRxBytes(net.b, net.vethB);
        const tcp = await timedIn(net.b, [process.execPath, ROLES_SCRIPT, 'tcp-client', net.addrA, String(m.tcpPort), String(src.files.length), tcpOut], m.tcpEnv, kids, 'tcp copy');
        const rx1 = vethRxBytes(net.b, net.vethB);
        fs.rmSync(tcpOut, { recursive: true, force: true });
        const aggOut = path.join(work, 'agg-out');
        const agg = await timedIn(net.b, aggregateArgs(m.port, aggOut), m.env, kids, 'wavebus aggregate');
        const rx2 = vethRxBytes(net.b, net.vethB);
        fs.rmSync(aggOut, { recursive: true, force: true });
        const manifest = JSON.parse(agg.stdout) as { complete: boolean; totals: { files: number; bytes: number }; direct?: { ranks: number[] } };
        if (!manifest.complete || manifest.totals.bytes !== total) throw new Error(`aggregate incomplete: ${JSON.stringify(manifest.totals)} of ${total} bytes`);
        // The path measured must be the one asked for: every rank direct, or (--relay) none.
        const directRanks = manifest.direct?.ranks.length ?? 0;
        if (directRanks !== (relay ? 0 : RANKS)) throw new Error(`aggregate fetched ${directRanks} of ${RANKS} ranks directly${relay ? ' although --relay was given' : ''}: ${agg.stderr.slice(-1000)}`);
        files = manifest.totals.files;
        if (run === 0 && m.name === 'tuned') Object.assign(veth, { tcp_rx_mb: r3((rx1 - rx0) / 1e6), aggregate_rx_mb: r3((rx2 - rx1) / 1e6) });
        const MBps = total / 1e6 / agg.s;
        const tcpMBps = total / 1e6 / tcp.s;
        perMode[m.name].push({ s: r3(agg.s), tcp_s: r3(tcp.s), MBps: Number(MBps.toPrecision(4)), tcp_MBps: Number(tcpMBps.toPrecision(4)), ratio: r3(MBps / tcpMBps) });
        process.stderr.write(`bench aggregate --netns run ${run + 1}/${runs} ${m.name}: aggregate ${MBps.toFixed(1)} MB/s, tcp ${tcpMBps.toFixed(1)} MB/s, ratio ${(MBps / tcpMBps).toFixed(3)}\n`);
      }
    }
    const summary = (rs: (typeof perMode)['tuned']) => ({
      runs: rs,
      MBps_median: Number(median(rs.map((r) => r.MBps)).toPrecision(4)),
      tcp_MBps_median: Number(median(rs.map((r) => r.tcp_MBps)).toPrecision(4)),
      ratio_median: r3(median(rs.map((r) => r.ratio))),
    });
    result = {
      mode: 'netns',
      namespaces: [net.a, net.b],
      job_addr: net.addrA,
      tool_addr: net.addrB,
      curve: true,
      transport: relay ? 'relay' : 'direct',
      size_mb: Number((total / 1e6).toFixed(1)),
      files,
      ranks: RANKS,
      chunk_mb: chunkMb,
      window,
      malloc_tuning_available: tunable,
      ratio: r3(median(perMode.tuned.map((r) => r.ratio))),
      ratio_untuned: r3(median(perMode.untuned.map((r) => r.ratio))),
      target_ratio: 0.8,
      tuned: summary(perMode.tuned),
      untuned: summary(perMode.untuned),
      // Included in every timing above (both sides are processes started in namespace B).
      start_s_median: { wavebus_aggregate_empty: r3(median(starts.aggregate)), node: r3(median(starts.node)) },
      veth_first_run: veth,
    };
  } finally {
    cleanup();
    process.removeListener('exit', cleanup);
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
  }
  return { ...result, namespaces_removed: !netnsExists(`${tag}a`) && !netnsExists(`${tag}b`) };
}
