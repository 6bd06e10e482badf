// Reading a .npy file's header back (inspect, compare, replay): the Python literal numpy writes,
// checked against the file's size. Errors name the file and the character or byte position.
import * as fs from 'fs';
import { DType, DTYPES, dtypeInfo, itemSize } from './dtype';
import { ArtifactFormatError } from '../errors';
import { readRange } from './read-range';

export interface NpyInfo {
  version: [number, number];
  descr: string;
  /** The dtype when the descr names exactly one (|V1 is either fp8: see the JSON beside the file). */
  dtype: DType | null;
  /** Every wavebus dtype written with this descr. */
  candidates: DType[];
  fortranOrder: boolean;
  shape: number[];
  /** File offset where the element bytes start. */
  dataOffset: number;
}

/** A tiny reader for the Python literal numpy writes as its header. */
class PyLiteral {
  private i = 0;
  constructor(private readonly s: string, private readonly where: string) {}
  private fail(msg: string): never {
    throw new ArtifactFormatError(`${this.where}: npy header: ${msg} at character ${this.i}`);
  }
  private ws(): void {
    while (this.i < this.s.length && /\s/.test(this.s[this.i])) this.i++;
  }
  private eat(ch: string): boolean {
    this.ws();
    if (this.s[this.i] === ch) {
      this.i++;
      return true;
    }
    return false;
  }
  value(): unknown {
    this.ws();
    const c = this.s[this.i];
    if (c === "'" || c === '"') {
      const end = this.s.indexOf(c, this.i + 1);
      if (end < 0) this.fail('unterminated string');
      const v = this.s.slice(this.i + 1, end);
      this.i = end + 1;
      return v;
    }
    if (c === '{') {
      this.i++;
      const out: Record<string, unknown> = {};
      while (!this.eat('}')) {
        const k = this.value();
        if (typeof k !== 'string') this.fail('dict key must be a string');
        if (!this.eat(':')) this.fail("expected ':'");
        out[k as string] = this.value();
        if (!this.eat(',')) {
          if (!this.eat('}')) this.fail("expected ',' or '}'");
          break;
        }
      }
      return out;
    }
    if (c === '(' || c === '[') {
      const close = c === '(' ? ')' : ']';
      this.i++;
      const out: unknown[] = [];
      while (!this.eat(close)) {
        out.push(this.value());
        if (!this.eat(',')) {
          if (!this.eat(close)) this.fail(`expected ',' or '${close}'`);
          break;
        }
      }
      return out;
    }
    const m = /^(True|False|None|-?\d+)L?/.exec(this.s.slice(this.i));
    if (!m) this.fail('unexpected token');
    this.i += m[0].length;
    if (m[1] === 'True') return true;
    if (m[1] === 'False') return false;
    if (m[1] === 'None') return null;
    return Number(m[1]);
  }
}

/** Parse the preamble of a .npy file held (at least) in `buf`. */
export function parseNpyHeader(buf: Buffer, where = '.npy'): NpyInfo {
  if (buf.length < 10 || buf[0] !== 0x93 || buf.toString('latin1', 1, 6) !== 'NUMPY') {
    throw new ArtifactFormatError(`${where}: not a .npy file (bad magic at byte 0)`);
  }
  const major = buf[6];
  const minor = buf[7];
  let headerLen: number;
  let start: number;
  if (major === 1) {
    headerLen = buf.readUInt16LE(8);
    start = 10;
  } else if (major === 2 || major === 3) {
    if (buf.length < 12) throw new ArtifactFormatError(`${where}: truncated .npy preamble`);
    headerLen = buf.readUInt32LE(8);
    start = 12;
  } else {
    throw new ArtifactFormatError(`${where}: unsupported .npy version ${major}.${minor} at byte 6`);
  }
  if (buf.length < start + headerLen) throw new ArtifactFormatError(`${where}: header of ${headerLen} bytes runs past the ${buf.length} bytes read`);
  const text = buf.toString(major === 3 ? 'utf8' : 'latin1', start, start + headerLen);
  const d = new PyLiteral(text, where).value() as Record<string, unknown>;
  if (!d || typeof d !== 'object' || Array.isArray(d)) throw new ArtifactFormatError(`${where}: npy header is not a dict`);
  const descr = d.descr;
  if (typeof descr !== 'string') throw new ArtifactFormatError(`${where}: npy header 'descr' must be a string (structured dtypes are not supported)`);
  if (typeof d.fortran_order !== 'boolean') throw new ArtifactFormatError(`${where}: npy header 'fortran_order' must be True or False`);
  const shape = d.shape;
  if (!Array.isArray(shape) || !shape.every((x) => Number.isSafeInteger(x) && (x as number) >= 0)) {
    throw new ArtifactFormatError(`${where}: npy header 'shape' must be a tuple of non-negative integers`);
  }
  // numpy may also spell little-endian single-byte types with '<' or '='; normalise for lookup.
  const norm = (s: string) => (s.length === 3 && s[2] === '1' ? `|${s.slice(1)}` : s.replace(/^=/, '<'));
  const candidates = DTYPES.filter((t) => dtypeInfo(t).npyDescr === norm(descr));
  return {
    version: [major, minor],
    descr,
    dtype: candidates.length === 1 ? candidates[0] : null,
    candidates,
    fortranOrder: d.fortran_order,
    shape: shape as number[],
    dataOffset: start + headerLen,
  };
}

/** Read and parse a .npy file's header. */
export function readNpyHeader(path: string): NpyInfo {
  const size = fs.statSync(path).size;
  const head = readRange(path, 0, Math.min(size, 12));
  let need = 10;
  if (head.length >= 10 && head[6] === 1) need = 10 + head.readUInt16LE(8);
  else if (head.length >= 12) need = 12 + head.readUInt32LE(8);
  if (need > size) throw new ArtifactFormatError(`${path}: header claims ${need} bytes but the file has ${size}`);
  const info = parseNpyHeader(readRange(path, 0, need), path);
  const numel = info.shape.reduce((a, b) => a * b, 1);
  const isz = info.candidates.length ? itemSize(info.candidates[0]) : null;
  if (isz !== null && info.dataOffset + numel * isz !== size) {
    throw new ArtifactFormatError(`${path}: expected ${info.dataOffset + numel * isz} bytes for shape (${info.shape.join(', ')}) ${info.descr}, file has ${size}`);
  }
  return info;
}
