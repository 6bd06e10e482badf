// rank_divergence's decision ring on the agent's side (docs/runtime-guard.md): the agent creates
// the file (0600, beside the mailbox) that its engine client maps and writes, per wave, a digest of
// the forward's inputs and of the token column it decided, with the column itself. The layout is
// proto/layouts.json's "decision" (src/client/decision-layout.ts); the writer is clients/python/wavebus_client/digest.py
// (src/client/digest.ts in TypeScript). The agent reads with pread on its own descriptor, and every
// number read is checked before use: the engine's process writes the file.
import * as fs from 'fs';
import * as zlib from 'zlib';
import { ConfigError } from '../errors';
import { DECISION, inputColumnsAt, inputSlotBytes, type Decision } from '../client/decision-layout';

export { DECISION, type Decision } from '../client/decision-layout';
const SLOTS = DECISION.slots;
const SB = DECISION.slotBytes;
const HEADERS_END = DECISION.slotHeaders + SLOTS * SB;

export function ringBytes(maxRows = DECISION.maxRows, maxInputTokens = DECISION.maxInputTokens): number {
  return inputColumnsAt(maxRows) + SLOTS * inputSlotBytes(maxRows, maxInputTokens);
}

export class DecisionRing {
  private readonly heads = Buffer.alloc(HEADERS_END);

  private constructor(
    readonly path: string,
    private fd: number,
    readonly maxRows: number,
    readonly maxInputTokens: number,
  ) {}

  /** A fresh ring at `file` (a previous agent's is replaced: an engine still mapping it keeps its copy). */
  static create(file: string, maxRows = DECISION.maxRows, maxInputTokens = DECISION.maxInputTokens): DecisionRing {
    fs.rmSync(file, { force: true });
    const fd = fs.openSync(file, fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o600);
    try {
      fs.ftruncateSync(fd, ringBytes(maxRows, maxInputTokens));
      const head = Buffer.alloc(20);
      head.writeUInt32LE(DECISION.magic, 0);
      head.writeUInt32LE(DECISION.version, 4);
      head.writeUInt32LE(SLOTS, DECISION.header.slots);
      head.writeUInt32LE(maxRows, DECISION.header.max_rows);
      head.writeUInt32LE(maxInputTokens, DECISION.header.max_input_tokens);
      fs.writeSync(fd, head, 0, head.length, 0);
    } catch (e) {
      fs.closeSync(fd);
      throw new ConfigError(`decision ring ${file}: ${(e as Error).message}`, 'ERR_CONFIG');
    }
    return new DecisionRing(file, fd, maxRows, maxInputTokens);
  }

  /** The whole decided waves the ring holds now (a slot being written, or not decided yet, is left out). */
  decided(): Decision[] {
    if (this.fd < 0) return [];
    const h = this.heads;
    fs.readSync(this.fd, h, 0, HEADERS_END, 0);
    const out: Decision[] = [];
    for (let i = 0; i < SLOTS; i++) {
      const d = this.slotAt(h, DECISION.slotHeaders + i * SB);
      if (d && (d.flags & DECISION.flagTokens) !== 0) out.push(d);
    }
    // A slot that changed between the two reads is left for the next poll.
    fs.readSync(this.fd, h, 0, HEADERS_END, 0);
    return out.filter((d) => {
      const again = this.slotAt(h, DECISION.slotHeaders + (d.wave % SLOTS) * SB);
      return again !== null && again.wave === d.wave && again.tokenCrc === d.tokenCrc && again.flags === d.flags && again.inputCrc === d.inputCrc;
    });
  }

  private slotAt(h: Buffer, off: number): Decision | null {
    const seq = h.readBigUInt64LE(off + DECISION.slot.seq);
    if (seq === 0n || seq % 2n === 1n) return null;
    const wave = h.readBigUInt64LE(off + DECISION.slot.wave);
    if (wave > BigInt(Number.MAX_SAFE_INTEGER)) return null;
    const w = Number(wave);
    if (DECISION.slotHeaders + (w % SLOTS) * SB !== off) return null; // a wave in another's slot: garbage
    return {
      wave: w,
      tokenCrc: h.readUInt32LE(off + DECISION.slot.token_crc),
      rows: h.readUInt32LE(off + DECISION.slot.rows),
      inputCrc: h.readUInt32LE(off + DECISION.slot.input_crc),
      inputTokens: h.readUInt32LE(off + DECISION.slot.input_tokens),
      flags: h.readUInt32LE(off + DECISION.slot.flags),
      inputRows: h.readUInt32LE(off + DECISION.slot.input_rows),
    };
  }

