// The agent's flight recorder plumbing (docs/recorder.md): the recorder of this rank with its crash
// report to the coordinator, the incident flush at a dump's wave, and the `capture
// --flush-recorder` arms (each taken once). The recorder itself is flight-recorder.ts.
import * as path from 'path';
import type { AgentBus } from '../bus/agent-bus';
import type { Logger } from '../log';
import { engineFaultPath, incidentFlushName, recorderPath } from '../paths';
import type { AgentOptions } from './agent-options';
import { TokenHasher } from '../guard/token-hash';
import type { RecorderFlushAccount } from '../messages';
import { FlightRecorder, takeFlushArms } from './flight-recorder';
import type { FlushResult } from './recorder-flush';
import { AutoVerdict } from './auto-verdict';
import type { RuntimeView } from './runtime-view';

export class AgentRecorder {
  /** The flight recorder (WAVEBUS_RECORD_FORWARDS): none when off. */
  readonly recorder?: FlightRecorder;
  /** Recorder flush arms already taken (a snapshot may carry one again). */
  private readonly flushArms = new Set<string>();
  /** verdict.auto's runner, on the replica head's agent (auto-verdict.ts). */
  private readonly verdicts?: AutoVerdict;

  constructor(
    private readonly opts: AgentOptions,
    private readonly root: string | undefined,
    private readonly log: Logger,
    private readonly bus: () => AgentBus | undefined,
    /** Whether an input region holds token ids (the agent's RegionTable). */
    tokenIds: (region: string) => boolean,
    /** The runtime config in force (verdict.auto). */
    private readonly view: () => RuntimeView = () => ({ verdict: { auto: false, allowLiveDevice: false } }) as RuntimeView,
  ) {
    const { runDir, identity } = opts;
    if (!opts.recorder) return;
    if (root && identity.tpRank === 0 && identity.pp === 1) {
      const target = opts.coordinator ? { coordinator: opts.coordinator, busToken: opts.busToken, curveFiles: opts.curveFiles } : undefined;
      this.verdicts = new AutoVerdict({ identity, root, args: opts.verdictArgs ?? [], target, log });
    }
    let hasher = opts.tokenHasher;
    this.recorder = new FlightRecorder({
      file: recorderPath(runDir, identity.localRank),
      faultFile: engineFaultPath(runDir, identity.localRank),
      settings: opts.recorder,
      root,
      identity,
      log,
      artifactModes: opts.artifactModes,
      crashName: `crash-${path.basename(runDir)}`,
      privacy: { tokenIds, hasher: () => (hasher ??= TokenHasher.ephemeral()) },
      onCrash: ({ exit, flush, note }) =>
        this.bus()?.sendEngineCrash({
          enginePid: exit.pid, exitKnown: exit.code !== null || exit.signal !== null, exitCode: exit.code ?? 0, signal: exit.signal ?? '',
          lastWave: Math.max(0, ...flush.forwards.map((f) => f.wave)), forwardsFlushed: flush.forwards.filter((f) => f.callDir).length,
          flushDir: flush.dir, note: /^uncaught ([\w.]+):/.exec(note)?.[1] ?? '', // the type: its message may hold a prompt
        }),
    });
  }

  /**
   * The ring written out at a dump's wave: the same name on every rank of the replica (the wave
   * every rank copies at). Resolves with this rank's account for the dump acks (undefined: the
   * recorder is off here).
   */
  atIncident(wave: number, jobs: readonly { jobId: string }[]): Promise<RecorderFlushAccount> | undefined {
    const { identity } = this.opts;
    const rec = this.recorder;
    if (!rec) return undefined;
    const name = incidentFlushName(wave, identity, identity.dpRank);
    const account = (error: string): RecorderFlushAccount => ({ dir: path.join('recorder', name), forwards: [], leftOut: [], error });
    if (!rec.writesOn('incident')) return Promise.resolve(account('recorder.on leaves out "incident" on this rank'));
    return rec.atIncident(name, wave, { jobs: jobs.map((j) => j.jobId) }).then(
      (r) => {
        if (!r) return account('this agent has no snapshot or dump root');
        const acc = flushAccount(r, this.root);
        const v = this.view().verdict;
        // Off the dump's path: the ack does not wait for the verdict.
        if (v.auto && this.verdicts) void this.verdicts.afterFlush(acc.dir, acc.forwards, v.allowLiveDevice);
        return acc;
      },
      (e) => {
        const err = String((e as Error)?.message ?? e);
        this.log.error({ err }, 'flight recorder: incident flush failed');
        return account(err);
      },
    );
  }

  /** A verdict in progress is killed (the agent stops). */
  stop(): void {
    this.verdicts?.stop();
  }

  /** `capture --flush-recorder` arms of this replica among `arms` (a snapshot's or a wave head's captures). */
  arms(arms: readonly Record<string, any>[] | undefined): void {
    takeFlushArms(arms, this.flushArms, this.recorder, this.opts.identity.dpRank, (r) => this.bus()?.sendCaptureResult(r));
  }
}

/** What a flush wrote, for the dump acks: the forwards whole on disk, and those recorded but not written. */
export function flushAccount(r: FlushResult, root: string | undefined): RecorderFlushAccount {
  return {
    dir: root ? path.relative(root, r.dir) : r.dir,
    forwards: r.forwards.filter((f) => f.callDir).map((f) => f.forward),
    leftOut: [...r.forwards.filter((f) => !f.callDir).map((f) => f.forward), ...r.torn.map((t) => t.forward)].sort((a, b) => a - b),
    error: '',
  };
}
