// rank_divergence's surfaces (test/fuzz-surfaces.ts SURFACES; docs/fuzzing.md): the decision ring
// the engine writes and the agent reads (agent/decision-ring.ts through RankDigests, as its poll
// and the coordinator's column asks take it), and the digests an agent sends that the coordinator
// compares (AgentMessage.decided through the ROUTER path into the guard's RankCompare, with the
// detector on and a hostile rank's column answers). Every place in the ring comes from
// proto/layouts.json's "decision" (DECISION, written by the TypeScript writer DecisionWriter), never
// from offsets of its own, so a change of layout changes this fuzz with it.
import * as fs from 'fs';
import type { Mutator } from '../../bench/lib/fuzz-mutator';
import { RankDigests } from '../../src/agent/rank-digests';
import { DEFAULT_MAX_FRAME_BYTES } from '../../src/bus/constants';
import { DropCounter, encodeAgentMessage } from '../../src/bus/frames';
import { VersionGate } from '../../src/bus/protocol-version';
import { admitRouterMessage, openRouterMessage } from '../../src/bus/router-inbox';
import { DECISION, inputColumnsAt, inputSlotBytes, type Decision } from '../../src/client/decision-layout';
import { DecisionWriter } from '../../src/client/digest';
import { ColumnScratch } from '../../src/client/telemetry';
import { Guard } from '../../src/guard/guard';
import { RankCompare } from '../../src/guard/rank-compare';
import { parseStartupOptions } from '../../src/guard/startup';
import { createLogger } from '../../src/log';
import type { Outcome, Surface } from '../fuzz-surfaces';

const quiet = createLogger('fuzz-digests', 'silent');
const WAVES = [11, 12, 13, 14];

/** Wave w's forward as the valid ring holds it: three rows of 2, 1 and 3 tokens, three sampled tokens. */
function forward(w: number): { ids: Int32Array; pos: Int32Array; starts: Int32Array; tokens: Int32Array } {
  return { ids: Int32Array.from([5, 6, 7, 8, 9, w]), pos: Int32Array.from([0, 1, 0, 0, 1, 2]), starts: Int32Array.from([0, 2, 3, 6]), tokens: Int32Array.from([100 + w, 7, 9]) };
}

/** Why a column ask was answered without a column, by kind (the agent's words; anything else is a problem). */
const COLUMN_REFUSALS: Array<[RegExp, string]> = [
  [/no longer holds/, 'gone'],
  [/digest only/, 'digest_only'],
  [/kept no input columns/, 'no_input_columns'],
  [/do not fit the ring/, 'inputs_do_not_fit'],
  [/lie outside/, 'row_starts_outside'],
  [/overwritten while read/, 'overwritten'],
];

const u32 = (n: unknown) => typeof n === 'number' && Number.isInteger(n) && n >= 0 && n < 2 ** 32;

/**
 * The agent's side: a ring made by the agent's own RankDigests.open, four decided waves written by
 * the client's DecisionWriter, then per input one part rewritten in place (the header, a slot's
 * struct, its token column, its input columns; a fifth crafted slot structs of edge values), the
 * ring polled as the agent's 2 ms timer does and each wave it sends asked for its token column and
 * its inputs' row digests, as the coordinator asks after a mismatch. What is sent must be whole
 * numbers in range, a column exactly `rows` (input: `input_rows`) long; a column refused must say
 * why in one of the agent's words.
 */
