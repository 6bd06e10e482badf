// rank_divergence against a real engine: examples/torch-engine at TP=2 under `wavebus launch`,
// each rank's client writing the digests of its forward's inputs and of its sampled token column
// into its decision ring, the agents carrying them to the coordinator. Faults are made by real
// means inside the engine: one rank's logits row pushed to another argmax, one rank's scheduler
// leaving a request out of its batch; and a healthy greedy run (both ranks sample alike) with one
// rank's agent frozen (SIGSTOP) for a while.
import * as fs from 'fs';
import * as http from 'http';
import * as path from 'path';
import { PYTHON, ROOT, cleanup, freePortPair, readManifests, spawnWavebus, tmpDir } from './helpers';

afterAll(cleanup);

const ENGINE = path.join(ROOT, 'examples', 'torch-engine');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Report {
  req_id: string;
  incident_type: string;
  detect_wave: number;
  dump_arm_wave: number | null;
  detail: Record<string, any>;
}

function get(port: number, p: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path: p, timeout: 3000, agent: false }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve(body));
    });
    req.on('error', reject);
    req.on('timeout', () => req.destroy(new Error(`${p}: no answer`)));
  });
}

function descendants(pid: number): number[] {
  const parent = new Map<number, number>();
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      parent.set(Number(d), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      /* gone */
    }
  }
  const out: number[] = [];
  const walk = (p: number) => {
    for (const [c, pp] of parent) if (pp === p) (out.push(c), walk(c));
  };
  walk(pid);
  return out;
}

const cmdline = (pid: number) => {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return [];
  }
};

interface Run {
  reports: Report[];
  dumps: { incident_type: string; req_id?: string; arm_wave: number; complete: boolean; completed_ranks: number[] }[];
  metrics: string;
}

