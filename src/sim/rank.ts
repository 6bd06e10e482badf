// One simulated engine rank: its shard of a paged KV pool and its input buffers live in POSIX
// shared memory; each step it calls the wavebus client exactly where a real engine would.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { WavebusClient, type BeforeForwardResult } from '../client/client';
import { itemSize } from '../artifacts/dtype';
import { CaptureError } from '../errors';
import { resolveIdentity } from '../launch/identity';
import { ShmSegment } from '../memory';
import type { StepTelemetry } from '../messages';
import { isShmPrefix } from '../launch/run-dir';
import type { SimFaults } from './faults';
import { fillKvPool, type KvGeometry } from './kv-pattern';
import { SimScheduler } from './scheduler';
import { TpBarrier } from './tp-barrier';
import { mkdirTrustedSync } from '../artifacts/safe-mkdir';
import { writeJsonAtomic } from '../artifacts/atomic-write';

export interface SimRankOptions {
  steps: number;
  stepMs: number;
  requests: number;
  speculative: number;
  geometry: Omit<KvGeometry, 'kvHeads'> & { totalKvHeads: number };
  faults: SimFaults;
  resultDir: string;
  /** Wall-clock ms at which step 1 starts on every rank (ranks of a TP group step together). */
  startAt?: number;
  /** Run without wavebus at all (the overhead bench's baseline). */
  detached?: boolean;
  /** Busy CPU work per step standing in for a CPU-bound forward; 0 = none. */
  computeUs?: number;
  /** Idle wait per step standing in for a forward on the accelerator (CPU free meanwhile); 0 = none. */
  forwardMs?: number;
  /** Stop stepping once this file exists (then `steps` is at most): a test ends the run when it has what it needs. */
  stopFile?: string;
  /** Record when each step ended (SimRankResult.stepEndsAt): a test measures the rate around an event. */
  stepTimes?: boolean;
  /** Names this rank's shm segment (shmNameFor); the job picks it so it can remove it if the rank dies. */
  shmTag?: string;
  /**
   * Where the TP group's ranks on this host meet every step (tp-barrier.ts: the stand-in for the
   * forward's all-reduce, which keeps a real TP group in lockstep); unset: each rank steps alone.
   */
  lockstepDir?: string;
  /** Register synthetic weights (one shard per owned layer) for the fingerprint (registerWeights). */
  weights?: boolean;
}

export interface SimRankResult {
  rank: number;
  steps: number;
  wallMs: number;
  stepsPerSec: number;
  /**
   * The rate after the first fifth of the steps (at least one step): the job's steady state, once
   * the engine's and the sidecar's processes have compiled their hot paths. A real job runs for
   * hours; the benches compare this as well as the whole run.
   */
  steadyStepsPerSec: number;
  endOfWaveTimeouts: number;
  /** endOfWave calls that slept on the mailbox for a vector not there yet (0: the engine never waited). */
  vectorWaits: number;
  lateVectors: number;
  /** With stepTimes: the wall-clock ms (Date.now()) at which each step ended. */
  stepEndsAt?: number[];
  /** endOfWave calls that returned at once because the wave vectors had stalled (a lost coordinator). */
  stalledSkips: number;
  /** Frees put off one step because a dump of the request was pending. */
  deferredFrees: number;
  /** 99th percentile of the µs spent inside endOfWave. */
  endOfWaveP99Us: number;
  /** endOfWave calls that took over SLOW_END_OF_WAVE_US (a wait, or a due dump's copy). */
  slowEndOfWaves: number;
  dueWaves: number;
  snapshots: string[];
  sent: number;
  shmName: string;
  /** CPU µs per step of this rank's process while stepping (all threads). */
  cpuUsPerStep: number;
  /** Mean µs per step spent inside wavebus client calls (waveHead, beforeForward, endOfWave). */
  clientUsPerStep: number;
  /** The part of clientUsPerStep spent in endOfWave (waiting for a wave vector that was late). */
  endOfWaveUsPerStep: number;
  /** Forwards aborted because their selected capture failed. */
  abortedForwards: number;
  /** Times the agent stopped answering, and calls that skipped it meanwhile (the engine went on). */
  agentLost: number;
  skippedUnavailable: number;
  /** Mean µs per step the forward's idle wait overran its nominal length (scheduling delay). */
  forwardOverrunUsPerStep: number;
}

export const MAX_ROWS = 4096;

export function layerName(layer: number): string {
  return `model.layers.${layer}.self_attn`;
}

/**
 * A tag for the job's shm names: under `wavebus launch` its WAVEBUS_SHM_PREFIX (the launcher
 * removes every segment with it once the command is gone, SIGKILL included), else a random one.
 */
