// An incident's verdict in the coordinator's status and /metrics (docs/verdict.md "In status and
// /metrics"): a real coordinator with a bus token, notes sent over its control channel by the
// control client `wavebus verdict --coordinator` uses, `wavebus status` (JSON and table) and
// /metrics over HTTP; with the runtime guard, a verdict written into the incident report naming its
// flush. test/verdict.test.ts sends one from the CLI after a real verdict. And the CLI's refusal of
// a --dp the incident's replica is past, on a flush made by hand (checked before any replay).
import { Coordinator } from '../src/bus/coordinator';
import { createTokenFile, loadBusToken } from '../src/bus/auth';
import { createLogger } from '../src/log';
import * as fs from 'fs';
import * as path from 'path';
import { AgentBus } from '../src/bus/agent-bus';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import { resolveIdentity } from '../src/launch/identity';
import type { StepTelemetry } from '../src/messages';
import { ControlClient } from '../src/tools/control-client';
import { cleanup, freePortPair, spawnWavebus, tmpDir, waitFor } from './helpers';

afterAll(cleanup);

const quiet = createLogger('verdict-status-test', 'error');

async function cli(args: string[]) {
  const p = spawnWavebus(args);
  const e = await p.exited;
  return { code: e.code, stdout: p.stdout(), stderr: p.stderr() };
}

test('verdict notes: kept, re-judged without double counting, refused with the field named; shown by status and counted by /metrics per verdict and host', async () => {
  const dir = tmpDir('wavebus-verdict-status-');
  const tokenFile = createTokenFile(dir);
  const port = await freePortPair();
  const c = new Coordinator({ port, layout: { worldSize: 4, tp: 2, pp: 1, dp: 2, cp: 1 }, metricsPort: 0, busToken: loadBusToken(tokenFile, {}), logger: quiet, heartbeatMs: 200, deadAfterMs: 5000 });
  await c.start();
  const client = new ControlClient({ coordinator: { host: '127.0.0.1', port }, busToken: loadBusToken(tokenFile, {}) });
  const stranger = new ControlClient({ coordinator: { host: '127.0.0.1', port } });
  try {
    await client.probe(5000);
    const note = (v: Record<string, unknown>) => client.request({ verdict: { incident: 'incident-wave12-dp0', verdict: 'transient', host: 'hostA', devices: [0, 1], replica: 0, ranks: [0, 1], reason: 'r', ...v } }, 5000);
    expect((await note({})).id).toBe('incident-wave12-dp0');
    // The same incident judged again moves to its new verdict; another incident adds.
    await note({ verdict: 'device-local', reason: 'the recorded outputs reproduce on host hostA devices 0,1 only', fingerprint: 'device 0: hostname a1, cpu Test CPU\nmicrocode 0x1' });
    await note({ incident: 'incident-wave30-dp1', verdict: 'deterministic', host: 'hostB', devices: [2, 3], replica: 1, ranks: [2, 3], bisectModule: 'model.layers.1.mlp.up_proj' });
    // Garbage is refused, naming the field; nothing is kept.
    const refused = async (v: Record<string, unknown>, want: string) => {
      await expect(note(v)).rejects.toThrow(want);
    };
    await refused({ verdict: 'maybe' }, 'verdict.verdict: expected deterministic | device-local | transient | inconclusive, got "maybe"');
    await refused({ incident: '../../etc' }, 'verdict.incident: expected incident-wave<w>');
    await refused({ host: 'host A' }, 'verdict.host: expected letters, digits');
    await refused({ ranks: [9] }, 'verdict.ranks: rank 9 is not in this job (world size 4)');
    await refused({ bisectModule: 'x y' }, 'verdict.bisect_module');
    // Without the job's bus token the note is refused before it is read: nothing kept.
    await expect(stranger.request({ verdict: { incident: 'incident-wave99', verdict: 'transient', host: 'evil' } }, 1000)).rejects.toThrow('this coordinator requires the bus token for control requests');

    const st = await cli(['status', '--coordinator', `127.0.0.1:${port}`, '--bus-token-file', tokenFile, '--json']);
    expect({ code: st.code, stderr: st.stderr }).toEqual({ code: 0, stderr: '' });
    const doc = JSON.parse(st.stdout);
    expect(doc.verdicts.counts).toEqual({ deterministic: 1, 'device-local': 1, transient: 0, inconclusive: 0 });
    // The device fingerprint comes as one line (control characters from the bus become spaces).
    expect(doc.verdicts.latest.map((v: any) => v.fingerprint)).toEqual(['device 0: hostname a1, cpu Test CPU microcode 0x1', null]);
    expect(doc.verdicts.latest.map((v: any) => [v.incident, v.verdict, v.host, v.devices, v.bisect_module])).toEqual([
      ['incident-wave12-dp0', 'device-local', 'hostA', [0, 1], null],
      ['incident-wave30-dp1', 'deterministic', 'hostB', [2, 3], 'model.layers.1.mlp.up_proj'],
    ]);
    const table = await cli(['status', '--coordinator', `127.0.0.1:${port}`, '--bus-token-file', tokenFile]);
    expect(table.stdout).toContain('verdicts: deterministic 1, device-local 1\n');
    // Clipped to the table's width.
    expect(table.stdout).toContain('  incident-wave12-dp0 DEVICE-LOCAL host hostA devices 0,1: the recorded outputs reproduce on host...\n');
    expect(table.stdout).toContain('...\n    device 0: hostname a1, cpu Test CPU microcode 0x1\n  incident-wave30-dp1 DETERMINISTIC host hostB devices 2,3: r\n');

    const text = await (await fetch(`http://127.0.0.1:${c.metricsAddress!.port}/metrics`)).text();
    const series = (verdict: string, host: string) => Number(text.match(new RegExp(`^wavebus_incident_verdicts\\{verdict="${verdict}",host="${host}"\\} (\\d+)$`, 'm'))?.[1]);
    expect([series('transient', 'hostA'), series('device-local', 'hostA'), series('deterministic', 'hostB'), series('inconclusive', 'other')]).toEqual([0, 1, 1, 0]);
    expect(text).not.toContain('host="evil"');
  } finally {
    await client.close();
    await stranger.close();
    await c.stop();
  }
}, 60000);

