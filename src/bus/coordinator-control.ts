// The coordinator's answers to control requests (`wavebus status / dump / capture`, docs/control.md).
// They reach this module only once admitted (router-inbox.ts): the bus token's MAC, or a CURVE key
// on the allow-list (the handshake), and this protocol version; anything else was refused there,
// counted, and nothing was armed. A malformed request is answered with an error naming the field.
// The plain status request (the one thing answered without the MAC) and an agent's token challenge
// are answered here too: every request about the coordinator itself, apart from its bus traffic.
import * as fs from 'fs';
import * as path from 'path';
import type { Coordinator } from './coordinator';
import { statusJson, statusReply } from './coordinator-replies';
import { NONCE_BYTES } from './constants';
import { PROTOCOL_VERSION } from './protocol-version';
import { CaptureArms, DEFAULT_ARM_CAPTURES, DEFAULT_WITHIN_WAVES, type CaptureSpec } from './capture-arms';
import type { ManualArms } from '../guard/manual-arms';
import type { AgentMsg, DropCounter } from './frames';
import { counter } from '../metrics';
import { parseArtifactJson } from '../artifacts/json-file';
import { replicaHead } from '../layout';
import { BadVerdictNote } from './verdict-book';

/** Most ids, token targets or indices one capture may name, and its largest budget. */
export const MAX_CAPTURE_RULES = 64;
export const MAX_ARM_CAPTURES = 1000;
const MAX_U32 = 0xffffffff;

/** A flight recorder flush as a capture arm (every rank of each replica writes its ring at the arm's wave). */
const FLUSH_ARM: Omit<CaptureSpec, 'replicas'> = { requestIds: [], tokenTargets: [], callIndices: [], next: true, tpRanks: [], format: 0, maxCaptures: 1, withinWaves: 1, flushRecorder: true };

/** A control request the coordinator does not act on: its reason names the field. */
class Refused extends Error {
  constructor(message: string, readonly code = 'ERR_CONTROL') {
    super(message);
  }
}

/** Waves per second of one replica, over its last heads. */
class WaveRate {
  private readonly at: number[] = [];
  private readonly waves: number[] = [];

  note(wave: number, now: number): void {
    this.at.push(now);
    this.waves.push(wave);
    if (this.at.length > 64) {
      this.at.shift();
      this.waves.shift();
    }
  }

  /** 0 when the replica has not stepped for 5 s (stalled or done). */
  perSecond(now: number): number {
    const n = this.at.length;
    if (n < 2 || now - this.at[n - 1] > 5000) return 0;
    const dt = (this.at[n - 1] - this.at[0]) / 1000;
    return dt > 0 ? Math.max(0, this.waves[n - 1] - this.waves[0]) / dt : 0;
  }
}

export class CoordinatorControl {
  readonly captures: CaptureArms;
  private readonly rates: WaveRate[];
  /** The protocol version each rank's agent said in its hello. */
  private readonly agentVersions = new Map<number, number>();
  private readonly handled = counter('wavebus_control_requests_total', 'Control requests (wavebus status / dump / capture) answered, by kind and outcome', ['kind', 'outcome'] as const);

  constructor(
    private readonly c: Coordinator,
    private readonly reply: (routingId: Buffer, msg: Record<string, unknown>) => void,
    private readonly drops: DropCounter,
  ) {
    this.captures = new CaptureArms(c.layout);
    this.rates = Array.from({ length: c.layout.dp }, () => new WaveRate());
    c.on('wave', (head: { wave: number }, replica: number) => {
      this.rates[replica]?.note(head.wave, Date.now());
      this.recorderBump();
    });
  }

  /** The recorder.flush watermark served: starts at 0, as dump.manual_dump's (the file found at start is not read). */
  private recorderFlushDone = 0;

  /**
   * A raise of recorder.flush (runtime config, docs/recorder.md): one flush of every replica per
   * head while the watermark is ahead, armed exactly as `capture --flush-recorder` is.
   */
  private recorderBump(): void {
    const cfg = (this.c.policy as { config?: () => { recorder?: { flush: number } } } | undefined)?.config?.();
    const mark = cfg?.recorder?.flush ?? 0;
    if (mark <= this.recorderFlushDone) return;
    this.recorderFlushDone++;
    const replicas = Array.from({ length: this.c.layout.dp }, (_, r) => r);
    const id = this.captures.queue({ ...FLUSH_ARM, replicas });
    this.c.log.info({ id, replicas, recorder_flush: this.recorderFlushDone }, 'flight recorder flush asked for by a recorder.flush raise');
  }