export function simShmTag(env: NodeJS.ProcessEnv = process.env): string {
  return isShmPrefix(env.WAVEBUS_SHM_PREFIX) ? `${env.WAVEBUS_SHM_PREFIX}sim` : `wavebus-sim-${crypto.randomBytes(6).toString('hex')}`;
}

export function shmNameFor(shmTag: string, rank: number): string {
  return `/${shmTag}-r${rank}`;
}

/** Unlink a segment if it is still there (a rank that died, or the job cleaning up after one). */
export function unlinkQuietly(shmName: string): void {
  try {
    ShmSegment.unlink(shmName);
  } catch {
    /* already gone */
  }
}

/** Spin the CPU for `us` microseconds: a forward that keeps the engine thread busy. */
function busyWork(us: number): void {
  const end = process.hrtime.bigint() + BigInt(Math.round(us * 1000));
  while (process.hrtime.bigint() < end) {
    /* spin */
  }
}

/** The requests among `ids` with a dump pending on this rank (none: no set, nothing asked). */
async function pendingOf(client: WavebusClient, ids: string[]): Promise<Set<string> | undefined> {
  let keep: Set<string> | undefined;
  for (const id of ids) if (await client.pendingDump(id)) (keep ??= new Set()).add(id);
  return keep;
}

/** An endOfWave longer than this waited for something (a memory load is well under 10 µs). */
const SLOW_END_OF_WAVE_US = 250;

function percentile(xs: Float64Array, p: number): number {
  if (xs.length === 0) return 0;
  const s = Float64Array.from(xs).sort();
  return Number(s[Math.min(s.length - 1, Math.floor(p * s.length))].toFixed(1));
}

/** This rank's place in the lockstep of its TP group's ranks on this host (LOCAL_RANK, LOCAL_WORLD_SIZE). */
function openBarrier(dir: string, id: ReturnType<typeof resolveIdentity>): Promise<TpBarrier> {
  const group = Math.floor(id.globalRank / id.tp);
  const firstLocal = id.globalRank - id.localRank;
  const peers: number[] = [];
  for (let t = 0; t < id.tp; t++) {
    const g = group * id.tp + t;
    if (t !== id.tpRank && g >= firstLocal && g < firstLocal + id.localWorldSize) peers.push(t);
  }
  return TpBarrier.open(dir, group, id.tpRank, peers);
}

/**
 * The weights a sim rank "loaded": one bfloat16 shard per layer it owns, the same bytes on every DP
 * replica of its TP / PP place (so replicas agree), one byte flipped when `flip` (a corrupted load).
 */
function simWeights(layers: number, own: (l: number) => boolean, id: ReturnType<typeof resolveIdentity>, flip: boolean): Record<string, { data: Buffer; dtype: string; shape: number[] }> {
  const out: Record<string, { data: Buffer; dtype: string; shape: number[] }> = {};
  for (let l = 0; l < layers; l++) {
    if (!own(l)) continue;
    const data = Buffer.alloc(4096);
    for (let i = 0; i < data.length; i++) data[i] = (i * 31 + l * 7 + id.tpRank * 13 + id.cpRank * 17) & 0xff;
    if (flip && Object.keys(out).length === 0) data[100] ^= 0x01;
    out[`model.layers.${l}.mlp.weight`] = { data, dtype: 'bfloat16', shape: [2048] };
  }
  return out;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, Math.max(0, ms)));

