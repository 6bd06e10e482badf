// The three selection rules (call index, token, request), OR'd together, evaluated live per forward
// so that only the targeted forward is written. Budget and rank narrowing live in the capturer.
import { ProtocolError } from '../errors';
import type { ForwardContext } from '../messages';
import type { SnapshotConfig } from './config';

export type SelectionReason = 'call_index' | 'request' | 'token' | 'recorder';

export interface SelectionMatch {
  /** The request's index in req_ids (upstream's batch_index), for both rules. */
  batch_index: number;
  request_id: string;
  /** token rule: the targeted token position (p + offset); request rule: the request's row position on decode, -1 otherwise. */
  position: number;
  reason: 'request' | 'token';
}

export interface Selection {
  selected: boolean;
  /** Sorted rule names: call_index, request, token. */
  selectedBy: SelectionReason[];
  matches: SelectionMatch[];
  /** This forward's 0-based post-warmup call index for its compiled graph; null for warmup. */
  callIndex: number | null;
}

/** Largest global_step / position both sides accept: a JS safe integer (the agent reads int64 as a number). */
export const MAX_CONTEXT_INT = Number.MAX_SAFE_INTEGER;
const MAX_U32 = 0xffffffff;

function isIntIn(v: unknown, lo: number, hi: number): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= lo && v <= hi;
}

/**
 * The forward-context rule, the same in every client (proto/wavebus.proto, ForwardContext, states
 * it; the Python client's forward.py checks it before sending): compilationHash non-empty;
 * globalStep 0..2^53-1; reqIds strings; positions each -1 (padding) or 0..2^53-1; rowRequest empty
 * or one entry per position, each -1 (padding) or an index into reqIds; numSpeculativeTokens
 * 0..2^32-1. An empty rowRequest is upstream's layout: row r belongs to request r when
 * r < reqIds.length, and is padding otherwise. Returns the context with rowRequest filled in.
 * Errors name the field and the row.
 */
export function checkForwardContext(ctx: ForwardContext): ForwardContext {
  const bad = (what: string) => new ProtocolError(`forward context: ${what}`, 'ERR_FORWARD_CONTEXT');
  if (typeof ctx.compilationHash !== 'string' || ctx.compilationHash === '') throw bad('compilationHash is empty');
  if (!Array.isArray(ctx.reqIds) || !ctx.reqIds.every((r) => typeof r === 'string')) throw bad('reqIds must be a list of strings');
  if (!Array.isArray(ctx.positions) || !Array.isArray(ctx.rowRequest)) throw bad('positions and rowRequest must be lists');
  if (!isIntIn(ctx.globalStep, 0, MAX_CONTEXT_INT)) throw bad(`globalStep = ${String(ctx.globalStep)} must be an integer in 0..${MAX_CONTEXT_INT}`);
  for (let r = 0; r < ctx.positions.length; r++) {
    if (!isIntIn(ctx.positions[r], -1, MAX_CONTEXT_INT)) throw bad(`positions[${r}] = ${String(ctx.positions[r])} must be -1 (padding) or an integer in 0..${MAX_CONTEXT_INT}`);
  }
  let rowRequest = ctx.rowRequest;
  if (rowRequest.length === 0) {
    rowRequest = ctx.positions.map((_p, r) => (r < ctx.reqIds.length ? r : -1));
  } else if (ctx.positions.length !== rowRequest.length) {
    throw bad(`positions has ${ctx.positions.length} rows but rowRequest has ${rowRequest.length} (leave rowRequest empty for row r = request r)`);
  }
  for (let r = 0; r < rowRequest.length; r++) {
    const q = rowRequest[r];
    if (!isIntIn(q, -1, ctx.reqIds.length - 1)) {
      throw bad(`rowRequest[${r}] = ${String(q)} is not -1 (padding) or an index into reqIds (${ctx.reqIds.length} ids)`);
    }
  }
  if (!isIntIn(ctx.numSpeculativeTokens, 0, MAX_U32)) {
    throw bad(`numSpeculativeTokens = ${String(ctx.numSpeculativeTokens)} must be an integer in 0..${MAX_U32}`);
  }
  return rowRequest === ctx.rowRequest ? ctx : { ...ctx, rowRequest };
}

/** The request rule: the caller's base id matches exactly or as the prefix of vLLM's `<id>-<suffix>`. */
export function requestMatches(id: string, target: string): boolean {
  return id === target || id.startsWith(target + '-');
}

