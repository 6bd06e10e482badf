// rank_divergence's engine side in TypeScript (docs/runtime-guard.md), the twin of
// clients/python/wavebus_client/digest.py: per wave, a CRC-32 (zlib's) of the forward's inputs
// (token ids' bytes, then positions') and of the token column the rank decided (as int32 LE, row
// order), written into the decision ring the agent created. The layout is proto/layouts.json's
// "decision" (decision-layout.ts). Node cannot map a file, so a write here is three pwrites of the slot (seq odd, the
// fields, seq even) and one per column: system calls, unlike the Python client's plain stores.
import * as fs from 'fs';
import * as zlib from 'zlib';
import { ConfigError } from '../errors';
import { DECISION as D, inputColumnsAt, inputSlotBytes } from './decision-layout';

const SLOTS = D.slots;
const SB = D.slotBytes;

export type IntColumn = Int32Array | Uint32Array | BigInt64Array | Float64Array | number[];

function bytesOf(a: ArrayBufferView): Buffer {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength);
}

/** The token column as int32 little-endian (the ring's form, whatever the engine's integer type). */
export function int32Column(column: IntColumn): Int32Array {
  if (column instanceof Int32Array) return column;
  const out = new Int32Array(column.length);
  for (let i = 0; i < column.length; i++) out[i] = Number(column[i]);
  return out;
}

/** The CRC-32 the ring holds for a token column (the Python client's `token_digest`). */
export function tokenDigest(column: IntColumn): number {
  const c = int32Column(column);
  return c.length ? zlib.crc32(bytesOf(c)) : 0;
}

/**
 * CRC-32 of the token ids as int32 little-endian, then the positions as int32 (the ring's form, as
 * the token digest; the Python client's `input_digest`): ranks holding int64 and int32 columns agree.
 */
export function inputDigest(tokenIds: ArrayBufferView, positions?: ArrayBufferView): number {
  let crc = zlib.crc32(bytesOf(int32Column(tokenIds as unknown as IntColumn)));
  if (positions) crc = zlib.crc32(bytesOf(int32Column(positions as unknown as IntColumn)), crc);
  return crc;
}

export class DecisionWriter {
  /** Every slot's struct as last written: the ring's one writer keeps them, so a write reads nothing back. */
  private readonly slots: Buffer;

  private constructor(
    readonly path: string,
    private fd: number,
    readonly maxRows: number,
    readonly maxInputTokens: number,
  ) {
    this.slots = Buffer.alloc(SLOTS * SB);
    fs.readSync(fd, this.slots, 0, this.slots.length, D.slotHeaders);
  }

  /** The ring at `file` (the path the agent's hello gave; no link followed). */
  static open(file: string): DecisionWriter {
    const fd = fs.openSync(file, fs.constants.O_RDWR | fs.constants.O_NOFOLLOW);
    try {
      const size = fs.fstatSync(fd).size;
      const head = Buffer.alloc(20);
      if (size < D.columns || fs.readSync(fd, head, 0, 20, 0) !== 20) throw new Error(`${size} bytes, shorter than its header`);
      const [magic, version, slots, maxRows, maxIn] = [0, 4, 8, D.header.max_rows, D.header.max_input_tokens].map((o) => head.readUInt32LE(o));
      if (magic !== D.magic || version !== D.version || slots !== SLOTS) throw new Error(`not a version ${D.version} ring of ${SLOTS} slots (magic ${magic.toString(16)}, version ${version}, slots ${slots})`);
      if (maxRows < 1 || inputColumnsAt(maxRows) + SLOTS * inputSlotBytes(maxRows, maxIn) > size) throw new Error(`columns of ${maxRows} rows and ${maxIn} input tokens do not fit its ${size} bytes`);
      return new DecisionWriter(file, fd, maxRows, maxIn);
    } catch (e) {
      fs.closeSync(fd);
      throw new ConfigError(`decision ring ${file}: ${(e as Error).message}`, 'ERR_CONFIG');
    }
  }

  /** One slot update: odd seq, then `during` (the column), the fields, even seq (digest.py's _begin/_write). */
  private write(wave: number, tokens: [number, number, number] | null, inputs: [number, number, number, number] | null, during?: () => void): void {
    const off = D.slotHeaders + (wave % SLOTS) * SB;
    const s = this.slots.subarray((wave % SLOTS) * SB, (wave % SLOTS + 1) * SB);
    const seq = s.readBigUInt64LE(0) | 1n;
    s.writeBigUInt64LE(seq, 0);
    fs.writeSync(this.fd, s, 0, 8, off);
    during?.();
    if (s.readBigUInt64LE(D.slot.wave) !== BigInt(wave)) s.fill(0, 8);
    let flags = s.readUInt32LE(D.slot.flags);
    if (tokens) {
      s.writeUInt32LE(tokens[0] >>> 0, D.slot.token_crc);
      s.writeUInt32LE(tokens[1] >>> 0, D.slot.rows);
      flags = (flags & (D.flagInputs | D.flagInputColumns)) | tokens[2];
    }
    if (inputs) {
      s.writeUInt32LE(inputs[0] >>> 0, D.slot.input_crc);
      s.writeUInt32LE(inputs[1] >>> 0, D.slot.input_tokens);
      s.writeUInt32LE(inputs[3] >>> 0, D.slot.input_rows);
      flags = (flags & ~(D.flagInputs | D.flagInputColumns)) | inputs[2];
    }
    s.writeBigUInt64LE(BigInt(wave), D.slot.wave);
    s.writeUInt32LE(flags >>> 0, D.slot.flags);
    fs.writeSync(this.fd, s, 8, SB - 8, off + 8);
    s.writeBigUInt64LE(seq + 1n, 0);
    fs.writeSync(this.fd, s, 0, 8, off);
  }

