// The soak's dump checker: every finished dump under the KV root (a manifest, or a manual dump's
// dump_skipped.json) is checked, counted per replica and removed, so the disk stays flat. A dump
// passes when its manifest says complete, names its replica, expects and completed exactly that
// replica's dump ranks, holds exactly their rank dirs, and `inspect --verify` finds no problem.
// It runs in a worker thread: verifying checksums takes long enough that, run on the engine's
// thread, it would hold up that thread's wavebus calls past their bound (lost waves that the bus
// did not cause).
import * as fs from 'fs';
import * as path from 'path';
import { isMainThread, parentPort, Worker, workerData } from 'worker_threads';
import { replicaDumpRanks, type WorldLayout } from '../../src/layout';
import { isKvRankDirName, kvRankDirFor, TIMELINE_DIR } from '../../src/paths';
import { inspectTree } from '../../src/tools/inspect';

export interface ReplicaTally {
  jobsComplete: number;
  jobsIncomplete: number;
  dumpsSkipped: number;
  bundlesVerified: number;
  /** Arm waves seen (one per manual dump served). */
  dumpWaves: number[];
}

export interface Tally {
  replicas: ReplicaTally[];
  problems: string[];
}

export function emptyTally(dp: number): Tally {
  return { replicas: Array.from({ length: dp }, () => ({ jobsComplete: 0, jobsIncomplete: 0, dumpsSkipped: 0, bundlesVerified: 0, dumpWaves: [] })), problems: [] };
}

/** Problems are kept up to 40 (the first ones name the cause). */
function note(t: Tally, p: string): void {
  if (t.problems.length < 40) t.problems.push(p);
}

const WAVE_DIR = /^wave_(\d+)(?:_dp(\d+))?$/;

/** One finished dump: its verdict is added to `t` (problems named by the dir). */
export function checkDump(wdir: string, replica: number, wave: number, layout: WorldLayout, t: Tally): void {
  const c = t.replicas[replica];
  if (!c) return void note(t, `${wdir}: no replica ${replica} in dp=${layout.dp}`);
  const m = JSON.parse(fs.readFileSync(path.join(wdir, 'manifest.json'), 'utf8'));
  if (!c.dumpWaves.includes(wave)) c.dumpWaves.push(wave);
  if (!m.complete) {
    c.jobsIncomplete++;
    return void note(t, `${wdir}: incomplete (missing ${JSON.stringify(m.missing_ranks)}, failed ${JSON.stringify(m.failed_ranks)}, skipped ${JSON.stringify(m.skipped_ranks)}${m.incomplete_reason ? `, ${m.incomplete_reason}` : ''})`);
  }
  const want = replicaDumpRanks(layout, replica);
  const dirs = fs.readdirSync(wdir).filter(isKvRankDirName).sort();
  const wantDirs = want.map((g) => kvRankDirFor(g, layout)).sort();
  const r = inspectTree(wdir, { verify: true });
  const bundles = r.bundles.filter((b) => b.kind === 'kv_dump');
  const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);
  const bad = [
    m.dp_rank !== replica && `dp_rank ${m.dp_rank} in replica ${replica}'s dir`,
    !same(m.expected_ranks, want) && `expected_ranks ${JSON.stringify(m.expected_ranks)}, replica ${replica}'s are ${JSON.stringify(want)}`,
    !same(m.completed_ranks, want) && `completed_ranks ${JSON.stringify(m.completed_ranks)}`,
    !same(dirs, wantDirs) && `rank dirs ${JSON.stringify(dirs)}, want ${JSON.stringify(wantDirs)}`,
    bundles.length !== want.length && `${bundles.length} verified bundles, want ${want.length}`,
    r.problems.length > 0 && `inspect --verify: ${r.problems.slice(0, 3).join('; ')}`,
  ].filter(Boolean);
  if (bad.length > 0) {
    c.jobsIncomplete++;
    return void note(t, `${wdir}: ${bad.join('; ')}`);
  }
  c.jobsComplete++;
  c.bundlesVerified += bundles.length;
}

