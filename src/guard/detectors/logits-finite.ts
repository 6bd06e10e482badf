// logits_finite: non-finite logit rows. The client checks its logits (isfinite) and sends the rows
// that are not all finite, with the request each row belongs to and the kind: nan | pos_inf |
// neg_inf | non_finite. item_sync is the client's choice of a blocking check before sampling;
// the guard only passes it on in the effective config. A row with no request is a warning only:
// no report is ever written for a guessed or empty request id (seed).
import type { NonFiniteRow } from '../../messages';

export const NON_FINITE_KINDS = ['nan', 'pos_inf', 'neg_inf', 'non_finite'] as const;

export interface LogitsFiniteHit {
  kind: string;
  kinds: string[];
  rows: number[];
}

export interface NonFiniteSplit {
  byRequest: Map<string, LogitsFiniteHit>;
  unattributed: NonFiniteRow[];
}

/** Group the rows by request; unknown kinds read as non_finite. */
export function splitNonFinite(rows: readonly NonFiniteRow[]): NonFiniteSplit {
  const byRequest = new Map<string, LogitsFiniteHit>();
  const unattributed: NonFiniteRow[] = [];
  for (const r of rows) {
    if (!r.reqId) {
      unattributed.push(r);
      continue;
    }
    const kind = (NON_FINITE_KINDS as readonly string[]).includes(r.kind) ? r.kind : 'non_finite';
    const hit = byRequest.get(r.reqId);
    if (!hit) {
      byRequest.set(r.reqId, { kind, kinds: [kind], rows: [r.row] });
    } else {
      if (!hit.kinds.includes(kind)) hit.kinds.push(kind);
      hit.rows.push(r.row);
    }
  }
  return { byRequest, unattributed };
}