  /**
   * The forward of `wave` takes these inputs (before_forward). Returns the digest. `rowStarts`:
   * where each row's tokens start, then their end (rows + 1 values, query_start_loc): given, the
   * inputs are kept in the slot so that an inputs-only divergence names its first row.
   */
  inputs(wave: number, tokenIds: ArrayBufferView, positions?: ArrayBufferView, rowStarts?: IntColumn): number {
    const count = (tokenIds as unknown as { length?: number }).length ?? tokenIds.byteLength;
    const ids = int32Column(tokenIds as unknown as IntColumn);
    const pos = positions ? int32Column(positions as unknown as IntColumn) : new Int32Array(ids.length);
    // inputDigest's definition over the int32 columns just made (no second conversion).
    let crc = zlib.crc32(bytesOf(ids));
    if (positions) crc = zlib.crc32(bytesOf(pos), crc);
    const starts = rowStarts ? int32Column(rowStarts) : null;
    const rows = starts ? starts.length - 1 : -1;
    if (!starts || rows < 0 || rows > this.maxRows || ids.length > this.maxInputTokens || pos.length !== ids.length) {
      this.write(wave, null, [crc, count, D.flagInputs, 0]);
      return crc;
    }
    const at = inputColumnsAt(this.maxRows) + (wave % SLOTS) * inputSlotBytes(this.maxRows, this.maxInputTokens);
    // The columns while the slot's seq is odd, like the token column.
    this.write(wave, null, [crc, count, D.flagInputs | D.flagInputColumns, rows], () => {
      fs.writeSync(this.fd, bytesOf(ids), 0, ids.byteLength, at);
      fs.writeSync(this.fd, bytesOf(pos), 0, pos.byteLength, at + 4 * this.maxInputTokens);
      fs.writeSync(this.fd, bytesOf(starts), 0, starts.byteLength, at + 8 * this.maxInputTokens);
    });
    return crc;
  }

  /** The rank decided `column` (one id per row, row order) in `wave`. Returns the digest. */
  decided(wave: number, column: IntColumn): number {
    const c = int32Column(column);
    const crc = c.length ? zlib.crc32(bytesOf(c)) : 0;
    const fits = c.length <= this.maxRows;
    const flags = D.flagTokens | (fits ? D.flagColumn : 0);
    // The column while the slot's seq is odd: a reader never takes a half-written one.
    const writeColumn = fits ? () => void fs.writeSync(this.fd, bytesOf(c), 0, c.byteLength, D.columns + (wave % SLOTS) * 4 * this.maxRows) : undefined;
    this.write(wave, [crc, c.length, flags], null, writeColumn);
    return crc;
  }

  close(): void {
    if (this.fd >= 0) fs.closeSync(this.fd);
    this.fd = -1;
  }
}

/**
 * The TypeScript client's `decided` / `decidedInputs`: with the mailbox's RANK_DIGEST bit clear each
 * returns false at once; set, the ring named by the agent's hello is opened once and written.
 */
export class ClientDigests {
  private writer?: DecisionWriter;
  /** A ring that could not be opened is not tried again until a hello names another. */
  private failedPath = '';

  constructor(
    private readonly features: () => number,
    private readonly bit: number,
    /** The hello's decision ring path (a hello is said within the bound when none was); '' when none. */
    private readonly ringPath: () => Promise<string>,
  ) {}

  private async ring(): Promise<DecisionWriter | undefined> {
    if ((this.features() & this.bit) === 0) return undefined;
    const p = await this.ringPath().catch(() => '');
    if (this.writer && this.writer.path === p) return this.writer;
    this.writer?.close();
    this.writer = undefined;
    if (!p || p === this.failedPath) return undefined;
    try {
      this.writer = DecisionWriter.open(p);
    } catch {
      this.failedPath = p;
    }
    return this.writer;
  }

  async decided(wave: number, column: IntColumn): Promise<boolean> {
    const w = await this.ring();
    if (!w) return false;
    w.decided(wave, column);
    return true;
  }

  async inputs(wave: number, tokenIds: ArrayBufferView, positions?: ArrayBufferView, rowStarts?: IntColumn): Promise<boolean> {
    const w = await this.ring();
    if (!w) return false;
    w.inputs(wave, tokenIds, positions, rowStarts);
    return true;
  }

  close(): void {
    this.writer?.close();
    this.writer = undefined;
  }
}