test('a verdict on an incident\'s recorder flush is written into the incident report that names the flush (whole, its mode kept); a note on another flush leaves it alone', async () => {
  // A real coordinator with the guard and two agents' bus sides recording (K=8): a NaN at wave 3 is an incident whose dump flushes the recorders.
  const layout = { worldSize: 2, tp: 2, pp: 1, dp: 1, cp: 1 };
  const root = tmpDir('wavebus-verdict-report-');
  const config = { report: { save_sensitive_info: true }, detector: { logits_finite: { enabled: true, on_trigger: ['report', 'dump_kv'] } }, dump: { auto_max_times: 10, auto_cooldown_seconds: 0 } };
  const startup = parseStartupOptions(JSON.stringify({ runtime_config: config }), {}, root);
  const guard = new Guard({ startup, layout, log: quiet });
  const port = await freePortPair();
  const c = new Coordinator({ port, layout, heartbeatMs: 100, deadAfterMs: 5000, policy: guard, logger: quiet });
  await c.start();
  const buses = [0, 1].map((rank) => new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity: resolveIdentity({}, { rank, worldSize: 2, tp: 2, pp: 1 }), heartbeatMs: 100, deadAfterMs: 5000, recorderForwards: 8, logger: quiet }));
  const client = new ControlClient({ coordinator: { host: '127.0.0.1', port } });
  try {
    let snaps = 0;
    for (const b of buses) b.on('snapshot', () => snaps++);
    await Promise.all(buses.map((b) => b.start()));
    await waitFor(() => snaps >= 2, 'both agents joined');
    const tel = (wave: number, nan: boolean): StepTelemetry => ({
      wave,
      requests: [{ reqId: 'req-a', newTokenIds: [1], newTokenLogprobs: [], newTokenRanks: [], draftLen: 0, accepted: 0, blockIds: [4, 5], finished: false, freed: false, promptLen: 10, numOutputTokens: 0 }],
      nonFinite: nan ? [{ row: 0, reqId: 'req-a', kind: 'nan' }] : [],
    });
    c.beginWave(1, null);
    c.beginWave(2, tel(1, false));
    c.beginWave(3, tel(2, true));
    const typeDir = path.join(startup.reportDir, 'logits_finite');
    await waitFor(() => fs.existsSync(typeDir) && fs.readdirSync(typeDir).length > 0, 'the incident report');
    const file = path.join(typeDir, fs.readdirSync(typeDir)[0]);
    const before = JSON.parse(fs.readFileSync(file, 'utf8'));
    const flush = path.basename(before.recorder_flush.dir);
    expect(flush).toBe(`incident-wave${before.dump_arm_wave}`);
    expect(before).not.toHaveProperty('verdict');
    const mode = fs.statSync(file).mode & 0o777;
    await client.probe(5000);
    // Another flush's verdict: no report names it; this one is untouched.
    await client.request({ verdict: { incident: 'incident-wave999', verdict: 'transient', host: 'hostA', ranks: [0, 1], reason: 'r' } }, 5000);
    expect(JSON.parse(fs.readFileSync(file, 'utf8'))).toEqual(before);
    const fingerprint = 'device 0: hostname a1, cpu Test CPU, microcode 0x1';
    await client.request({ verdict: { incident: flush, verdict: 'device-local', host: 'hostA', devices: [0, 1], ranks: [0, 1], reason: 'the recorded outputs reproduce on host hostA devices 0,1 only', fingerprint } }, 5000);
    const after = JSON.parse(fs.readFileSync(file, 'utf8'));
    expect(after).toEqual({ ...before, verdict: { incident: flush, verdict: 'device-local', host: 'hostA', devices: [0, 1], replica: 0, ranks: [0, 1], reason: 'the recorded outputs reproduce on host hostA devices 0,1 only', bisect_module: null, fingerprint, time: expect.any(String) } });
    expect(fs.statSync(file).mode & 0o777).toBe(mode); // token ids in it (save_sensitive_info): still owner-only
    expect(mode).toBe(0o600);
    // Judged again: the report holds the newest verdict.
    await client.request({ verdict: { incident: flush, verdict: 'transient', host: 'hostA', devices: [0, 1], ranks: [0, 1], reason: 'again' } }, 5000);
    expect(JSON.parse(fs.readFileSync(file, 'utf8')).verdict).toMatchObject({ verdict: 'transient', reason: 'again', fingerprint: null });
  } finally {
    await client.close();
    await Promise.all(buses.map((b) => b.stop()));
    await c.stop();
    guard.close();
  }
}, 60000);

