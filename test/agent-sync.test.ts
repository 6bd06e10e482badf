// An engine's wave head goes out only once its agent has applied the coordinator's snapshot: before
// that the mailbox shows no bus, and the client skips the head at once (the engine never waits on a
// bus it has not joined). Tests that step a job right after starting it must therefore wait for
// every agent to sync, not only to be live: test/job-harness.ts does (a suite run once failed at
// wave 1 of trace.test's job, the head never sent, when it waited for "live" only).
import * as path from 'path';
import { Agent } from '../src/agent/agent';
import { Coordinator } from '../src/bus/coordinator';
import { WavebusClient } from '../src/client/client';
import { MailboxFeature } from '../src/client/mailbox';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import { resolveIdentity } from '../src/launch/identity';
import type { WorldLayout } from '../src/layout';
import { cleanup, freePortPair, tmpDir, waitFor } from './helpers';
import { startHarnessJob, stopHarnessJob } from './job-harness';

jest.setTimeout(60000);
afterAll(() => cleanup());

const runtimeConfig = { detector: { logits_finite: { enabled: true, on_trigger: ['report'] } } };

test('a wave head before the agent has synced is skipped by the client; once synced, heads reach the coordinator', async () => {
  const root = tmpDir('wavebus-sync-');
  const layout: WorldLayout = { worldSize: 1, tp: 1, pp: 1, dp: 1, cp: 1 };
  const port = await freePortPair();
  const runDir = path.join(root, 'run');
  const env = { RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' };
  // The agent starts first: no coordinator yet, so it cannot sync.
  const agent = new Agent({ identity: resolveIdentity(env), runDir, coordinator: { host: '127.0.0.1', port }, heartbeatMs: 100, endOfWaveTimeoutMs: 2000 });
  await agent.start();
  const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: '0' } });
  let coordinator: Coordinator | undefined;
  let guard: Guard | undefined;
  try {
    expect(agent.synced).toBe(false);
    await client.waveHead(1); // returns at once: nothing to send it to
    // A head the client had sent would reach its agent within a turn or two of the loop; the check
    // that decides is the coordinator's, below (a head queued now would reach it once it starts).
    await new Promise((r) => setTimeout(r, 200));
    expect(agent.stats.waveHeadsRelayed + agent.stats.waveHeadsReencoded).toBe(0);

    const startup = parseStartupOptions(JSON.stringify({ runtime_config: runtimeConfig }), {}, root);
    guard = new Guard({ startup, layout });
    coordinator = new Coordinator({ port, layout, heartbeatMs: 100, policy: guard });
    const heads: number[] = [];
    coordinator.on('wave', () => heads.push(coordinator!.streams.stream(0).wave));
    await coordinator.start();
    await waitFor(() => agent.synced, 'the agent to sync');
    expect(client.featureFlags() & MailboxFeature.BUS_ACTIVE).toBe(MailboxFeature.BUS_ACTIVE);
    await client.waveHead(2);
    await waitFor(() => coordinator!.streams.stream(0).wave === 2, 'the coordinator to handle the head of wave 2');
    expect(agent.stats.waveHeadsRelayed).toBe(1);
    expect(heads).toEqual([2]); // wave 1's head was never sent
  } finally {
    await client.close();
    await agent.stop();
    await coordinator?.stop();
    guard?.close();
  }
});

test('the harness returns a job whose every agent has synced and whose every engine sees the bus', async () => {
  const job = await startHarnessJob({ tp: 2, dp: 2, runtimeConfig });
  try {
    for (const r of job.ranks) {
      expect(r.agent.synced).toBe(true);
      expect(r.client.featureFlags() & MailboxFeature.BUS_ACTIVE).toBe(MailboxFeature.BUS_ACTIVE);
    }
  } finally {
    await stopHarnessJob(job);
  }
});
