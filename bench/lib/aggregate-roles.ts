// The processes of `bench aggregate` (bench/aggregate.ts, bench/lib/aggregate-netns.ts), one module
// so that loopback and network-namespace runs start the very same code:
//   node aggregate-roles.js job HOST PORT ROOT RANKS [CURVE_DIR]   starts the coordinator and one agent per rank,
//                                                                 each its own process (as in a real job)
//   node aggregate-roles.js coordinator HOST PORT RANKS [CURVE_DIR]
//   node aggregate-roles.js agent HOST PORT ROOT RANK RANKS [CURVE_DIR]
//   node aggregate-roles.js tcp-server HOST PORT FILE_LIST          the baseline's sender
//   node aggregate-roles.js tcp-client HOST PORT COUNT OUT          the baseline's receiver
// Servers print READY once they serve. The source bundles are written by writeSource().
import { spawn, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as net from 'net';
import * as path from 'path';
import { Coordinator } from '../../src/bus/coordinator';
import { AgentBus } from '../../src/bus/agent-bus';
import { loadCurveDirClient, loadCurveDirServer } from '../../src/bus/curve';
import { FileServer } from '../../src/agent/file-server';
import { DirectFiles, fileRequestHandler } from '../../src/agent/direct-files';
import { resolveIdentity } from '../../src/launch/identity';
import { createLogger } from '../../src/log';
import { crc32c, formatChecksum } from '../../src/artifacts/checksum';
import { keepFreedMemory } from '../../src/malloc-tuning';
import { COORDINATOR_NODE_FLAGS } from '../../src/bus/constants';

/** This module as a script (dist/bench/lib/aggregate-roles.js). */
export const ROLES_SCRIPT = path.join(__dirname, 'aggregate-roles.js');

/** A bench process (aggregate-roles.ts) started by `cmd` + `args`; ready once it prints READY. */
export function child(cmd: string, args: string[], env: NodeJS.ProcessEnv = process.env, stdin: 'ignore' | 'pipe' = 'ignore'): { proc: ChildProcess; ready: Promise<void> } {
  const proc = spawn(cmd, args, { stdio: [stdin, 'pipe', 'inherit'], env });
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

/** rank<g>/ dirs of random files with a dump.json recording their checksums (as real bundles do). */
export function writeSource(root: string, totalBytes: number, ranks: number): { files: string[]; bytes: number } {
  const perRank = Math.floor(totalBytes / ranks);
  const fileBytes = Math.min(perRank, 16 * 2 ** 20);
  const files: string[] = [];
  let bytes = 0;
  for (let g = 0; g < ranks; g++) {
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

/** Exit when the parent (the job role) goes: its pipe to our stdin closes. */
function exitWithParent(): void {
  process.stdin.on('end', () => process.exit(0));
  process.stdin.on('error', () => process.exit(0));
  process.stdin.resume();
}

/** The coordinator of the job on HOST:PORT; READY once all `ranks` agents are live. */
async function coordinator(host: string, port: number, ranks: number, curveDir?: string): Promise<void> {
  exitWithParent();
  keepFreedMemory(); // as `wavebus coordinator` does (WAVEBUS_MALLOC_TUNING=0 keeps glibc's defaults)
  const log = createLogger('bench', 'silent');
  const c = new Coordinator({ host, port, layout: { worldSize: ranks, tp: ranks, pp: 1, dp: 1, cp: 1 }, heartbeatMs: 200, logger: log, curve: curveDir ? loadCurveDirServer(curveDir) : undefined });
  await c.start();
  const t = setInterval(() => {
    if (c.liveRanks().length === ranks) {
      clearInterval(t);
      process.stdout.write('READY\n');
    }
  }, 50);
}

/** One rank's agent side as `wavebus agent` wires it: its bus, its FileServer, and (with CURVE) its own file socket. */
async function agent(host: string, port: number, root: string, rank: number, ranks: number, curveDir?: string): Promise<void> {
  exitWithParent();
  keepFreedMemory();
  const log = createLogger('bench', 'silent');
  const curve = curveDir ? loadCurveDirClient(curveDir) : undefined;
  const roots = () => ({ dumps: path.join(root, 'dumps') });
  const bus = new AgentBus({ coordinator: { host, port }, identity: resolveIdentity({}, { rank, worldSize: ranks, tp: ranks, pp: 1 }), heartbeatMs: 200, logger: log, curve });
  const direct = curve ? new DirectFiles({ globalRank: rank, roots, coordinator: { host, port }, enabled: true, log }) : undefined;
  bus.onRequest(fileRequestHandler(new FileServer(rank, roots, log), direct, rank));
  await bus.start();
  process.stdout.write('READY\n');
}

/** The job: a coordinator and one agent per rank, each its own process; READY once all agents are live. */
async function job(host: string, port: number, root: string, ranks: number, curveDir?: string): Promise<void> {
  const opt = curveDir ? [curveDir] : [];
  const coord = child(process.execPath, [...COORDINATOR_NODE_FLAGS, __filename, 'coordinator', host, String(port), String(ranks), ...opt], process.env, 'pipe'); // as the launcher starts it
  const agents = Array.from({ length: ranks }, (_, r) => child(process.execPath, [__filename, 'agent', host, String(port), root, String(r), String(ranks), ...opt], process.env, 'pipe'));
  const kids = [coord, ...agents].map((k) => k.proc);
  const stop = () => {
    for (const k of kids) k.kill('SIGKILL');
  };
  process.on('exit', stop);
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(1));
  for (const k of kids) k.on('exit', () => process.exit(1)); // a job that lost a process is no job
  await Promise.all([...agents.map((a) => a.ready), coord.ready]);
  process.stdout.write('READY\n');
}

/** The baseline's sender: streams the listed files, each length-prefixed, to every connection. */
function tcpServer(host: string, port: number, list: string): void {
  const files = JSON.parse(fs.readFileSync(list, 'utf8')) as string[];
  const srv = net.createServer(async (sock) => {
    for (const f of files) {
      const h = Buffer.alloc(8);
      h.writeBigUInt64LE(BigInt(fs.statSync(f).size));
      sock.write(h);
      for await (const chunk of fs.createReadStream(f, { highWaterMark: 4 << 20 })) {
        if (!sock.write(chunk)) await new Promise((r) => sock.once('drain', r));
      }
    }
    sock.end();
  });
  srv.listen(port, host, () => process.stdout.write('READY\n'));
}

/** The baseline's receiver: `count` length-prefixed files from HOST:PORT into out/f<i>, each fsynced. */
export async function tcpCopy(host: string, port: number, count: number, out: string): Promise<void> {
  fs.mkdirSync(out, { recursive: true });
  const sock = net.connect(port, host);
  let idx = 0;
  let left = -1;
  let fd = -1;
  let pending = Buffer.alloc(0);
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
          fd = fs.openSync(path.join(out, `f${idx}`), 'w');
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
    sock.on('end', () => (idx === count ? resolve() : reject(new Error(`tcp copy got ${idx} of ${count} files`))));
    sock.on('error', reject);
  });
}

if (require.main === module) {
  const [role, host, port, ...rest] = process.argv.slice(2);
  const fail = (e: unknown) => {
    process.stderr.write(`bench aggregate ${role}: ${(e as Error).message}\n`);
    process.exit(1);
  };
  if (role === 'job') job(host, Number(port), rest[0], Number(rest[1]), rest[2]).catch(fail);
  else if (role === 'coordinator') coordinator(host, Number(port), Number(rest[0]), rest[1]).catch(fail);
  else if (role === 'agent') agent(host, Number(port), rest[0], Number(rest[1]), Number(rest[2]), rest[3]).catch(fail);
  else if (role === 'tcp-server') tcpServer(host, Number(port), rest[0]);
  else if (role === 'tcp-client') tcpCopy(host, Number(port), Number(rest[0]), rest[1]).catch(fail);
  else fail(new Error(`unknown role ${JSON.stringify(role)}`));
}
