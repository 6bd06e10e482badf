// The end of a wave on this rank: the client's end_of_wave (the dump copy, its files written behind
// the engine) and due_dumps, and a wave ended without its vector. Apart from agent.ts, which keeps
// the bus, the mailbox and the client socket these answer through.
import type { AgentBus } from '../bus/agent-bus';
import { WavebusError } from '../errors';
import type { RankIdentity } from '../layout';
import type { Logger } from '../log';
import type { RecorderFlushAccount } from '../messages';
import type { DumpExecutor } from './dump-executor';
import type { RuntimeView } from './runtime-view';
import type { WaveTimeline } from './timeline';
import type { WaveBook } from './wave-book';
import { jobsFor, type WaveDuties } from './wave-duties';

/** What the end of a wave needs of its agent. */
export interface WaveEndHost {
  identity: RankIdentity;
  log: Logger;
  stats: { endOfWaveTimeouts: number; missedWaves: number; dumpsWritten: number; dumpsFailed: number };
  timeline: WaveTimeline;
  waves: WaveBook;
  duties: WaveDuties;
  dumps: DumpExecutor;
  stagingBytes?: number;
  bus: () => AgentBus | undefined;
  view: () => RuntimeView;
  boundMs: () => number;
  /** The agent's settle(): wave-duties.ts, and the features published when they changed. */
  settle: (upTo: number, copyAt?: number) => void;
  publishFeatures: () => void;
  writeTimeline: () => void;
  /** A dump job of this rank is copied at the end of `wave` (an incident): the flight recorder, if on, reads its ring now (the engine waits) and writes it out behind. */
  recorderAtIncident?: (wave: number, jobs: readonly { jobId: string; incidentType: string; reqId: string }[]) => Promise<RecorderFlushAccount> | undefined;
}

export class WaveEnds {
  /** The last wave a dueDumps answer gave up because the coordinator was lost (never copied here). */
  private forfeitedTo = -1;
  /** The dump files being written, in order (waited for at drain and stop). */
  writes: Promise<void> = Promise.resolve();

  constructor(private readonly h: WaveEndHost) {}

  async endOfWave(wave: number): Promise<Record<string, unknown>> {
    const { h } = this;
    const bus = h.bus();
    if (!bus) return {};
    const ended = h.waves.ended;
    // The coordinator is lost and this vector never came, or this wave was given up by a dueDumps
    // answer: at once, nothing done (a wait would only cost the engine a bound per step).
    if ((bus.coordinatorLost && !h.waves.known(wave)) || (wave <= this.forfeitedTo && !ended.has(wave))) {
      this.missedWave(wave);
      return { timedOut: true, coordinatorLost: true };
    }
    if (!(await h.waves.waitFor(wave, h.boundMs()))) {
      this.missedWave(wave);
      return { timedOut: true };
    }
    if (ended.has(wave)) return {};
    ended.add(wave);
    h.duties.lastEnded = wave;
    h.settle(wave, wave);
    const lane = h.duties.lanes.get(wave);
    if (!lane || lane.jobs.length === 0) return {};
    h.duties.lanes.delete(wave);
    const jobs = jobsFor(h.identity, lane.jobs);
    if (jobs.length === 0) return {};
    h.publishFeatures(); // no job waits here any more (a rank off the vector goes back off it)
    // Read now (the engine waits), written behind; its account goes with this wave's dump acks.
    const flushed = h.recorderAtIncident?.(wave, jobs);
    const view = h.view();
    const { staged, refused } = await h.dumps.stage(jobs, {
      format: view.format,
      freeHeadroomBytes: view.freeHeadroomBytes,
      stagingBytes: h.stagingBytes ?? 1 << 30,
    });
    for (const r of refused) bus.sendDumpResult(r);
    // The engine is released now; files are written behind it.
    this.writes = this.writes.then(async () => {
      const start = h.timeline.now();
      const results = await h.dumps.write(staged, h.view().format);
      const recorderFlush = await flushed;
      for (const r of results) {
        if (recorderFlush) r.recorderFlush = recorderFlush;
        if (r.error) h.stats.dumpsFailed++;
        else h.stats.dumpsWritten++;
        h.bus()?.sendDumpResult(r);
      }
      h.timeline.record('dump', wave, start, h.timeline.now() - start, staged.length);
      h.writeTimeline();
    });
    return { dumpsWritten: staged.length };
  }

  /**
   * dueDumps: with the coordinator lost and the vector not here, nothing is due, at once, and the
   * wave is given up on this rank (forfeitedTo): a vector that arrives later for it is not copied,
   * since the engine has freed the blocks this answer let go.
   */
  async dueDumps(wave: number): Promise<Record<string, unknown>> {
    if (this.h.bus()?.coordinatorLost && !this.h.waves.known(wave)) {
      if (wave > this.forfeitedTo) this.forfeitedTo = wave;
      return { dueReqIds: [], coordinatorLost: true };
    }
    return { dueReqIds: await this.dueReqIds(wave) };
  }

  /**
   * The req ids of the dump jobs due at the end of `wave` that this rank has not copied yet; waits
   * (within the bound) for a vector not there yet. Throws ERR_TIMEOUT if it does not come: the
   * client then keeps every finished request one more step.
   */
  private async dueReqIds(wave: number): Promise<string[]> {
    const boundMs = this.h.boundMs();
    if (!(await this.h.waves.waitFor(wave, boundMs))) throw new WavebusError('ERR_TIMEOUT', `wave ${wave}'s vector did not arrive within ${boundMs} ms`);
    if (this.h.waves.ended.has(wave)) return [];
    const lane = this.h.duties.lanes.get(wave);
    return lane ? lane.jobs.map((j) => j.reqId) : [];
  }

  /** The engine ended `wave` without its vector (the bound ran out): counted, logged, its jobs acked as wave_already_ended. */
  missedWave(wave: number): void {
    const { h } = this;
    h.timeline.record('missed_vector', wave, h.timeline.now());
    h.stats.endOfWaveTimeouts++;
    h.stats.missedWaves++;
    h.waves.ended.add(wave);
    h.duties.lastEnded = wave;
    // Rate-limited: a dead coordinator would otherwise log once per engine step.
    if (h.stats.endOfWaveTimeouts === 1 || h.stats.endOfWaveTimeouts % 100 === 0) {
      h.log.warn({ wave, boundMs: h.boundMs(), total: h.stats.endOfWaveTimeouts }, 'wave vector did not arrive before end_of_wave; the step goes on');
    }
    // Its jobs (their lane may come later: onWave settles it then) cannot be copied any more.
    h.settle(wave);
  }
}
