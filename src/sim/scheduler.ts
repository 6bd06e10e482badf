// The simulated engine's scheduler: requests arrive, are prefilled, decode one token per step
// (with speculative statistics when enabled), finish and free their blocks. It is a pure
// function of its options, so every rank of a job computes the same batches and block tables,
// as every rank of a real TP job does.
import type { NonFiniteRow, RequestStep, StepTelemetry } from '../messages';
import { prng } from '../prng';
import type { SimFaults } from './faults';

export interface SchedulerOptions {
  requests: number;
  numBlocks: number;
  blockSize: number;
  /** Speculative tokens per step (0 = off). */
  speculative: number;
  seed?: number;
  /**
   * The DP replica (dp rank): replicas serve the same request ids (ids may repeat across
   * replicas) with different lengths, so their block tables differ.
   */
  replica?: number;
}

export interface SimRequest {
  index: number;
  id: string;
  promptLen: number;
  maxTokens: number;
  arrival: number;
  blockIds: number[];
  tokens: number[];
  state: 'waiting' | 'running' | 'finished' | 'freed';
  finishedAt?: number;
}

export interface StepBatch {
  step: number;
  isPrompt: boolean;
  reqIds: string[];
  /** Per row: the position of the token the row processes. */
  positions: number[];
  rowRequest: number[];
  inputIds: number[];
  telemetry: StepTelemetry & { requests: RequestStep[] };
}

function suffix(i: number, seed: number): string {
  return ((Math.imul(i + 1, 0x9e3779b1) ^ seed) >>> 0).toString(16).padStart(8, '0');
}

export class SimScheduler {
  readonly requests: SimRequest[] = [];
  private readonly free: number[] = [];
  // Per-step work follows the live requests only, so a long workload (thousands of requests)
  // costs the simulated engine no more per step than a short one.
  /** The first request that has not arrived yet (arrivals are in index order). */
  private nextArrival = 0;
  /** Arrived, waiting for blocks; index order. */
  private waiting: SimRequest[] = [];
  /** Running, or finished and not yet freed; index order. */
  private active: SimRequest[] = [];
  private readonly rand: () => number;

  constructor(
    private readonly opts: SchedulerOptions,
    private readonly faults: SimFaults = {},
  ) {
    const seed = opts.seed ?? 1234;
    this.rand = prng(seed);
    for (let b = opts.numBlocks - 1; b >= 0; b--) this.free.push(b);
    for (let i = 0; i < opts.requests; i++) {
      this.requests.push({
        index: i,
        // vLLM appends a unique suffix to the caller's id: 'req-3' becomes 'req-3-9a8546d5'.
        id: `req-${i}-${suffix(i, seed)}`,
        promptLen: 12 + ((i * 7) % 29),
        maxTokens: 48 + ((i * 13 + (opts.replica ?? 0) * 7) % 40),
        arrival: 1 + Math.floor(i / 2),
        blockIds: [],
        tokens: [],
        state: 'waiting',
      });
    }
  }

  /** Finished requests whose blocks are not given back yet (an engine asks pendingDump for these). */
  finishedHolding(step: number): string[] {
    return this.active.filter((r) => r.state === 'finished' && r.finishedAt !== undefined && r.finishedAt < step).map((r) => r.id);
  }