export async function runSimRank(opts: SimRankOptions, onReady: () => Promise<number | undefined>): Promise<SimRankResult> {
  const id = resolveIdentity(process.env);
  const g: KvGeometry = { ...opts.geometry, kvHeads: Math.max(1, Math.floor(opts.geometry.totalKvHeads / id.tp)) };
  const poolBytes = g.numBlocks * g.blockSize * g.kvHeads * g.headDim * itemSize(g.dtype);
  const inputBytes = MAX_ROWS * 4 + MAX_ROWS * 8;
  const shmName = shmNameFor(opts.shmTag ?? simShmTag(), id.globalRank);
  const seg = ShmSegment.create(shmName, g.layers * 2 * poolBytes + inputBytes);
  // Every way out unlinks it: process.exit (an injected death included) runs 'exit' handlers;
  // a SIGKILL does not, and then the job (or the launcher) removes it.
  const unlinkAtExit = () => unlinkQuietly(shmName);
  process.on('exit', unlinkAtExit);
  const mem = seg.buffer();
  for (let l = 0; l < g.layers; l++) {
    fillKvPool(mem.subarray((2 * l) * poolBytes, (2 * l + 1) * poolBytes), g, l, 'k', id.globalRank);
    fillKvPool(mem.subarray((2 * l + 1) * poolBytes, (2 * l + 2) * poolBytes), g, l, 'v', id.globalRank);
  }
  const inputsOff = g.layers * 2 * poolBytes;
  const client = opts.detached ? undefined : await WavebusClient.connect();
  // An agent too slow to answer (a busy host) is no reason to stop the engine: the client keeps
  // the region and sends it once the agent answers.
  const register = async (r: Parameters<WavebusClient['register']>[0]): Promise<void> => {
    try {
      await client?.register(r);
    } catch (e) {
      if ((e as { code?: string }).code !== 'ERR_AGENT_UNAVAILABLE') throw e;
      process.stderr.write(`sim rank ${id.globalRank}: ${(e as Error).message}; stepping on\n`);
    }
  };
  const shape = [g.numBlocks, g.blockSize, g.kvHeads, g.headDim];
  // Each pipeline stage holds its own layers (stage p of P: layers l with floor(l*P/L) = p).
  const ownLayer = (l: number): boolean => Math.floor((l * id.pp) / g.layers) === id.ppRank;
  for (let l = 0; l < g.layers && client; l++) {
    if (!ownLayer(l)) continue;
    for (const [i, kv] of (['k', 'v'] as const).entries()) {
      await register({ name: `${layerName(l)}.${kv}`, kind: 'shm', shmName, offset: (2 * l + i) * poolBytes, nbytes: poolBytes, dtype: g.dtype, shape, role: 'kv_pool', layer: layerName(l), kv });
    }
  }
  await register({ name: 'input_ids', kind: 'shm', shmName, offset: inputsOff, nbytes: MAX_ROWS * 4, dtype: 'int32', shape: [MAX_ROWS], role: 'input' });
  await register({ name: 'positions', kind: 'shm', shmName, offset: inputsOff + MAX_ROWS * 4, nbytes: MAX_ROWS * 8, dtype: 'int64', shape: [MAX_ROWS], role: 'input' });
  if (opts.weights && client) {
    try {
      await client.registerWeights(simWeights(g.layers, ownLayer, id, opts.faults.weightFlip?.rank === id.globalRank));
    } catch (e) {
      if ((e as { code?: string }).code !== 'ERR_AGENT_UNAVAILABLE') throw e;
      process.stderr.write(`sim rank ${id.globalRank}: ${(e as Error).message}; stepping on\n`);
    }
  }
  // Where a test (or a user) finds this rank's process, e.g. to kill it.
  mkdirTrustedSync(opts.resultDir, 0o755, 'sim result directory');
  fs.writeFileSync(path.join(opts.resultDir, `pid-rank${id.globalRank}`), String(process.pid));

  const barrier = opts.lockstepDir ? await openBarrier(opts.lockstepDir, id) : undefined;
  const sched = new SimScheduler({ requests: opts.requests, numBlocks: g.numBlocks, blockSize: g.blockSize, speculative: opts.speculative, replica: id.dpRank }, opts.faults);
  const startAt = (await onReady()) ?? opts.startAt ?? Date.now();
  const extra = opts.faults.slowRank?.rank === id.globalRank ? opts.faults.slowRank.extraMs : 0;
  const snapshots: string[] = [];
  let prev: StepTelemetry | undefined;
  await sleep(startAt - Date.now());
  const t0 = Date.now();
  const cpu0 = process.cpuUsage();
  let clientNs = 0n;
  let endNs = 0n;
  const eowUs = new Float64Array(client ? opts.steps : 0);
  const stepEndsAt: number[] | undefined = opts.stepTimes ? [] : undefined;
  let overrunNs = 0n;
  let abortedForwards = 0;
  let deferredFrees = 0;
  const steadyFrom = Math.max(1, Math.floor(opts.steps / 5));
  let steadyAt = t0;
  let step = 1;
  for (; step <= opts.steps; step++) {
    if (step === steadyFrom + 1) steadyAt = Date.now();
    if (opts.stopFile !== undefined && fs.existsSync(opts.stopFile)) break;
    if (opts.faults.rankDies?.rank === id.globalRank && opts.faults.rankDies.at === step) {
      process.stderr.write(`sim rank ${id.globalRank}: injected death at step ${step}\n`);
      process.exit(1);
    }
    if (opts.stepMs > 0) await sleep(startAt + (step - 1) * opts.stepMs - Date.now());
    // Blocks of a request with a pending dump stay one more step (unless the fault says otherwise).
    const eager = opts.faults.eagerFree !== undefined && step >= opts.faults.eagerFree.from;
    const keep = client && !eager ? await pendingOf(client, sched.finishedHolding(step)) : undefined;
    if (keep) deferredFrees += keep.size;
    const batch = sched.step(step, keep);
    // The engine fills its input buffers whether or not wavebus is attached.
    const rows = Math.min(batch.positions.length, MAX_ROWS);
    for (let r = 0; r < rows; r++) {
      mem.writeInt32LE(batch.inputIds[r], inputsOff + r * 4);
      mem.writeBigInt64LE(BigInt(batch.positions[r]), inputsOff + MAX_ROWS * 4 + r * 8);
    }
    if (client) {
      const c0 = process.hrtime.bigint();
      await client.waveHead(step, prev);
      const snap = await client
        .beforeForward(
          {
          compilationHash: `sim-${batch.isPrompt ? 'prefill' : 'decode'}-tp${id.tp}`,
          globalStep: step,
          isPrompt: batch.isPrompt,
          reqIds: batch.reqIds,
          positions: batch.positions,
          rowRequest: batch.rowRequest,
          numSpeculativeTokens: opts.speculative,
        },
        [
          { region: 'input_ids', dtype: 'int32', shape: [rows] },
          { region: 'positions', dtype: 'int64', shape: [rows] },
        ],
      )
        .catch((e: unknown) => {
          // A failed capture aborts this forward (fail loud), not the engine: counted, the wave goes on.
          if (!(e instanceof CaptureError)) throw e;
          process.stderr.write(`sim rank ${id.globalRank}: step ${step}: forward aborted: ${e.message}\n`);
          abortedForwards++;
          return { captured: false } as BeforeForwardResult;
        });
      if (snap.captured && snap.callDir) snapshots.push(snap.callDir);
      clientNs += process.hrtime.bigint() - c0;
    }
    if (opts.faults.uncaught?.rank === id.globalRank && opts.faults.uncaught.at === step) {
      // Thrown outside any promise chain, as an engine's bug would be: Node's uncaught-exception path.
      setImmediate(() => {
        throw new Error(`injected fault: uncaught exception in forward ${step}`);
      });
      await new Promise<never>(() => undefined);
    }
    // The forward itself: half the step, longer on an injected slow rank.
    if (opts.computeUs) busyWork(opts.computeUs);
    if (opts.forwardMs) {
      const f0 = process.hrtime.bigint();
      await sleep(opts.forwardMs);
      overrunNs += process.hrtime.bigint() - f0 - BigInt(Math.round(opts.forwardMs * 1e6));
    }
    if (opts.stepMs > 0 || extra > 0) await sleep(opts.stepMs / 2 + extra);
    // No TP rank's forward ends before every rank of its group reached it (the all-reduce).
    if (barrier) await barrier.arrive(step);
    if (client) {
      const e0 = process.hrtime.bigint();
      await client.endOfWave(step);
      const e = process.hrtime.bigint() - e0;
      endNs += e;
      eowUs[step - 1] = Number(e) / 1000;
    }
    prev = batch.telemetry;
    stepEndsAt?.push(Date.now());
  }
  const endAt = Date.now();
  const wallMs = endAt - t0;
  const cpu = process.cpuUsage(cpu0);
  const steps = step - 1; // fewer than opts.steps when the stop file ended the run
  const result: SimRankResult = {
    rank: id.globalRank,
    steps,
    wallMs,
    stepsPerSec: (steps * 1000) / Math.max(1, wallMs),
    steadyStepsPerSec: steps > steadyFrom ? ((steps - steadyFrom) * 1000) / Math.max(1, endAt - steadyAt) : (steps * 1000) / Math.max(1, wallMs),
    endOfWaveTimeouts: client?.stats.endOfWaveTimeouts ?? 0,
    vectorWaits: client?.stats.vectorWaits ?? 0,
    lateVectors: client?.stats.lateVectors ?? 0,
    stalledSkips: client?.stats.stalledSkips ?? 0,
    ...(stepEndsAt ? { stepEndsAt } : {}),
    deferredFrees,
    endOfWaveP99Us: percentile(eowUs.subarray(0, steps), 0.99),
    slowEndOfWaves: eowUs.subarray(0, steps).filter((us) => us > SLOW_END_OF_WAVE_US).length,
    dueWaves: client?.stats.dueWaves ?? 0,
    abortedForwards,
    agentLost: client?.stats.agentLost ?? 0,
    skippedUnavailable: client?.stats.skippedUnavailable ?? 0,
    snapshots,
    sent: client?.stats.sent ?? 0,
    shmName,
    cpuUsPerStep: (cpu.user + cpu.system) / Math.max(1, steps),
    clientUsPerStep: Number((clientNs + endNs) / 1000n) / Math.max(1, steps),
    endOfWaveUsPerStep: Number(endNs / 1000n) / Math.max(1, steps),
    forwardOverrunUsPerStep: Number(overrunNs / 1000n) / Math.max(1, steps),
  };
  await client?.close();
  barrier?.close();
  mkdirTrustedSync(opts.resultDir, 0o755, 'sim result directory');
  // Whole or not there: a test or the launcher's caller waits for this file to exist, then reads it.
  writeJsonAtomic(path.join(opts.resultDir, `rank${id.globalRank}.json`), result, { mode: 0o644 });
  seg.close();
  unlinkQuietly(shmName);
  process.off('exit', unlinkAtExit);
  return result;
}