/** One TP=2 launch of the engine with rank_divergence alone on (report + dump_kv); `during` runs while it does. */
async function runEngine(engineArgs: string[], during?: (launchPid: number, metricsPort: number) => Promise<void>): Promise<Run> {
  const dir = tmpDir('wavebus-rankdiv-');
  const runtimeConfig = {
    detector: { rank_divergence: { enabled: true } },
    actions: { defaults: { on_trigger: ['report', 'dump_kv'] } },
    dump: { auto_max_times: 4, free_headroom_bytes: 0 },
  };
  const port = await freePortPair();
  const metricsPort = await freePortPair();
  const launch = spawnWavebus(
    [
      'launch', '--nproc-per-node', '2', '--tp', '2', '--port', String(port), '--metrics-port', String(metricsPort),
      '--additional-config', JSON.stringify({ runtime_config: runtimeConfig }),
      '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000',
      '--', PYTHON, path.join(ENGINE, 'torchrun_env.py'), path.join(ENGINE, 'engine.py'), '--out', path.join(dir, 'out'), ...engineArgs,
    ],
    { env: { ...process.env, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache') }, cwd: dir },
  );
  let metrics = '';
  let polling = true;
  // The coordinator's /metrics, read while the job runs (it goes with the job).
  const poll = (async () => {
    while (polling) {
      const m = await get(metricsPort, '/metrics').catch(() => '');
      if (m.includes('wavebus_')) metrics = m;
      await sleep(200);
    }
  })();
  if (during) await during(launch.child.pid!, metricsPort);
  const { code } = await launch.exited;
  polling = false;
  await poll;
  if (code !== 0) throw new Error(`launch exited ${code}\n${launch.stdout().slice(-4000)}\n${launch.stderr().slice(-6000)}`);
  const reportDir = path.join(dir, 'runtime', 'report');
  const rd = path.join(reportDir, 'rank_divergence');
  const reports = fs.existsSync(rd) ? fs.readdirSync(rd).filter((n) => n.endsWith('.json')).map((n) => JSON.parse(fs.readFileSync(path.join(rd, n), 'utf8')) as Report) : [];
  reports.sort((a, b) => a.detect_wave - b.detect_wave);
  return { reports, dumps: readManifests(path.join(reportDir, 'kv_cache')), metrics };
}

function metric(text: string, name: string, labels: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(labels));
  return line ? Number(line.split(' ').pop()) : 0;
}

test("one rank's logits pushed to another argmax at step 6: the incident names the wave, that rank, the row and the request; both ranks dump", async () => {
  // Requests arrive every 2 steps: at forward 6 the batch holds req-0, req-1, req-2 (rows 0..2).
  const run = await runEngine(['--requests', '3', '--max-tokens', '12', '--fault', 'diverge:6:1:1']);
  expect(run.reports.length).toBeGreaterThanOrEqual(1);
  const first = run.reports[0];
  expect(first.detect_wave).toBe(6);
  expect(first.detail.wave).toBe(6);
  expect(first.detail.groups.map((g: { ranks: number[] }) => g.ranks)).toEqual([[0], [1]]);
  expect(first.detail.divergent_ranks).toEqual([1]);
  expect(first.detail.first_row).toBe(1);
  expect(first.req_id).toBe('req-1');
  expect(first.detail.inputs_differed).toBe(false);
  expect(first.detail.divergence).toBe('outputs');
  expect(first.detail.unknown_ranks).toEqual([]);
  const [t0, t1] = [first.detail.row_tokens['0'], first.detail.row_tokens['1']];
  expect(t0).not.toBe(t1);
  // Named within a few waves: detected at a head shortly after the wave (decided one wave ahead).
  expect(first.dump_arm_wave).not.toBeNull();
  expect(first.dump_arm_wave! - 6).toBeLessThanOrEqual(4);
  // Its KV dump was copied on every rank of the replica.
  const dump = run.dumps.find((d) => d.incident_type === 'rank_divergence' && d.req_id === 'req-1' && d.arm_wave === first.dump_arm_wave);
  expect(dump).toBeDefined();
  expect(dump!.completed_ranks).toEqual([0, 1]);
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="diverged"')).toBeGreaterThanOrEqual(1);
  expect(metric(run.metrics, 'wavebus_incidents_total', 'incident_type="rank_divergence",action="report"')).toBeGreaterThanOrEqual(1);
  // Before the fault every wave agreed.
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="agreed"')).toBeGreaterThanOrEqual(4);
}, 180000);

test("one rank's scheduler leaves a request out of forward 6: the incident says the inputs already differed", async () => {
  const run = await runEngine(['--requests', '3', '--max-tokens', '12', '--fault', 'drop:6:2:1']);
  expect(run.reports.length).toBeGreaterThanOrEqual(1);
  const first = run.reports[0];
  expect(first.detail.wave).toBe(6);
  expect(first.detail.inputs_differed).toBe(true);
  expect(first.detail.divergence).toBe('inputs');
  expect(first.detail.input_groups.map((g: { ranks: number[] }) => g.ranks)).toEqual([[0], [1]]);
  expect(first.detail.first_row).toBe(2);
  expect(first.req_id).toBe('req-2');
}, 180000);

test('healthy greedy run (both ranks sample alike): no alert over a long run; a frozen agent (SIGSTOP) gives unknown waves, never an alert', async () => {
  let froze = false;
  const run = await runEngine(['--requests', '4', '--max-tokens', '60', '--step-sleep-ms', '15'], async (launchPid, metricsPort) => {
    // Rank 1's agent, once waves have been compared.
    let agent: number | undefined;
    const until = Date.now() + 60000;
    while (Date.now() < until) {
      const m = await get(metricsPort, '/metrics').catch(() => '');
      agent = descendants(launchPid).find((p) => {
        const c = cmdline(p);
        const i = c.indexOf('--rank');
        return c.includes('agent') && i >= 0 && c[i + 1] === '1';
      });
      if (agent && metric(m, 'wavebus_rank_digest_waves_total', 'result="agreed"') >= 10) break;
      await sleep(200);
    }
    expect(agent).toBeDefined();
    process.kill(agent!, 'SIGSTOP');
    froze = true;
    await sleep(1500);
    process.kill(agent!, 'SIGCONT');
  });
  expect(froze).toBe(true);
  expect(run.reports).toEqual([]);
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="diverged"')).toBe(0);
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="agreed"')).toBeGreaterThanOrEqual(40);
  // The waves rank 1 did not report while frozen: unknown, counted against it.
  expect(metric(run.metrics, 'wavebus_rank_digest_unknown_waves', 'rank="1"')).toBeGreaterThanOrEqual(1);
  expect(metric(run.metrics, 'wavebus_rank_digest_waves_total', 'result="unknown"')).toBeGreaterThanOrEqual(1);
}, 240000);
