// `wavebus bench aggregate --size-mb M`: aggregation throughput of M MB of bundles (4 ranks ×
// M/4 MB) over loopback — coordinator + 4 agents in a child process, `aggregate()` here — against
// a plain TCP copy of the same bytes (a node net server in a child process → a client here
// writing each file with fsync), measured in the same run. Target: ratio ≥ 0.8.
// Also reports the CPU time and page faults of each side in its best round (this process: the
// tool or the TCP client; the child: coordinator + agents or the TCP server): where the time goes.
import { spawn, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as net from 'net';
import * as os from 'os';
import * as path from 'path';
import { aggregate, DEFAULT_CHUNK_MB, DEFAULT_PARALLEL_FILES, DEFAULT_WINDOW } from '../src/tools/aggregate';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { keepFreedMemory, MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES } from '../src/malloc-tuning';
import { freePort, freePortPair } from '../src/bus/ports';
import { intFlag, numberFlag } from '../src/commands/flags';

const RANKS = 4;

/** `name`'s value: a whole count, or (`fraction`) a number of MiB that may be fractional. */
function arg(argv: string[], name: string, def: number, fraction = false): number {
  const i = argv.indexOf(name);
  if (i < 0) return def;
  return fraction ? numberFlag(argv[i + 1], name, 1 / 1024) : intFlag(argv[i + 1], name);
}

/** rank<g>/ dirs of random files with a dump.json recording their checksums (as real bundles do). */
function writeSource(root: string, totalBytes: number): { files: string[]; bytes: number } {
  const perRank = Math.floor(totalBytes / RANKS);
  const fileBytes = Math.min(perRank, 16 * 2 ** 20);
  const files: string[] = [];
  let bytes = 0;
  for (let g = 0; g < RANKS; g++) {
    const dir = path.join(root, 'dumps', 'bench', 'req', 'wave_1', `rank${g}`);
    fs.mkdirSync(dir, { recursive: true });
    const listed = [];
    for (let i = 0, left = perRank; left > 0; i++) {
      const n = Math.min(fileBytes, left);
      const data = Buffer.allocUnsafe(n);
      for (let o = 0; o < n; o += 4) data.writeUInt32LE((Math.random() * 2 ** 32) >>> 0, Math.min(o, n - 4));
      const name = `layer${i}.bin`;
      fs.writeFileSync(path.join(dir, name), data);
      listed.push({ path: name, bytes: n, checksum: formatChecksum(crc32c(data)) });
      files.push(path.join(dir, name));
      bytes += n;
      left -= n;
    }
    fs.writeFileSync(path.join(dir, 'dump.json'), JSON.stringify({ identity: { global_rank: g }, files: listed }));
    files.push(path.join(dir, 'dump.json'));
  }
  return { files, bytes };
}

function child(script: string, args: string[], env: NodeJS.ProcessEnv = process.env): { proc: ChildProcess; ready: Promise<void> } {
  const proc = spawn(process.execPath, ['-e', script, ...args], { stdio: ['ignore', 'pipe', 'inherit'], env });
  const ready = new Promise<void>((resolve, reject) => {
    let out = '';
    proc.stdout!.on('data', (b) => {
      out += b.toString();
      if (out.includes('READY')) resolve();
    });
    proc.on('exit', (code) => reject(new Error(`bench child exited ${code} before it was ready`)));
  });
  return { proc, ready };
}

const DIST = path.resolve(__dirname, '..', 'src');

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

/** The job side: coordinator + one AgentBus/FileServer per rank, all serving `root`. */
const JOB_SCRIPT = `
const path = require('path');
const [dist, port, root, ranks] = process.argv.slice(1);
const { Coordinator } = require(path.join(dist, 'bus/coordinator'));
const { AgentBus } = require(path.join(dist, 'bus/agent-bus'));
const { FileServer } = require(path.join(dist, 'agent/file-server'));
const { resolveIdentity } = require(path.join(dist, 'identity'));
const { createLogger } = require(path.join(dist, 'log'));
const log = createLogger('bench', 'silent');
require(path.join(dist, 'malloc-tuning')).keepFreedMemory(); // as \`wavebus coordinator\` does
(async () => {
  const n = Number(ranks);
  const c = new Coordinator({ port: Number(port), layout: { worldSize: n, tp: n, pp: 1, dp: 1, cp: 1 }, heartbeatMs: 200, logger: log });
  await c.start();
  for (let r = 0; r < n; r++) {
    const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port: Number(port) }, identity: resolveIdentity({}, { rank: r, worldSize: n, tp: n, pp: 1 }), heartbeatMs: 200, logger: log });
    const fsrv = new FileServer(r, () => ({ dumps: path.join(root, 'dumps') }), log);
    bus.onRequest((req) => fsrv.handle(req));
    await bus.start();
  }
  const t = setInterval(() => { if (c.liveRanks().length === n) { clearInterval(t); process.stdout.write('READY\\n'); } }, 50);
})();
`;

/** The baseline: a TCP server that streams the files, length-prefixed, one connection. */
const TCP_SCRIPT = `
const net = require('net'); const fs = require('fs');
const [port, list] = process.argv.slice(1);
const files = JSON.parse(fs.readFileSync(list, 'utf8'));
const srv = net.createServer(async (sock) => {
  for (const f of files) {
    const size = fs.statSync(f).size;
    const h = Buffer.alloc(8); h.writeBigUInt64LE(BigInt(size));
    sock.write(h);
    for await (const chunk of fs.createReadStream(f, { highWaterMark: 4 << 20 })) {
      if (!sock.write(chunk)) await new Promise((r) => sock.once('drain', r));
    }
  }
  sock.end();
});
srv.listen(Number(port), '127.0.0.1', () => process.stdout.write('READY\\n'));
`;

async function tcpCopy(port: number, files: string[], out: string): Promise<void> {
  fs.mkdirSync(out, { recursive: true });
  const sock = net.connect(port, '127.0.0.1');
  let idx = 0;
  let left = -1;
  let fd = -1;
  let pending = Buffer.alloc(0);
  const open = () => {
    fd = fs.openSync(path.join(out, `f${idx}`), 'w');
  };
  const finish = () => {
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    fd = -1;
    idx++;
    left = -1;
  };
  await new Promise<void>((resolve, reject) => {
    sock.on('data', (b: Buffer) => {
      let buf = pending.length ? Buffer.concat([pending, b]) : b;
      pending = Buffer.alloc(0);
      while (buf.length > 0) {
        if (left < 0) {
          if (buf.length < 8) {
            pending = Buffer.from(buf);
            return;
          }
          left = Number(buf.readBigUInt64LE(0));
          buf = buf.subarray(8);
          open();
          if (left === 0) finish();
          continue;
        }
        const n = Math.min(left, buf.length);
        fs.writeSync(fd, buf, 0, n);
        left -= n;
        buf = buf.subarray(n);
        if (left === 0) finish();
      }
    });
    sock.on('end', () => (idx === files.length ? resolve() : reject(new Error(`tcp copy got ${idx} of ${files.length} files`))));
    sock.on('error', reject);
  });
}

export async function run(argv: string[]): Promise<Record<string, unknown>> {
  const sizeMb = arg(argv, '--size-mb', 64, true);
  const chunkMb = arg(argv, '--chunk-mb', DEFAULT_CHUNK_MB, true);
  const window = arg(argv, '--window', DEFAULT_WINDOW);
  const parallelFiles = arg(argv, '--parallel-files', DEFAULT_PARALLEL_FILES);
  const rounds = arg(argv, '--rounds', 2);
  // this process is the tool: as `wavebus aggregate` does (WAVEBUS_MALLOC_TUNING=0: glibc defaults)
  const tuned = keepFreedMemory();
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-bench-agg-'));
  const kids: ChildProcess[] = [];
  try {
    const src = writeSource(path.join(work, 'src'), Math.round(sizeMb * 2 ** 20));
    const port = await freePortPair();
    const job = child(JOB_SCRIPT, [DIST, String(port), path.join(work, 'src'), String(RANKS)]);
    kids.push(job.proc);
    const listFile = path.join(work, 'files.json');
    fs.writeFileSync(listFile, JSON.stringify(src.files));
    const tcpPort = await freePort();
    // The baseline's server gets the allocator settings the job has (same as keepFreedMemory):
    // both sides then reuse freed memory and the comparison is about the transport.
    const sameMalloc = tuned ? { MALLOC_MMAP_THRESHOLD_: String(MMAP_THRESHOLD_BYTES), MALLOC_TRIM_THRESHOLD_: String(TRIM_THRESHOLD_BYTES) } : {};
    const tcp = child(TCP_SCRIPT, [String(tcpPort), listFile], { ...process.env, ...sameMalloc });
    kids.push(tcp.proc);
    await Promise.all([job.ready, tcp.ready]);
    const total = src.files.reduce((n, f) => n + fs.statSync(f).size, 0);

    // Alternate, best of `rounds` each (2 by default), so neither side gets a warm page cache
    // the other lacked.
    const agg: Round[] = [];
    const tcpRounds: Round[] = [];
    let files = 0;
    for (let round = 0; round < rounds; round++) {
      tcpRounds.push(await timed(tcp.proc, () => tcpCopy(tcpPort, src.files, path.join(work, `tcp${round}`))));
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