  hello(rank: number, protocolVersion: number): void {
    this.agentVersions.set(rank, protocolVersion);
  }

  /** Something armed by control on `replica` waits for a head or is in force (replica-wake.ts). */
  armedOn(replica: number): boolean {
    return (this.manualArms?.waitingFor(replica) ?? false) || this.captures.open(replica);
  }

  /** What waits for `replica`'s next head gives it up, with `why` (replica-wake.ts). */
  failQueued(replica: number, why: string): void {
    this.manualArms?.fail(replica, why);
    this.captures.fail(replica, why);
    this.c.log.warn({ replica, why }, 'what was armed on this replica could not be served');
  }

  /**
   * Refuse at once an arm no head of `replicas` can take: the replica's head rank (its wave heads
   * decide every vector) joined the bus and its agent was lost since. Nothing is armed. One that has
   * not joined yet (a job starting) is not refused: the arm waits for it.
   */
  private servable(replicas: number[], what: string): void {
    const live = new Set(this.c.liveRanks());
    const lost = (g: number) => !live.has(g) && this.c.rankTable.get(g) !== undefined;
    const dead = replicas.filter((r) => lost(replicaHead(this.c.layout, r)));
    if (dead.length === 0) return;
    const which = dead.map((r) => `replica ${r} (its head rank ${replicaHead(this.c.layout, r)})`).join(', ');
    throw new Refused(`${what}: ${which} lost its agent, so no wave of it can carry the ${what}; nothing was armed (live ranks: ${[...live].sort((a, b) => a - b).join(',') || 'none'})`, 'ERR_CONTROL_UNSERVABLE');
  }

  private get manualArms(): ManualArms | undefined {
    return (this.c.policy as { manualArms?: ManualArms } | undefined)?.manualArms;
  }

  /** An admitted status, challenge or control request (answered), or an agent's word on a capture (counted when its rank is known). */
  onMessage(routingId: Buffer, rank: number, msg: AgentMsg): void {
    switch (msg.body) {
      case 'status':
        return this.reply(routingId, { requestId: msg.requestId, status: statusReply(this.c) });
      case 'challenge': {
        // An agent's new connection asks us to prove the bus token (coordinator-link.ts): the nonce
        // back, under our MAC. Only with a token: without one there is nothing to prove.
        const nonce = msg.challenge.nonce as Uint8Array | undefined;
        if (!this.c.opts.busToken || !nonce || nonce.length !== NONCE_BYTES) return this.drops.drop('unexpected', `a challenge of ${nonce?.length ?? 0} bytes`);
        return this.reply(routingId, { requestId: msg.requestId, proof: { nonce } });
      }
      case 'control':
        return this.reply(routingId, { requestId: msg.requestId, control: this.answer(msg) });
      default:
        if (this.c.rankTable.touch(rank, routingId)) this.captures.onResult({ ...msg.captureResult, globalRank: rank });
    }
  }

  /** Answer one admitted control request. */
  answer(msg: AgentMsg): Record<string, unknown> {
    const req = msg.control ?? {};
    const kind: string = req.request ?? 'none';
    try {
      const body = this.act(kind, req);
      this.handled.inc({ kind, outcome: 'ok' });
      return { protocolVersion: PROTOCOL_VERSION, ...body };
    } catch (e) {
      this.handled.inc({ kind, outcome: 'refused' });
      const code = e instanceof Refused ? e.code : 'ERR_CONTROL';
      if (!(e instanceof Refused)) this.c.log.error({ kind, err: String((e as Error)?.stack ?? e) }, 'control request failed');
      return { protocolVersion: PROTOCOL_VERSION, errorCode: code, error: (e as Error).message };
    }
  }