test('verdict refuses a --dp the incident\'s replica is past, naming the flag and both numbers (nothing replayed)', async () => {
  // A recorder flush of replica 3 (TP=2: ranks 6, 7), made by hand: the check comes before any replay.
  const tree = tmpDir('wavebus-verdict-dp-');
  for (const [t, g] of [[0, 6], [1, 7]]) {
    const call = path.join(tree, 'recorder', 'incident-wave7-dp3', 'h0', `rank${g}`, 'call0');
    fs.mkdirSync(call, { recursive: true });
    fs.writeFileSync(path.join(call, 'meta.json'), JSON.stringify({ schema: 1, format: 'pt', inputs: [], hash: 'h0', global_rank: g, tp_rank: t, dp_rank: 3, call_index: 0, selected_by: ['recorder'] }));
  }
  const engineOut = tmpDir('wavebus-verdict-dp-out-');
  const r = await cli(['verdict', tree, '--engine-out', engineOut, '--dp', '2']);
  expect({ code: r.code, stdout: r.stdout }).toEqual({ code: 2, stdout: '' });
  expect(r.stderr).toContain('--dp 2: the incident incident-wave7-dp3 is of replica 3');
  // Without --dp the job is taken as DP=1: refused the same way, naming the default.
  const dflt = await cli(['verdict', tree, '--engine-out', engineOut]);
  expect(dflt.code).toBe(2);
  expect(dflt.stderr).toContain('--dp 1: the incident incident-wave7-dp3 is of replica 3');
});
