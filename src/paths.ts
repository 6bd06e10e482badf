// Owns every directory name wavebus builds, so that layouts live in exactly one place.
import * as fs from 'fs';
import * as path from 'path';
import { ConfigError, KvDirNameError } from './errors';
import { MAX_WORLD_SIZE, globalRankOf, rankCoordinates, type WorldLayout } from './layout';

/** The per-process input snapshot directory name: unique under any parallelism (docs/design.md). */
export function rankDirName(globalRank: number): string {
  if (!Number.isInteger(globalRank) || globalRank < 0) {
    throw new RangeError(`global rank must be a non-negative integer, got ${globalRank}`);
  }
  return `rank${globalRank}`;
}

/** A rank's coordinates, as its KV dump directory names them. */
export interface KvRankCoords {
  dpRank: number;
  tpRank: number;
  ppRank: number;
  cpRank: number;
}

const KV_COORDS = ['dpRank', 'tpRank', 'ppRank', 'cpRank'] as const;
/** Every coordinate lies below its parallel size, and no size is over the largest world. */
const MAX_KV_COORD = MAX_WORLD_SIZE - 1;
const KV_DIR_RE = /^dp(0|[1-9]\d{0,5})_tp(0|[1-9]\d{0,5})_pp(0|[1-9]\d{0,5})_cp(0|[1-9]\d{0,5})$/;
const LEGACY_RANK_DIR_RE = /^rank(0|[1-9]\d{0,5})$/;
const KV_DIR_FORM = 'dp<d>_tp<t>_pp<p>_cp<c> (decimal, no leading zeros)';

/** The seed's KV dump directory of one rank: `dp<d>_tp<t>_pp<p>_cp<c>` (runtime-guard "On-disk layout"). */
export function kvRankDirName(c: KvRankCoords): string {
  for (const k of KV_COORDS) {
    const v = c[k];
    if (!Number.isInteger(v) || v < 0 || v > MAX_KV_COORD) throw new KvDirNameError(`${k} must be an integer in 0..${MAX_KV_COORD}, got ${String(v)}`);
  }
  return `dp${c.dpRank}_tp${c.tpRank}_pp${c.ppRank}_cp${c.cpRank}`;
}

/** The KV dump directory of global rank `g` in `layout`. */
export function kvRankDirFor(globalRank: number, layout: WorldLayout): string {
  return kvRankDirName(rankCoordinates(globalRank, layout));
}

function shown(name: string): string {
  return JSON.stringify(name.length > 80 ? `${name.slice(0, 80)}...` : name);
}

/** Strict parse of a `dp<d>_tp<t>_pp<p>_cp<c>` name; `where` names the directory in the error. */
export function parseKvRankDirName(name: string, where = 'KV dump directory'): KvRankCoords {
  const m = typeof name === 'string' ? KV_DIR_RE.exec(name) : null;
  if (!m) throw new KvDirNameError(`${where} ${shown(String(name))} is not ${KV_DIR_FORM}`);
  const c = { dpRank: Number(m[1]), tpRank: Number(m[2]), ppRank: Number(m[3]), cpRank: Number(m[4]) };
  for (const k of KV_COORDS) {
    if (c[k] > MAX_KV_COORD) throw new KvDirNameError(`${where} ${shown(name)}: ${k} ${c[k]} is over ${MAX_KV_COORD} (MAX_WORLD_SIZE - 1)`);
  }
  return c;
}

/** A KV dump rank directory as readers meet it: the seed's name, or `rank<g>` written by wavebus before it. */
export type KvRankDir = { name: string; coords: KvRankCoords } | { name: string; legacyRank: number };

/** Whether a directory name has the form of a KV dump rank directory (either layout); values are not checked. */
export function isKvRankDirName(name: string): boolean {
  return KV_DIR_RE.test(name) || LEGACY_RANK_DIR_RE.test(name);
}

/** Read a KV dump rank directory name of either layout; anything else is refused (KvDirNameError). */
export function readKvRankDirName(name: string, where = 'KV dump directory'): KvRankDir {
  const legacy = typeof name === 'string' ? LEGACY_RANK_DIR_RE.exec(name) : null;
  if (legacy) {
    const g = Number(legacy[1]);
    if (g > MAX_KV_COORD) throw new KvDirNameError(`${where} ${shown(name)}: rank ${g} is over ${MAX_KV_COORD} (MAX_WORLD_SIZE - 1)`);
    return { name, legacyRank: g };
  }
  try {
    return { name, coords: parseKvRankDirName(name, where) };
  } catch (e) {
    if (KV_DIR_RE.test(name)) throw e;
    throw new KvDirNameError(`${where} ${shown(String(name))} is not ${KV_DIR_FORM} (nor rank<g> of an older wavebus)`);
  }
}