  private act(kind: string, req: Record<string, any>): Record<string, unknown> {
    switch (kind) {
      case 'status':
        return { statusJson: JSON.stringify(this.status()) };
      case 'dump':
        return this.dump(req.dump);
      case 'capture':
        return this.capture(req.capture);
      case 'query':
        return this.query(String(req.query.id ?? ''));
      case 'verdict':
        try {
          const v = this.c.verdicts.note(req.verdict);
          let report: string | undefined;
          try {
            report = this.c.policy?.onVerdict?.(v);
          } catch (e) {
            // A full disk loses the report's copy only: the verdict is kept for status and /metrics.
            this.c.log.error({ incident: v.incident, err: (e as Error).message }, 'cannot write the verdict into the incident report');
          }
          this.c.log.info({ incident: v.incident, verdict: v.verdict, host: v.host, report }, 'incident verdict');
          return { id: v.incident };
        } catch (e) {
          throw e instanceof BadVerdictNote ? new Refused(e.message) : e;
        }
      default:
        throw new Refused('control: the request names no known kind (status, dump, capture, query, verdict)');
    }
  }

  /** The /healthz document and what `wavebus status` shows beside it. */
  status(): Record<string, unknown> {
    const now = Date.now();
    const s = statusJson(this.c);
    const replicas = s.replicas as Record<string, Record<string, unknown>>;
    for (const [r, rep] of Object.entries(replicas)) rep.waves_per_s = Math.round((this.rates[Number(r)]?.perSecond(now) ?? 0) * 10) / 10;
    const ranks = s.ranks as Record<string, Record<string, unknown>>;
    for (const [r, st] of Object.entries(ranks)) st.protocol_version = this.agentVersions.get(Number(r)) ?? null;
    return {
      ...s,
      protocol_version: PROTOCOL_VERSION,
      captures: this.captures.statusJson(),
      manual_dumps_waiting: this.manualArms?.waiting() ?? 0,
      // The flight recorder is the agents' (WAVEBUS_RECORD_FORWARDS); a flush is a capture arm.
      recorder: 'per agent (WAVEBUS_RECORD_FORWARDS)',
    };
  }

  private replicasOf(r: Record<string, any>, field: string): number[] {
    const dp = this.c.layout.dp;
    if (!r.hasReplica) return Array.from({ length: dp }, (_, i) => i);
    const replica = Number(r.replica);
    if (!(Number.isInteger(replica) && replica >= 0 && replica < dp)) throw new Refused(`${field}.replica = ${replica} is not a replica of this job (dp=${dp})`);
    return [replica];
  }

  private dump(r: Record<string, any>): Record<string, unknown> {
    const arms = this.manualArms;
    if (!arms) throw new Refused('dump: this coordinator runs without the runtime guard (no --runtime-config-path): nothing can be dumped');
    const requestId = String(r.requestId ?? '');
    if (r.all === Boolean(requestId)) throw new Refused('dump: give either request_id or all, not both and not neither');
    if (requestId.length > 256) throw new Refused(`dump.request_id: ${requestId.length} characters, at most 256`);
    const replicas = this.replicasOf(r, 'dump');
    this.servable(replicas, 'dump');
    const arm = arms.queue(requestId || undefined, replicas);
    this.c.wake.refresh(); // a job whose bus sleeps wakes for it
    this.c.log.info({ id: arm.id, request: arm.requestId ?? '(all)', replicas: arm.replicas }, 'manual dump asked for by a control request');
    return { id: arm.id };
  }

