// An incident's verdict in the coordinator's status and /metrics (docs/verdict.md "In status and
// /metrics"): a real coordinator with a bus token, notes sent over its control channel by the
// control client `wavebus verdict --coordinator` uses, `wavebus status` (JSON and table) and
// /metrics over HTTP. test/verdict.test.ts sends one from the CLI after a real verdict.
import { Coordinator } from '../src/bus/coordinator';
import { createTokenFile, loadBusToken } from '../src/bus/auth';
import { createLogger } from '../src/log';
import { ControlClient } from '../src/tools/control-client';
import { freePortPair, spawnWavebus, tmpDir } from './helpers';

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
