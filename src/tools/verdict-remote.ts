// Replay (2) of `wavebus verdict` on another host, through that host's agent (docs/verdict.md "What
// runs where"): the verdict sends the incident's recorded forwards and the engine's outputs for them
// to the coordinator (RelayRequest.replay, authenticated as every tool request is: the bus token's
// MAC, or CURVE), which forwards them to the asked rank's agent over the agent's own connection
// (CURVE across hosts). That agent checks the request (src/agent/replay-server.ts), writes it under
// its snapshot root and runs `wavebus verdict --replay-request DIR` there: replayHere with that
// host's replayer, shard, environment and devices. Its answer is the replay's per-tensor errors.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { RelayClient } from '../bus/relay-client';
import { DEFAULT_MAX_FRAME_BYTES } from '../bus/constants';
import { PROTOCOL_VERSION } from '../bus/protocol-version';
import { VerdictError } from '../errors';
import type { StagedReplayRequest } from '../agent/replay-server';
import type { ControlTarget } from './control-client';
import type { Tolerances } from './bisect-compare';
import type { Incident } from './verdict-plan';
import { engineOutputNames, replayHere, type ReplayRun } from './verdict-replay';
import type { ReplayResult, ReplaySpec, TensorError } from './verdict-run';
import type { DeviceFingerprint } from './verdict-fingerprint';

/** What one replay request may carry (the agent checks the same: replay-server.ts). */
export const MAX_REPLAY_REQUEST_BYTES = 32 * 2 ** 20;
export const MAX_REPLAY_FILES = 4096;
export const MAX_REPLAY_TIMEOUT_MS = 600_000;
/** Beyond the replay's own bound: the agent's start-up of the CLI, the relay's hops. */
const RELAY_SLACK_MS = 30_000;

/** The request's files: the flush's bundles of the incident's forwards, and the engine's outputs of them. */
export function replayFiles(inc: Incident, engineOut: string): { files: { path: string; data: Buffer }[] } | { error: string } {
  const files: { path: string; data: Buffer }[] = [];
  let bytes = 0;
  const add = (rel: string, file: string): string | undefined => {
    const st = fs.lstatSync(file);
    if (!st.isFile()) return `${file}: not a regular file`;
    bytes += st.size;
    if (bytes > MAX_REPLAY_REQUEST_BYTES) return `the incident's forwards and outputs pass ${MAX_REPLAY_REQUEST_BYTES} bytes (a replay request's limit)`;
    if (files.length >= MAX_REPLAY_FILES) return `the incident's forwards and outputs are more than ${MAX_REPLAY_FILES} files (a replay request's limit)`;
    files.push({ path: rel, data: fs.readFileSync(file) });
    return undefined;
  };
  try {
    for (const g of inc.ranks) {
      for (const c of inc.calls) {
        const dir = path.join(inc.snapshots, `rank${g}`, `call${c}`);
        for (const name of fs.readdirSync(dir).filter((n) => !n.startsWith('.')).sort()) {
          const err = add(`snapshots/rank${g}/call${c}/${name}`, path.join(dir, name));
          if (err) return { error: err };
        }
      }
    }
    for (const name of engineOutputNames(inc.snapshots, inc.calls, inc.ranks)) {
      const file = path.join(engineOut, name);
      if (!fs.existsSync(file)) continue; // the replay names it: "no engine output"
      const err = add(`engine/${name}`, file);
      if (err) return { error: err };
    }
  } catch (e) {
    return { error: (e as Error).message };
  }
  return { files };
}

export interface RemoteReplay {
  target: ControlTarget;
  /** The global rank whose agent runs it (the other replica's TP rank 0). */
  rank: number;
  tol: string[];
  allowLiveDevice: boolean;
  timeoutMs: number;
}