  /**
   * The token column of `wave` (int32 little-endian, row order), if the ring still holds it whole;
   * else why not.
   */
  column(wave: number): { column: Buffer } | { error: string } {
    if (this.fd < 0) return { error: 'the decision ring is closed' };
    const before = this.decided().find((d) => d.wave === wave);
    if (!before) return { error: `the ring no longer holds wave ${wave} (it keeps the last ${SLOTS})` };
    if ((before.flags & DECISION.flagColumn) === 0 || before.rows > this.maxRows) return { error: `wave ${wave}: ${before.rows} rows, more than the ring's ${this.maxRows}: digest only` };
    const column = Buffer.alloc(before.rows * 4);
    fs.readSync(this.fd, column, 0, column.length, DECISION.columns + (wave % SLOTS) * 4 * this.maxRows);
    const after = this.decided().find((d) => d.wave === wave);
    if (!after || after.tokenCrc !== before.tokenCrc) return { error: `wave ${wave} was overwritten while read` };
    return { column };
  }

  /**
   * One digest per row of the forward's inputs of `wave` (u32 LE, row order): CRC-32 of the row's
   * token ids, then its positions (as int32), from the input columns the engine kept. Asked only
   * after an inputs mismatch, to name the first row whose inputs differ. Every number the engine
   * wrote is checked first: a row start out of order or past the tokens is an error, not a read.
   */
  inputRowDigests(wave: number): { column: Buffer } | { error: string } {
    if (this.fd < 0) return { error: 'the decision ring is closed' };
    const before = this.decided().find((d) => d.wave === wave);
    if (!before) return { error: `the ring no longer holds wave ${wave} (it keeps the last ${SLOTS})` };
    const rows = before.inputRows;
    const n = before.inputTokens;
    if ((before.flags & DECISION.flagInputColumns) === 0) return { error: `wave ${wave}: the engine kept no input columns (no row starts given, or more than ${this.maxInputTokens} tokens)` };
    if (rows > this.maxRows || n > this.maxInputTokens) return { error: `wave ${wave}: ${rows} input rows / ${n} tokens do not fit the ring` };
    const at = inputColumnsAt(this.maxRows) + (wave % SLOTS) * inputSlotBytes(this.maxRows, this.maxInputTokens);
    const ids = Buffer.alloc(n * 4);
    const pos = Buffer.alloc(n * 4);
    const starts = Buffer.alloc((rows + 1) * 4);
    fs.readSync(this.fd, ids, 0, ids.length, at);
    fs.readSync(this.fd, pos, 0, pos.length, at + 4 * this.maxInputTokens);
    fs.readSync(this.fd, starts, 0, starts.length, at + 8 * this.maxInputTokens);
    const after = this.decided().find((d) => d.wave === wave);
    if (!after || after.inputCrc !== before.inputCrc || after.inputRows !== rows) return { error: `wave ${wave} was overwritten while read` };
    const out = Buffer.alloc(rows * 4);
    for (let r = 0; r < rows; r++) {
      const a = starts.readInt32LE(r * 4);
      const b = starts.readInt32LE((r + 1) * 4);
      if (a < 0 || b < a || b > n) return { error: `wave ${wave}: row ${r}'s tokens ${a}..${b} lie outside the forward's ${n} tokens` };
      out.writeUInt32LE(zlib.crc32(pos.subarray(a * 4, b * 4), zlib.crc32(ids.subarray(a * 4, b * 4))) >>> 0, r * 4);
    }
    return { column: out };
  }

  close(): void {
    if (this.fd >= 0) fs.closeSync(this.fd);
    this.fd = -1;
    fs.rmSync(this.path, { force: true });
  }
}