export const decisionRingSurface: Surface = {
  name: 'decision_ring',
  from: 'the decision ring the engine client writes per wave and the agent polls while rank_divergence is on (agent/decision-ring.ts, agent/rank-digests.ts)',
  async open(dir) {
    let sent: Decision[] = [];
    const digests = new RankDigests(dir, { globalRank: 0, localRank: 0 } as never, quiet, () => ({ sendDecisions: (d) => void (sent = d) }));
    const file = digests.open();
    const w = DecisionWriter.open(file);
    for (const wave of WAVES) {
      const f = forward(wave);
      w.inputs(wave, f.ids, f.pos, f.starts);
      w.decided(wave, f.tokens);
    }
    w.close();
    const valid = fs.readFileSync(file);
    const maxRows = DECISION.maxRows;
    const maxIn = DECISION.maxInputTokens;
    const slotOf = (wave: number) => wave % DECISION.slots;
    // Each part: [start, end) of the file.
    const parts: Array<[number, number]> = [[0, DECISION.slotHeaders]];
    for (const wave of WAVES) {
      const i = slotOf(wave);
      parts.push([DECISION.slotHeaders + i * DECISION.slotBytes, DECISION.slotHeaders + (i + 1) * DECISION.slotBytes]);
      parts.push([DECISION.columns + i * 4 * maxRows, DECISION.columns + i * 4 * maxRows + 4 * 3]);
      const at = inputColumnsAt(maxRows) + i * inputSlotBytes(maxRows, maxIn);
      parts.push([at, at + 4 * 6], [at + 4 * maxIn, at + 4 * maxIn + 4 * 6], [at + 8 * maxIn, at + 8 * maxIn + 4 * 4]);
    }
    const fd = fs.openSync(file, 'r+');
    const restore = () => void fs.writeSync(fd, valid, 0, valid.length, 0);

    /** A slot struct of edge values (a wave of this slot or another, seq even or odd, counts past the ring). */
    const craftSlot = (m: Mutator): Buffer => {
      const s = Buffer.alloc(DECISION.slotBytes);
      const nat = () => m.pick([0, 1, 2, 3, 6, maxRows - 1, maxRows, maxRows + 1, maxIn, maxIn + 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1]);
      const wave = m.pick([WAVES[m.int(4)], WAVES[m.int(4)] + DECISION.slots, 0, 2 ** 53 - 1, 2 ** 53 + DECISION.slots, 2 ** 64 - 1]);
      s.writeBigUInt64LE(BigInt(m.pick([0, 1, 2, 3, 1000, 2 ** 40])), DECISION.slot.seq);
      s.writeBigUInt64LE(BigInt.asUintN(64, BigInt(wave)), DECISION.slot.wave);
      for (const k of ['token_crc', 'rows', 'input_crc', 'input_tokens', 'input_rows'] as const) s.writeUInt32LE(nat() >>> 0, DECISION.slot[k]);
      let flags = 0;
      for (const f of [DECISION.flagTokens, DECISION.flagInputs, DECISION.flagColumn, DECISION.flagInputColumns]) if (m.rand() < 0.7) flags |= f;
      s.writeUInt32LE(m.rand() < 0.9 ? flags : m.int(2 ** 31), DECISION.slot.flags);
      return Buffer.concat([Buffer.from([0xff]), s]); // the first byte: "a crafted slot" (a mutation starts otherwise)
    };

    const feed = (input: Buffer, m: Mutator): Outcome => {
      if (input.length === DECISION.slotBytes + 1 && input[0] === 0xff) {
        fs.writeSync(fd, input, 1, DECISION.slotBytes, DECISION.slotHeaders + slotOf(WAVES[m.int(4)]) * DECISION.slotBytes);
      } else {
        const [a, b] = parts[input.length > 0 ? input[0] % parts.length : m.int(parts.length)];
        const bytes = m.rand() < 0.3 ? input : m.mutate(valid.subarray(a, b));
        // In place, at most to the end of the file: a part can spill into the next one, never grow the file.
        fs.writeSync(fd, bytes, 0, Math.min(bytes.length, valid.length - a), a);
      }
      try {
        return take();
      } finally {
        restore();
      }
    };

    const take = (): Outcome => {
      sent = [];
      (digests as unknown as { lastSent: number }).lastSent = -1; // each input is read as a fresh agent reads the ring
      digests.poll();
      const refusals: string[] = [];
      for (const d of sent) {
        if (!Number.isSafeInteger(d.wave) || d.wave < 0) throw new Error(`sent wave ${d.wave}`);
        for (const k of ['tokenCrc', 'rows', 'inputCrc', 'inputTokens', 'flags', 'inputRows'] as const) if (!u32(d[k])) throw new Error(`sent ${k} ${d[k]}`);
        if ((d.flags & DECISION.flagTokens) === 0) throw new Error(`sent wave ${d.wave} not decided (flags ${d.flags})`);
        for (const inputs of [false, true]) {
          const a = digests.column(d.wave, inputs).decidedColumn as { found: boolean; column?: Buffer; error?: string };
          if (a.found) {
            const want = 4 * (inputs ? d.inputRows : d.rows);
            if (a.column?.length !== want) throw new Error(`wave ${d.wave}: ${inputs ? 'input' : 'token'} column of ${a.column?.length} bytes, ${want} expected`);
            continue;
          }
          const kind = COLUMN_REFUSALS.find(([re]) => re.test(String(a.error)))?.[1];
          if (!kind) throw new Error(`wave ${d.wave}: a column refused for no named reason: ${a.error}`);
          refusals.push(`${inputs ? 'inputs' : 'tokens'}_${kind}`);
        }
      }
      if (refusals.length) return { refused: `ring:${refusals[0]}`, detail: refusals.join(' ') };
      return { accepted: `waves_${sent.length}` };
    };

    return {
      valid: parts.map((_, i) => Buffer.from([i])),
      craft: craftSlot,
      feed,
      alive() {
        const o = take();
        if (!('accepted' in o) || o.accepted !== `waves_${WAVES.length}`) throw new Error(`the restored ring: ${JSON.stringify(o)}`);
        for (const wave of WAVES) {
          const c = digests.column(wave).decidedColumn as { column: Buffer };
          if (!Buffer.from(forward(wave).tokens.buffer).equals(c.column)) throw new Error(`wave ${wave}'s column read back wrong`);
        }
      },
      close() {
        fs.closeSync(fd);
        digests.close();
      },
    };
  },
};

