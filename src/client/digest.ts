// rank_divergence's engine side in TypeScript (docs/runtime-guard.md), the twin of
// clients/python/wavebus_client/digest.py: per wave, a CRC-32 (zlib's) of the forward's inputs
// (token ids' bytes, then positions') and of the token column the rank decided (as int32 LE, row
// order), written into the decision ring the agent created. The layout is proto/layouts.json's
// "decision" (decision-layout.ts). Node cannot map a file, so a write here is one pwrite of the slot (and one of the
// column): a system call per call, unlike the Python client's plain stores.
import * as fs from 'fs';
import * as zlib from 'zlib';
import { ConfigError } from '../errors';
import { DECISION as D } from './decision-layout';

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

/** CRC-32 of the token ids' bytes, then the positions' bytes, as the engine holds them. */
export function inputDigest(tokenIds: ArrayBufferView, positions?: ArrayBufferView): number {
  let crc = zlib.crc32(bytesOf(tokenIds));
  if (positions) crc = zlib.crc32(bytesOf(positions), crc);
  return crc;
}

export class DecisionWriter {
  private readonly slot = Buffer.alloc(SB);

  private constructor(
    readonly path: string,
    private fd: number,
    readonly maxRows: number,
  ) {}

  /** The ring at `file` (the path the agent's hello gave; no link followed). */
  static open(file: string): DecisionWriter {
    const fd = fs.openSync(file, fs.constants.O_RDWR | fs.constants.O_NOFOLLOW);
    try {
      const size = fs.fstatSync(fd).size;
      const head = Buffer.alloc(16);
      if (size < D.columns || fs.readSync(fd, head, 0, 16, 0) !== 16) throw new Error(`${size} bytes, shorter than its header`);
      const [magic, version, slots, maxRows] = [0, 4, 8, 12].map((o) => head.readUInt32LE(o));
      if (magic !== D.magic || version !== D.version || slots !== SLOTS) throw new Error(`not a version ${D.version} ring of ${SLOTS} slots (magic ${magic.toString(16)}, version ${version}, slots ${slots})`);
      if (maxRows < 1 || D.columns + SLOTS * 4 * maxRows > size) throw new Error(`columns of ${maxRows} rows do not fit its ${size} bytes`);
      return new DecisionWriter(file, fd, maxRows);
    } catch (e) {
      fs.closeSync(fd);
      throw new ConfigError(`decision ring ${file}: ${(e as Error).message}`, 'ERR_CONFIG');
    }
  }

  /** One slot update: odd seq, then `during` (the column), the fields, even seq (digest.py's _begin/_write). */
  private write(wave: number, tokens: [number, number, number] | null, inputs: [number, number, number] | null, during?: () => void): void {
    const off = D.slotHeaders + (wave % SLOTS) * SB;
    const s = this.slot;
    fs.readSync(this.fd, s, 0, SB, off);
    const seq = s.readBigUInt64LE(0) | 1n;
    s.writeBigUInt64LE(seq, 0);
    fs.writeSync(this.fd, s, 0, 8, off);
    during?.();
    if (s.readBigUInt64LE(D.slot.wave) !== BigInt(wave)) s.fill(0, 8);
    let flags = s.readUInt32LE(D.slot.flags);
    if (tokens) {
      s.writeUInt32LE(tokens[0] >>> 0, D.slot.token_crc);
      s.writeUInt32LE(tokens[1] >>> 0, D.slot.rows);
      flags = (flags & D.flagInputs) | tokens[2];
    }
    if (inputs) {
      s.writeUInt32LE(inputs[0] >>> 0, D.slot.input_crc);
      s.writeUInt32LE(inputs[1] >>> 0, D.slot.input_tokens);
      flags |= inputs[2];
    }
    s.writeBigUInt64LE(BigInt(wave), D.slot.wave);
    s.writeUInt32LE(flags >>> 0, D.slot.flags);
    fs.writeSync(this.fd, s, 8, SB - 8, off + 8);
    s.writeBigUInt64LE(seq + 1n, 0);
    fs.writeSync(this.fd, s, 0, 8, off);
  }

  /** The forward of `wave` takes these inputs (before_forward). Returns the digest. */
  inputs(wave: number, tokenIds: ArrayBufferView, positions?: ArrayBufferView): number {
    const crc = inputDigest(tokenIds, positions);
    const count = (tokenIds as unknown as { length?: number }).length ?? tokenIds.byteLength;
    this.write(wave, null, [crc, count, D.flagInputs]);
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

  async inputs(wave: number, tokenIds: ArrayBufferView, positions?: ArrayBufferView): Promise<boolean> {
    const w = await this.ring();
    if (!w) return false;
    w.inputs(wave, tokenIds, positions);
    return true;
  }

  close(): void {
    this.writer?.close();
    this.writer = undefined;
  }
}
