// verdict.auto (docs/verdict.md "Automatically after an incident"): once an incident's recorder flush
// is whole on this host, the agent of the replica's head (TP rank 0, whose host holds the replica's
// TP group: verdict replays a group in one process) runs `wavebus verdict` on it as a child process,
// where the artifacts are, and the CLI tells the coordinator the verdict over its authenticated
// control channel with this agent's credentials (the bus token on a pipe, or the CURVE key files).
// The agent imports nothing of the tools: the CLI is the one implementation of the replays, the
// verdict and its note. The replays are the CLI's children, off the engine's path; a serving
// engine's device is replayed on only with verdict.allow_live_device. What the verdict needs that
// the config cannot know (the engine's --engine-out, the job's --dp, hosts) is the agent's
// --verdict-arg. One run at a time; a second incident while one runs waits for it.
import { spawn, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import type { Logger } from '../log';
import type { RankIdentity } from '../layout';
import { TOKEN_FD, type BusToken } from '../bus/auth';
import { packageRoot, rankDirName } from '../paths';
import { collectBounded, killGroup, type ChildResult } from './bounded-child';

/** How long the replica's other ranks may take to finish their flush of the same incident. */
export const PEER_FLUSH_WAIT_MS = 60_000;
/** A whole verdict (its replays have their own bound: --replay-timeout-ms) is killed after this. */
const RUN_BOUND_MS = 60 * 60_000;
/** The CLI's output kept (its JSON document is a few hundred KiB at K=4096 forwards). */
const MAX_OUTPUT = 32 * 2 ** 20;

export interface AutoVerdictOptions {
  identity: RankIdentity;
  /** The root the recorder flushes under (TREE). */
  root: string;
  /** --verdict-arg: appended to every run (e.g. --engine-out=DIR, --dp=2). */
  args: readonly string[];
  /** The coordinator to tell, with this agent's credentials; none: verdict.json only. */
  target?: { coordinator: { host: string; port: number }; busToken?: BusToken; curveFiles?: { serverKey: string; key: string } };
  log: Logger;
}

export class AutoVerdict {
  private chain: Promise<void> = Promise.resolve();
  private child?: ChildProcess;
  private stopped = false;

  constructor(private readonly o: AutoVerdictOptions) {}

  /** After this rank's incident flush `dir` (relative to root) holding `forwards`: queue a verdict on it. */
  afterFlush(dir: string, forwards: readonly number[], allowLiveDevice: boolean): Promise<void> {
    const run = this.chain.then(() => this.run(dir, forwards, allowLiveDevice)).catch((e) => this.o.log.error({ err: String((e as Error)?.message ?? e), flush: dir }, 'verdict.auto: failed'));
    this.chain = run;
    return run;
  }

  private async run(dir: string, forwards: readonly number[], allowLiveDevice: boolean): Promise<void> {
    if (this.stopped || forwards.length === 0) return;
    const flush = path.join(this.o.root, dir);
    await this.peersFlushed(flush, Math.max(...forwards));
    const t = this.o.target;
    const tell = t ? [`--coordinator=${hostPort(t.coordinator)}`, ...(t.busToken ? [`--bus-token-fd=${TOKEN_FD}`] : []), ...(t.curveFiles ? [`--curve-server-key=${t.curveFiles.serverKey}`, `--curve-key=${t.curveFiles.key}`] : []), '--timeout=10000'] : [];
    const argv = [path.join(packageRoot(), 'bin', 'wavebus.js'), 'verdict', this.o.root, '--incident', path.basename(flush), '--json', ...(allowLiveDevice ? ['--allow-live-device'] : []), ...tell, ...this.o.args];
    this.o.log.info({ flush: dir, args: this.o.args }, 'verdict.auto: judging the incident');
    const { code, stdout, stderr } = await this.spawnCli(argv, t?.busToken?.pipeText());
    const last = stderr.trim().split('\n').slice(-3).join(' | ');
    // 1 and 3: the verdict is written and printed, only the coordinator was not told (the CLI's exits).
    if (code !== 0 && !((code === 1 || code === 3) && stdout.trim())) throw new Error(`wavebus verdict exited ${code}: ${last}`);
    const v = JSON.parse(stdout) as { verdict: string; reason: string; host?: string };
    this.o.log.warn({ flush: dir, verdict: v.verdict, reason: v.reason, host: v.host }, 'verdict.auto: incident verdict');
    if (code !== 0) this.o.log.error({ flush: dir, err: last }, 'verdict.auto: the coordinator was not told the verdict');
  }

  /** Until every TP rank of this replica has `newest` whole in the flush (its meta.json is written last), or the bound. */
  private async peersFlushed(flush: string, newest: number): Promise<void> {
    const { identity: id } = this.o;
    const ranks = Array.from({ length: id.tp }, (_, t) => id.globalRank - id.tpRank + t);
    const deadline = Date.now() + PEER_FLUSH_WAIT_MS;
    const whole = () => {
      let hashes: string[];
      try {
        hashes = fs.readdirSync(flush, { withFileTypes: true }).filter((e) => e.isDirectory() && e.name !== 'verdict').map((e) => e.name);
      } catch {
        return false;
      }
      return hashes.some((h) => ranks.every((g) => fs.existsSync(path.join(flush, h, rankDirName(g), `call${newest}`, 'meta.json'))));
    };
    while (!whole()) {
      if (this.stopped) throw new Error('the agent stops');
      if (Date.now() > deadline) {
        this.o.log.warn({ flush, ranks, newest }, `verdict.auto: the replica's ranks did not all flush forward ${newest} within ${PEER_FLUSH_WAIT_MS} ms; judging what is there`);
        return;
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  private async spawnCli(argv: string[], secret: string | undefined): Promise<ChildResult> {
    // Its own process group: stopping it stops its replays too. The bus token goes on a pipe (fd 3).
    const child = spawn(process.execPath, argv, { stdio: ['ignore', 'pipe', 'pipe', secret === undefined ? 'ignore' : 'pipe'], detached: true });
    this.child = child;
    if (secret !== undefined) {
      const pipe = child.stdio[3] as NodeJS.WritableStream & { on(e: 'error', f: () => void): void };
      pipe.on('error', () => undefined); // a CLI that died first: its exit says why
      pipe.end(secret);
    }
    try {
      return await collectBounded(child, RUN_BOUND_MS, MAX_OUTPUT);
    } finally {
      this.child = undefined;
    }
  }

  /** Stop: a verdict in progress is killed, its replays with it (one process group). */
  stop(): void {
    this.stopped = true;
    if (this.child) killGroup(this.child, 'SIGTERM');
  }
}

const hostPort = (c: { host: string; port: number }) => (c.host.includes(':') ? `[${c.host}]:${c.port}` : `${c.host}:${c.port}`);