/**
 * The coordinator's side: a TP=2 guard with rank_divergence on. Rank 0 (well-behaved) reports each
 * input's wave; the input is rank 1's frame (a `decided` message as the agent sends it, mutated, or
 * crafted with edge values), taken through the ROUTER path (openRouterMessage, admitRouterMessage)
 * and handed to the guard as the coordinator hands it. A mismatch makes the guard ask both ranks
 * for their columns: rank 1 answers with bytes of the input (any length), an error, or a throw.
 * Counted by what the comparison did; the guard logging an error (a divergence it could not
 * resolve, or anything else) is a problem.
 */
export const rankDigestsSurface: Surface = {
  name: 'rank_digests',
  from: 'the coordinator ROUTER: an agent\'s rank digests (AgentMessage.decided) compared with rank_divergence on (guard/rank-compare.ts, guard/divergence.ts), with the agents\' column answers',
  async open(dir) {
    const layout = { worldSize: 2, tp: 2, pp: 1, dp: 1, cp: 1 };
    const startup = parseStartupOptions(JSON.stringify({ runtime_config: { detector: { rank_divergence: { enabled: true } } } }), {}, dir);
    const log = createLogger('fuzz-digests-guard', 'silent');
    const failures: string[] = [];
    log.error = ((o: unknown, msg?: string) => void failures.push(`${msg}: ${JSON.stringify(o).slice(0, 400)}`)) as typeof log.error;
    const guard = new Guard({ startup, layout, log });
    // Each input is compared on a fresh RankCompare (the first waves of a job), so mutated frames of the
    // same waves are compared every time rather than ignored as settled.
    const divergence = (guard as unknown as { divergence: { compare: RankCompare } }).divergence;
    let dropped: string | undefined;
    const drops = new DropCounter(undefined, 'fuzz', (reason) => (dropped = reason));
    const admission = { drops, versions: new VersionGate(), worldSize: layout.worldSize, reply: () => undefined };
    const scratch = new ColumnScratch();
    let conn = 0;
    let answer: Buffer = Buffer.alloc(0);
    const ask = async (rank: number, w: number, inputs?: boolean) => {
      if (rank === 0) return { column: Buffer.from(Int32Array.from(inputs ? [1, 2, 3] : [100 + w, 7, 9]).buffer) };
      if (answer.length > 0 && answer[0] % 7 === 0) throw new Error('rank 1 did not answer in time');
      if (answer.length > 0 && answer[0] % 7 === 1) return { column: null, error: 'the ring no longer holds it' };
      return { column: answer.subarray(1) };
    };
    const digest = (w: number, extra: Record<string, number> = {}) => ({ wave: w, tokenCrc: 0x1234 + w, rows: 3, inputCrc: 0x5678 + w, inputTokens: 6, flags: DECISION.flagTokens | DECISION.flagInputs, ...extra });
    const frame = (w: number) => encodeAgentMessage({ requestId: 0, globalRank: 1, decided: { decisions: [digest(w), digest(w + 1, { tokenCrc: 1 })] } });
    const valid = [frame(100), encodeAgentMessage({ requestId: 0, globalRank: 1, decided: { decisions: [digest(100, { inputCrc: 9 })] } }), encodeAgentMessage({ requestId: 0, globalRank: 1, decided: { decisions: [] } })];
    const totals = (): Record<string, number> => ({ ...divergence.compare.counts()[0].counts });

    const settle = () => new Promise<void>((r) => setImmediate(r));
    const feed = async (input: Buffer): Promise<Outcome> => {
      dropped = undefined;
      answer = input;
      (divergence as { compare: RankCompare }).compare = new RankCompare(layout);
      const before = totals();
      const failed = failures.length;
      // Each input on a connection of its own: a frame that reads as a hello of another version
      // refuses its connection from then on (VersionGate), which would drop every later input.
      const routingId = Buffer.alloc(5);
      routingId.writeUInt32BE(++conn, 1);
      const opened = openRouterMessage([routingId, input], DEFAULT_MAX_FRAME_BYTES, undefined, scratch, drops);
      const rank = opened ? admitRouterMessage(opened, admission) : undefined;
      let out: Outcome;
      if (opened && rank !== undefined) {
        if (opened.msg.body !== 'decided') {
          out = { accepted: `other_body:${opened.msg.body}` };
        } else {
          // As the coordinator hands them over (coordinator.ts, case 'decided'); the rank is the one the frame claims.
          const decisions = (opened.msg.decided.decisions ?? []).map((d: Record<string, unknown>) => ({ ...d, wave: Number(d.wave ?? 0) }));
          guard.onRankDecisions(rank, decisions as never, ask);
          // The well-behaved rank's digests of the waves the frame named (and 100, 101) settle what it left open.
          const waves = new Set<number>([100, 101, ...decisions.slice(0, 8).map((d: { wave: number }) => d.wave).filter((w: number) => Number.isSafeInteger(w) && w >= 0)]);
          guard.onRankDecisions(0, [...waves].sort((a, b) => a - b).map((w) => digest(w)), ask);
          const after = totals();
          const changed = Object.keys(after).filter((k) => after[k] > before[k]);
          out = { accepted: changed.length ? `compared:${changed.sort().join('+')}` : 'nothing_settled' };
        }
      } else {
        if (dropped === undefined) throw new Error('a frame neither taken nor counted as dropped');
        out = { refused: `drop:${dropped}` };
      }
      // Column asks resolve in the background: let them finish before the next input.
      for (let i = 0; i < 4; i++) await settle();
      if (failures.length > failed) throw new Error(`the guard logged an error: ${failures[failures.length - 1]}`);
      return out;
    };
    return {
      valid,
      craft: (m) => {
        const nat = () => m.pick([0, 1, 3, 2 ** 31, 2 ** 32 - 1]);
        const decisions = Array.from({ length: m.pick([0, 1, 2, 65, 300]) }, () => ({ wave: m.pick([100, 101, 102, 0, 2 ** 53 - 1, 1000]), tokenCrc: nat(), rows: nat(), inputCrc: nat(), inputTokens: nat(), flags: nat() }));
        return encodeAgentMessage({ requestId: m.int(10), globalRank: m.rand() < 0.9 ? 1 : m.pick([0, 2, 2 ** 31]), decided: { decisions } });
      },
      feed,
      async alive() {
        const before = totals();
        guard.onRankDecisions(1, [digest(200), digest(201)], ask);
        guard.onRankDecisions(0, [digest(200), digest(201)], ask);
        if (!(totals().agreed >= before.agreed + 2)) throw new Error(`two agreeing ranks afterwards: ${JSON.stringify(totals())}`);
      },
      close() {},
    };
  },
};
