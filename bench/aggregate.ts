// `wavebus bench aggregate --size-mb M`: aggregation throughput of M MB of bundles (4 ranks ×
// M/4 MB) over loopback — coordinator + 4 agents in a child process, `aggregate()` here — against
// a plain TCP copy of the same bytes (a node net server in a child process → a client here
// writing each file with fsync), measured in the same run. Target: ratio ≥ 0.8.
// Also reports the CPU time and page faults of each side in its best round (this process: the
// tool or the TCP client; the child: coordinator + agents or the TCP server): where the time goes.
// `--netns`: the same across two network namespaces, with CURVE and `wavebus aggregate` itself
// (bench/lib/aggregate-netns.ts).
import type { ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { aggregate, DEFAULT_CHUNK_MB, DEFAULT_PARALLEL_FILES, DEFAULT_WINDOW } from '../src/tools/aggregate';
import { child, ROLES_SCRIPT, tcpCopy, writeSource } from './lib/aggregate-roles';
import { runNetns } from './lib/aggregate-netns';
import { keepFreedMemory, MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES } from '../src/malloc-tuning';
import { freePort, freePortPair } from '../src/bus/ports';
import { ConfigError } from '../src/errors';
import type { BenchArgs, BenchFlags } from './lib/flags';

const RANKS = 4;

/** CPU ms (user + system) and minor page faults of a process, from /proc (Linux); NaN elsewhere. */
function usage(pid: number | undefined): { cpuMs: number; faults: number } {
  try {
    const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return { cpuMs: ((Number(f[11]) + Number(f[12])) * 1000) / 100, faults: Number(f[7]) }; // USER_HZ is 100 on Linux
  } catch {
    return { cpuMs: NaN, faults: NaN };
  }
}

interface Round {
  s: number;
  self: { cpuMs: number; faults: number };
  child: { cpuMs: number; faults: number };
}

/** Time `fn`, with the CPU time and page faults of this process and of `child` meanwhile. */
async function timed(child: ChildProcess, fn: () => Promise<void>): Promise<Round> {
  const c0 = usage(child.pid);
  const s0 = usage(process.pid);
  const t = process.hrtime.bigint();
  await fn();
  const s = Number(process.hrtime.bigint() - t) / 1e9;
  const c1 = usage(child.pid);
  const s1 = usage(process.pid);
  return {
    s,
    self: { cpuMs: s1.cpuMs - s0.cpuMs, faults: s1.faults - s0.faults },
    child: { cpuMs: c1.cpuMs - c0.cpuMs, faults: c1.faults - c0.faults },
  };
}

const best = (rs: Round[]) => rs.reduce((a, b) => (b.s < a.s ? b : a));

export const summary = 'Aggregation throughput of M MiB of bundles (4 ranks) over loopback, or with --netns across two network namespaces with CURVE, against a plain TCP copy of the same bytes in the same run (target ratio >= 0.8).';
const MIB_FRACTION = 1 / 1024; // sizes in MiB may be fractional (a test moves 2 MiB)
export const flags = {
  netns: { type: 'boolean', default: false, describe: 'across two network namespaces with CURVE and `wavebus aggregate` itself (needs root)' },
  'size-mb': { type: 'number', min: MIB_FRACTION, describe: 'MiB of bundles over 4 ranks (default: 64; 256 with --netns)' },
  'chunk-mb': { type: 'number', default: DEFAULT_CHUNK_MB, min: MIB_FRACTION, describe: 'chunk size of the transfer in MiB' },
  window: { type: 'int', default: DEFAULT_WINDOW, describe: 'chunks in flight' },
  'parallel-files': { type: 'int', describe: `files fetched at once (default: ${DEFAULT_PARALLEL_FILES}; loopback only)` },
  rounds: { type: 'int', describe: 'alternating rounds of each side, the best kept (default: 2; loopback only)' },
  runs: { type: 'int', describe: 'runs of each allocator mode (default: 3; --netns only)' },
  relay: { type: 'boolean', default: false, describe: 'every chunk through the coordinator, the path before direct fetch (--netns only)' },
} satisfies BenchFlags;

export async function run(args: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  // A flag of the other mode would be ignored: refused instead, so that no run measures something else than asked.
  const otherMode = args.netns ? (['parallel-files', 'rounds'] as const) : (['runs', 'relay'] as const);
  for (const k of otherMode) {
    if (args[k] !== undefined && args[k] !== false) throw new ConfigError(`bench aggregate: --${k} applies ${args.netns ? 'without' : 'with'} --netns only`);
  }
  const chunkMb = args['chunk-mb'];
  const window = args.window;
  if (args.netns) return runNetns({ sizeMb: args['size-mb'] ?? 256, runs: args.runs ?? 3, chunkMb, window, relay: args.relay });
  const sizeMb = args['size-mb'] ?? 64;
  const parallelFiles = args['parallel-files'] ?? DEFAULT_PARALLEL_FILES;
  const rounds = args.rounds ?? 2;
  // this process is the tool: as `wavebus aggregate` does (WAVEBUS_MALLOC_TUNING=0: glibc defaults)
  const tuned = keepFreedMemory();
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-bench-agg-'));
  const kids: ChildProcess[] = [];
  try {
    const src = writeSource(path.join(work, 'src'), Math.round(sizeMb * 2 ** 20), RANKS);
    const port = await freePortPair();
    const job = child(process.execPath, [ROLES_SCRIPT, 'job', '127.0.0.1', String(port), path.join(work, 'src'), String(RANKS)]);
    kids.push(job.proc);
    const listFile = path.join(work, 'files.json');
    fs.writeFileSync(listFile, JSON.stringify(src.files));
    const tcpPort = await freePort();
    // The baseline's server gets the allocator settings the job has (same as keepFreedMemory):
    // both sides then reuse freed memory and the comparison is about the transport.
    const sameMalloc = tuned ? { MALLOC_MMAP_THRESHOLD_: String(MMAP_THRESHOLD_BYTES), MALLOC_TRIM_THRESHOLD_: String(TRIM_THRESHOLD_BYTES) } : {};
    const tcp = child(process.execPath, [ROLES_SCRIPT, 'tcp-server', '127.0.0.1', String(tcpPort), listFile], { ...process.env, ...sameMalloc });
    kids.push(tcp.proc);
    await Promise.all([job.ready, tcp.ready]);
    const total = src.files.reduce((n, f) => n + fs.statSync(f).size, 0);

    // Alternate, best of `rounds` each (2 by default), so neither side gets a warm page cache
    // the other lacked.
    const agg: Round[] = [];
    const tcpRounds: Round[] = [];
    let files = 0;
    for (let round = 0; round < rounds; round++) {
      tcpRounds.push(await timed(tcp.proc, () => tcpCopy('127.0.0.1', tcpPort, src.files.length, path.join(work, `tcp${round}`))));
      agg.push(
        await timed(job.proc, async () => {
          const m = await aggregate({
            coordinator: { host: '127.0.0.1', port },
            out: path.join(work, `agg${round}`),
            what: 'dumps',
            chunkBytes: Math.floor(chunkMb * 2 ** 20),
            window,
            parallelFiles,
          });
          if (!m.complete) throw new Error(`aggregate incomplete: ${JSON.stringify(m.totals)}`);
          files = m.totals.files;
        }),
      );
    }
    const mb = total / 1e6;
    const a = best(agg);
    const b = best(tcpRounds);
    const MBps = mb / a.s;
    const tcpMBps = mb / b.s;
    return {
      size_mb: Number(mb.toFixed(1)),
      files,
      ranks: RANKS,
      chunk_mb: chunkMb,
      window,
      parallel_files: parallelFiles,
      rounds,
      MBps: Number(MBps.toFixed(1)),
      tcp_MBps: Number(tcpMBps.toFixed(1)),
      ratio: Number((MBps / tcpMBps).toFixed(3)),
      target_ratio: 0.8,
      malloc_tuned: tuned,
      // CPU ms and minor page faults in each side's best round: the tool and the job
      // (coordinator + 4 agents); the TCP client and server. On a VM a fault into fresh memory
      // can cost several µs: faults are often where the time goes.
      cpu_ms: { tool: a.self.cpuMs, job: a.child.cpuMs, tcp_client: b.self.cpuMs, tcp_server: b.child.cpuMs },
      page_faults: { tool: a.self.faults, job: a.child.faults, tcp_client: b.self.faults, tcp_server: b.child.faults },
      seconds: { aggregate: agg.map((r) => Number(r.s.toFixed(3))), tcp: tcpRounds.map((r) => Number(r.s.toFixed(3))) },
    };
  } finally {
    for (const k of kids) k.kill('SIGKILL');
    fs.rmSync(work, { recursive: true, force: true });
  }
}
