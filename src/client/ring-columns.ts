// A telemetry-ring slot to the wire's TelemetryColumns (proto), checked where it is read: rows
// and event rows below the ring's max_rows, token counts adding up, token ids below the vocab.
// A NaN log-prob is not garbage: a model gone bad makes them (logits_finite and garbled are there
// for it), and the columns read NaN as "no log-prob", exactly as from the dict path. Garbage is never passed on: bad rows drop the step's columns, bad tokens
// drop its per-token columns (rows, flags and speculative counts still go). Finish/free events
// become the flags column; an event row that sampled nothing this step is appended with no tokens
// (clients/python/wavebus_client/tensor_inline.py builds the same when there is no ring).
import type { RingAsk, RingSlotRead } from './ring-layout';

export type RingGarbage = 'torn' | 'bad_seq' | 'bad_counts' | 'no_ring' | 'row_out_of_range' | 'token_count' | 'token_out_of_range' | 'bad_event' | 'bad_extra';

export interface RingColumnsOut {
  /** camelCase TelemetryColumns fields (bytes as Uint8Array), without bind/blocks. */
  columns: Record<string, unknown> | null;
  garbage: RingGarbage[];
}

const u32 = (b: Uint8Array | undefined): Uint32Array | undefined => (b ? new Uint32Array(b.buffer, b.byteOffset, b.byteLength / 4) : undefined);
const bytes = (a: ArrayBufferView): Uint8Array => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

/** Reused between steps: row -> position in this step's rows (-1: absent). */
export class RowIndex {
  private pos: Int32Array = new Int32Array(0);

  reserve(maxRows: number): Int32Array {
    if (this.pos.length < maxRows) this.pos = new Int32Array(maxRows).fill(-1);
    return this.pos;
  }
}

function appendU32(a: Uint32Array | undefined, extra: number, value: (i: number) => number): Uint8Array | undefined {
  if (!a) return undefined;
  if (extra === 0) return bytes(a);
  const out = new Uint32Array(a.length + extra);
  out.set(a);
  for (let i = 0; i < extra; i++) out[a.length + i] = value(i);
  return bytes(out);
}

export function ringColumns(slot: RingSlotRead, ask: RingAsk, index: RowIndex): RingColumnsOut {
  const garbage: RingGarbage[] = [];
  const c = slot.columns;
  const rows = u32(c.get('row'));
  const n = slot.rows;
  if (!rows || rows.length !== n) return { columns: null, garbage: ['bad_counts'] };
  for (let i = 0; i < n; i++) if (rows[i] >= ask.maxRows) return { columns: null, garbage: ['row_out_of_range'] };
  const evRows = u32(c.get('event_row')) ?? new Uint32Array(0);
  const evFlags = c.get('event_flags') ?? new Uint8Array(0);
  if (evRows.length !== evFlags.length) return { columns: null, garbage: ['bad_counts'] };
  for (let i = 0; i < evRows.length; i++) if (evRows[i] >= ask.maxRows || evFlags[i] === 0 || evFlags[i] > 3) return { columns: null, garbage: ['bad_event'] };
  const draft = u32(c.get('draft_len'));
  const accepted = u32(c.get('accepted'));
  if (Boolean(draft) !== Boolean(accepted)) return { columns: null, garbage: ['bad_counts'] };

  // Per-token columns: kept only when whole and in range.
  let counts = u32(c.get('token_count'));
  let ids = u32(c.get('token_ids'));
  let lps: Float32Array | undefined = c.has('token_logprobs') ? new Float32Array(c.get('token_logprobs')!.buffer) : undefined;
  if (ids) {
    let sum = 0;
    if (counts) for (let i = 0; i < n; i++) sum += counts[i];
    else sum = n;
    if (sum !== ids.length || (lps && lps.length !== ids.length)) garbage.push('token_count');
    else {
      if (ask.vocab > 0) for (let i = 0; i < ids.length; i++) if (ids[i] >= ask.vocab) { garbage.push('token_out_of_range'); break; }
    }
    if (garbage.length > 0) ids = counts = lps = undefined;
    else if (!counts) counts = new Uint32Array(n).fill(1);
  }

  // Finish/free events into flags; rows that sampled nothing appended.
  const flags = new Uint8Array(n + evRows.length);
  const extra: number[] = [];
  if (evRows.length > 0) {
    const pos = index.reserve(ask.maxRows);
    for (let i = 0; i < n; i++) pos[rows[i]] = i;
    for (let e = 0; e < evRows.length; e++) {
      const at = pos[evRows[e]];
      if (at >= 0) flags[at] |= evFlags[e];
      else {
        pos[evRows[e]] = n + extra.length;
        flags[n + extra.length] = evFlags[e];
        extra.push(evRows[e]);
      }
    }
    for (let i = 0; i < n; i++) pos[rows[i]] = -1;
    for (const r of extra) pos[r] = -1;
  }
  const k = extra.length;
  const columns: Record<string, unknown> = {
    rows: n + k,
    slot: appendU32(rows, k, (i) => extra[i]),
    flags: flags.subarray(0, n + k),
  };
  if (ids && counts) {
    columns.tokenCount = appendU32(counts, k, () => 0);
    columns.tokenIds = bytes(ids);
    if (lps) columns.tokenLogprobs = bytes(lps);
  }
  if (draft && accepted) {
    columns.draftLen = appendU32(draft, k, () => 0);
    columns.accepted = appendU32(accepted, k, () => 0);
  }
  return { columns, garbage };
}
