// The typed runtime config (proto AgentConfig): built once on the coordinator from the validated
// config (src/guard/agent-config.ts), carried in ConfigLane and SnapshotReply, read by the agent
// as it is (src/agent/runtime-view.ts); and the hello's typed Features the clients read.
import * as fs from 'fs';
import * as path from 'path';
import { DEFAULT_VIEW, runtimeView, viewOf } from '../src/agent/runtime-view';
import { tensorFormatToProto } from '../src/artifacts/tensor-format';
import { AgentBus, type SnapshotReplyMsg, type WaveEvent } from '../src/bus/agent-bus';
import { Coordinator } from '../src/bus/coordinator';
import { encodeBusFrame, decodeBusFrame } from '../src/bus/frames';
import { agentConfig } from '../src/guard/agent-config';
import { configFromRaw, defaultConfig, DETECTOR_NAMES } from '../src/guard/config';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import { resolveIdentity } from '../src/launch/identity';
import { createLogger } from '../src/log';
import type { AgentConfig } from '../src/messages';
import { startHarnessJob, stopHarnessJob } from './job-harness';
import { ROOT, cleanup, freePortPair, tmpDir, waitFor } from './helpers';

const quiet = createLogger('agent-config-test', 'error');
const LAYOUT1 = { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 };

afterAll(cleanup);

describe('agentConfig (the one builder)', () => {
  test('the defaults it carries are config.ts defaults, and the bus is on only when something needs it', () => {
    const d = defaultConfig();
    const cfg = agentConfig(d, { hotReload: false, dumpRoot: '/dumps' });
    expect(cfg).toEqual({
      busActive: false,
      hotReload: false,
      detectors: [],
      itemSync: d.detector.logits_finite.item_sync,
      dumpFormat: tensorFormatToProto(d.dump.format),
      freeHeadroomBytes: d.dump.free_headroom_bytes,
      dumpRoot: '/dumps',
      allPpStages: d.dump.pp_stages === 'all',
      recorderOn: d.recorder.on,
      recorderForwards: d.recorder.forwards,
      recorderMaxBytes: d.recorder.max_bytes,
      saveSensitiveInfo: 0,
      verdictAuto: false,
      verdictAllowLiveDevice: false,
    });
    expect(agentConfig(d, { hotReload: true, dumpRoot: '' }).busActive).toBe(true);
    expect(agentConfig(configFromRaw({ dump: { manual_dump: 1 } }, 't'), { hotReload: false, dumpRoot: '' }).busActive).toBe(true);
    for (const name of DETECTOR_NAMES) {
      const one = agentConfig(configFromRaw({ detector: { [name]: { enabled: true } } }, 't'), { hotReload: false, dumpRoot: '' });
      expect([name, one.busActive, one.detectors]).toEqual([name, true, [name]]);
    }
    // The agent's view before any config arrived is the same builder's, on the same defaults.
    expect(DEFAULT_VIEW).toEqual({ ...runtimeView(cfg), dumpRoot: undefined });
    expect(DEFAULT_VIEW).toMatchObject({ busActive: false, format: d.dump.format, freeHeadroomBytes: d.dump.free_headroom_bytes });
  });

  test('the agent, the bus and the clients hold no config default of their own', () => {
    // The 5 GiB headroom is config.ts's to say, and the default format tensor-format.ts's; a copy drifts.
    for (const dir of ['src/agent', 'src/client', 'src/bus']) {
      for (const f of fs.readdirSync(path.join(ROOT, dir)).filter((n) => n.endsWith('.ts'))) {
        const text = fs.readFileSync(path.join(ROOT, dir, f), 'utf8');
        expect([`${dir}/${f}`, /2 \*\* 30|1024 \*\* 3|5368709120/.test(text)]).toEqual([`${dir}/${f}`, false]);
      }
    }
    expect(fs.readFileSync(path.join(ROOT, 'src/agent/runtime-view.ts'), 'utf8')).not.toMatch(/'pt'|"pt"|free_headroom/);
  });

  test('an unknown TensorFormat from a peer is refused by name; a missing config is the default view', () => {
    const cfg = agentConfig(defaultConfig(), { hotReload: false, dumpRoot: '' });
    expect(() => runtimeView({ ...cfg, dumpFormat: 99 })).toThrow(/AgentConfig\.dump_format: unknown TensorFormat 99/);
    expect(viewOf(null)).toEqual(DEFAULT_VIEW);
    // On the wire: the lane decodes to the same object, every field typed.
    const [topic, frame] = encodeBusFrame(5, 1, 'config', { wave: 3, version: 2, config: cfg });
    const back = decodeBusFrame([Buffer.from(topic), frame], 1 << 20);
    expect(back.ok && back.value.config).toEqual({ wave: 3, version: 2, config: cfg });
  });
});

