// The guard's table of the engine's requests: each request's state (slot, token counts, block
// table, quota, muted detectors, kept token ids), bound to the telemetry slot the client gave it,
// and forgotten when freed (its id remembered a while, so late telemetry does not revive it).
import type { SlotBinding } from '../messages';
import type { DetectorSet } from './detectors';
import type { IncidentCount } from './quotas';

export interface ReqState {
  reqId: string;
  promptLen: number;
  outputTokens: number;
  blockIds: number[];
  finished: boolean;
  freed: boolean;
  /** The request's telemetry slot, also its record in the detectors' state slab; -1 when unbound. */
  slot: number;
  /** MUTE_BIT of each detector the quota stopped for this request. */
  muted: number;
  quota: Map<string, IncidentCount> | null;
  /** Recent output token ids, kept only when report.save_sensitive_info is on. */
  tail: number[] | null;
  /** The prompt's first token ids (as the engine gave them), kept only when save_sensitive_info is on. */
  prompt: number[] | null;
}

const FREED_MEMORY = 65536;

export class RequestTable {
  readonly reqs = new Map<string, ReqState>();
  /** The request bound to each telemetry slot. */
  bySlot: (ReqState | undefined)[] = [];
  private readonly freedIds = new Set<string>();

  /** A state in no table (an incident that names no request: no blocks, so no dump). */
  detached(reqId: string): ReqState {
    return { reqId, promptLen: 0, outputTokens: 0, blockIds: [], finished: false, freed: false, slot: -1, muted: 0, quota: null, tail: null, prompt: null };
  }

  /** The state of `reqId`, created unbound (no slot) when it is new. */
  state(reqId: string): ReqState {
    let st = this.reqs.get(reqId);
    if (!st) {
      st = { reqId, promptLen: 0, outputTokens: 0, blockIds: [], finished: false, freed: this.freedIds.has(reqId), slot: -1, muted: 0, quota: null, tail: null, prompt: null };
      this.reqs.set(reqId, st);
    }
    return st;
  }

  /**
   * A request takes a slot; whoever held it before was freed (the client reuses freed slots).
   * `promptIdsCap`: keep this many prompt token ids (save_sensitive_info), null: keep none.
   */
  bind(b: SlotBinding, detectors: DetectorSet, promptIdsCap: number | null): void {
    const old = this.bySlot[b.slot];
    if (old !== undefined && old.reqId === b.reqId) {
      if (b.promptLen > 0) old.promptLen = b.promptLen; // a re-sent binding
      return;
    }
    if (old !== undefined) this.forget(old);
    const st = this.state(b.reqId);
    if (st.slot >= 0 && this.bySlot[st.slot] === st) this.bySlot[st.slot] = undefined;
    st.slot = b.slot;
    this.bySlot[b.slot] = st;
    detectors.resetSlot(b.slot);
    if (b.promptLen > 0) st.promptLen = b.promptLen;
    if (promptIdsCap !== null && b.promptTokenIds) st.prompt = b.promptTokenIds.slice(0, promptIdsCap);
  }

  forget(st: ReqState): void {
    this.reqs.delete(st.reqId);
    if (st.slot >= 0 && this.bySlot[st.slot] === st) this.bySlot[st.slot] = undefined;
    st.slot = -1;
    this.freedIds.add(st.reqId);
    if (this.freedIds.size > FREED_MEMORY) this.freedIds.delete(this.freedIds.values().next().value as string);
  }

  clear(): void {
    this.reqs.clear();
    this.bySlot = [];
  }
}

/** Keep a request's recent output token ids (save_sensitive_info), at most about 2 × the report's cap. */
export function keepTokens(st: ReqState, ids: Uint32Array, from: number, to: number, maxOutputTokenIds: number): void {
  const cap = Math.max(32, maxOutputTokenIds);
  const tail = st.tail ?? (st.tail = []);
  for (let k = from; k < to; k++) tail.push(ids[k]);
  if (tail.length > 2 * cap) tail.splice(0, tail.length - cap);
}
