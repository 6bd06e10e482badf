// `wavebus verdict`: device or software? The incident's recorded forwards are replayed (1) in a
// fresh process on the rank's own host and devices, (2) on another host or device holding the same
// shard (the same TP ranks of another DP replica, or a host the user names), and, when both
// reproduce what the engine computed, (3) at TP=1 with the probe on, for bisect to name the first
// module. Verdict: deterministic | device-local | transient | inconclusive (docs/verdict.md).
import * as fs from 'fs';
import * as path from 'path';
import { writeFileAtomic, artifactWrite } from '../artifacts/atomic-write';
import { DEFAULT_ARTIFACT_MODES } from '../artifacts/artifact-mode';
import { VerdictError } from '../errors';
import { bisect } from './bisect';
import { DEFAULT_TOLERANCES, type Tolerances } from './bisect-compare';
import { jsonSafe } from './compare';
import { findIncident, placementOf, replicaHost, type Incident, type Placement } from './verdict-plan';
import { runProcess, type ReplayResult, type ReplaySpec } from './verdict-run';
import { describeDevice, type DeviceFingerprint } from './verdict-fingerprint';
import { replayHere } from './verdict-replay';
import { replayViaAgent } from './verdict-remote';
import type { ControlTarget } from './control-client';

export type VerdictKind = 'deterministic' | 'device-local' | 'transient' | 'inconclusive';

export interface VerdictOptions {
  tree: string;
  incident?: string;
  /** Where the engine saved what it computed (the torch example: forward_rank<g>_step<S>.pt, pid_rank<g>). */
  engineOut: string;
  /** The replayer's argv prefix (default: python3 examples/torch-engine/replay.py). */
  replayer: string[];
  /** Appended to every replay (e.g. --shard-patch FILE: what the engine loaded). */
  replayerArgs: string[];
  dp: number;
  hosts: Map<number, Placement>;
  hostEnvs: Map<string, Record<string, string>>;
  /** A host the user names for replay (2) instead of another replica's: its agent's (with `remote` and a --rank-host there), else here with its --host-env. */
  otherHost?: string;
  allowLiveDevice: boolean;
  reference: boolean;
  tolerances?: Partial<Tolerances>;
  timeoutMs: number;
  /**
   * The job's coordinator: replay (2) on another replica's host (or on the --other-host where an
   * agent of the job runs) runs through that agent over the authenticated bus (verdict-remote.ts), not here. `tol`: the --tol flags, sent as given.
   */
  remote?: { target: ControlTarget; tol: string[] };
}

export interface Verdict {
  incident: { id: string; dir: string; replica: number; tp: number; ranks: number[]; calls: number[] };
  verdict: VerdictKind;
  reason: string;
  /** device-local: where it reproduces, and those devices as the replay there saw them. */
  host?: string;
  devices?: number[];
  fingerprint?: DeviceFingerprint[];
  /** transient / device-local: the forwards that did not reproduce (call, rank). */
  calls?: { call: number; rank: number }[];
  /** deterministic: bisect of the TP=N replay against TP=1 on the newest forward. */
  bisect?: { call: number; first: { module: string; ranks: number[]; max_abs_diff: number } | null; out?: string; error?: string };
  replays: ReplayResult[];
  tolerances: Tolerances;
  time: string;
  wall_ms: number;
}

const notReproduced = (r: ReplayResult) => r.tensors.filter((t) => !t.within_tolerance).map((t) => ({ call: t.call, rank: t.rank }));

/** The env of a replay "on" host: this process's environment with the host's lines over it. */
function envFor(o: VerdictOptions, host: string): NodeJS.ProcessEnv {
  return { ...process.env, ...(o.hostEnvs.get(host) ?? {}) };
}

/** A replay run here, as a child of this process, with `spec.host`'s environment (--host-env). */
function replayOn(o: VerdictOptions, inc: Incident, spec: ReplaySpec, work: string, tols: Tolerances): Promise<ReplayResult> {
  return replayHere(spec, {
    snapshots: inc.snapshots, engineOut: o.engineOut, calls: inc.calls, ranks: inc.ranks, replayer: o.replayer, replayerArgs: o.replayerArgs,
    env: envFor(o, spec.host), allowLiveDevice: o.allowLiveDevice, timeoutMs: o.timeoutMs,
  }, path.join(work, spec.role), tols);
}

