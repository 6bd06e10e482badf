// Manual KV dumps asked for on a running job (`wavebus dump`, docs/control.md): each is armed at
// the next wave head of every replica it names, exactly as a raise of dump.manual_dump is (the
// guard's manualDump: same ledger, same request_info.json and manifest), and remembers the jobs it
// armed there so that the tool can follow them to their manifests.
import { requestMatches } from '../snapshot/selector';

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
}

/** Arms kept for the tool to follow; the oldest go first. */
const KEPT = 64;

export class ManualArms {
  private readonly arms = new Map<string, ManualArm>();
  private next = 1;

  /** Queue a manual dump for the next head of each of `replicas`; returns its id. */
  queue(requestId: string | undefined, replicas: number[]): ManualArm {
    const arm: ManualArm = { id: `dump-${this.next++}`, requestId, replicas, armed: new Map() };
    this.arms.set(arm.id, arm);
    if (this.arms.size > KEPT) this.arms.delete(this.arms.keys().next().value as string);
    return arm;
  }

  /** The arms `replica`'s head takes now (each replica takes each arm once). */
  take(replica: number): ManualArm[] {
    const out: ManualArm[] = [];
    for (const a of this.arms.values()) if (a.replicas.includes(replica) && !a.armed.has(replica)) out.push(a);
    return out;
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
    for (const a of this.arms.values()) if (a.armed.size < a.replicas.length) n++;
    return n;
  }
}
