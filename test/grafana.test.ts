// dashboards/grafana/wavebus.json: every series a panel queries is served on a running job's
// /metrics (the in-process harness: a real coordinator with the guard, real agents and clients,
// TP=2 × DP=2, an incident and a KV dump in each replica), with the labels the panel groups by.
import * as fs from 'fs';
import * as path from 'path';
import { cleanup, ROOT, waitFor } from './helpers';
import type { StepTelemetry } from '../src/messages';
import { runReplicaWave, startHarnessJob, step, stopHarnessJob, type HarnessJob } from './job-harness';

jest.setTimeout(120000);

let job: HarnessJob | undefined;
afterAll(async () => {
  if (job) await stopHarnessJob(job);
  await cleanup();
});

const dashboard = JSON.parse(fs.readFileSync(path.join(ROOT, 'dashboards', 'grafana', 'wavebus.json'), 'utf8'));

/** Prometheus text → series name → the label sets of its samples. */
function samples(text: string): Map<string, Record<string, string>[]> {
  const out = new Map<string, Record<string, string>[]>();
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (\S+)$/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[3] ?? '').matchAll(/(\w+)="([^"]*)"/g)) labels[l[1]] = l[2];
    out.set(m[1], [...(out.get(m[1]) ?? []), labels]);
  }
  return out;
}

test('the dashboard is well formed', () => {
  expect(dashboard).toMatchObject({ uid: 'wavebus', title: 'wavebus' });
  expect(dashboard.templating.list).toEqual(expect.arrayContaining([expect.objectContaining({ name: 'datasource', type: 'datasource', query: 'prometheus' })]));
  const ids = dashboard.panels.map((p: any) => p.id);
  expect(new Set(ids).size).toBe(ids.length);
  for (const p of dashboard.panels) {
    expect(p.datasource).toEqual({ type: 'prometheus', uid: '${datasource}' });
    expect(p.gridPos.x + p.gridPos.w).toBeLessThanOrEqual(24);
    expect(p.targets.length).toBeGreaterThan(0);
    for (const t of p.targets) expect(t.expr).toMatch(/wavebus_/);
  }
  const titles = dashboard.panels.map((p: any) => p.title).join('\n');
  for (const want of [/incident/i, /dump/i, /late/i, /waves per second, per replica/i, /liveness/i, /memory/i]) expect(titles).toMatch(want);
  const prom = fs.readFileSync(path.join(ROOT, 'dashboards', 'prometheus.yml'), 'utf8');
  expect(prom).toMatch(/^scrape_configs:\n {2}- job_name: wavebus\n {4}metrics_path: \/metrics\n/m);
});

test("every series a panel queries is on a running job's /metrics, with the labels it groups by", async () => {
  job = await startHarnessJob({
    tp: 2,
    dp: 2,
    metricsPort: 0,
    // As `wavebus launch --runtime-config-hot-reload` (the demo): wavebus_config_error is served then.
    hotReload: true,
    runtimeConfig: {
      detector: { logits_finite: { enabled: true, on_trigger: ['report', 'dump_kv'] } },
      dump: { auto_max_times: 4, auto_cooldown_seconds: 0, free_headroom_bytes: 0 },
    },
  });
  const j = job;
  const prev: Array<StepTelemetry | undefined> = [undefined, undefined];
  for (let w = 1; w <= 7; w++) {
    for (const r of [0, 1]) {
      await runReplicaWave(j, r, w, prev[r]);
      prev[r] = { wave: w, requests: [step(`req-${r}`, [100 + w], [1 + r, 3 + r])], nonFinite: w === 2 ? [{ row: 0, reqId: `req-${r}`, kind: 'nan' }] : [] };
    }
  }
  const addr = j.coordinator.metricsAddress!;
  const scrape = async () => samples(await (await fetch(`http://${addr.host}:${addr.port}/metrics`)).text());
  // Dump results and the agents' heartbeats (late/missed counts) arrive on their own time.
  await waitFor(async () => {
    const s = await scrape();
    return (s.get('wavebus_dumps_total') ?? []).some((l) => l.result === 'ok') && (s.get('wavebus_late_vectors') ?? []).length === 4;
  }, 'dump results and every rank heartbeat on /metrics');
  const s = await scrape();
  for (const p of dashboard.panels) {
    for (const t of p.targets) {
      const series = [...new Set((t.expr as string).match(/\bwavebus_[a-z_]+\b/g))];
      for (const name of series) {
        const got = s.get(name);
        if (!got?.length) throw new Error(`panel "${p.title}" queries ${name}, which /metrics does not serve`);
        // The labels it groups by and its legend names are on the series.
        const by = [...(t.expr as string).matchAll(/by \(([^)]*)\)/g)].flatMap((m) => m[1].split(',').map((x) => x.trim()));
        const legend = [...(t.legendFormat as string).matchAll(/\{\{(\w+)\}\}/g)].map((m) => m[1]);
        for (const label of [...by, ...legend]) expect(got.some((l) => label in l)).toBe(true);
      }
    }
  }
  // What the panels show here: an incident per replica, waves of both replicas, 4 live agents.
  expect(s.get('wavebus_incidents_total')!.filter((l) => l.action === 'report' && l.incident_type === 'logits_finite').length).toBe(1);
  expect(s.get('wavebus_replica_waves_total')!.map((l) => l.dp).sort()).toEqual(['0', '1']);
  const text = await (await fetch(`http://${addr.host}:${addr.port}/metrics`)).text();
  expect(Number(/^wavebus_live_agents (\d+)/m.exec(text)![1])).toBe(4);
  expect(Number(/^wavebus_replica_waves_total\{dp="1"\} (\d+)/m.exec(text)![1])).toBeGreaterThanOrEqual(7);
  expect(Number(/^wavebus_coordinator_memory_bytes\{kind="rss"\} (\d+)/m.exec(text)![1])).toBeGreaterThan(1 << 20);
});
