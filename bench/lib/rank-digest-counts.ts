// `bench overhead --rank-divergence`: the waves the coordinator compared, read from its /metrics
// (wavebus_rank_digest_waves_total by result) while the job still runs. The proof that the mode
// measured the detector at work: digests written and compared, not a feature bit left clear.
import * as http from 'http';

export type DigestCounts = Record<'agreed' | 'diverged' | 'partial' | 'unknown', number>;

/** The Prometheus text of 127.0.0.1:port/metrics (2 s bound, 4 MiB at most). */
function getMetrics(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/metrics', timeout: 2000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (s: string) => {
        body += s;
        if (body.length > 4 << 20) req.destroy(new Error(`/metrics on port ${port}: over 4 MiB`));
      });
      res.on('end', () => (res.statusCode === 200 ? resolve(body) : reject(new Error(`/metrics on port ${port}: HTTP ${res.statusCode}`))));
    });
    req.on('timeout', () => req.destroy(new Error(`/metrics on port ${port}: no answer in 2 s`)));
    req.on('error', reject);
  });
}

/** The waves compared so far, every replica together, by result. */
export function parseDigestCounts(text: string): DigestCounts {
  const out: DigestCounts = { agreed: 0, diverged: 0, partial: 0, unknown: 0 };
  for (const m of text.matchAll(/^wavebus_rank_digest_waves_total\{([^}]*)\} (\S+)$/gm)) {
    const result = /result="(\w+)"/.exec(m[1])?.[1];
    if (result !== undefined && result in out) out[result as keyof DigestCounts] += Number(m[2]);
  }
  return out;
}

export async function digestCounts(port: number): Promise<DigestCounts> {
  return parseDigestCounts(await getMetrics(port));
}
