// A verdict's replay asked of this agent over the bus (CoordinatorMessage.replay, relayed from a
// `wavebus verdict` on another host; docs/verdict.md "What runs where"). The request is a tool's,
// so every field is checked and bounded here, and its files land only in a fresh owner-only folder
// under this agent's snapshot root (dot-named: never listed or served), at paths of one fixed shape.
// The replay itself is `wavebus verdict <folder> --replay-request` with this agent's --verdict-arg
// (this host's replayer, shard patch, --engine-out for the serving check), as a child in its own
// process group, bounded in time and output; the request chooses no program and no argument but
// numbers and tolerances. One replay at a time; the folder is removed after.
import { spawn, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import type { CoordinatorMsg } from '../bus/frames';
import type { Logger } from '../log';
import { collectBounded, killGroup, type ChildResult } from './bounded-child';
import { packageRoot } from '../paths';

/** The limits of one request (the tool keeps to the same: src/tools/verdict-remote.ts). */
export const REPLAY_LIMITS = { bytes: 32 * 2 ** 20, files: 4096, calls: 4096, ranks: 64, tolerances: 8, timeoutMs: 600_000 };
/** Beyond the replay's bound: the CLI's start and its comparison. */
const SLACK_MS = 30_000;
/** The CLI's output kept: its JSON is a few KiB per forward and rank. */
const MAX_OUTPUT = 8 * 2 ** 20;
const MAX_FINGERPRINT = 64 * 1024;

const FILE = /^(?:snapshots\/rank(0|[1-9]\d{0,8})\/call(0|[1-9]\d{0,8})\/[A-Za-z0-9_][A-Za-z0-9._-]{0,127}|engine\/forward_rank(0|[1-9]\d{0,8})_step(?:0|[1-9]\d{0,14})\.pt)$/;
const TOL = /^[a-z0-9_]{1,24}=[0-9.eE+-]{1,24},[0-9.eE+-]{1,24}$/;
const INCIDENT = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export class ReplayRefused extends Error {}

/**
 * DIR/request.json: the checked request as the agent stages it for `wavebus verdict DIR
 * --replay-request` (src/tools/verdict-remote.ts reads it back); its files lie in DIR, its
 * tolerances go on the command line.
 */
export interface StagedReplayRequest {
  incident: string;
  calls: number[];
  ranks: number[];
  devices: number[];
  ranksOnDevices: number[];
  allowLiveDevice: boolean;
  timeoutMs: number;
}

interface Checked extends StagedReplayRequest {
  tolerances: string[];
  files: { path: string; data: Buffer }[];
}

const uints = (v: unknown, field: string, max: number, most: number): number[] => {
  const a = (Array.isArray(v) ? v : []) as unknown[];
  if (a.length > most) throw new ReplayRefused(`${field}: ${a.length} entries (at most ${most})`);
  return a.map((x, i) => {
    const n = Number(x);
    if (!Number.isSafeInteger(n) || n < 0 || n > max) throw new ReplayRefused(`${field}[${i}]: ${String(x).slice(0, 40)} is not an integer 0..${max}`);
    return n;
  });
};

/** The request, checked: a ReplayRefused names the field (and the file's position) that is wrong. */
export function checkReplayRequest(r: Record<string, any> | undefined): Checked {
  if (!r || typeof r !== 'object') throw new ReplayRefused('replay: empty request');
  const incident = String(r.incident ?? '');
  if (!INCIDENT.test(incident)) throw new ReplayRefused(`incident: ${JSON.stringify(incident.slice(0, 80))} is not a flush folder's name`);
  const calls = uints(r.calls, 'calls', 2 ** 32 - 1, REPLAY_LIMITS.calls);
  const ranks = uints(r.ranks, 'ranks', 2 ** 32 - 1, REPLAY_LIMITS.ranks);
  const devices = uints(r.devices, 'devices', 65535, REPLAY_LIMITS.ranks);
  const ranksOnDevices = uints(r.ranksOnDevices, 'ranks_on_devices', 2 ** 32 - 1, REPLAY_LIMITS.ranks);
  if (calls.length === 0) throw new ReplayRefused('calls: none');
  if (ranks.length === 0 || devices.length !== ranks.length) throw new ReplayRefused(`devices: ${devices.length} for ${ranks.length} ranks (one per TP rank, at least one)`);
  const timeoutMs = Number(r.timeoutMs ?? 0) || REPLAY_LIMITS.timeoutMs;
  if (timeoutMs > REPLAY_LIMITS.timeoutMs) throw new ReplayRefused(`timeout_ms: ${timeoutMs} (at most ${REPLAY_LIMITS.timeoutMs})`);
  const tolerances = ((Array.isArray(r.tolerances) ? r.tolerances : []) as unknown[]).map(String);
  if (tolerances.length > REPLAY_LIMITS.tolerances) throw new ReplayRefused(`tolerances: ${tolerances.length} (at most ${REPLAY_LIMITS.tolerances})`);
  tolerances.forEach((t, i) => {
    if (!TOL.test(t)) throw new ReplayRefused(`tolerances[${i}]: ${JSON.stringify(t.slice(0, 80))} is not DTYPE=ATOL,RTOL`);
  });
  const list = (Array.isArray(r.files) ? r.files : []) as Record<string, any>[];
  if (list.length === 0 || list.length > REPLAY_LIMITS.files) throw new ReplayRefused(`files: ${list.length} (1..${REPLAY_LIMITS.files})`);
  const seen = new Set<string>();
  let bytes = 0;
  const files = list.map((f, i) => {
    const p = String(f?.path ?? '');
    const m = FILE.exec(p);
    if (!m) throw new ReplayRefused(`files[${i}].path: ${JSON.stringify(p.slice(0, 120))} is not snapshots/rank<g>/call<N>/<name> or engine/forward_rank<g>_step<S>.pt`);
    const g = Number(m[1] ?? m[3]);
    if (!ranks.includes(g)) throw new ReplayRefused(`files[${i}].path: ${p}: rank ${g} is not one of ranks`);
    if (m[2] !== undefined && !calls.includes(Number(m[2]))) throw new ReplayRefused(`files[${i}].path: ${p}: call ${m[2]} is not one of calls`);
    if (seen.has(p)) throw new ReplayRefused(`files[${i}].path: ${p} twice`);
    seen.add(p);
    const data = f.data instanceof Uint8Array ? Buffer.from(f.data.buffer, f.data.byteOffset, f.data.byteLength) : Buffer.alloc(0);
    bytes += data.length;
    if (bytes > REPLAY_LIMITS.bytes) throw new ReplayRefused(`files: more than ${REPLAY_LIMITS.bytes} bytes`);
    return { path: p, data };
  });
  return { incident, calls, ranks, devices, ranksOnDevices, allowLiveDevice: Boolean(r.allowLiveDevice), timeoutMs, tolerances, files };
}

export interface ReplayServerOptions {
  globalRank: number;
  /** This agent's snapshot root: the request's files are written under it. */
  root: string | undefined;
  /** --verdict-arg: this host's replayer and its arguments, --engine-out (the serving check). */
  args: readonly string[];
  log: Logger;
  /** The program run with `verdict DIR --replay-request ...` (default this package's CLI under this Node). */
  cli?: string[];
}

export class ReplayServer {
  private child?: ChildProcess;
  private busy = false;
  private stopped = false;

  constructor(private readonly o: ReplayServerOptions) {}

  /** Answer a CoordinatorMessage.replay with a ReplayReply body. */
  async handle(req: CoordinatorMsg): Promise<Record<string, unknown>> {
    const t0 = Date.now();
    const answer = (body: Record<string, unknown>) => ({ replay: { globalRank: this.o.globalRank, hostname: os.hostname(), wallMs: Date.now() - t0, ...body } });
    let c: Checked;
    try {
      c = checkReplayRequest(req.replay as Record<string, any>);
    } catch (e) {
      if (e instanceof ReplayRefused) return answer({ error: `refused: ${e.message}` });
      throw e;
    }
    if (this.stopped) return answer({ error: 'the agent stops' });
    if (this.busy) return answer({ error: 'a replay is already running on this agent (one at a time); retry after it' });
    if (!this.o.root || !fs.existsSync(this.o.root)) return answer({ error: 'this agent has no snapshot root to replay under' });
    this.busy = true;
    let dir: string | undefined;
    try {
      dir = fs.mkdtempSync(path.join(this.o.root, '.verdict-replay-')); // 0700, new: nothing in it is anyone else's
      for (const f of c.files) {
        const to = path.join(dir, ...f.path.split('/'));
        fs.mkdirSync(path.dirname(to), { recursive: true, mode: 0o700 });
        fs.writeFileSync(to, f.data, { flag: 'wx', mode: 0o600 });
      }
      fs.mkdirSync(path.join(dir, 'engine'), { recursive: true, mode: 0o700 });
      const { files: _files, tolerances, ...rest } = c;
      const staged: StagedReplayRequest = rest;
      fs.writeFileSync(path.join(dir, 'request.json'), JSON.stringify(staged), { flag: 'wx', mode: 0o600 });
      this.o.log.info({ incident: c.incident, calls: c.calls.length, devices: c.devices }, 'replaying an incident for a verdict on another host');
      const argv = [...(this.o.cli ?? [process.execPath, path.join(packageRoot(), 'bin', 'wavebus.js')]), 'verdict', dir, '--replay-request', ...this.o.args, ...tolerances.map((t) => `--tol=${t}`)];
      const run = await this.spawnCli(argv, c.timeoutMs + SLACK_MS);
      if (run.code !== 0) return answer({ error: `wavebus verdict --replay-request exited ${run.code}: ${run.stderr.trim().split('\n').slice(-3).join(' | ').slice(-2000)}` });
      return answer(replyOf(JSON.parse(run.stdout)));
    } catch (e) {
      return answer({ error: `the replay failed here: ${String((e as Error)?.message ?? e).slice(0, 2000)}` });
    } finally {
      this.busy = false;
      if (dir) fs.rmSync(dir, { recursive: true, force: true });
    }
  }

  private async spawnCli(argv: string[], boundMs: number): Promise<ChildResult> {
    const child = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    this.child = child;
    try {
      return await collectBounded(child, boundMs, MAX_OUTPUT);
    } finally {
      this.child = undefined;
    }
  }

  /** A replay in progress is killed with its replayer (one process group). */
  stop(): void {
    this.stopped = true;
    if (this.child) killGroup(this.child, 'SIGTERM');
  }
}

/** The CLI's ReplayResult JSON as a ReplayReply body. */
function replyOf(r: Record<string, any>): Record<string, unknown> {
  const fp = r.fingerprint === undefined ? undefined : JSON.stringify(r.fingerprint);
  return {
    error: r.ok ? '' : String(r.error ?? 'the replay did not run'),
    tensors: ((r.tensors ?? []) as Record<string, any>[]).map((t) => ({
      call: t.call, rank: t.rank, shape: t.shape, dtype: t.dtype, atol: t.atol, rtol: t.rtol, maxAbsDiff: unsafeNumber(t.max_abs_diff),
      mismatched: t.mismatched, numel: t.numel, bitExact: t.bit_exact, withinTolerance: t.within_tolerance,
    })),
    fingerprintJson: fp !== undefined && fp.length <= MAX_FINGERPRINT ? fp : '',
    fingerprintError: fp !== undefined && fp.length > MAX_FINGERPRINT ? `fingerprint of ${fp.length} bytes (at most ${MAX_FINGERPRINT})` : String(r.fingerprint_error ?? ''),
  };
}

/** The CLI's JSON writes non-finite numbers as 'inf' / '-inf' / 'nan' (jsonSafe): a double again. */
function unsafeNumber(v: unknown): number {
  return v === 'inf' ? Infinity : v === '-inf' ? -Infinity : v === 'nan' ? NaN : Number(v);
}