/** Check, count and remove every finished dump under kvRoot; dumps still pending stay. */
export function collectDumps(kvRoot: string, layout: WorldLayout, t: Tally = emptyTally(layout.dp)): Tally {
  if (!fs.existsSync(kvRoot)) return t;
  for (const incident of fs.readdirSync(kvRoot)) {
    if (incident === TIMELINE_DIR) continue; // the ranks' wave timing, not an incident
    const idir = path.join(kvRoot, incident);
    for (const e of fs.readdirSync(idir)) {
      // <incident>/wave_<W>[_dp<R>]/dump_skipped.json: a manual dump with no running request
      const skip = WAVE_DIR.exec(e);
      if (skip) {
        const r = Number(skip[2] ?? 0);
        if (t.replicas[r]) t.replicas[r].dumpsSkipped++;
        note(t, `${incident}/${e}: skipped: ${fs.readFileSync(path.join(idir, e, 'dump_skipped.json'), 'utf8').slice(0, 200)}`);
        fs.rmSync(path.join(idir, e), { recursive: true, force: true });
        continue;
      }
      for (const w of fs.readdirSync(path.join(idir, e))) {
        const wdir = path.join(idir, e, w);
        const name = WAVE_DIR.exec(w);
        if (!name || !fs.existsSync(path.join(wdir, 'manifest.json'))) continue; // still pending
        checkDump(wdir, Number(name[2] ?? 0), Number(name[1]), layout, t);
        fs.rmSync(wdir, { recursive: true, force: true });
      }
    }
  }
  return t;
}

/** Wave dirs still without a manifest (dumps that never finished). */
export function unfinishedDumps(kvRoot: string): string[] {
  if (!fs.existsSync(kvRoot)) return [];
  return (fs.readdirSync(kvRoot, { recursive: true }) as string[]).filter((f) => /(^|\/)wave_\d+(_dp\d+)?$/.test(f));
}

/**
 * The collector off the engine's thread: collect() asks for a pass (passes queue up, one at a
 * time), tally() waits for every asked pass and returns the totals. Where the compiled worker
 * file is missing (TypeScript run directly), passes run inline.
 */
export class Collector {
  private readonly worker?: Worker;
  private asked = 0;
  private done = 0;
  private last: Tally;
  private waiters: (() => void)[] = [];
  private failure?: Error;

  constructor(private readonly kvRoot: string, private readonly layout: WorldLayout) {
    this.last = emptyTally(layout.dp);
    const file = path.join(__dirname, 'soak-collector.js');
    if (!fs.existsSync(file)) return;
    this.worker = new Worker(file, { workerData: { role: 'soak-collector', kvRoot, layout } });
    this.worker.on('message', (t: Tally) => {
      this.last = t;
      this.done++;
      for (const w of this.waiters.splice(0)) w();
    });
    this.worker.on('error', (e) => {
      this.failure = e;
      for (const w of this.waiters.splice(0)) w();
    });
  }

  collect(): void {
    this.asked++;
    if (this.worker) this.worker.postMessage('collect');
    else {
      this.last = collectDumps(this.kvRoot, this.layout, this.last);
      this.done++;
    }
  }

  async tally(): Promise<Tally> {
    while (this.done < this.asked && !this.failure) await new Promise<void>((r) => this.waiters.push(r));
    if (this.failure) throw this.failure;
    return this.last;
  }

  async close(): Promise<void> {
    await this.worker?.terminate();
  }
}

if (!isMainThread && workerData?.role === 'soak-collector') {
  const { kvRoot, layout } = workerData as { kvRoot: string; layout: WorldLayout };
  const t = emptyTally(layout.dp);
  parentPort!.on('message', () => {
    collectDumps(kvRoot, layout, t);
    parentPort!.postMessage(t);
  });
}