  /**
   * Run step `step` (a wave): admit, prefill or decode, and return the batch with its telemetry.
   * `keep`: finished requests whose blocks stay one more step (a dump of them is pending).
   */
  step(step: number, keep?: ReadonlySet<string>): StepBatch {
    const f = this.faults;
    const requestSteps: RequestStep[] = [];
    const nonFinite: NonFiniteRow[] = [];
    // Requests that finished last step free their blocks now (telemetry reports it), unless kept.
    let freed = 0;
    for (const r of this.active) {
      if (r.state === 'finished' && r.finishedAt !== undefined && r.finishedAt < step && !keep?.has(r.id)) {
        r.state = 'freed';
        freed++;
        for (const b of r.blockIds) this.free.push(b);
        requestSteps.push(this.requestStep(r, [], [], [], 0, 0, false, true));
      }
    }
    if (freed > 0) this.active = this.active.filter((r) => r.state !== 'freed');
    while (this.nextArrival < this.requests.length && this.requests[this.nextArrival].arrival <= step) this.waiting.push(this.requests[this.nextArrival++]);
    // Admit arrivals (prefill) when their blocks fit; one prefill batch per step, as chunked prefill off.
    const admitted = this.waiting.filter((r) => {
      const need = Math.ceil((r.promptLen + r.maxTokens) / this.opts.blockSize);
      if (need > this.free.length) return false;
      r.blockIds = this.free.splice(this.free.length - need, need).reverse();
      r.state = 'running';
      return true;
    });
    if (admitted.length > 0) {
      this.waiting = this.waiting.filter((r) => r.state === 'waiting');
      this.active = [...this.active, ...admitted].sort((a, b) => a.index - b.index);
      const positions: number[] = [];
      const rowRequest: number[] = [];
      const inputIds: number[] = [];
      admitted.forEach((r, i) => {
        for (let p = 0; p < r.promptLen; p++) {
          positions.push(p);
          rowRequest.push(i);
          inputIds.push(1000 + ((r.index * 31 + p * 17) % 20000));
        }
        // Prefill samples the first output token too.
        const t = this.sample(r, step);
        requestSteps.push(this.requestStep(r, [t.id], [t.logprob], [t.rank], 0, 0, false, false));
      });
      return { step, isPrompt: true, reqIds: admitted.map((r) => r.id), positions, rowRequest, inputIds, telemetry: { wave: step, requests: requestSteps, nonFinite } };
    }
    const running = this.active.filter((r) => r.state === 'running');
    const positions: number[] = [];
    const rowRequest: number[] = [];
    const inputIds: number[] = [];
    running.forEach((r, row) => {
      positions.push(r.promptLen + r.tokens.length - 1);
      rowRequest.push(row);
      inputIds.push(r.tokens[r.tokens.length - 1]);
      if (f.nonFinite && f.nonFinite.request === r.index && f.nonFinite.at === step) {
        nonFinite.push({ row, reqId: r.id, kind: f.nonFinite.kind ?? 'nan' });
      }
      const t = this.sample(r, step);
      let draft = 0;
      let accepted = 0;
      if (this.opts.speculative > 0) {
        draft = this.opts.speculative;
        const drift = f.specDrift && f.specDrift.request === r.index && step >= f.specDrift.from;
        // accepted counts the bonus token; healthy acceptance sits between the detector's bands.
        accepted = drift ? 1 : 1 + Math.min(draft, 1 + Math.floor(this.rand() * draft));
      }
      const finished = r.tokens.length >= r.maxTokens;
      if (finished) {
        r.state = 'finished';
        r.finishedAt = step;
      }
      requestSteps.push(this.requestStep(r, [t.id], [t.logprob], [t.rank], draft, accepted, finished, false));
    });
    return { step, isPrompt: false, reqIds: running.map((r) => r.id), positions, rowRequest, inputIds, telemetry: { wave: step, requests: requestSteps, nonFinite } };
  }

  private sample(r: SimRequest, step: number): { id: number; logprob: number; rank: number } {
    const f = this.faults;
    const u = this.rand();
    let id = 100 + Math.floor(u * 31900);
    let logprob = -0.05 - 1.5 * this.rand();
    let rank = Math.floor(this.rand() * this.rand() * 4);
    if (f.repetition && f.repetition.request === r.index && step >= f.repetition.from) {
      const period = f.repetition.period ?? 3;
      id = 500 + (r.tokens.length % period);
      logprob = -0.01;
      rank = 0;
    }
    if (f.garbled && f.garbled.request === r.index && step >= f.garbled.from) {
      logprob = -9 - 3 * this.rand();
      rank = 200 + Math.floor(this.rand() * 5000);
    }
    r.tokens.push(id);
    return { id, logprob, rank };
  }

  private requestStep(r: SimRequest, ids: number[], lps: number[], ranks: number[], draft: number, accepted: number, finished: boolean, freed: boolean): RequestStep {
    return {
      reqId: r.id,
      newTokenIds: ids,
      newTokenLogprobs: lps,
      newTokenRanks: ranks,
      draftLen: draft,
      accepted,
      blockIds: r.blockIds,
      finished,
      freed,
      promptLen: r.promptLen,
      numOutputTokens: r.tokens.length,
    };
  }
}