export class CaptureSelector {
  /** Post-warmup calls seen so far, per compilation hash (each compiled graph counts its own). */
  private readonly calls = new Map<string, number>();

  constructor(private readonly config: SnapshotConfig) {}

  /** Calls counted so far for one compiled graph. */
  callsSeen(compilationHash: string): number {
    return this.calls.get(compilationHash) ?? 0;
  }

  /**
   * Evaluate one forward; `ctx` should come from checkForwardContext (it is checked again here).
   * `counted`: its call index as the client counted it (a client that offers only the forwards a
   * rule could select counts the others too); absent, this selector counts the forwards it sees.
   */
  evaluate(given: ForwardContext, counted?: number): Selection {
    const ctx = checkForwardContext(given);
    // Warmup forwards are neither counted nor captured: call 0 is the first real call.
    if (ctx.warmup) return { selected: false, selectedBy: [], matches: [], callIndex: null };
    // Count before checking: this forward's index is the number of calls before it.
    const callIndex = counted ?? this.callsSeen(ctx.compilationHash);
    this.calls.set(ctx.compilationHash, callIndex + 1);

    const selectedBy: SelectionReason[] = [];
    const matches: SelectionMatch[] = [];
    if (this.callRuleFires(callIndex)) selectedBy.push('call_index');
    const requestMatchesFound = this.requestRule(ctx);
    if (requestMatchesFound.length > 0) selectedBy.push('request');
    const tokenMatchesFound = this.tokenRule(ctx);
    if (tokenMatchesFound.length > 0) selectedBy.push('token');
    matches.push(...requestMatchesFound, ...tokenMatchesFound);
    matches.sort((a, b) => a.batch_index - b.batch_index || (a.reason < b.reason ? -1 : a.reason > b.reason ? 1 : 0));
    return { selected: selectedBy.length > 0, selectedBy, matches, callIndex };
  }

  private callRuleFires(callIndex: number): boolean {
    const rule = this.config.callRule;
    switch (rule.kind) {
      case 'first':
        return callIndex === 0;
      case 'all':
        return true;
      case 'indices':
        return rule.indices.has(callIndex);
      case 'never':
        return false;
    }
  }

  /**
   * Token rule, decode only: a row at position p generates tokens p+1 .. p+num_speculative_tokens+1;
   * the first offset whose position is a target fires, one match per request (at its first real
   * row that hits). Prefill is skipped, where that relationship between a row's position and the
   * generated token does not hold. Padding rows (position -1 or no request) never match.
   */
  private tokenRule(ctx: ForwardContext): SelectionMatch[] {
    const targets = this.config.tokenTargets;
    if (ctx.isPrompt || targets.size === 0) return [];
    const out: SelectionMatch[] = [];
    const done = new Set<number>();
    const maxOffset = ctx.numSpeculativeTokens + 1;
    for (let row = 0; row < ctx.positions.length; row++) {
      const p = ctx.positions[row];
      const q = ctx.rowRequest[row];
      if (p < 0 || q < 0 || done.has(q)) continue;
      for (let offset = 1; offset <= maxOffset; offset++) {
        if (targets.has(p + offset)) {
          out.push({ batch_index: q, request_id: ctx.reqIds[q], position: p + offset, reason: 'token' });
          done.add(q);
          break;
        }
      }
    }
    return out;
  }

  /**
   * Request rule, prefill and decode, as upstream records it: one match per matching request in
   * req_ids, batch_index = its index there; position = its (first real) row's position on decode,
   * -1 on prefill (where a row position says nothing about the request) or when it has no row.
   */
  private requestRule(ctx: ForwardContext): SelectionMatch[] {
    const targets = this.config.requestIds;
    if (targets.length === 0) return [];
    const firstRow = new Map<number, number>();
    for (let row = 0; row < ctx.positions.length; row++) {
      const q = ctx.rowRequest[row];
      if (ctx.positions[row] >= 0 && q >= 0 && !firstRow.has(q)) firstRow.set(q, ctx.positions[row]);
    }
    const out: SelectionMatch[] = [];
    ctx.reqIds.forEach((id, q) => {
      if (!targets.some((t) => requestMatches(id, t))) return;
      const position = !ctx.isPrompt ? firstRow.get(q) ?? -1 : -1;
      out.push({ batch_index: q, request_id: id, position, reason: 'request' });
    });
    return out;
  }
}
