// What the rank_divergence tests share (rank-divergence.test.ts on the PyTorch engine,
// rank-divergence-transformers.test.ts and transformers.test.ts on transformers): the coordinator's
// /metrics read while a job runs, its rank_divergence reports, and the checks of the incident one
// rank's logits row pushed to another argmax makes, whichever engine ran it.
import * as fs from 'fs';
import * as http from 'http';
import * as path from 'path';

export interface DivergenceReport {
  req_id: string;
  incident_type: string;
  detect_wave: number;
  dump_arm_wave: number | null;
  detail: Record<string, any>;
}

/** The coordinator's /metrics text, '' while it does not answer. */
export function getMetrics(port: number): Promise<string> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/metrics', timeout: 3000, agent: false }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve(body));
    });
    req.on('error', () => resolve(''));
    req.on('timeout', () => req.destroy());
  });
}

/** One sample's value (the first line of `name` whose labels contain `labels`), 0 when absent. */
export function metric(text: string, name: string, labels: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(labels));
  return line ? Number(line.split(' ').pop()) : 0;
}

/** Reads /metrics every 200 ms while the job runs (it goes with the job); stop() gives the last one with wavebus samples. */
export function pollMetrics(port: number): { stop: () => Promise<string> } {
  let metrics = '';
  let polling = true;
  const poll = (async () => {
    while (polling) {
      const m = await getMetrics(port);
      if (m.includes('wavebus_')) metrics = m;
      await new Promise((r) => setTimeout(r, 200));
    }
  })();
  return {
    stop: async () => {
      polling = false;
      await poll;
      return metrics;
    },
  };
}

/** The rank_divergence reports under a runtime's report dir, by detect wave. */
export function divergenceReports(reportDir: string): DivergenceReport[] {
  const rd = path.join(reportDir, 'rank_divergence');
  const reports = fs.existsSync(rd) ? fs.readdirSync(rd).filter((n) => n.endsWith('.json')).map((n) => JSON.parse(fs.readFileSync(path.join(rd, n), 'utf8')) as DivergenceReport) : [];
  return reports.sort((a, b) => a.detect_wave - b.detect_wave);
}

/**
 * The first incident of a TP=2 job whose rank `rank` sampled another token for `req` (its row
 * `row`) at `wave`: detected in that wave, the outputs (not the inputs) differed, the rank, row and
 * request named, both ranks known; its dump armed within `armedWithin` waves and copied on both ranks.
 */
export function expectOutputsDivergence(
  reports: DivergenceReport[],
  dumps: { incident_type: string; req_id?: string; arm_wave: number; completed_ranks: number[] }[],
  want: { wave: number; rank: number; row: number; req: string; armedWithin: number },
): DivergenceReport {
  expect(reports.length).toBeGreaterThanOrEqual(1);
  const first = reports[0];
  expect(first.detect_wave).toBe(want.wave);
  expect(first.detail.wave).toBe(want.wave);
  expect(first.detail.groups.map((g: { ranks: number[] }) => g.ranks)).toEqual([[1 - want.rank], [want.rank]].sort((a, b) => a[0] - b[0]));
  expect(first.detail.divergent_ranks).toEqual([want.rank]);
  expect(first.detail.first_row).toBe(want.row);
  expect(first.req_id).toBe(want.req);
  expect(first.detail.inputs_differed).toBe(false);
  expect(first.detail.divergence).toBe('outputs');
  expect(first.detail.unknown_ranks).toEqual([]);
  expect(first.detail.row_tokens['0']).not.toBe(first.detail.row_tokens['1']);
  expect(first.dump_arm_wave).not.toBeNull();
  expect(first.dump_arm_wave! - want.wave).toBeLessThanOrEqual(want.armedWithin);
  const dump = dumps.find((d) => d.incident_type === 'rank_divergence' && d.req_id === want.req && d.arm_wave === first.dump_arm_wave);
  expect(dump?.completed_ranks).toEqual([0, 1]);
  return first;
}