  private capture(r: Record<string, any>): Record<string, unknown> {
    if (r.flushRecorder) {
      // Every rank of each replica writes out its ring at the same wave (docs/recorder.md).
      const replicas = this.replicasOf(r, 'capture');
      this.servable(replicas, 'capture');
      const id = this.captures.queue({ ...FLUSH_ARM, replicas });
      this.c.wake.refresh();
      this.c.log.info({ id, replicas }, 'flight recorder flush asked for by a control request');
      return { id };
    }
    const list = (v: unknown, field: string, ok: (x: any) => boolean, what: string): any[] => {
      const a = Array.isArray(v) ? v : [];
      if (a.length > MAX_CAPTURE_RULES) throw new Refused(`capture.${field}: ${a.length} entries, at most ${MAX_CAPTURE_RULES}`);
      a.forEach((x, i) => {
        if (!ok(x)) throw new Refused(`capture.${field}[${i}] = ${JSON.stringify(x)}: expected ${what}`);
      });
      return a;
    };
    const { tp } = this.c.layout;
    const spec: CaptureSpec = {
      requestIds: list(r.requestIds, 'request_ids', (x) => typeof x === 'string' && x.trim() !== '' && x.length <= 256, 'a non-empty request id of at most 256 characters').map((x) => String(x).trim()),
      tokenTargets: list(r.tokenTargets, 'token_targets', (x) => Number.isSafeInteger(Number(x)) && Number(x) >= 0, 'a token position').map(Number),
      callIndices: list(r.callIndices, 'call_indices', (x) => Number.isSafeInteger(Number(x)) && Number(x) >= 0, 'a call index').map(Number),
      next: Boolean(r.next),
      tpRanks: list(r.tpRanks, 'tp_ranks', (x) => Number.isInteger(x) && x >= 0 && x < tp, `a tp rank of this job (tp=${tp})`).map(Number),
      format: Number(r.format ?? 0),
      maxCaptures: Number(r.maxCaptures ?? 0) || DEFAULT_ARM_CAPTURES,
      replicas: this.replicasOf(r, 'capture'),
      withinWaves: Number(r.withinWaves ?? 0) || DEFAULT_WITHIN_WAVES,
    };
    if (spec.next && spec.callIndices.length > 0) throw new Refused('capture: give next or call_indices, not both');
    if (!spec.next && spec.callIndices.length + spec.tokenTargets.length + spec.requestIds.length === 0) throw new Refused('capture: no rule (give request_ids, token_targets, call_indices or next)');
    if (!(spec.format >= 0 && spec.format <= 3)) throw new Refused(`capture.format = ${spec.format}: not a TensorFormat`);
    if (spec.maxCaptures > MAX_ARM_CAPTURES) throw new Refused(`capture.max_captures = ${spec.maxCaptures}: at most ${MAX_ARM_CAPTURES}`);
    if (spec.withinWaves > MAX_U32) throw new Refused(`capture.within_waves = ${spec.withinWaves}: too large`);
    this.servable(spec.replicas, 'capture');
    const id = this.captures.queue(spec);
    this.c.wake.refresh(); // a job whose bus sleeps wakes for it
    this.c.log.info({ id, requests: spec.requestIds, tokens: spec.tokenTargets, calls: spec.callIndices, next: spec.next, tpRanks: spec.tpRanks, replicas: spec.replicas }, 'input snapshot armed by a control request');
    return { id };
  }

  private query(id: string): Record<string, unknown> {
    const cap = this.captures.progress(id);
    // A queued arm on a woken replica whose engine has not connected yet: what it waits for (the tool says it at its --timeout).
    if (cap) return { id, capture: cap.map((p) => (!p.armed && !p.unserved ? { ...p, waiting: this.c.wake.waiting((p.arm as { replica: number }).replica) ?? '' } : p)) };
    const arm = this.manualArms?.get(id);
    if (!arm) throw new Refused(`query: no arm ${JSON.stringify(id)} on this coordinator (it keeps the last 64; a restarted coordinator knows none)`);
    const jobs = [...arm.armed.values()].flatMap((a) => a.jobs.map((j) => ({ ...j, ...manifestOf(j.dir, j.skippedReason) })));
    const unserved = [...arm.unserved].map(([replica, why]) => `replica ${replica}: ${why}`);
    const waiting = arm.replicas.filter((r) => !arm.armed.has(r) && !arm.unserved.has(r)).flatMap((r) => {
      const why = this.c.wake.waiting(r);
      return why ? [`replica ${r}: ${why}`] : [];
    });
    return { id, dump: { id, replicas: arm.replicas, replicasArmed: [...arm.armed.keys()], jobs, unserved, waiting } };
  }
}

/** What a dump's manifest.json (written by the ledger when the job settles) says, read without following links. */
function manifestOf(dir: string, skippedReason?: string): Record<string, unknown> {
  if (skippedReason) return { settled: true, complete: false, skippedReason };
  let fd: number;
  try {
    fd = fs.openSync(path.join(dir, 'manifest.json'), fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  } catch {
    return { settled: false, complete: false };
  }
  try {
    if (fs.fstatSync(fd).size > 4 << 20) return { settled: true, complete: false, skippedReason: 'manifest_unreadable' };
    const m = parseArtifactJson(fs.readFileSync(fd, 'utf8')) as Record<string, unknown>;
    return { settled: true, complete: m.complete === true, expectedRanks: m.expected_ranks ?? [], completedRanks: m.completed_ranks ?? [] };
  } catch {
    return { settled: true, complete: false, skippedReason: 'manifest_unreadable' };
  } finally {
    fs.closeSync(fd);
  }
}
