// `wavebus status / dump / capture` against running jobs (docs/control.md): a whole job of real
// processes (coordinator, one agent per rank, `wavebus sim`) with the job's bus token; a TP=8
// coordinator with its eight agents on the bus for the table's width; and the clear answers when
// no coordinator is there, when one speaks another protocol version, and when the job ends.
import * as fs from 'fs';
import * as path from 'path';
import { Router } from 'zeromq';
import { AgentBus } from '../src/bus/agent-bus';
import { Coordinator } from '../src/bus/coordinator';
import { decodeAgentMessage, encodeCoordinatorMessage } from '../src/bus/frames';
import { PROTOCOL_VERSION } from '../src/bus/protocol-version';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import { loadCallDir } from '../src/snapshot/loader';
import { WIDTH } from '../src/tools/status-table';
import { freePortPair, spawnWavebus, tmpDir, waitFor } from './helpers';
import { jobStarter } from './sim-job';

jest.setTimeout(240000);

const quiet = createLogger('control-test', 'error');
const startJob = jobStarter();

/** The CLI as a child process, this process's event loop free meanwhile (an in-process coordinator answers it). */
async function cliAsync(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const p = spawnWavebus(args);
  const e = await p.exited;
  return { code: e.code, stdout: p.stdout(), stderr: p.stderr() };
}

/** Every line of a CLI's output fits the width. */
function widest(text: string): number {
  return Math.max(...text.split('\n').map((l) => l.length));
}

/** The bundles `capture --wait` printed: rank -> call dirs. */
function bundlesOf(stdout: string): Map<number, string[]> {
  const out = new Map<number, string[]>();
  for (const m of stdout.matchAll(/^rank (\d+) wave (\d+): (.+)$/gm)) {
    const r = Number(m[1]);
    out.set(r, [...(out.get(r) ?? []), m[3]]);
  }
  return out;
}

