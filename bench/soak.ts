// `wavebus bench soak [--agents 8] [--waves 1000] [--dp 2] [--dump-every 100] [--pace-ms 1] --json`
// (the documented full run: `--agents 64 --waves 10000 --dp 2`, many minutes on 2 cores).
//
// A coordinator process and N agent processes on loopback (bench/lib/proc-job.ts) run for many
// waves with a manual KV dump every --dump-every waves. This process plays the engine of --dp
// replicas, each stepping on its own (its own loop, wave numbers, requests and wave stream headed
// by its TP0): per wave, pendingDump() for the requests it is about to free (kept a wave when a
// dump is pending), the head's waveHead(w) with the telemetry of w-1, the forward (--pace-ms),
// endOfWave(w) on every rank of the replica. Each finished dump is checked (complete, exactly its
// replica's ranks, `inspect --verify` on its tree) and removed so the disk stays flat.
//
// Pass rule (printed as `rule`): 0 lost waves (an end_of_wave that timed out) in every replica;
// every replica served every manual dump and every dump job completed; no wavebus process died;
// and flat resources: for the coordinator and every agent, RSS at the end <= 1.25 x RSS after
// warm-up and open fds at the end <= fds after warm-up + 2. Reported beside the rule: which agent
// held each replica's host-receiver role, and every process's RSS sampled across the run
// (bench/lib/soak-samples.ts).
import * as fs from 'fs';
import { ConfigError } from '../src/errors';
import { MAX_TIMER_MS } from '../src/commands/flags';
import type { BenchArgs, BenchFlags } from './lib/flags';
import type { StepTelemetry } from '../src/messages';
import type { WavebusClient } from '../src/client/client';
import { alive, POOL_BLOCKS, ProcJob } from './lib/proc-job';
import { SoakWorkload } from './lib/soak-workload';
import { Collector, unfinishedDumps } from './lib/soak-collector';
import { SoakSamples, rssKb } from './lib/soak-samples';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export const RSS_MAX_RATIO = 1.25;
export const FD_MAX_GROWTH = 2;
export const RULE = `pass: 0 lost waves in every replica; every replica served every manual dump and every dump job completed (exactly its replica's ranks, inspect --verify clean); no wavebus process died; per process RSS end <= ${RSS_MAX_RATIO} x after warm-up and fds end <= after warm-up + ${FD_MAX_GROWTH}`;

export interface Usage {
  rssKb: number;
  fds: number;
}

function usage(pid: number): Usage {
  return { rssKb: rssKb(pid), fds: fs.readdirSync(`/proc/${pid}/fd`).length };
}

/** CPU µs (user + system, all threads) a process has used so far: /proc/<pid>/stat, USER_HZ 100. */
export function cpuUs(pid: number): number {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) * 10000;
  } catch {
    return 0; // exited: counted as a death elsewhere
  }
}

/** The flatness verdict for processes sampled after warm-up and at the end (same order). */
export function flatness(start: Usage[], end: Usage[]): { rssRatioMax: number; rssWorst: number; fdGrowthMax: number; rssFlat: boolean; fdsFlat: boolean } {
  const ratios = end.map((e, i) => e.rssKb / Math.max(1, start[i].rssKb));
  const rssRatioMax = Math.max(...ratios);
  const fdGrowthMax = Math.max(...end.map((e, i) => e.fds - start[i].fds));
  // Which process (its index in the samples): a failure must say whose memory grew, not only how much.
  const rssWorst = ratios.indexOf(rssRatioMax);
  return { rssRatioMax: +rssRatioMax.toFixed(3), rssWorst, fdGrowthMax, rssFlat: rssRatioMax <= RSS_MAX_RATIO, fdsFlat: fdGrowthMax <= FD_MAX_GROWTH };
}

/** The agents' usage; `roleOf(g)` names global rank g's part in the job (a replica head does more per wave). */
function summarize(start: Usage[], end: Usage[], roleOf: (g: number) => string): Record<string, unknown> {
  const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
  const f = flatness(start, end);
  const mb = (kb: number) => +(kb / 1024).toFixed(1);
  return {
    rss_start_mb_mean: mb(sum(start.map((u) => u.rssKb)) / start.length),
    rss_end_mb_mean: mb(sum(end.map((u) => u.rssKb)) / end.length),
    rss_ratio_max: f.rssRatioMax,
    rss_worst: { global_rank: f.rssWorst, role: roleOf(f.rssWorst), start_mb: mb(start[f.rssWorst].rssKb), end_mb: mb(end[f.rssWorst].rssKb) },
    fds_start_max: Math.max(...start.map((u) => u.fds)),
    fds_end_max: Math.max(...end.map((u) => u.fds)),
    fds_growth_max: f.fdGrowthMax,
    flat: f.rssFlat && f.fdsFlat,
  };
}

