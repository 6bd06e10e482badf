// rank_divergence in the guard (docs/runtime-guard.md): digests in (rank-compare.ts), and for each
// divergence the token column of one rank per group asked of its agent, the first row where the
// groups differ found, and the row's request named from the replica's telemetry of that wave. The
// incident itself (report, KV dump on every rank of the replica with the recorder flush, quota) is
// taken at the replica's next head through the guard's one incident path.
import type { Logger } from '../log';
import type { WorldLayout } from '../layout';
import type { TelemetryColumns } from '../messages';
import { counter, gauge } from '../metrics';
import { firstDifferingRow, RankCompare, type Divergence, type RankDecisionMsg, type RankGroup } from './rank-compare';
import type { ReqState, RequestTable } from './requests';

/** Asks one rank's agent for its token column of a wave (int32 LE; inputs: its per-row input digests, u32 LE), or null with why not. */
export type ColumnAsker = (rank: number, wave: number, inputs?: boolean) => Promise<{ column: Buffer | null; error?: string }>;

/** Telemetry row maps kept per replica: a divergence is named within a few waves of its wave. */
const ROW_MAPS = 64;

export interface DivergenceHit {
  divergence: Divergence;
  detail: Record<string, unknown>;
  /** The row where the groups first differ (null: not found: no column, or the columns agree). */
  row: number | null;
}

export class DivergenceWatch {
  readonly compare: RankCompare;
  /** Per replica: wave -> the request of each telemetry row of that wave. */
  private readonly rowMaps: Map<number, (ReqState | undefined)[]>[];
  /** Per replica: divergences whose columns are in, waiting for the next head. */
  private readonly ready: DivergenceHit[][];
  private readonly waves = counter('wavebus_rank_digest_waves_total', 'rank_divergence: waves compared per replica, by result (agreed, diverged, partial: without some ranks, unknown: fewer than two ranks reported)', ['dp_rank', 'result'] as const);
  private readonly unknown = gauge('wavebus_rank_digest_unknown_waves', 'rank_divergence: waves compared without this rank\'s digest (it reported none in time: unknown, not divergent)', ['rank'] as const);
  private readonly withUnknown = gauge('wavebus_rank_digest_waves_with_unknown', 'rank_divergence: waves of this replica settled without some rank\'s digest (partial + unknown results): unknown, not divergent', ['dp_rank'] as const);
  private readonly seen = new Map<number, { agreed: number; diverged: number; partial: number; unknown: number }>();

  constructor(
    layout: WorldLayout,
    private readonly log: Logger,
  ) {
    this.compare = new RankCompare(layout);
    this.rowMaps = Array.from({ length: layout.dp }, () => new Map());
    this.ready = Array.from({ length: layout.dp }, () => []);
  }

  /** The head's telemetry of `wave` went through the request table: remember each row's request. */
  noteRows(replica: number, wave: number, c: TelemetryColumns, table: RequestTable): void {
    const maps = this.rowMaps[replica];
    const rows: (ReqState | undefined)[] = new Array(c.rows);
    for (let i = 0; i < c.rows; i++) rows[i] = table.bySlot[c.slot[i]];
    maps.set(wave, rows);
    if (maps.size > ROW_MAPS) maps.delete(maps.keys().next().value as number);
  }

  /** A rank's digests; a divergence found is resolved (columns asked) in the background. */
  add(rank: number, decisions: RankDecisionMsg[], graceWaves: number, ask: ColumnAsker): void {
    const found = this.compare.add(rank, decisions, graceWaves);
    this.publishCounts();
    for (const d of found) {
      this.log.warn({ dp_rank: d.replica, wave: d.wave, groups: d.tokenGroups.map((g) => g.ranks), inputs_differed: d.inputsDiffered, unknown: d.unknownRanks }, 'rank_divergence: ranks decided different tokens');
      this.resolve(d, ask).then(
        (hit) => this.ready[d.replica].push(hit),
        (e) => this.log.error({ dp_rank: d.replica, wave: d.wave, err: String((e as Error)?.message ?? e) }, 'rank_divergence: the divergence could not be resolved; no incident'),
      );
    }
  }

  private publishCounts(): void {
    for (const { replica, counts, unknownByRank } of this.compare.counts()) {
      const before = this.seen.get(replica) ?? { agreed: 0, diverged: 0, partial: 0, unknown: 0 };
      for (const k of ['agreed', 'diverged', 'partial', 'unknown'] as const) {
        if (counts[k] > before[k]) this.waves.inc({ dp_rank: String(replica), result: k }, counts[k] - before[k]);
      }
      this.seen.set(replica, { ...counts });
      this.withUnknown.set({ dp_rank: String(replica) }, counts.partial + counts.unknown);
      for (const [rank, n] of unknownByRank) this.unknown.set({ rank: String(rank) }, n);
    }
  }