/** Replay `spec` on rank `r.rank`'s host through its agent; a refusal or failure is a result with `error`. */
export async function replayViaAgent(inc: Incident, engineOut: string, spec: ReplaySpec, r: RemoteReplay): Promise<ReplayResult> {
  const base: ReplayResult = { ...spec, ok: false, tensors: [], agent_rank: r.rank };
  const built = replayFiles(inc, engineOut);
  if ('error' in built) return { ...base, error: `not sent to rank ${r.rank}'s agent: ${built.error}` };
  const timeoutMs = Math.min(r.timeoutMs, MAX_REPLAY_TIMEOUT_MS);
  const request = {
    incident: inc.id, calls: inc.calls, ranks: inc.ranks, devices: spec.devices, ranksOnDevices: spec.ranksOnDevices,
    allowLiveDevice: r.allowLiveDevice, files: built.files, timeoutMs, tolerances: r.tol,
  };
  const t0 = Date.now();
  const client = new RelayClient(r.target.coordinator, DEFAULT_MAX_FRAME_BYTES, r.target.busToken, r.target.curve);
  let reply: Record<string, any>;
  try {
    // The agent's own refusal comes back as its ReplayReply (error, fingerprint): read it whole.
    const m = await client.request({ relay: { rank: r.rank, replay: request, timeoutMs: timeoutMs + RELAY_SLACK_MS, protocolVersion: PROTOCOL_VERSION } }, timeoutMs + RELAY_SLACK_MS + 5000);
    if (m.body === 'refused') throw new Error(m.refused.error);
    const rr = (m.body === 'relay' ? m.relay : {}) as Record<string, any>;
    if (m.body !== 'relay') throw new Error(`the coordinator answered ${m.body} to a relay request`);
    if (rr.error) throw new Error(`the coordinator: ${rr.error}`);
    if (rr.reply !== 'replay') throw new Error(`the relay's answer carries ${rr.reply ?? 'nothing'}, not a replay`);
    reply = rr.replay as Record<string, any>;
  } catch (e) {
    return { ...base, wall_ms: Date.now() - t0, error: `not run through rank ${r.rank}'s agent: ${(e as Error).message}` };
  } finally {
    await client.close().catch(() => undefined);
  }
  const seen = fingerprintOf(reply);
  const done = { ...base, ...seen, agent_hostname: String(reply.hostname ?? '').slice(0, 256), wall_ms: Number(reply.wallMs ?? Date.now() - t0) };
  if (reply.error) return { ...done, error: `rank ${r.rank}'s agent: ${String(reply.error).slice(0, 2000)}` };
  const tensors = ((reply.tensors ?? []) as Record<string, any>[]).map(tensorOf);
  if (tensors.length === 0) return { ...done, error: `rank ${r.rank}'s agent answered no tensors` };
  return { ...done, ok: true, tensors };
}

function tensorOf(t: Record<string, any>): TensorError {
  return {
    call: Number(t.call ?? 0), rank: Number(t.rank ?? 0), shape: ((t.shape ?? []) as unknown[]).map(Number), dtype: String(t.dtype ?? ''),
    atol: Number(t.atol ?? 0), rtol: Number(t.rtol ?? 0), max_abs_diff: Number(t.maxAbsDiff ?? 0), mismatched: Number(t.mismatched ?? 0),
    numel: Number(t.numel ?? 0), bit_exact: Boolean(t.bitExact), within_tolerance: Boolean(t.withinTolerance),
  };
}

function fingerprintOf(reply: Record<string, any>): { fingerprint: DeviceFingerprint[] } | { fingerprint_error: string } {
  if (reply.fingerprintError) return { fingerprint_error: String(reply.fingerprintError).slice(0, 2000) };
  try {
    const devices = JSON.parse(String(reply.fingerprintJson || '[]'));
    if (Array.isArray(devices)) return { fingerprint: devices.filter((d) => d && typeof d === 'object').slice(0, 64) };
  } catch {
    /* below */
  }
  return { fingerprint_error: "the agent's fingerprint_json is not a JSON array" };
}

/**
 * `wavebus verdict DIR --replay-request` (the agent's child): replay what DIR holds (snapshots/,
 * engine/, request.json) on this host with its replayer and environment; the engine serving here
 * is seen through this host's --engine-out (its pid_rank<g>).
 */
export async function runReplayRequest(dir: string, o: { replayer: string[]; replayerArgs: string[]; servingOut?: string; tolerances: Tolerances }): Promise<ReplayResult> {
  let req: StagedReplayRequest;
  try {
    req = JSON.parse(fs.readFileSync(path.join(dir, 'request.json'), 'utf8')) as StagedReplayRequest;
  } catch (e) {
    throw new VerdictError(`--replay-request ${dir}: request.json: ${(e as Error).message}`);
  }
  const snapshots = path.join(dir, 'snapshots');
  const run: ReplayRun = {
    snapshots, engineOut: path.join(dir, 'engine'), servingOut: o.servingOut, calls: req.calls, ranks: req.ranks,
    replayer: o.replayer, replayerArgs: o.replayerArgs, env: process.env, allowLiveDevice: req.allowLiveDevice, timeoutMs: req.timeoutMs,
  };
  if (!req.allowLiveDevice && o.servingOut === undefined) {
    return { role: 'other', host: os.hostname(), devices: req.devices, ranksOnDevices: req.ranksOnDevices, ok: false, tensors: [], error: "no --engine-out on this host's agent (--verdict-arg=--engine-out=DIR): whether its engines serve on those devices cannot be told, so nothing is replayed (--allow-live-device to replay anyway)" };
  }
  return replayHere({ role: 'other', host: os.hostname(), devices: req.devices, ranksOnDevices: req.ranksOnDevices }, run, path.join(dir, 'out'), o.tolerances);
}
