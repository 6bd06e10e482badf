// The agent's flight recorder plumbing (docs/recorder.md): the recorder of this rank with its crash
// report to the coordinator, the incident flush at a dump's wave, and the `capture
// --flush-recorder` arms (each taken once). The recorder itself is flight-recorder.ts.
import * as path from 'path';
import type { AgentBus } from '../bus/agent-bus';
import type { Logger } from '../log';
import { engineFaultPath, incidentFlushName, recorderPath } from '../paths';
import type { AgentOptions } from './agent-options';
import { FlightRecorder, takeFlushArms } from './flight-recorder';

export class AgentRecorder {
  /** The flight recorder (WAVEBUS_RECORD_FORWARDS): none when off. */
  readonly recorder?: FlightRecorder;
  /** Recorder flush arms already taken (a snapshot may carry one again). */
  private readonly flushArms = new Set<string>();

  constructor(
    private readonly opts: AgentOptions,
    root: string | undefined,
    private readonly log: Logger,
    private readonly bus: () => AgentBus | undefined,
  ) {
    const { runDir, identity } = opts;
    if (!opts.recorder) return;
    this.recorder = new FlightRecorder({
      file: recorderPath(runDir, identity.localRank),
      faultFile: engineFaultPath(runDir, identity.localRank),
      settings: opts.recorder,
      root,
      identity,
      log,
      artifactModes: opts.artifactModes,
      crashName: `crash-${path.basename(runDir)}`,
      onCrash: ({ exit, flush, note }) =>
        this.bus()?.sendEngineCrash({
          enginePid: exit.pid, exitKnown: exit.code !== null || exit.signal !== null, exitCode: exit.code ?? 0, signal: exit.signal ?? '',
          lastWave: Math.max(0, ...flush.forwards.map((f) => f.wave)), forwardsFlushed: flush.forwards.filter((f) => f.callDir).length,
          flushDir: flush.dir, note: /^uncaught ([\w.]+):/.exec(note)?.[1] ?? '', // the type: its message may hold a prompt
        }),
    });
  }

  /** The ring written out at a dump's wave: the same name on every rank of the replica (the wave every rank copies at). */
  atIncident(wave: number, jobs: readonly { jobId: string }[]): Promise<unknown> | undefined {
    const { identity } = this.opts;
    return this.recorder
      ?.atIncident(incidentFlushName(wave, identity, identity.dpRank), wave, { jobs: jobs.map((j) => j.jobId) })
      .catch((e) => this.log.error({ err: String((e as Error)?.message ?? e) }, 'flight recorder: incident flush failed'));
  }

  /** `capture --flush-recorder` arms of this replica among `arms` (a snapshot's or a wave head's captures). */
  arms(arms: readonly Record<string, any>[] | undefined): void {
    takeFlushArms(arms, this.flushArms, this.recorder, this.opts.identity.dpRank, (r) => this.bus()?.sendCaptureResult(r));
  }
}
