// An in-process job for tests that need real dumps, reports and snapshots: a coordinator running
// the guard, one Agent per rank, and a TypeScript client per rank with its KV pool in real shared
// memory. test/engine.test.ts and the feature tests all start their jobs here.
import * as path from 'path';
import { Agent } from '../src/agent/agent';
import type { ArtifactModes } from '../src/artifacts/artifact-mode';
import { Coordinator } from '../src/bus/coordinator';
import { WavebusClient } from '../src/client/client';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import { resolveIdentity } from '../src/launch/identity';
import { replicaHead, type WorldLayout } from '../src/layout';
import { ShmSegment } from '../src/memory';
import type { RequestStep, StepTelemetry } from '../src/messages';
import { fillKvPool, type KvGeometry } from '../src/sim/kv-pattern';
import { resolveSnapshotConfig } from '../src/snapshot/config';
import { freePortPair, tmpDir, waitFor } from './helpers';

export const G: KvGeometry = { layers: 2, numBlocks: 32, blockSize: 4, kvHeads: 2, headDim: 8, dtype: 'bfloat16' };
export const POOL = G.numBlocks * G.blockSize * G.kvHeads * G.headDim * 2;

export interface HarnessRank {
  agent: Agent;
  client: WavebusClient;
  seg: ShmSegment;
  shmName: string;
}

export interface HarnessJob {
  coordinator: Coordinator;
  guard: Guard;
  ranks: HarnessRank[];
  root: string;
  dumpRoot: string;
  reportRoot: string;
  layout: WorldLayout;
  /** The runtime config file (hot reload: edit it). */
  configPath: string;
}

export async function startHarnessJob(opts: {
  tp: number;
  /** Pipeline stages (default 1): stage p holds layers l with floor(l * pp / layers) = p. */
  pp?: number;
  /** DP replicas (default 1), each with its own wave stream. */
  dp?: number;
  runtimeConfig: Record<string, unknown>;
  /** The engine's name for KV layer l (default `layers.${l}`). */
  layerName?: (l: number) => string;
  layers?: number;
  artifactModes?: ArtifactModes;
  snapshotEnv?: NodeJS.ProcessEnv;
  /** runtime_config_hot_reload: the guard re-reads the config file at every wave head. */
  hotReload?: boolean;
  /** Each agent's end_of_wave bound (default 5000 ms). */
  endOfWaveTimeoutMs?: number;
  /** The coordinator's lookaheadWaves (default DEFAULT_LOOKAHEAD_WAVES). */
  lookaheadWaves?: number;
  /** The coordinator's /metrics port (0: a free one); none by default. */
  metricsPort?: number;
  /** Start only the first `agents` ranks (default all): the rest stay missing. */
  agents?: number;
  /** The coordinator's dump-ack bound (default 10000 ms). */
  dumpAckTimeoutMs?: number;
}): Promise<HarnessJob> {
  const layers = opts.layers ?? G.layers;
  const layerName = opts.layerName ?? ((l: number) => `layers.${l}`);
  const root = tmpDir('wavebus-harness-');
  const pp = opts.pp ?? 1;
  const dp = opts.dp ?? 1;
  const world = opts.tp * pp * dp;
  const layout: WorldLayout = { worldSize: world, tp: opts.tp, pp, dp, cp: 1 };
  const startup = parseStartupOptions(JSON.stringify({ runtime_config_hot_reload: opts.hotReload ?? false, runtime_config: opts.runtimeConfig }), {}, root);
  const guard = new Guard({ startup, layout, artifactModes: opts.artifactModes, ...(opts.hotReload ? { pollIntervalMs: 0, verifyIntervalMs: 0 } : {}) });
  const port = await freePortPair();
  const coordinator = new Coordinator({ port, layout, heartbeatMs: 300, dumpAckTimeoutMs: opts.dumpAckTimeoutMs ?? 10000, policy: guard, lookaheadWaves: opts.lookaheadWaves, metricsPort: opts.metricsPort });
  await coordinator.start();
  const job: HarnessJob = { coordinator, guard, ranks: [], root, dumpRoot: startup.dumpDir, reportRoot: startup.reportDir, layout, configPath: startup.configPath };
  const runDir = path.join(root, 'run');
  for (let g = 0; g < (opts.agents ?? world); g++) {
    const env = { RANK: String(g), LOCAL_RANK: String(g), WORLD_SIZE: String(world), LOCAL_WORLD_SIZE: String(world), WAVEBUS_TP: String(opts.tp), WAVEBUS_PP: String(pp), WAVEBUS_DP: String(dp) };
    const identity = resolveIdentity(env);
    const snapshot = resolveSnapshotConfig({ WAVEBUS_CACHE_ROOT: root, ...(opts.snapshotEnv ?? {}) });
    const agent = new Agent({ identity, runDir, coordinator: { host: '127.0.0.1', port }, heartbeatMs: 300, endOfWaveTimeoutMs: opts.endOfWaveTimeoutMs ?? 5000, snapshot, roots: { dumps: startup.dumpDir }, artifactModes: opts.artifactModes });
    await agent.start();
    const shmName = `/wavebus-harness-${process.pid}-${port}-r${g}`;
    const seg = ShmSegment.create(shmName, 2 * layers * POOL + 4096);
    job.ranks.push({ agent, client: undefined as unknown as WavebusClient, seg, shmName });
    const mem = seg.buffer();
    for (let l = 0; l < layers; l++) {
      fillKvPool(mem.subarray(2 * l * POOL, (2 * l + 1) * POOL), G, l, 'k', g);
      fillKvPool(mem.subarray((2 * l + 1) * POOL, (2 * l + 2) * POOL), G, l, 'v', g);
    }
    mem.fill(7, 2 * layers * POOL);
    const client = await WavebusClient.connect({ env: { WAVEBUS_RUN_DIR: runDir, LOCAL_RANK: String(g) } });
    job.ranks[g].client = client;
    for (let l = 0; l < layers; l++) {
      if (Math.floor((l * pp) / layers) !== identity.ppRank) continue; // another stage's layer
      for (const [i, kv] of (['k', 'v'] as const).entries()) {
        await client.register({ name: `pool${l}.${kv}`, shmName, offset: (2 * l + i) * POOL, nbytes: POOL, dtype: G.dtype, shape: [G.numBlocks, G.blockSize, G.kvHeads, G.headDim], role: 'kv_pool', layer: layerName(l), kv });
      }
    }
    await client.register({ name: 'input0', shmName, offset: 2 * layers * POOL, nbytes: 4096, dtype: 'int32', shape: [1024], role: 'input' });
  }
  // Live is not enough: until an agent has applied its snapshot its mailbox shows no bus, and its
  // engine sends no wave head (a step right after start would wait for a head never sent).
  await waitFor(() => coordinator.liveRanks().length === job.ranks.length && job.ranks.every((r) => r.agent.synced), 'agents live and synced');
  return job;
}

