// What `wavebus verdict` replays, and where: the incident's recorder flush in the tree (its ranks,
// its forwards), the job's layout (DP replicas of `tp` ranks, global rank = replica * tp + tp rank,
// as `wavebus launch --dp` numbers them), each rank's host and device, and each host's environment
// for the replay processes that stand in for running there (docs/verdict.md).
import * as fs from 'fs';
import * as path from 'path';
import { VerdictError } from '../errors';
import { META_FILE, parseMeta } from '../snapshot/meta';

export interface Placement {
  host: string;
  device: number;
}

export interface Incident {
  /** The flush folder's name: incident-wave<w>[-dp<r>], crash-<run>, flush-capture-<n>. */
  id: string;
  dir: string;
  /** <dir>/<compilation hash>: rank<g>/call<N>/ bundles (replay.py's --snapshots). */
  snapshots: string;
  replica: number;
  tp: number;
  /** Global ranks of the flush, tp_rank order. */
  ranks: number[];
  /** Calls recorded on every rank of the flush, ascending. */
  calls: number[];
}

const FLUSH = /^(incident-wave\d+(-dp\d+)?|crash-[A-Za-z0-9._-]+|flush-capture-\d+)$/;

/** Every recorder flush folder under `tree` (a cache root, snapshot root or aggregated tree; 5 levels down at most; no link followed). */
export function listIncidents(tree: string): { id: string; dir: string }[] {
  const out: { id: string; dir: string }[] = [];
  const walk = (dir: string, depth: number) => {
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      if (!e.isDirectory() || e.name.startsWith('.')) continue;
      const p = path.join(dir, e.name);
      if (path.basename(dir) === 'recorder' && FLUSH.test(e.name)) out.push({ id: e.name, dir: p });
      else if (depth < 5) walk(p, depth + 1);
    }
  };
  walk(tree, 0);
  return out.sort((a, b) => a.dir.localeCompare(b.dir));
}

/** The incident `id` (default: the only incident flush of the tree), read: its ranks and forwards. */
export function findIncident(tree: string, id?: string): Incident {
  if (!fs.existsSync(tree) || !fs.statSync(tree).isDirectory()) throw new VerdictError(`TREE ${JSON.stringify(tree)}: not a directory`);
  const all = listIncidents(tree);
  const named = id === undefined ? all.filter((f) => f.id.startsWith('incident-')) : all.filter((f) => f.id === id);
  if (named.length === 0) {
    const have = all.map((f) => f.id).join(', ') || 'none';
    throw new VerdictError(id === undefined ? `${tree}: no recorder/incident-wave<w> flush (flushes: ${have}); the flight recorder writes one when an incident's dump is copied (docs/recorder.md)` : `--incident ${id}: no recorder/${id} under ${tree} (flushes: ${have})`);
  }
  if (named.length > 1) throw new VerdictError(`${tree}: ${named.length} incident flushes (${named.map((f) => f.id).join(', ')}): name one with --incident`);
  const { id: name, dir } = named[0];
  // verdict/: a previous verdict's replays (verdict.ts), not a compilation hash.
  const hashes = fs.readdirSync(dir, { withFileTypes: true }).filter((e) => e.isDirectory() && !e.name.startsWith('.') && e.name !== 'verdict');
  if (hashes.length !== 1) throw new VerdictError(`${dir}: expected one compilation-hash folder, found ${hashes.length}`);
  const snapshots = path.join(dir, hashes[0].name);
  const metas = fs.readdirSync(snapshots).filter((n) => /^rank\d+$/.test(n)).map((n) => {
    const rankDir = path.join(snapshots, n);
    const calls = fs.readdirSync(rankDir).filter((c) => /^call\d+$/.test(c)).map((c) => Number(c.slice(4)));
    if (calls.length === 0) throw new VerdictError(`${rankDir}: no call<N> bundle`);
    const meta = parseMeta(fs.readFileSync(path.join(rankDir, `call${calls[0]}`, META_FILE), 'utf8'), path.join(rankDir, `call${calls[0]}`, META_FILE));
    return { global: meta.global_rank, tpRank: meta.tp_rank, dp: meta.dp_rank ?? 0, calls: new Set(calls) };
  }).sort((a, b) => a.tpRank - b.tpRank);
  if (metas.length === 0) throw new VerdictError(`${snapshots}: no rank<g> folder`);
  if (metas.some((m, i) => m.tpRank !== i)) throw new VerdictError(`${snapshots}: tp ranks ${metas.map((m) => m.tpRank)}: a flush holds one whole TP group`);
  const calls = [...metas[0].calls].filter((c) => metas.every((m) => m.calls.has(c))).sort((a, b) => a - b);
  if (calls.length === 0) throw new VerdictError(`${snapshots}: no forward recorded on every rank`);
  return { id: name, dir, snapshots, replica: metas[0].dp, tp: metas.length, ranks: metas.map((m) => m.global), calls };
}