test('status, dump and capture on a running simulated TP=2 job with a bus token; a peer without the token is refused and nothing is armed', async () => {
  const cache = tmpDir('wavebus-control-cache-');
  const job = await startJob({ world: 2, steps: 100000, stepMs: 20, requests: 4000, untilStopped: true, busToken: true, agentEnv: { WAVEBUS_CACHE_ROOT: cache } });
  await job.waitWave(5);
  const at = ['--coordinator', `127.0.0.1:${job.port}`];
  const auth = [...at, '--bus-token-file', job.tokenFile!];
  // Asynchronous: the job's processes write to pipes this process reads, which a blocking spawn would stall.
  const cli = cliAsync;

  // The table: layout, replicas, ranks, config, and nothing wider than the terminal budget.
  const table = await cli(['status', ...auth]);
  expect({ status: table.code, stderr: table.stderr }).toEqual({ status: 0, stderr: '' });
  expect(table.stdout).toMatch(/layout DP1 x PP1 x TP2 \(2 ranks\)/);
  expect(table.stdout).toMatch(/^0 +0 +0 +0 +yes /m);
  expect(table.stdout).toMatch(/^1 +0 +0 +1 +yes /m);
  expect(table.stdout).toMatch(/^config v1 from .*runtime_config\.json \(hot reload on\)$/m);
  expect(table.stdout).toMatch(/^recorder: per agent \(WAVEBUS_RECORD_FORWARDS\)$/m);
  expect(widest(table.stdout)).toBeLessThanOrEqual(WIDTH);

  const json = async () => {
    const r = await cli(['status', '--json', ...auth]);
    expect({ status: r.code, stderr: r.stderr }).toEqual({ status: 0, stderr: '' });
    return JSON.parse(r.stdout);
  };
  const s0 = await json();
  expect(s0.protocol_version).toBe(PROTOCOL_VERSION);
  expect(s0.ranks['0'].protocol_version).toBe(PROTOCOL_VERSION);
  expect(s0.ranks['1'].live).toBe(true);
  expect(s0.replicas['0'].waves_per_s).toBeGreaterThan(0);
  expect(s0.captures).toEqual([]);
  expect(s0.recorder).toBe('per agent (WAVEBUS_RECORD_FORWARDS)');

  // Without the token: refused in words, counted, and nothing armed.
  const rogue = await cli(['capture', '--next', ...at]);
  expect(rogue.code).toBe(1);
  expect(rogue.stderr).toMatch(/requires the bus token for control requests.*nothing was armed \[ERR_CONTROL_REFUSED\]/);
  const s1 = await json();
  expect(s1.dropped.no_mac).toBeGreaterThanOrEqual(1);
  expect(s1.captures).toEqual([]);

  // A bad argument names itself, before anything is sent.
  const badRanks = await cli(['capture', '--next', '--ranks', '0,x', ...auth]);
  expect(badRanks.code).toBe(2);
  expect(badRanks.stderr).toMatch(/--ranks="0,x": bad entry "x"/);
  const badFormat = await cli(['capture', '--next', '--format', 'jpg', ...auth]);
  expect(badFormat.code).toBe(2);
  expect(badFormat.stderr).toMatch(/--format="jpg" is not a snapshot format/);
  const neither = await cli(['dump', ...auth]);
  expect(neither.code).toBe(2);
  expect(neither.stderr).toMatch(/--request \/ --all: give exactly one/);

  // --next: the forward of the wave the capture takes effect at, on both ranks.
  const next = await cli(['capture', '--next', '--format', 'npy', '--wait', '--timeout', '60000', ...auth]);
  expect({ status: next.code, stderr: next.stderr }).toEqual({ status: 0, stderr: '' });
  const nb = bundlesOf(next.stdout);
  expect([...nb.keys()].sort()).toEqual([0, 1]);
  const metas = await Promise.all([0, 1].map(async (r) => (await loadCallDir(nb.get(r)![0])).meta));
  expect(metas.map((m) => m.global_rank)).toEqual([0, 1]);
  expect(metas[0].global_step).toBe(metas[1].global_step);
  expect(metas[0].format).toBe('npy');
  expect(metas[0].selected_by).toEqual(['call_index']);
  expect(nb.get(0)![0].startsWith(cache)).toBe(true);

  // --request: a request that has not arrived yet (the sim's arrivals are 1 + i/2), prefix-matched,
  // two captures per rank, the same forwards on both ranks.
  const wave = (await job.status()).wave;
  const i = 2 * (wave + 60);
  const cap = await cli(['capture', '--request', `req-${i}`, '--max-captures', '2', '--wait', '--timeout', '90000', ...auth]);
  expect({ status: cap.code, stderr: cap.stderr }).toEqual({ status: 0, stderr: '' });
  const cb = bundlesOf(cap.stdout);
  expect([...cb.keys()].sort()).toEqual([0, 1]);
  const steps = await Promise.all(
    [0, 1].map(async (r) => {
      expect(cb.get(r)!.length).toBe(2);
      const ms = await Promise.all(cb.get(r)!.map(async (d) => (await loadCallDir(d)).meta));
      for (const m of ms) {
        expect(m.selected_by).toEqual(['request']);
        expect(m.matches.every((x: { request_id: string }) => x.request_id.startsWith(`req-${i}-`))).toBe(true);
      }
      return ms.map((m) => m.global_step).sort((a, b) => a - b);
    }),
  );
  expect({ steps: steps[1], out: cap.stdout, sim: steps[0].join() === steps[1].join() ? '' : job.sim?.stderr().slice(-3000) }).toEqual({ steps: steps[0], out: cap.stdout, sim: '' });
  // Each capture writes under a folder of its own (docs/control.md, "Where the bundles go"): the
  // second one's call0 sits beside the first's, which is still the --next forward it was.
  for (const r of [0, 1]) {
    expect(nb.get(r)![0]).toMatch(new RegExp(`/live/capture-1-wave\\d+/[^/]+/rank${r}/call0$`));
    expect(cb.get(r)!.every((d) => /\/live\/capture-2-wave\d+\//.test(d))).toBe(true);
    const kept = (await loadCallDir(nb.get(r)![0])).meta;
    expect({ by: kept.selected_by, step: kept.global_step }).toEqual({ by: ['call_index'], step: metas[r].global_step });
  }
  const s2 = await json();
  expect(s2.captures.map((c: { state: string }) => c.state)).toEqual(['done', 'done']);

  // dump --all: every running request, as a manual_dump raise; --wait exits 0 when every manifest is complete.
  const dump = await cli(['dump', '--all', '--wait', '--timeout', '60000', ...auth]);
  expect({ status: dump.code, stderr: dump.stderr }).toEqual({ status: 0, stderr: '' });
  const manifests = [...dump.stdout.matchAll(/^complete: (.+manifest\.json)$/gm)].map((m) => m[1]);
  expect(manifests.length).toBeGreaterThan(0);
  for (const f of manifests) {
    const m = JSON.parse(fs.readFileSync(f, 'utf8'));
    expect({ complete: m.complete, ranks: m.completed_ranks }).toEqual({ complete: true, ranks: [0, 1] });
    expect(f.startsWith(path.join(job.kvRoot, 'manual_trigger'))).toBe(true);
  }
  // A request that is not running: refused as a manual dump with no targets is, and exit 1.
  const none = await cli(['dump', '--request', 'no-such-request', '--wait', '--timeout', '30000', ...auth]);
  expect(none.code).toBe(1);
  expect(none.stdout).toMatch(/^skipped \(no_dump_targets\): .*dump_skipped\.json$/m);

  // These agents run without WAVEBUS_RECORD_FORWARDS: each rank says so (docs/recorder.md).
  const flush = await cli(['capture', '--flush-recorder', '--wait', '--timeout', '30000', ...auth]);
  expect(flush.code).toBe(1);
  expect(flush.stderr).toMatch(/rank 0 wave \d+: capture failed: the flight recorder is off on this rank \(set WAVEBUS_RECORD_FORWARDS\)/);
  expect(flush.stderr).toMatch(/rank 1 wave \d+: capture failed: the flight recorder is off on this rank/);

  // The job ends while a command waits: a clear answer, not a hang.
  const waiting = spawnWavebus(['capture', '--request', 'never-arrives', '--wait', '--timeout', '60000', ...auth]);
  await waitFor(() => /armed capture-/.test(waiting.stdout()), 'the capture to be armed', 30000);
  job.coordinator.child.kill('SIGTERM');
  const ended = await waiting.exited;
  expect({ code: ended.code, stderr: waiting.stderr() }).toEqual({ code: 3, stderr: expect.stringMatching(/stopped answering \(the job ended\?\) \[ERR_JOB_ENDED\]/) });
});

test('the status table of a TP=8 job is no wider than 100 columns', async () => {
  const port = await freePortPair();
  const layout = { worldSize: 8, tp: 8, pp: 1, dp: 1, cp: 1 };
  const c = new Coordinator({ port, layout, heartbeatMs: 100, deadAfterMs: 5000, logger: quiet });
  await c.start();
  const buses: AgentBus[] = [];
  try {
    for (let r = 0; r < 8; r++) {
      const identity = resolveIdentity({}, { rank: r, worldSize: 8, tp: 8, pp: 1 });
      const b = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity, heartbeatMs: 100, deadAfterMs: 5000, logger: quiet });
      buses.push(b);
      await b.start();
    }
    await waitFor(() => c.ready, 'eight agents on the bus', 30000);
    const r = await cliAsync(['status', '--coordinator', `127.0.0.1:${port}`]);
    expect({ status: r.code, stderr: r.stderr }).toEqual({ status: 0, stderr: '' });
    expect(r.stdout).toMatch(/layout DP1 x PP1 x TP8 \(8 ranks\)/);
    expect(r.stdout.match(/^\d +0 +0 +\d +yes /gm)?.length).toBe(8);
    expect(widest(r.stdout)).toBeLessThanOrEqual(WIDTH);
  } finally {
    for (const b of buses) await b.stop();
    await c.stop();
  }
});