/** The global rank a KV dump directory belongs to; a seed-named one needs the job's layout. */
export function kvRankOfDir(d: KvRankDir, layout: WorldLayout): number {
  if ('legacyRank' in d) return d.legacyRank;
  const { tp, pp, dp, cp } = layout;
  const c = d.coords;
  if (c.tpRank >= tp || c.ppRank >= pp || c.dpRank >= dp || c.cpRank >= cp) {
    throw new KvDirNameError(`KV dump directory ${shown(d.name)} lies outside the layout tp=${tp} pp=${pp} dp=${dp} cp=${cp}`);
  }
  return globalRankOf(c, layout);
}

/**
 * The engine client of local rank `l` talks to its agent here. Keyed on the local rank because
 * the run dir is per host and every launcher (torchrun, Slurm) gives each process LOCAL_RANK.
 */
export function agentEndpoint(runDir: string, localRank: number): string {
  return `ipc://${localRankFile(runDir, localRank, 'agent-local', '.sock')}`;
}

/** `<runDir>/<stem><l><suffix>`: a file of local rank `l` in the run dir (a local rank is a non-negative integer). */
function localRankFile(runDir: string, localRank: number, stem: string, suffix = ''): string {
  if (!Number.isInteger(localRank) || localRank < 0) {
    throw new RangeError(`local rank must be a non-negative integer, got ${localRank}`);
  }
  return path.join(runDir, `${stem}${localRank}${suffix}`);
}

/** Longest path a unix socket address holds (sun_path is 108 bytes with the NUL). */
export const MAX_IPC_PATH = 107;

/**
 * A path the kernel cannot take (a component over NAME_MAX, the whole over PATH_MAX) is refused
 * here, naming its flag or variable: the processes it is handed to would otherwise fail with
 * ENAMETOOLONG.
 */
export function checkPathLength(value: string, flag: string, code = 'ERR_CONFIG'): void {
  const long = value.split('/').find((c) => Buffer.byteLength(c) > 255);
  if (long !== undefined) throw new ConfigError(`${flag}: a path component of ${Buffer.byteLength(long)} bytes (at most 255)`, code);
  if (Buffer.byteLength(value) > 4095) throw new ConfigError(`${flag}: a path of ${Buffer.byteLength(value)} bytes (at most 4095)`, code);
}

/**
 * Throws a ConfigError naming `flag` when the socket of local rank `localRank` (the highest one
 * that will live there) does not fit a unix socket address. Checked before anything is created.
 */
export function checkRunDirFits(runDir: string, localRank: number, flag: string, code = 'ERR_CONFIG'): void {
  const longest = agentEndpoint(runDir, localRank).slice('ipc://'.length);
  if (Buffer.byteLength(longest) > MAX_IPC_PATH) {
    throw new ConfigError(`${flag} ${runDir}: too long for a unix socket path (${longest} is over ${MAX_IPC_PATH} bytes); pick a shorter directory`, code);
  }
}

/** The shared-memory wave-vector mailbox of local rank `l`, written by its agent, mapped by its client. */
export function mailboxPath(runDir: string, localRank: number): string {
  return localRankFile(runDir, localRank, 'mailbox-local');
}

/** rank_divergence's decision ring of a local rank (src/agent/decision-ring.ts). */
export function decisionPath(runDir: string, localRank: number): string {
  return localRankFile(runDir, localRank, 'decided-local');
}

/** The flight recorder's ring beside the mailbox (docs/recorder.md). */
export function recorderPath(runDir: string, localRank: number): string {
  return localRankFile(runDir, localRank, 'recorder-local');
}

/** The engine's faulthandler file beside the ring: the Python client writes a fatal signal's traceback there, the agent reads it after a death (docs/recorder.md). */
export function engineFaultPath(runDir: string, localRank: number): string {
  return localRankFile(runDir, localRank, 'engine-fault-local', '.txt');
}

/** The package root: walk up from here (src/ under ts-jest, dist/src/ when built) to wavebus's package.json. */
export function packageRoot(from: string = __dirname): string {
  let dir = from;
  for (;;) {
    const pj = path.join(dir, 'package.json');
    if (fs.existsSync(pj)) {
      try {
        if ((JSON.parse(fs.readFileSync(pj, 'utf8')) as { name?: string }).name === 'wavebus') return dir;
      } catch {
        /* unreadable package.json: keep walking */
      }
    }
    const up = path.dirname(dir);
    if (up === dir) throw new Error(`cannot find the wavebus package root (package.json named wavebus) above ${from}`);
    dir = up;
  }
}