/** Replay (3): the newest forward at TP=N and TP=1 with the probe on, and bisect between them. */
async function reference(o: VerdictOptions, inc: Incident, same: ReplaySpec, work: string, tols: Tolerances): Promise<NonNullable<Verdict['bisect']>> {
  const call = inc.calls[inc.calls.length - 1];
  const dirs = { a: path.join(work, 'probe-tp' + inc.tp), b: path.join(work, 'probe-tp1') };
  for (const [d, extra] of [[dirs.a, same.devices.flatMap((dev, t) => ['--device', `${t}=${dev}`])], [dirs.b, ['--tp', '1', '--device', `0=${same.devices[0]}`]]] as const) {
    fs.rmSync(d, { recursive: true, force: true });
    const run = await runProcess([...o.replayer, '--snapshots', inc.snapshots, '--call', String(call), '--probe', d, ...extra, ...o.replayerArgs], envFor(o, same.host), o.timeoutMs);
    if (run.code !== 0) return { call, first: null, error: `the probe replay ${path.basename(d)} exited ${run.code}: ${run.tail.trim().split('\n').slice(-2).join(' | ')}` };
  }
  try {
    const r = await bisect(dirs.a, dirs.b, { tolerances: tols });
    const out = path.join(path.dirname(work), 'verdict-bisect.json');
    writeFileAtomic(out, `${JSON.stringify(jsonSafe(r), null, 2)}\n`, artifactWrite(DEFAULT_ARTIFACT_MODES));
    return { call, out, first: r.first ? { module: r.first.module, ranks: r.first.ranks, max_abs_diff: r.first.max_abs_diff } : null };
  } catch (e) {
    return { call, first: null, error: `bisect: ${(e as Error).message}` };
  }
}

/**
 * Replay (2) on the host the user names (--other-host), with the incident's device indices. With the
 * coordinator known and an agent of the job on that host (a rank --rank-host places there), that
 * agent runs it (its lowest rank's; the serving check covers the ranks there on those devices);
 * otherwise it runs here with the host's --host-env, standing for that host as far as its
 * environment goes.
 */
function otherHostSpec(o: VerdictOptions, host: string, devices: number[]): { spec: ReplaySpec; agentRank?: number } {
  const onHost = [...o.hosts.entries()].filter(([, p]) => p.host === host).map(([g]) => g).sort((a, b) => a - b);
  if (o.remote && onHost.length) {
    const ranksOnDevices = onHost.filter((g) => devices.includes(placementOf(o.hosts, g).device));
    return { spec: { role: 'other', host, devices, ranksOnDevices }, agentRank: onHost[0] };
  }
  // Without its environment a replay "on" it would run as this host: no second host at all.
  if (!o.hostEnvs.has(host)) {
    const why = o.remote ? 'and no --rank-host places a rank (an agent) there' : 'and without --coordinator no agent is asked';
    throw new VerdictError(`--other-host ${host}: no --host-env ${host}=FILE says what a process there sees, ${why}`);
  }
  return { spec: { role: 'other', host, devices, ranksOnDevices: [] } };
}

export async function verdict(o: VerdictOptions): Promise<Verdict> {
  const t0 = Date.now();
  const inc = findIncident(o.tree, o.incident);
  const tols: Tolerances = { ...DEFAULT_TOLERANCES, ...(o.tolerances ?? {}) };
  const work = path.join(inc.dir, 'verdict');
  fs.mkdirSync(work, { recursive: true, mode: 0o700 });
  // The incident's replica is the job's: a replica past --dp would make "another replica" a guess.
  if (inc.replica >= o.dp) throw new VerdictError(`--dp ${o.dp}: the incident ${inc.id} is of replica ${inc.replica}: give the job's DP (replicas 0..DP-1)`);
  const here = replicaHost(o.hosts, inc.ranks);
  const same: ReplaySpec = { role: 'same', host: here.host, devices: here.devices, ranksOnDevices: inc.ranks };
  let other: ReplaySpec | string;
  /** The rank whose agent runs replay (2), when it runs on another host through the bus. */
  let agentRank: number | undefined;
  if (o.otherHost !== undefined) {
    const named = otherHostSpec(o, o.otherHost, here.devices);
    other = named.spec;
    agentRank = named.agentRank;
  } else {
    const d = Array.from({ length: o.dp }, (_, i) => i).find((i) => i !== inc.replica);
    if (d === undefined) {
      other = `no second replica holds the shard (DP=${o.dp}; name one with --other-host)`;
    } else {
      const ranks = inc.ranks.map((_, t) => d * inc.tp + t);
      const there = replicaHost(o.hosts, ranks);
      other = { role: 'other', host: there.host, devices: there.devices, ranksOnDevices: ranks };
      // Another replica's host is reached through its head agent when the coordinator is known.
      if (o.remote) agentRank = ranks[0];
    }
  }
  const replays: ReplayResult[] = [{ ...(await replayOn(o, inc, same, work, tols)), ran: 'here' }];
  if (typeof other !== 'string') {
    replays.push(o.remote && agentRank !== undefined
      ? { ...(await replayViaAgent(inc, o.engineOut, other, { target: o.remote.target, rank: agentRank, tol: o.remote.tol, allowLiveDevice: o.allowLiveDevice, timeoutMs: o.timeoutMs })), ran: `on ${other.host} by rank ${agentRank}'s agent` }
      : { ...(await replayOn(o, inc, other, work, tols)), ran: o.hostEnvs.has(other.host) ? `here, with ${other.host}'s environment (--host-env)` : 'here' });
  }
  const done = (v: Omit<Verdict, 'incident' | 'replays' | 'tolerances' | 'time' | 'wall_ms'>): Verdict => ({
    incident: { id: inc.id, dir: inc.dir, replica: inc.replica, tp: inc.tp, ranks: inc.ranks, calls: inc.calls },
    ...v, replays, tolerances: tols, time: new Date().toISOString(), wall_ms: Date.now() - t0,
  });
  const [s, x] = [replays[0], replays[1] as ReplayResult | undefined];
  if (!s.ok) return done({ verdict: 'inconclusive', reason: `the same-host replay failed: ${s.error}` });
  const sameMiss = notReproduced(s);
  if (sameMiss.length) {
    const xMiss = x?.ok ? notReproduced(x) : undefined;
    if (xMiss && xMiss.length === 0) {
      return done({ verdict: 'inconclusive', reason: `the engine's output reproduces on host ${x!.host} but not on its own host ${s.host}`, calls: sameMiss });
    }
    return done({ verdict: 'transient', reason: `${sameMiss.length} recorded output(s) do not reproduce in a fresh process on host ${s.host} devices ${s.devices.join(',')}${xMiss ? ` nor on host ${x!.host} devices ${x!.devices.join(',')}` : ''}`, calls: sameMiss });
  }
  if (typeof other === 'string') return done({ verdict: 'inconclusive', reason: `every recorded output reproduces on host ${s.host}, and ${other}` });
  if (!x!.ok) return done({ verdict: 'inconclusive', reason: `every recorded output reproduces on host ${s.host}; the replay on host ${x!.host} devices ${x!.devices.join(',')} did not run: ${x!.error}` });
  const xMiss = notReproduced(x!);
  if (xMiss.length) {
    return done({ verdict: 'device-local', reason: `the recorded outputs reproduce on host ${s.host} devices ${s.devices.join(',')} only: ${xMiss.length} of them differ on host ${x!.host} devices ${x!.devices.join(',')}`, host: s.host, devices: s.devices, fingerprint: s.fingerprint, calls: xMiss });
  }
  const b = o.reference ? await reference(o, inc, same, work, tols) : undefined;
  const found = b?.first ? `; bisect against TP=1 names ${b.first.module} (rank ${b.first.ranks.join(',')})` : b?.error ? `; the TP=1 reference failed: ${b.error}` : b ? '; bisect against TP=1 finds no module out of tolerance' : '';
  return done({ verdict: 'deterministic', reason: `every recorded output reproduces on host ${s.host} and on host ${x!.host} devices ${x!.devices.join(',')}: software, weights or input${found}`, bisect: b });
}