test('a clear answer within --timeout when no coordinator is there, and when one speaks another protocol version', async () => {
  const port = await freePortPair();
  const t0 = Date.now();
  const gone = await cliAsync(['status', '--coordinator', `127.0.0.1:${port}`, '--timeout', '500']);
  expect(gone.code).toBe(3);
  expect(gone.stderr).toMatch(/no coordinator answered at tcp:\/\/127\.0\.0\.1:\d+ within 500 ms: is the job running/);
  expect(Date.now() - t0).toBeLessThan(15000);

  // A coordinator of the protocol before this one: it answers status with its version.
  const router = new Router({ linger: 0 });
  await router.bind(`tcp://127.0.0.1:${port + 1}`);
  const serve = (async () => {
    for await (const [id, payload] of router) {
      const d = decodeAgentMessage(payload, 1 << 20);
      if (!d.ok) continue;
      await router.send([id, encodeCoordinatorMessage({ epoch: 1, requestId: d.value.requestId, status: { protocolVersion: PROTOCOL_VERSION - 1, statusJson: '{}' } })]);
    }
  })().catch(() => undefined);
  try {
    const old = await cliAsync(['dump', '--all', '--coordinator', `127.0.0.1:${port}`, '--timeout', '5000']);
    expect(old.code).toBe(1);
    expect(old.stderr).toMatch(new RegExp(`bus protocol mismatch: the coordinator speaks version ${PROTOCOL_VERSION - 1}, .* version ${PROTOCOL_VERSION}; upgrade the coordinator`));
  } finally {
    router.close();
    await serve;
  }
});
