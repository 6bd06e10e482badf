// The soak's engine workload for one DP replica: a few request slots, each request prefilled,
// decoding one token per wave for `life` waves, finishing, and freeing its blocks the wave after,
// unless the engine learnt from pendingDump() that a dump of it is still to be copied: then its
// blocks stay one more wave (as the torch and simulated engines do). Slots start staggered so a
// replica always has running requests (a manual dump always has targets). Request ids repeat
// across replicas on purpose (each replica counts from 0).
import type { RequestStep, StepTelemetry } from '../../src/messages';

export interface WorkloadOptions {
  slots: number;
  /** Waves a request decodes before it finishes. */
  life: number;
  blocksPerRequest: number;
  poolBlocks: number;
}

interface Req {
  id: string;
  blocks: number[];
  tokens: number;
  finishAt: number;
  finished: boolean;
}

export class SoakWorkload {
  private readonly free: number[] = [];
  private readonly slots: (Req | undefined)[];
  /** Finished, blocks still held (waiting for their free, possibly deferred). */
  private holding: Req[] = [];
  private next = 0;
  /** Frees put off a wave because a dump of the request was pending. */
  deferredFrees = 0;
  admitted = 0;
  freed = 0;

  constructor(private readonly o: WorkloadOptions) {
    if (o.slots * o.blocksPerRequest * 2 > o.poolBlocks) throw new Error(`soak workload: ${o.slots} slots × ${o.blocksPerRequest} blocks need a pool of ${o.slots * o.blocksPerRequest * 2} blocks (room for deferred frees), have ${o.poolBlocks}`);
    for (let b = o.poolBlocks - 1; b >= 0; b--) this.free.push(b);
    this.slots = Array.from({ length: o.slots }, () => undefined);
  }

  /** The finished requests whose blocks the next step would free: the engine asks pendingDump for these. */
  finishedHolding(): string[] {
    return this.holding.map((r) => r.id);
  }

  /** Run wave w: free (unless kept), admit into empty slots whose start has come, decode; its telemetry. */
  step(w: number, keep?: ReadonlySet<string>): StepTelemetry & { requests: RequestStep[] } {
    const out: RequestStep[] = [];
    const stillHeld: Req[] = [];
    for (const r of this.holding) {
      if (keep?.has(r.id)) {
        this.deferredFrees++;
        stillHeld.push(r);
        continue;
      }
      this.free.push(...r.blocks);
      this.freed++;
      out.push(this.row(r, false, true));
    }
    this.holding = stillHeld;
    const stagger = Math.max(1, Math.floor(this.o.life / this.o.slots));
    for (let s = 0; s < this.slots.length; s++) {
      let r = this.slots[s];
      if (r) {
        r.tokens++;
        r.finished = w >= r.finishAt;
        out.push(this.row(r, r.finished, false));
        if (r.finished) {
          this.holding.push(r);
          this.slots[s] = undefined;
        }
        continue;
      }
      if (w < 1 + s * stagger || this.free.length < this.o.blocksPerRequest) continue;
      r = { id: `soak-req-${this.next++}`, blocks: this.free.splice(this.free.length - this.o.blocksPerRequest), tokens: 1, finishAt: w + this.o.life, finished: false };
      this.admitted++;
      this.slots[s] = r;
      out.push(this.row(r, false, false)); // prefill samples the first token
    }
    return { wave: w, requests: out, nonFinite: [] };
  }

  private row(r: Req, finished: boolean, freed: boolean): RequestStep {
    const tok = freed ? [] : [100 + ((r.tokens * 7919) % 30000)];
    return {
      reqId: r.id, newTokenIds: tok, newTokenLogprobs: freed ? [] : [-0.5], newTokenRanks: freed ? [] : [0], draftLen: 0, accepted: 0,
      blockIds: r.blocks, finished, freed, promptLen: 8, numOutputTokens: r.tokens,
    };
  }
}