export const summary = 'A long run of N agents over DP replicas with periodic manual dumps: no wave lost, every dump complete, no process died, memory and fds flat.';
export const flags = {
  agents: { type: 'int', default: 8, describe: 'agent processes (= ranks); a multiple of --dp' },
  dp: { type: 'int', default: 2, describe: 'DP replicas, each its own wave stream and engine loop' },
  waves: { type: 'int', default: 1000, describe: 'waves each replica runs' },
  'dump-every': { type: 'int', default: 100, describe: 'a manual dump (hot reload of dump.manual_dump) every N waves of replica 0' },
  'pace-ms': { type: 'number', default: 1, describe: 'the forward: ms between a wave head and its end' },
  'bound-ms': { type: 'int', default: 1000, max: MAX_TIMER_MS, describe: "agents' end_of_wave bound (a wave later than this is lost)" },
} satisfies BenchFlags;

export async function run(a: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  if (a.agents % a.dp !== 0) throw new ConfigError(`bench soak: --agents ${a.agents} must be a multiple of --dp ${a.dp}`);
  return soak({ agents: a.agents, dp: a.dp, waves: a.waves, dumpEvery: a['dump-every'], paceMs: a['pace-ms'], boundMs: a['bound-ms'] });
}

export interface SoakOptions {
  agents: number;
  dp: number;
  waves: number;
  dumpEvery: number;
  paceMs: number;
  boundMs: number;
}

/** The requests among `ids` with a dump still to be copied (the engine keeps their blocks a wave). */
async function pendingOf(client: WavebusClient, ids: string[]): Promise<Set<string> | undefined> {
  let keep: Set<string> | undefined;
  for (const id of ids) if (await client.pendingDump(id)) (keep ??= new Set()).add(id);
  return keep;
}

