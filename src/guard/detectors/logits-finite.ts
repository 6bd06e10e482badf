// logits_finite: non-finite logit rows. The client checks its logits (isfinite) and sends the rows
// that are not all finite, with the request each row belongs to and the kind: nan | pos_inf |
// neg_inf | non_finite. item_sync is the client's choice of a blocking check before sampling;
// the guard only passes it on in the effective config. A row with no request is a warning only:
// no report is ever written for a guessed or empty request id (seed).
import type { NonFiniteRow } from '../../messages';
import { bool, type DetectorCommon } from '../config-schema';
import type { DetectorSpec } from './spec';

export interface LogitsFiniteConfig extends DetectorCommon {
  /** Client side: check before sampling and block on the result (else the check overlaps sampling). */
  item_sync: boolean;
}

/** Not on the native pass: the guard takes the rows the client sent (guard.ts, splitNonFinite). */
export const LOGITS_FINITE: DetectorSpec<'logits_finite', LogitsFiniteConfig> = {
  name: 'logits_finite',
  params: { item_sync: bool(false) },
};

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