  /**
   * The token columns of one rank per token group and, when the inputs differed, the per-row input
   * digests of one rank per input group; the first row where any group differs from the largest.
   * first_row is where the divergence began: the inputs' row when they differed, else the tokens'.
   */
  private async resolve(d: Divergence, ask: ColumnAsker): Promise<DivergenceHit> {
    const errors: Record<string, string> = {};
    const tokens = d.tokenGroups.length > 1 ? await firstRow(d.tokenGroups, d.wave, ask, false, errors) : { row: null, cols: [] };
    const inputs = d.inputsDiffered === true ? await firstRow(d.inputGroups, d.wave, ask, true, errors) : { row: null, cols: [] };
    const row = d.inputsDiffered === true ? inputs.row : tokens.row;
    const detail: Record<string, unknown> = {
      wave: d.wave,
      groups: d.tokenGroups.map((g) => ({ ranks: g.ranks, token_digest: g.digest })),
      input_groups: d.inputGroups.map((g) => ({ ranks: g.ranks, input_digest: g.digest })),
      inputs_differed: d.inputsDiffered,
      divergence: d.inputsDiffered === true ? 'inputs' : d.inputsDiffered === false ? 'outputs' : 'unknown_inputs',
      unknown_ranks: d.unknownRanks,
      divergent_ranks: (d.tokenGroups.length > 1 ? d.tokenGroups : d.inputGroups).slice(1).flatMap((g) => g.ranks),
      first_row: row,
      first_token_row: tokens.row,
    };
    if (d.inputsDiffered === true) detail.first_input_row = inputs.row;
    const tr = tokens.row;
    if (tr !== null) detail.row_tokens = Object.fromEntries(d.tokenGroups.map((g, k) => [String(g.ranks[0]), tokens.cols[k] && tr < tokens.cols[k]!.length ? tokens.cols[k]![tr] : null]));
    if (Object.keys(errors).length > 0) detail.column_errors = errors;
    return { divergence: d, detail, row };
  }

  /**
   * At `replica`'s head whose telemetry covers waves up to `detectWave`: the hits to take now,
   * each with the request of its row (undefined: none known). A hit whose wave's telemetry is not
   * in yet waits, up to two heads past it.
   */
  take(replica: number, detectWave: number): { hit: DivergenceHit; st: ReqState | undefined }[] {
    const list = this.ready[replica];
    if (list.length === 0) return [];
    const out: { hit: DivergenceHit; st: ReqState | undefined }[] = [];
    const keep: DivergenceHit[] = [];
    for (const hit of list) {
      const map = this.rowMaps[replica].get(hit.divergence.wave);
      if (!map && detectWave < hit.divergence.wave + 2) {
        keep.push(hit);
        continue;
      }
      const st = map && hit.row !== null ? map[hit.row] : undefined;
      if (st) hit.detail.req_id = st.reqId;
      out.push({ hit, st });
    }
    this.ready[replica] = keep;
    return out;
  }
}

/**
 * One rank per group asked for its column of `wave`; the first row where any group's column differs
 * from the first (largest) group's, or null (a column missing, or the columns agree). A rank that
 * could not answer is noted in `errors` (keyed "rank" or "rank inputs").
 */
async function firstRow(groups: RankGroup[], wave: number, ask: ColumnAsker, inputs: boolean, errors: Record<string, string>): Promise<{ row: number | null; cols: (Int32Array | null)[] }> {
  const answers = await Promise.all(groups.map((g) => ask(g.ranks[0], wave, inputs).catch((e) => ({ column: null, error: String((e as Error)?.message ?? e) }))));
  const cols = answers.map((c, k) => {
    if (!c.column) {
      errors[inputs ? `${groups[k].ranks[0]} inputs` : String(groups[k].ranks[0])] = c.error ?? 'no column';
      return null;
    }
    return new Int32Array(c.column.buffer.slice(c.column.byteOffset, c.column.byteOffset + (c.column.length & ~3)));
  });
  let row: number | null = null;
  const ref = cols[0];
  if (ref) {
    for (const other of cols.slice(1)) {
      if (!other) continue;
      const r = firstDifferingRow(ref, other);
      if (r !== null && (row === null || r < row)) row = r;
    }
  }
  return { row, cols };
}