/** `--rank-host G=HOST[:DEVICE]` (repeatable). A rank not named is on host `local`, device = its global rank. */
export function parseRankHosts(raw: string[]): Map<number, Placement> {
  const out = new Map<number, Placement>();
  for (const item of raw) {
    const m = /^(\d+)=([A-Za-z0-9][A-Za-z0-9._-]{0,63})(?::(\d+))?$/.exec(item);
    if (!m) throw new VerdictError(`--rank-host: expected G=HOST[:DEVICE] (HOST: letters, digits, . _ -), got ${JSON.stringify(item.slice(0, 200))}`);
    out.set(Number(m[1]), { host: m[2], device: m[3] === undefined ? Number(m[1]) : Number(m[3]) });
  }
  return out;
}

export const placementOf = (hosts: Map<number, Placement>, g: number): Placement => hosts.get(g) ?? { host: 'local', device: g };

/** `--host-env HOST=FILE`: the environment a replay "on HOST" runs with (KEY=VALUE lines over this process's environment). */
export function parseHostEnvs(raw: string[]): Map<string, Record<string, string>> {
  const out = new Map<string, Record<string, string>>();
  for (const item of raw) {
    const eq = item.indexOf('=');
    const host = item.slice(0, eq);
    if (eq < 1 || !/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/.test(host)) throw new VerdictError(`--host-env: expected HOST=FILE, got ${JSON.stringify(item.slice(0, 200))}`);
    const file = item.slice(eq + 1);
    let text: string;
    try {
      if (fs.statSync(file).size > 1 << 20) throw new Error('larger than 1 MiB');
      text = fs.readFileSync(file, 'utf8');
    } catch (e) {
      throw new VerdictError(`--host-env ${host}: ${file}: ${(e as Error).message}`);
    }
    const env: Record<string, string> = {};
    text.split('\n').forEach((line, i) => {
      const t = line.trim();
      if (!t || t.startsWith('#')) return;
      const m = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(t);
      if (!m) throw new VerdictError(`--host-env ${host}: ${file}:${i + 1}: expected KEY=VALUE, got ${JSON.stringify(t.slice(0, 80))}`);
      env[m[1]] = m[2];
    });
    out.set(host, env);
  }
  return out;
}

/** The host of a replica's TP group (one host per replica: TP within a node). */
export function replicaHost(hosts: Map<number, Placement>, ranks: number[]): { host: string; devices: number[] } {
  const ps = ranks.map((g) => placementOf(hosts, g));
  const names = [...new Set(ps.map((p) => p.host))];
  if (names.length !== 1) throw new VerdictError(`--rank-host: ranks ${ranks.join(',')} (one TP group) lie on hosts ${names.join(', ')}: verdict replays a TP group in one process, on one host`);
  return { host: names[0], devices: ps.map((p) => p.device) };
}

/** Is rank g's engine still running (the torch example writes pid_rank<g> in its --out)? The pid, or undefined. */
export function servingPid(engineOut: string, g: number): number | undefined {
  let pid: number;
  try {
    pid = Number(fs.readFileSync(path.join(engineOut, `pid_rank${g}`), 'utf8').trim());
  } catch {
    return undefined;
  }
  if (!Number.isSafeInteger(pid) || pid <= 0) return undefined;
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return / Z /.test(stat.slice(stat.lastIndexOf(')'), stat.lastIndexOf(')') + 4)) ? undefined : pid; // a zombie serves nothing
  } catch {
    return undefined;
  }
}
