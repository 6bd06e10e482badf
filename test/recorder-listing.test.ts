// An incident's dump arms a flight recorder flush on every rank of the replica that copies it:
// over real sockets, each agent's Hello says its recorder's K; the guard then writes the flush's
// folder (recorder/incident-wave<w>), the wave its forwards are taken up to, and the recording
// ranks into the incident report and request_info.json. With no rank recording, neither says so.
import * as fs from 'fs';
import * as path from 'path';
import { AgentBus } from '../src/bus/agent-bus';
import { Coordinator } from '../src/bus/coordinator';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import type { StepTelemetry } from '../src/messages';
import { cleanup, freePortPair, tmpDir, waitFor } from './helpers';

afterAll(cleanup);

const quiet = createLogger('recorder-listing-test', 'error');
const LAYOUT = { worldSize: 2, tp: 2, pp: 1, dp: 1, cp: 1 };
const CONFIG = { detector: { logits_finite: { enabled: true, on_trigger: ['report', 'dump_kv'] } }, dump: { auto_max_times: 10, auto_cooldown_seconds: 0 } };

const tel = (wave: number, nan: boolean): StepTelemetry => ({
  wave,
  requests: [{ reqId: 'req-a', newTokenIds: [1], newTokenLogprobs: [], newTokenRanks: [], draftLen: 0, accepted: 0, blockIds: [4, 5], finished: false, freed: false, promptLen: 10, numOutputTokens: 0 }],
  nonFinite: nan ? [{ row: 0, reqId: 'req-a', kind: 'nan' }] : [],
});

/** A real coordinator with the guard; two agents' bus sides whose Hello says `forwards[r]`; a NaN at wave 3. */
async function incidentWith(forwards: number[]): Promise<{ report: any; info: any }> {
  const root = tmpDir('wavebus-recorder-listing-');
  const startup = parseStartupOptions(JSON.stringify({ runtime_config: CONFIG }), {}, root);
  const guard = new Guard({ startup, layout: LAYOUT, log: quiet });
  const port = await freePortPair();
  const c = new Coordinator({ port, layout: LAYOUT, heartbeatMs: 100, deadAfterMs: 5000, policy: guard, logger: quiet });
  await c.start();
  const buses = forwards.map((k, rank) => new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity: resolveIdentity({}, { rank, worldSize: 2, tp: 2, pp: 1 }), heartbeatMs: 100, deadAfterMs: 5000, recorderForwards: k, logger: quiet }));
  try {
    let snaps = 0;
    for (const b of buses) b.on('snapshot', () => snaps++);
    await Promise.all(buses.map((b) => b.start()));
    await waitFor(() => snaps >= buses.length, 'both agents joined');
    c.beginWave(1, null);
    c.beginWave(2, tel(1, false));
    c.beginWave(3, tel(2, true));
    const typeDir = path.join(startup.reportDir, 'logits_finite');
    await waitFor(() => fs.existsSync(typeDir) && fs.readdirSync(typeDir).length > 0, 'the incident report');
    const report = JSON.parse(fs.readFileSync(path.join(typeDir, fs.readdirSync(typeDir)[0]), 'utf8'));
    const infoFile = path.join(report.dump_dir, 'request_info.json');
    await waitFor(() => fs.existsSync(infoFile), 'request_info.json');
    return { report, info: JSON.parse(fs.readFileSync(infoFile, 'utf8')) };
  } finally {
    await Promise.all(buses.map((b) => b.stop()));
    await c.stop();
    guard.close();
  }
}

test('recorder on (rank 0 K=8, rank 1 K=4): the report and request_info.json name the flush, its wave and ranks', async () => {
  const { report, info } = await incidentWith([8, 4]);
  const w = report.dump_arm_wave;
  expect(Number.isSafeInteger(w) && w > 2).toBe(true);
  const want = { dir: `recorder/incident-wave${w}`, forwards_wanted: { up_to_wave: w, newest: 8 }, ranks: [0, 1], forwards_per_rank: { 0: 8, 1: 4 } };
  expect(report.recorder_flush).toEqual(want);
  expect(info.recorder_flush).toEqual(want);
  expect(info.arm_wave).toBe(w);
});

test('recorder on one rank only: only that rank is listed', async () => {
  const { report, info } = await incidentWith([0, 6]);
  expect(report.recorder_flush.ranks).toEqual([1]);
  expect(info.recorder_flush.ranks).toEqual([1]);
  expect(info.recorder_flush.forwards_wanted.newest).toBe(6);
});

test('recorder off on every rank: neither the report nor request_info.json has recorder_flush', async () => {
  const { report, info } = await incidentWith([0, 0]);
  expect(report.dump_attempted).toBe(true);
  expect(info.job_id).toBeDefined();
  expect(report).not.toHaveProperty('recorder_flush');
  expect(info).not.toHaveProperty('recorder_flush');
});