/** A real coordinator running the guard with `runtimeConfig`, and an agent's bus side joining it. */
async function roundTrip(runtimeConfig: Record<string, unknown>): Promise<{ lane: AgentConfig | null; snap: AgentConfig | null; built: AgentConfig; dumpDir: string }> {
  const root = tmpDir('wavebus-agent-config-');
  const startup = parseStartupOptions(JSON.stringify({ runtime_config: runtimeConfig }), {}, root);
  const guard = new Guard({ startup, layout: LAYOUT1, log: quiet });
  const port = await freePortPair();
  const c = new Coordinator({ port, layout: LAYOUT1, heartbeatMs: 200, deadAfterMs: 5000, policy: guard, logger: quiet });
  await c.start();
  const bus = new AgentBus({ coordinator: { host: '127.0.0.1', port }, identity: resolveIdentity({}, { rank: 0, worldSize: 1, tp: 1, pp: 1 }), heartbeatMs: 200, deadAfterMs: 5000, logger: quiet });
  try {
    const snapshots: SnapshotReplyMsg[] = [];
    const waves: WaveEvent[] = [];
    bus.on('snapshot', (s: SnapshotReplyMsg) => snapshots.push(s));
    bus.on('wave', (w: WaveEvent) => waves.push(w));
    await bus.start();
    await waitFor(() => snapshots.length > 0, 'snapshot');
    c.beginWave(1, null); // the guard's first wave head carries its config, in the vector of wave 2
    await waitFor(() => waves.some((w) => w.head.wave === 2), 'wave 2');
    const w1 = waves.find((w) => w.head.wave === 2)!;
    expect(w1.head.configDue).toBe(true);
    return { lane: w1.config!.config, snap: snapshots[0].config, built: guard.snapshotState(0).config, dumpDir: startup.dumpDir };
  } finally {
    await bus.stop();
    await c.stop();
    guard.close();
  }
}

test('verdict: off by default; auto and allow_live_device are booleans; an unknown key is refused naming its path', () => {
  expect(defaultConfig().verdict).toEqual({ auto: false, allow_live_device: false });
  expect(configFromRaw({ verdict: { auto: true } }, 'f').verdict).toEqual({ auto: true, allow_live_device: false });
  expect(() => configFromRaw({ verdict: { auto: 'yes' } }, 'f')).toThrow('f: verdict.auto: expected a boolean, got "yes"');
  expect(() => configFromRaw({ verdict: { allow_live_device: 1 } }, 'f')).toThrow('f: verdict.allow_live_device: expected a boolean, got 1');
  expect(() => configFromRaw({ verdict: { auto: true, engine_out: '/x' } }, 'f')).toThrow("f: unknown key 'verdict.engine_out' (allowed here: auto, allow_live_device)");
});

describe('coordinator -> agent over real sockets', () => {
  test('a config without dump keys reaches the agent with config.ts defaults, in the lane and in the snapshot', async () => {
    const d = defaultConfig();
    const got = await roundTrip({});
    expect(got.lane).toEqual(got.built);
    expect(got.snap).toEqual(got.built);
    expect(viewOf(got.lane)).toEqual({
      busActive: false,
      hotReload: false,
      detectors: [],
      itemSync: false,
      format: d.dump.format,
      freeHeadroomBytes: d.dump.free_headroom_bytes,
      dumpRoot: got.dumpDir,
      ppStages: d.dump.pp_stages,
      recorder: { on: d.recorder.on, forwards: d.recorder.forwards, maxBytes: d.recorder.max_bytes },
      sensitive: d.report.save_sensitive_info,
      verdict: { auto: false, allowLiveDevice: false },
    });
  });

  test('what the operator set arrives typed: detectors, item_sync, format, headroom, dump root, pp_stages, recorder, save_sensitive_info, verdict', async () => {
    const got = await roundTrip({
      detector: { garbled: { enabled: true }, logits_finite: { enabled: true, item_sync: true } },
      dump: { format: 'safetensors', free_headroom_bytes: 12345, manual_dump: 0, pp_stages: 'all' },
      recorder: { on: ['flush', 'crash'], forwards: 8 },
      report: { save_sensitive_info: 'hashed' },
      verdict: { auto: true, allow_live_device: true },
    });
    expect(got.lane).toEqual(got.built);
    expect(got.snap).toEqual(got.built);
    expect(viewOf(got.snap)).toEqual({
      busActive: true,
      hotReload: false,
      detectors: ['logits_finite', 'garbled'],
      itemSync: true,
      format: 'safetensors',
      freeHeadroomBytes: 12345,
      dumpRoot: got.dumpDir,
      ppStages: 'all',
      recorder: { on: ['crash', 'flush'], forwards: 8, maxBytes: 0 },
      sensitive: 'hashed',
      verdict: { auto: true, allowLiveDevice: true },
    });
  });
});

test('the agent acts on the typed config: its hello gives the TypeScript client typed features', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: { detector: { garbled: { enabled: true }, logits_finite: { enabled: true, item_sync: true } } } });
  try {
    const client = job.ranks[0].client;
    await waitFor(() => client.featureFlags() !== 0, 'the agent has the config');
    await client.waveHead(1);
    await client.endOfWave(1);
    await waitFor(() => client.reportedFeatures()?.detectors.length === 2, 'features with detectors');
    expect(client.reportedFeatures()).toEqual({ tp0: true, bus: true, detectors: ['logits_finite', 'garbled'], itemSync: true, snapshots: false, endOfWaveTimeoutMs: 5000, recorderForwards: 0, snapshotSelection: null });
  } finally {
    await stopHarnessJob(job);
  }
});
