// rank_divergence's decision ring on the agent's side (docs/runtime-guard.md): the agent creates
// the file (0600, beside the mailbox) that its engine client maps and writes, per wave, a digest of
// the forward's inputs and of the token column it decided, with the column itself. The layout is
// proto/layouts.json's "decision" (src/client/decision-layout.ts); the writer is clients/python/wavebus_client/digest.py
// (src/client/digest.ts in TypeScript). The agent reads with pread on its own descriptor, and every
// number read is checked before use: the engine's process writes the file.
import * as fs from 'fs';
import { ConfigError } from '../errors';
import { DECISION, type Decision } from '../client/decision-layout';

export { DECISION, type Decision } from '../client/decision-layout';
const SLOTS = DECISION.slots;
const SB = DECISION.slotBytes;
const HEADERS_END = DECISION.slotHeaders + SLOTS * SB;

export function ringBytes(maxRows = DECISION.maxRows): number {
  return DECISION.columns + SLOTS * 4 * maxRows;
}

export class DecisionRing {
  private readonly heads = Buffer.alloc(HEADERS_END);

  private constructor(
    readonly path: string,
    private fd: number,
    readonly maxRows: number,
  ) {}

  /** A fresh ring at `file` (a previous agent's is replaced: an engine still mapping it keeps its copy). */
  static create(file: string, maxRows = DECISION.maxRows): DecisionRing {
    fs.rmSync(file, { force: true });
    const fd = fs.openSync(file, fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o600);
    try {
      fs.ftruncateSync(fd, ringBytes(maxRows));
      const head = Buffer.alloc(16);
      head.writeUInt32LE(DECISION.magic, 0);
      head.writeUInt32LE(DECISION.version, 4);
      head.writeUInt32LE(SLOTS, DECISION.header.slots);
      head.writeUInt32LE(maxRows, DECISION.header.max_rows);
      fs.writeSync(fd, head, 0, head.length, 0);
    } catch (e) {
      fs.closeSync(fd);
      throw new ConfigError(`decision ring ${file}: ${(e as Error).message}`, 'ERR_CONFIG');
    }
    return new DecisionRing(file, fd, maxRows);
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

  close(): void {
    if (this.fd >= 0) fs.closeSync(this.fd);
    this.fd = -1;
    fs.rmSync(this.path, { force: true });
  }
}