/** Write <incident dir>/verdict.json (whole, 0640); returns its path. */
export function writeVerdict(v: Verdict): string {
  const file = path.join(v.incident.dir, 'verdict.json');
  writeFileAtomic(file, `${JSON.stringify(jsonSafe(v), null, 2)}\n`, artifactWrite(DEFAULT_ARTIFACT_MODES));
  return file;
}

export function formatVerdict(v: Verdict): string {
  const i = v.incident;
  const lines = [`incident ${i.id} (replica ${i.replica}, ranks ${i.ranks.join(',')}, forwards ${i.calls[0]}..${i.calls[i.calls.length - 1]}): ${v.verdict.toUpperCase()}`, `  ${v.reason}`];
  for (const r of v.replays) {
    const bad = r.tensors.filter((t) => !t.within_tolerance);
    const worst = r.tensors.reduce((m, t) => Math.max(m, t.max_abs_diff), 0);
    lines.push(`  replay ${r.role.padEnd(5)} host ${r.host}${r.agent_rank !== undefined ? ` (rank ${r.agent_rank}'s agent${r.agent_hostname ? ` on ${r.agent_hostname}` : ''})` : r.ran && r.ran !== 'here' ? ` (${r.ran})` : ''} devices ${r.devices.join(',')}: ${r.ok ? `${r.tensors.length - bad.length}/${r.tensors.length} outputs within tolerance (${r.tensors.filter((t) => t.bit_exact).length} bit-exact), max|diff| ${worst.toPrecision(3)}` : `not run: ${r.error}`}${r.wall_ms !== undefined ? ` [${(r.wall_ms / 1000).toFixed(1)} s]` : ''}`);
    for (const t of bad.slice(0, 8)) lines.push(`    call ${t.call} rank ${t.rank}: max|diff| ${t.max_abs_diff.toPrecision(3)}, ${t.mismatched}/${t.numel} beyond atol ${t.atol} + rtol ${t.rtol}`);
  }
  for (const d of v.verdict === 'device-local' ? v.fingerprint ?? [] : []) lines.push(`  device ${d.index} on host ${v.host}: ${describeDevice(d)}`);
  if (v.bisect) lines.push(`  bisect (call ${v.bisect.call}, TP=${i.tp} vs TP=1): ${v.bisect.first ? `first out of tolerance: ${v.bisect.first.module} rank ${v.bisect.first.ranks.join(',')}` : v.bisect.error ?? 'no module out of tolerance'}`);
  lines.push(`  ${(v.wall_ms / 1000).toFixed(1)} s in all`);
  return `${lines.join('\n')}\n`;
}
