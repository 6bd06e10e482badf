// One replay process of `wavebus verdict`, run on this host: the serving-device check, the
// replayer (the engine's replay script) with the incident's forwards and device indices, and each
// saved output compared with the engine's. The verdict runs it for its own host (verdict.ts), and
// an agent's `wavebus verdict --replay-request` runs it for a replay asked over the bus
// (verdict-remote.ts): one implementation wherever the replay runs.
import * as fs from 'fs';
import * as path from 'path';
import type { Tolerances } from './bisect-compare';
import { servingPid } from './verdict-plan';
import { compareSaved, runProcess, type ReplayResult, type ReplaySpec } from './verdict-run';
import { readReplayFingerprint } from './verdict-fingerprint';

export interface ReplayRun {
  /** <flush>/<compilation hash>: rank<g>/call<N>/ bundles (replay.py's --snapshots). */
  snapshots: string;
  /** The engine's saved outputs (forward_rank<g>_step<S>.pt) to compare with. */
  engineOut: string;
  /** Where this host's engines say they serve (pid_rank<g>); undefined: `engineOut`. */
  servingOut?: string;
  calls: number[];
  /** The incident's global ranks, TP order (whose outputs are compared). */
  ranks: number[];
  /** The replayer's argv prefix and the arguments appended to every replay. */
  replayer: string[];
  replayerArgs: string[];
  env: NodeJS.ProcessEnv;
  allowLiveDevice: boolean;
  timeoutMs: number;
}

/** Replay `spec` into `out` (emptied first) and compare; a refusal or failure is a result with `error`. */
export async function replayHere(spec: ReplaySpec, r: ReplayRun, out: string, tols: Tolerances): Promise<ReplayResult> {
  const base: ReplayResult = { ...spec, ok: false, tensors: [] };
  if (!r.allowLiveDevice) {
    const servingOut = r.servingOut ?? r.engineOut;
    const live = spec.ranksOnDevices.map((g) => [g, servingPid(servingOut, g)] as const).filter(([, pid]) => pid !== undefined);
    if (live.length) {
      const at = spec.ranksOnDevices.indexOf(live[0][0]);
      return { ...base, error: `rank ${live[0][0]}'s engine (pid ${live[0][1]}) still serves on host ${spec.host} device ${spec.devices[at] ?? spec.devices[0]}: not replayed there (--allow-live-device to replay anyway)` };
    }
  }
  fs.rmSync(out, { recursive: true, force: true });
  const argv = [...r.replayer, '--snapshots', r.snapshots, '--call', r.calls.join(','), '--engine-out', r.engineOut, '--save-logits', out,
    ...spec.devices.flatMap((d, t) => ['--device', `${t}=${d}`]), ...r.replayerArgs];
  const run = await runProcess(argv, r.env, r.timeoutMs);
  // Exit 1 is replay.py's "not bit-exact": a result, not a failure. Anything else failed.
  if (run.code !== 0 && run.code !== 1) return { ...base, wall_ms: run.ms, error: `the replay exited ${run.code}: ${lastLines(run.tail, 3)}` };
  const fp = readReplayFingerprint(out);
  const seen = 'devices' in fp ? { fingerprint: fp.devices } : { fingerprint_error: fp.error };
  const { tensors, missing } = compareSaved(out, r.calls, r.ranks, tols);
  if (tensors.length === 0) return { ...base, ...seen, wall_ms: run.ms, error: `nothing to compare: ${missing.slice(0, 3).join('; ')}${run.code ? ` (the replay exited ${run.code}: ${lastLines(run.tail, 2)})` : ''}` };
  return { ...base, ...seen, ok: true, wall_ms: run.ms, tensors };
}

export const lastLines = (tail: string, n: number): string => tail.trim().split('\n').slice(-n).join(' | ');

/** The engine's output files of the incident's forwards: forward_rank<g>_step<S>.pt, S each call's global step (its meta.json). */
export function engineOutputNames(snapshots: string, calls: number[], ranks: number[]): string[] {
  const out: string[] = [];
  for (const g of ranks) {
    for (const c of calls) {
      const meta = JSON.parse(fs.readFileSync(path.join(snapshots, `rank${g}`, `call${c}`, 'meta.json'), 'utf8')) as { global_step?: unknown };
      if (Number.isSafeInteger(meta.global_step)) out.push(`forward_rank${g}_step${meta.global_step}.pt`);
    }
  }
  return out;
}
