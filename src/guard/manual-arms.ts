// Manual KV dumps asked for on a running job (`wavebus dump`, docs/control.md): each is armed at
// the next wave head of every replica it names, exactly as a raise of dump.manual_dump is (the
// guard's armOne, through manualDumpJobs: same ledger, request_info.json and manifest), and remembers the jobs it
// armed there so that the tool can follow them to their manifests.
import { requestMatches } from '../snapshot/selector';
import type { DumpJob } from '../messages';
import type { ReplicaState } from './replica-state';
import type { ReqState } from './requests';

/** What arming one request's dump came to (the guard's armOne): a job, a refusal's file, or a failure. */
export interface ArmOutcome {
  job?: DumpJob;
  skipped?: string;
  /** The refusal's dump_skipped.json. */
  dir?: string;
  failed?: boolean;
}

/** How the guard arms one manual dump: each request as an incident's dump is, a refusal when none runs, its counter. */
export interface ManualDumpArming {
  armOne(st: ReqState): ArmOutcome;
  /** Writes the no_dump_targets refusal; its dump_skipped.json. */
  refuseNone(): string;
  count(action: string): void;
}

const SKIPPED_FILE = /[/\\]dump_skipped\.json$/;

/** One manual dump of `running` (a replica's running requests it names): the jobs and refusals it made. */
export function manualDumpJobs(running: ReqState[], a: ManualDumpArming): ManualArmJob[] {
  if (running.length === 0) {
    const dir = a.refuseNone();
    a.count('dump_skipped');
    return [{ jobId: '', dir: dir.replace(SKIPPED_FILE, ''), skippedReason: 'no_dump_targets' }];
  }
  const out: ManualArmJob[] = [];
  for (const st of running) {
    const r = a.armOne(st);
    a.count(r.job ? 'dump_kv' : r.dir ? 'dump_skipped' : r.failed ? 'dump_failed' : 'duplicate');
    if (r.job || r.dir) out.push(r.job ? { jobId: r.job.jobId, dir: r.job.dumpDir } : { jobId: '', dir: r.dir!.replace(SKIPPED_FILE, ''), skippedReason: r.skipped });
  }
  return out;
}

/** One dump job (or refusal) a manual arm made on one replica. */
export interface ManualArmJob {
  jobId: string;
  /** The dump's wave dir (manifest.json, or dump_skipped.json when refused). */
  dir: string;
  skippedReason?: string;
}

export interface ManualArm {
  id: string;
  /** One request (the prefix rule), or every running request when undefined. */
  requestId?: string;
  replicas: number[];
  /** Per replica whose head took it: the arm wave and the jobs. */
  armed: Map<number, { wave: number; jobs: ManualArmJob[] }>;
  /** Per replica that could not take it: why (nothing was armed there). */
  unserved: Map<number, string>;
}

/** Arms kept for the tool to follow; the oldest go first. */
const KEPT = 64;

export class ManualArms {
  private readonly arms = new Map<string, ManualArm>();
  private next = 1;
  /** Replicas whose head takes nothing now (the first head after a wake: src/bus/replica-wake.ts). */
  readonly held = new Set<number>();

  /** Queue a manual dump for the next head of each of `replicas`; returns its id. */
  queue(requestId: string | undefined, replicas: number[]): ManualArm {
    const arm: ManualArm = { id: `dump-${this.next++}`, requestId, replicas, armed: new Map(), unserved: new Map() };
    this.arms.set(arm.id, arm);
    if (this.arms.size > KEPT) this.arms.delete(this.arms.keys().next().value as string);
    return arm;
  }

  /** The arms `replica`'s head takes now (each replica takes each arm once). */
  take(replica: number): ManualArm[] {
    const out: ManualArm[] = [];
    for (const a of this.arms.values()) if (ManualArms.waitsOn(a, replica)) out.push(a);
    return out;
  }

  private static waitsOn(a: ManualArm, replica: number): boolean {
    return a.replicas.includes(replica) && !a.armed.has(replica) && !a.unserved.has(replica);
  }

  /** Whether an arm waits for `replica`'s next head. */
  waitingFor(replica: number): boolean {
    for (const a of this.arms.values()) if (ManualArms.waitsOn(a, replica)) return true;
    return false;
  }

  /** Every arm waiting for `replica` gives it up: `why` is what the tool says (nothing is armed there). */
  fail(replica: number, why: string): void {
    for (const a of this.arms.values()) if (ManualArms.waitsOn(a, replica)) a.unserved.set(replica, why);
  }

  /**
   * At a head of `rs`: while the replica is behind the dump.manual_dump `watermark`, one manual dump
   * of all its running requests per head (one raise reaches every replica); then each arm it has not
   * taken, the same way. `dump` arms one (the guard's) and says what it made.
   */
  atHead(rs: ReplicaState, watermark: number, wave: number, dump: (wants: (reqId: string) => boolean, info: Record<string, unknown>) => ManualArmJob[]): void {
    if (this.held.has(rs.replica)) return;
    if (watermark > rs.manualDone) {
      rs.manualDone++;
      dump(() => true, { manual_dump: rs.manualDone });
    }
    for (const arm of this.take(rs.replica)) arm.armed.set(rs.replica, { wave, jobs: dump((id) => ManualArms.wants(arm, id), { manual_request: arm.id }) });
  }

  get(id: string): ManualArm | undefined {
    return this.arms.get(id);
  }

  /** Whether `reqId` is one `arm` dumps. */
  static wants(arm: ManualArm, reqId: string): boolean {
    return arm.requestId === undefined || requestMatches(reqId, arm.requestId);
  }

  /** Arms queued and not yet taken by every replica they name. */
  waiting(): number {
    let n = 0;
    for (const a of this.arms.values()) if (a.armed.size + a.unserved.size < a.replicas.length) n++;
    return n;
  }
}
