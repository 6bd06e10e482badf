// Dumps a previous coordinator armed and never finished: it was killed (or restarted) while their
// acks or copy window were pending, so their wave dir holds request_info.json and no manifest.json.
// At startup the guard finds them under its dump root and hands them to the ledger, which writes a
// manifest saying so (complete: false, incomplete_reason "coordinator_restarted") and still counts
// acks that reach this coordinator afterwards (an agent's queued ack goes to the new one). Only the
// layout <root>/<incident>/<req>/wave_<W>[_dp<R>] is read; links are not followed; a record that
// does not fit this job's layout is skipped with a warning, never trusted.
import * as fs from 'fs';
import * as path from 'path';
import type { Logger } from '../log';
import type { DumpJob } from '../messages';
import { PP_STAGES, type PpStages, type WorldLayout } from '../layout';

/** request_info.json is a few hundred bytes; anything far larger is not ours. */
const MAX_INFO_BYTES = 1 << 20;
/** At most this many are adopted at one start (the ledger tracks a bounded number of jobs). */
export const MAX_ORPHANS = 1024;

export interface OrphanDump {
  job: DumpJob;
  ppStages: PpStages;
}

function dirsIn(dir: string): string[] {
  try {
    return fs.readdirSync(dir, { withFileTypes: true }).filter((e) => e.isDirectory() && !e.name.startsWith('.')).map((e) => e.name);
  } catch {
    return [];
  }
}

function readInfo(file: string): unknown {
  let fd: number;
  try {
    fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  } catch {
    return undefined; // absent, or a link
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile() || st.size > MAX_INFO_BYTES) return undefined;
    return JSON.parse(fs.readFileSync(fd, 'utf8'));
  } catch {
    return undefined;
  } finally {
    fs.closeSync(fd);
  }
}

const int = (v: unknown, min = 0): v is number => Number.isSafeInteger(v) && (v as number) >= min;

/** The job a request_info.json describes, if it fits this layout; else why not. */
export function orphanJob(dir: string, raw: unknown, layout: WorldLayout): OrphanDump | string {
  const i = raw as Record<string, unknown> | null;
  if (!i || typeof i !== 'object') return 'request_info.json is not a JSON object';
  const world = layout.tp * layout.pp * layout.dp * layout.cp;
  if (typeof i.job_id !== 'string' || typeof i.incident_type !== 'string' || typeof i.req_id !== 'string') return 'job_id, incident_type or req_id is not a string';
  if (!int(i.dp_rank) || i.dp_rank >= layout.dp) return `dp_rank ${String(i.dp_rank)} is outside dp=${layout.dp}`;
  if (!int(i.arm_wave) || !int(i.detect_wave)) return 'arm_wave or detect_wave is not a wave number';
  if (!Array.isArray(i.expected_ranks) || i.expected_ranks.length === 0 || !i.expected_ranks.every((g) => int(g) && g < world)) return `expected_ranks is not a list of ranks below ${world}`;
  if (!Array.isArray(i.block_ids) || !i.block_ids.every((b) => int(b))) return 'block_ids is not a list of block ids';
  const ppStages = (PP_STAGES as readonly unknown[]).includes(i.pp_stages) ? (i.pp_stages as PpStages) : 'last';
  return {
    ppStages,
    job: {
      incidentType: i.incident_type,
      reqId: i.req_id,
      blockIds: i.block_ids as number[],
      detectWave: i.detect_wave,
      armWave: i.arm_wave,
      dumpDir: dir,
      requestFinishedAtDump: i.request_finished_at_dump === true,
      jobId: i.job_id,
      replica: i.dp_rank,
      ranks: [...new Set(i.expected_ranks as number[])].sort((a, b) => a - b),
    },
  };
}

/** Wave dirs under dumpRoot with request_info.json and no manifest.json, as jobs of this layout. */
export function findOrphanDumps(dumpRoot: string, layout: WorldLayout, log?: Pick<Logger, 'warn'>): OrphanDump[] {
  const out: OrphanDump[] = [];
  for (const incident of dirsIn(dumpRoot)) {
    for (const req of dirsIn(path.join(dumpRoot, incident))) {
      for (const w of dirsIn(path.join(dumpRoot, incident, req))) {
        if (!/^wave_\d+(_dp\d+)?$/.test(w)) continue;
        const dir = path.join(dumpRoot, incident, req, w);
        if (fs.existsSync(path.join(dir, 'manifest.json'))) continue;
        const raw = readInfo(path.join(dir, 'request_info.json'));
        if (raw === undefined) continue;
        const o = orphanJob(dir, raw, layout);
        if (typeof o === 'string') {
          log?.warn({ dir, reason: o }, 'an unfinished dump from an earlier coordinator does not fit this job; left as it is');
          continue;
        }
        out.push(o);
        if (out.length >= MAX_ORPHANS) return out;
      }
    }
  }
  return out;
}