/** A dump.json `identity` as written by the dump executor (older dumps carry the same fields). */
export interface DumpIdentity {
  global_rank?: unknown;
  dp_rank?: unknown;
  tp_rank?: unknown;
  pp_rank?: unknown;
  cp_rank?: unknown;
}

/**
 * The name the directory of `d`'s layout must have for the dump.json identity inside it: the
 * seed's name from the coordinates, or rank<g> for an older dump. Throws KvDirNameError when
 * the identity lacks what the name needs, or names another directory.
 */
export function checkKvDirIdentity(d: KvRankDir, id: DumpIdentity, where = 'KV dump directory'): void {
  const g = id.global_rank;
  let named: string;
  if ('legacyRank' in d) {
    if (!Number.isSafeInteger(g) || (g as number) < 0) throw new KvDirNameError(`${where} ${shown(d.name)}: its dump.json has no identity.global_rank`);
    named = `rank${g as number}`;
  } else {
    try {
      named = kvRankDirName({ dpRank: id.dp_rank as number, tpRank: id.tp_rank as number, ppRank: id.pp_rank as number, cpRank: id.cp_rank as number });
    } catch (e) {
      throw new KvDirNameError(`${where} ${shown(d.name)}: its dump.json identity: ${(e as Error).message}`);
    }
  }
  if (named !== d.name) throw new KvDirNameError(`${where} ${shown(d.name)} disagrees with its dump.json (global rank ${String(g)}, ${named})`);
}

/** How request_info.json, manifest.json and the coordinator's status record a layout. */
export interface LayoutJson {
  world_size: number;
  tp: number;
  pp: number;
  dp: number;
  cp: number;
}

export function layoutJson(l: WorldLayout): LayoutJson {
  return { world_size: l.worldSize, tp: l.tp, pp: l.pp, dp: l.dp, cp: l.cp };
}

/** A recorded layout read back (from a file or the network): checked, or the reason it is refused. */
export function readLayoutJson(raw: unknown): { layout: WorldLayout } | { reason: string } {
  const l = raw as Partial<Record<keyof LayoutJson, unknown>> | null;
  const sizes = [l?.tp, l?.pp, l?.dp, l?.cp];
  if (typeof l !== 'object' || l === null || !sizes.every((n) => Number.isSafeInteger(n) && (n as number) >= 1)) {
    return { reason: `layout ${shown(JSON.stringify(raw) ?? String(raw))} is not {world_size, tp, pp, dp, cp} of positive integers` };
  }
  const [tp, pp, dp, cp] = sizes as number[];
  const world = tp * pp * dp * cp;
  if (l.world_size !== world) return { reason: `layout world_size ${String(l.world_size)} is not tp*pp*dp*cp = ${world}` };
  if (world > MAX_WORLD_SIZE) return { reason: `layout world_size ${world} is over ${MAX_WORLD_SIZE} (MAX_WORLD_SIZE)` };
  return { layout: { worldSize: world, tp, pp, dp, cp } };
}

/** Whether `relPath` lies in global rank `g`'s own KV dump dir (either layout; the seed's name needs the layout). */
export function inKvRankDirOf(relPath: string, g: number, layout: WorldLayout | undefined): boolean {
  return relPath.split('/').some((c) => {
    try {
      const d = readKvRankDirName(c);
      return 'legacyRank' in d ? d.legacyRank === g : layout !== undefined && kvRankOfDir(d, layout) === g;
    } catch {
      return false; // not a rank dir, or one outside the layout
    }
  });
}

/** The folder under the dump root that holds the ranks' and the coordinator's wave timing (`wavebus trace`), not an incident type. */
export const TIMELINE_DIR = 'timeline';

/** A flight recorder's incident flush folder (under recorder/): the agents write it, the guard lists it. */
export function incidentFlushName(wave: number, layout: { dp: number }, replica: number): string {
  return `incident-wave${wave}${layout.dp > 1 ? `-dp${replica}` : ''}`;
}

/** The telemetry ring beside the mailbox (proto/layouts.json's "telemetry"; docs/python-client.md, "The tensor hot path"). */
export function telemetryRingPath(runDir: string, localRank: number): string {
  return localRankFile(runDir, localRank, 'telemetry-ring-local');
}