export async function stopHarnessJob(job: HarnessJob): Promise<void> {
  for (const r of job.ranks) {
    await r.client?.close();
    await r.agent.stop();
    r.seg.close();
    try {
      ShmSegment.unlink(r.shmName);
    } catch {
      /* gone */
    }
  }
  await job.coordinator.stop();
  job.guard.close();
}

export function step(reqId: string, tokens: number[], blockIds: number[], extra: Partial<RequestStep> = {}): RequestStep {
  return { reqId, newTokenIds: tokens, newTokenLogprobs: [], newTokenRanks: [], draftLen: 0, accepted: 0, blockIds, finished: false, freed: false, promptLen: 8, numOutputTokens: 0, ...extra };
}

/** One engine step on every rank: TP0 opens the wave with last wave's telemetry; all end it. */
export async function runWave(job: HarnessJob, wave: number, prev: StepTelemetry | undefined) {
  return runReplicaWave(job, 0, wave, prev);
}

/**
 * One engine step of one DP replica: its head (last-PP TP0) opens the wave; its ranks end it. The
 * vector of `wave` was decided a wave ahead, so end_of_wave does not wait for this head: the step
 * returns once the coordinator has handled it too (what the guard decided is in its vector, wave+1),
 * as a real engine's next step would see.
 */
export async function runReplicaWave(job: HarnessJob, replica: number, wave: number, prev: StepTelemetry | undefined) {
  await job.ranks[replicaHead(job.layout, replica)].client.waveHead(wave, prev);
  const mine = job.ranks.filter((r) => r.agent.identity.dpRank === replica);
  const results = await Promise.all(mine.map((r) => r.client.endOfWave(wave)));
  const deadline = Date.now() + 10000;
  while (job.coordinator.streams.stream(replica).wave < wave) {
    if (Date.now() > deadline) throw new Error(`the coordinator did not handle replica ${replica}'s head of wave ${wave} within 10 s`);
    await new Promise((r) => setTimeout(r, 2));
  }
  return results;
}