export async function soak(o: SoakOptions): Promise<Record<string, unknown>> {
  const t0 = Date.now();
  const config = { detector: { logits_finite: { enabled: true, on_trigger: ['report'] } }, dump: { manual_dump: 0, free_headroom_bytes: 0, format: 'npy' } };
  const job = new ProcJob({
    world: o.agents, dp: o.dp, boundMs: o.boundMs, ackTimeoutMs: 30000, heartbeatMs: 500, config,
  });
  const lost = Array.from({ length: o.dp }, () => ({ lost: 0, settle: 0 }));
  const problems: string[] = [];
  const problem = (p: string) => problems.length < 40 && problems.push(p);
  const work = Array.from({ length: o.dp }, () => new SoakWorkload({ slots: 3, life: 48, blocksPerRequest: 2, poolBlocks: POOL_BLOCKS }));
  const prev: (StepTelemetry | undefined)[] = Array.from({ length: o.dp }, () => undefined);
  let dumpsAsked = 0;
  const sample = () => ({ coordinator: usage(job.coordinator.child.pid!), agents: job.agents.map((x) => usage(x.child.pid!)) });
  let startUsage: ReturnType<typeof sample> | undefined;
  // The coordinator's own view of its memory (status `memory`): a growing heap means something is kept.
  const coordMemory = () => job.status(5000).then((s) => s.json.memory as Record<string, number> | undefined, () => undefined);
  let startMemory: Promise<Record<string, number> | undefined> | undefined;
  const warmup = Math.min(200, Math.floor(o.waves / 5));
  // RSS across the run (about 50 samples) and who receives for each replica (bench/lib/soak-samples.ts).
  let samples: SoakSamples | undefined;

  const replicaLoop = async (r: number, from: number, to: number, settle: boolean): Promise<void> => {
    const head = job.clients[job.head(r)];
    for (let w = from; w <= to; w++) {
      if (!settle && r === 0) {
        if (w === warmup) {
          startUsage = sample();
          startMemory = coordMemory();
          samples?.take(w, true);
        } else if (w > warmup) samples?.take(w);
        if (w % o.dumpEvery === 0) {
          job.manualDump(++dumpsAsked);
          collector?.collect();
        }
      }
      const keep = await pendingOf(head, work[r].finishedHolding());
      const tel = work[r].step(w, keep);
      const ends = await job.step(r, w, prev[r], o.paceMs);
      prev[r] = tel;
      const n = ends.filter((e) => e.timedOut).length;
      if (settle) lost[r].settle += n;
      else lost[r].lost += n;
    }
  };
  let collector: Collector | undefined;
  // Interrupted (Ctrl-C, a job scheduler's SIGTERM): the coordinator, agents, shm and dirs still go.
  const stop = (sig: NodeJS.Signals) => void job.close().finally(() => process.exit(sig === 'SIGINT' ? 130 : 143));
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  try {
    await job.start();
    collector = new Collector(job.kvRoot, job.layout);
    samples = new SoakSamples(() => [job.coordinator, ...job.agents].map((p) => p.child.pid!), job.runDir, o.dp, Math.max(1, Math.floor(o.waves / 50)));
    const waveStart = Date.now();
    // The sidecar of this host (coordinator and every agent) from the first wave to the last.
    const sidecarCpu = () => [job.coordinator, ...job.agents].reduce((a, p) => a + cpuUs(p.child.pid!), 0);
    const cpuStart = sidecarCpu();
    // Every replica steps on its own: concurrent loops, not lockstep.
    await Promise.all(Array.from({ length: o.dp }, (_, r) => replicaLoop(r, 1, o.waves, false)));
    const waveSeconds = (Date.now() - waveStart) / 1000;
    const sidecarCpuUs = sidecarCpu() - cpuStart;
    // Keep stepping (counted apart) until every replica served every manual dump and no dump is pending.
    let next = o.waves + 1;
    let st: Record<string, any> = {};
    const settleBy = Date.now() + 60000;
    for (;;) {
      st = (await job.status(5000)).json;
      const served = Object.values(st.guard_replicas ?? {}).map((g: any) => g.manual_dump_done as number);
      if (served.length === o.dp && served.every((n) => n >= dumpsAsked) && (st.dumps?.pending ?? 1) === 0) break;
      if (Date.now() > settleBy) {
        problem(`settle: replicas served ${JSON.stringify(served)} of ${dumpsAsked} manual dumps, ${st.dumps?.pending} dump(s) pending after 60 s`);
        break;
      }
      await Promise.all(Array.from({ length: o.dp }, (_, r) => replicaLoop(r, next, next + 4, true)));
      next += 5;
      await sleep(20);
    }
    collector!.collect();
    const tally = await collector!.tally();
    problems.push(...tally.problems);
    const endUsage = sample();
    samples!.take(next, true);
    const receiverRanks = Array.from({ length: o.dp }, (_, r) => [...samples!.receivers].reverse().find((x) => x.replica === r)?.global_rank ?? -1).filter((g) => g >= 0);
    const endMemory = await coordMemory();
    const memStart = (await startMemory) ?? endMemory;
    const mb = (m: Record<string, number> | undefined, k: string) => (m?.[k] === undefined ? null : +(m[k] / 2 ** 20).toFixed(1));
    const su = startUsage ?? endUsage;
    // Dirs still without a manifest: a dump that never finished.
    for (const f of unfinishedDumps(job.kvRoot)) problem(`${f}: no manifest at the end`);
    const dead = [job.coordinator, ...job.agents].filter((p) => !alive(p));
    if (dead.length > 0) problem(`${dead.length} wavebus process(es) died: ${dead.flatMap((p) => p.stderr.slice(-2)).join(' | ').slice(0, 1500)}`);
    const coordFlat = flatness([su.coordinator], [endUsage.coordinator]);
    const agentsFlat = flatness(su.agents, endUsage.agents);
    const headOf = new Map(Array.from({ length: o.dp }, (_, r) => [job.head(r), r]));
    const agentRole = (g: number) => [headOf.has(g) ? `replica ${headOf.get(g)}'s head` : 'not a replica head', ...(receiverRanks.includes(g) ? ["its host's receiver"] : [])].join(', ');
    const stats = job.clients.map((c) => c.stats);
    const replicas = tally.replicas.map((c, r) => {
      const ranks = job.ranksOf(r);
      return {
        replica: r,
        ranks,
        lost_waves: lost[r].lost,
        settle_lost_waves: lost[r].settle,
        manual_dumps_served: st.guard_replicas?.[String(r)]?.manual_dump_done ?? null,
        dump_waves: c.dumpWaves.length,
        jobs_complete: c.jobsComplete,
        jobs_incomplete: c.jobsIncomplete,
        dumps_skipped: c.dumpsSkipped,
        bundles_verified: c.bundlesVerified,
        deferred_frees: work[r].deferredFrees,
        requests_admitted: work[r].admitted,
        vector_waits: ranks.reduce((n, g) => n + stats[g].vectorWaits, 0),
        late_vectors: ranks.reduce((n, g) => n + stats[g].lateVectors, 0),
      };
    });
    const failures: string[] = [];
    for (const x of replicas) {
      if (x.lost_waves > 0) failures.push(`replica ${x.replica}: ${x.lost_waves} lost waves`);
      if (x.manual_dumps_served !== dumpsAsked) failures.push(`replica ${x.replica}: served ${x.manual_dumps_served} of ${dumpsAsked} manual dumps`);
      if (x.dump_waves !== dumpsAsked) failures.push(`replica ${x.replica}: dumps found at ${x.dump_waves} waves, ${dumpsAsked} asked`);
      if (x.jobs_incomplete > 0 || x.dumps_skipped > 0) failures.push(`replica ${x.replica}: ${x.jobs_incomplete} incomplete, ${x.dumps_skipped} skipped dump(s)`);
    }
    if ((st.dumps?.freed_before_copy ?? 0) > 0) failures.push(`${st.dumps.freed_before_copy} dump(s) freed before their copy`);
    if (dead.length > 0) failures.push(`${dead.length} process(es) died`);
    if (!coordFlat.rssFlat) failures.push(`RSS grew: coordinator x${coordFlat.rssRatioMax}`);
    if (!agentsFlat.rssFlat) failures.push(`RSS grew: agent of global rank ${agentsFlat.rssWorst} (${agentRole(agentsFlat.rssWorst)}) x${agentsFlat.rssRatioMax}`);
    if (!coordFlat.fdsFlat || !agentsFlat.fdsFlat) failures.push(`fds grew: coordinator +${coordFlat.fdGrowthMax}, agents max +${agentsFlat.fdGrowthMax}`);
    if (problems.length > 0 && failures.length === 0) failures.push(`${problems.length} problem(s)`);
    return {
      agents: o.agents,
      dp: o.dp,
      waves: o.waves,
      waves_per_sec: +((o.waves * o.dp) / waveSeconds).toFixed(1),
      lost_waves: replicas.reduce((n, x) => n + x.lost_waves, 0),
      // Per wave of one replica (waves x dp of them): the coordinator's and every agent's CPU, the
      // dumps' copies included (one every --dump-every waves), from the first wave to the last.
      sidecar_cpu_us_per_wave: Math.round(sidecarCpuUs / (o.waves * o.dp)),
      dumps_asked: dumpsAsked,
      jobs_complete: replicas.reduce((n, x) => n + x.jobs_complete, 0),
      jobs_incomplete: replicas.reduce((n, x) => n + x.jobs_incomplete, 0),
      bundles_verified: replicas.reduce((n, x) => n + x.bundles_verified, 0),
      freed_before_copy: st.dumps?.freed_before_copy ?? null,
      replicas,
      coordinator: {
        rss_start_mb: +(su.coordinator.rssKb / 1024).toFixed(1),
        rss_end_mb: +(endUsage.coordinator.rssKb / 1024).toFixed(1),
        rss_ratio: coordFlat.rssRatioMax,
        heap_used_start_mb: mb(memStart, 'heap_used'),
        heap_used_end_mb: mb(endMemory, 'heap_used'),
        new_space_start_mb: mb(memStart, 'new_space'),
        new_space_end_mb: mb(endMemory, 'new_space'),
        external_start_mb: mb(memStart, 'external'),
        external_end_mb: mb(endMemory, 'external'),
        fds_start: su.coordinator.fds,
        fds_end: endUsage.coordinator.fds,
        flat: coordFlat.rssFlat && coordFlat.fdsFlat,
      },
      agents_usage: summarize(su.agents, endUsage.agents, agentRole),
      // Which agent received for each replica (held the flock), and RSS sampled across the run.
      receivers: receiverRanks.map((g) => ({ global_rank: g, role: agentRole(g) })),
      rss_samples: samples!.summary(receiverRanks),
      rule: RULE,
      pass: failures.length === 0,
      failures,
      problems,
      seconds: (Date.now() - t0) / 1000,
    };
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
    await collector?.close();
    await job.close();
  }
}
