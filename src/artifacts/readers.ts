// Reading wavebus's own artifacts back (inspect, compare, replay): .npy headers, .safetensors
// headers, .pt zip records and the data.pkl subset our pickler emits (which is also what
// torch.save writes for plain tensors and dicts). Errors name the file and the byte position.
import * as fs from 'fs';
import { CaptureError } from '../errors';
import { DType, DTYPES, dtypeFromSafetensors, dtypeFromTorchName, dtypeFromTorchStorage, dtypeInfo, itemSize } from './dtype';
import { OP } from './pickle';

/** Malformed artifact: message names the file and where in it. */
export class ArtifactFormatError extends CaptureError {
  constructor(message: string) {
    super(message, 'ERR_ARTIFACT_FORMAT');
  }
}

function readRange(path: string, offset: number, length: number): Buffer {
  const fd = fs.openSync(path, 'r');
  try {
    const b = Buffer.alloc(length);
    let done = 0;
    while (done < length) {
      const n = fs.readSync(fd, b, done, length - done, offset + done);
      if (n === 0) throw new ArtifactFormatError(`${path}: unexpected end of file at byte ${offset + done} (wanted ${length} bytes from ${offset})`);
      done += n;
    }
    return b;
  } finally {
    fs.closeSync(fd);
  }
}

/** Bytes [offset, offset + length) of a file. */
export function readBytes(path: string, offset: number, length: number): Buffer {
  return readRange(path, offset, length);
}

// ---------------------------------------------------------------- npy

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

// ---------------------------------------------------------------- safetensors

export interface SafetensorsEntry {
  name: string;
  code: string;
  dtype: DType | null;
  shape: number[];
  /** Offsets relative to the data buffer. */
  begin: number;
  end: number;
}

export interface SafetensorsInfo {
  /** Bytes of JSON (N in the u64 prefix). */
  headerBytes: number;
  /** File offset of the data buffer (8 + N). */
  dataOffset: number;
  tensors: SafetensorsEntry[];
  metadata: Record<string, string>;
}

/** Parse the header of a .safetensors file; checks offsets are contiguous and match dtype × shape. */
export function parseSafetensorsHeader(buf: Buffer, where = '.safetensors', fileSize?: number): SafetensorsInfo {
  if (buf.length < 8) throw new ArtifactFormatError(`${where}: shorter than the 8-byte header length`);
  const n = Number(buf.readBigUInt64LE(0));
  if (n > 100 * 1024 * 1024) throw new ArtifactFormatError(`${where}: header length ${n} is implausible`);
  if (buf.length < 8 + n) throw new ArtifactFormatError(`${where}: header of ${n} bytes runs past the ${buf.length} bytes read`);
  let json: unknown;
  try {
    json = JSON.parse(buf.toString('utf8', 8, 8 + n));
  } catch (e) {
    throw new ArtifactFormatError(`${where}: header JSON at bytes 8..${8 + n} does not parse: ${(e as Error).message}`);
  }
  if (!json || typeof json !== 'object' || Array.isArray(json)) throw new ArtifactFormatError(`${where}: header is not a JSON object`);
  const tensors: SafetensorsEntry[] = [];
  let metadata: Record<string, string> = {};
  for (const [name, v] of Object.entries(json as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (!v || typeof v !== 'object' || Object.values(v).some((x) => typeof x !== 'string')) {
        throw new ArtifactFormatError(`${where}: __metadata__ must map strings to strings`);
      }
      metadata = v as Record<string, string>;
      continue;
    }
    const e = v as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    const bad = (what: string) => new ArtifactFormatError(`${where}: tensor ${JSON.stringify(name)}: ${what}`);
    if (!e || typeof e !== 'object') throw bad('entry is not an object');
    if (typeof e.dtype !== 'string') throw bad('dtype must be a string');
    if (!Array.isArray(e.shape) || !e.shape.every((x) => Number.isSafeInteger(x) && x >= 0)) throw bad('shape must be non-negative integers');
    if (!Array.isArray(e.data_offsets) || e.data_offsets.length !== 2 || !e.data_offsets.every((x) => Number.isSafeInteger(x) && x >= 0)) {
      throw bad('data_offsets must be [begin, end]');
    }
    const dtype = dtypeFromSafetensors(e.dtype);
    const [begin, end] = e.data_offsets as number[];
    if (dtype !== null) {
      const want = (e.shape as number[]).reduce((a, b) => a * b, 1) * itemSize(dtype);
      if (end - begin !== want) throw bad(`data_offsets span ${end - begin} bytes, ${e.dtype} ${JSON.stringify(e.shape)} needs ${want}`);
    }
    tensors.push({ name, code: e.dtype, dtype, shape: e.shape as number[], begin, end });
  }
  const sorted = [...tensors].sort((a, b) => a.begin - b.begin);
  let pos = 0;
  for (const t of sorted) {
    if (t.begin !== pos || t.end < t.begin) throw new ArtifactFormatError(`${where}: tensor ${JSON.stringify(t.name)} data_offsets [${t.begin}, ${t.end}] are not contiguous (expected begin ${pos})`);
    pos = t.end;
  }
  if (fileSize !== undefined && 8 + n + pos !== fileSize) {
    throw new ArtifactFormatError(`${where}: data buffer ends at ${8 + n + pos}, file has ${fileSize} bytes`);
  }
  return { headerBytes: n, dataOffset: 8 + n, tensors, metadata };
}

export function readSafetensorsHeader(path: string): SafetensorsInfo {
  const size = fs.statSync(path).size;
  const lenBuf = readRange(path, 0, 8);
  const n = Number(lenBuf.readBigUInt64LE(0));
  if (8 + n > size) throw new ArtifactFormatError(`${path}: header length ${n} exceeds the file (${size} bytes)`);
  return parseSafetensorsHeader(readRange(path, 0, 8 + n), path, size);
}

// ---------------------------------------------------------------- zip

export interface ZipRecord {
  name: string;
  crc32: number;
  size: number;
  method: number;
  localHeaderOffset: number;
  /** File offset of the record's first byte. */
  dataOffset: number;
}

/** List a stored zip's records from its central directory (ZIP64 aware). */
export function listZip(path: string): ZipRecord[] {
  const size = fs.statSync(path).size;
  const tailLen = Math.min(size, 22 + 0xffff);
  const tail = readRange(path, size - tailLen, tailLen);
  let eocd = -1;
  for (let i = tail.length - 22; i >= 0; i--) {
    if (tail.readUInt32LE(i) === 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw new ArtifactFormatError(`${path}: not a zip archive (no end-of-central-directory record)`);
  const eocdAbs = size - tailLen + eocd;
  let count = tail.readUInt16LE(eocd + 10);
  let cdSize = tail.readUInt32LE(eocd + 12);
  let cdOffset = tail.readUInt32LE(eocd + 16);
  if (eocdAbs >= 20) {
    const loc = readRange(path, eocdAbs - 20, 20);
    if (loc.readUInt32LE(0) === 0x07064b50) {
      const off64 = Number(loc.readBigUInt64LE(8));
      const r = readRange(path, off64, 56);
      if (r.readUInt32LE(0) !== 0x06064b50) throw new ArtifactFormatError(`${path}: bad ZIP64 end record at byte ${off64}`);
      count = Number(r.readBigUInt64LE(32));
      cdSize = Number(r.readBigUInt64LE(40));
      cdOffset = Number(r.readBigUInt64LE(48));
    }
  }
  if (cdOffset + cdSize > size) throw new ArtifactFormatError(`${path}: central directory [${cdOffset}, +${cdSize}) runs past the end (${size})`);
  const cd = readRange(path, cdOffset, cdSize);
  const out: ZipRecord[] = [];
  let p = 0;
  for (let i = 0; i < count; i++) {
    if (p + 46 > cd.length || cd.readUInt32LE(p) !== 0x02014b50) throw new ArtifactFormatError(`${path}: bad central directory entry ${i} at byte ${cdOffset + p}`);
    const method = cd.readUInt16LE(p + 10);
    const crc32 = cd.readUInt32LE(p + 16);
    let csize = cd.readUInt32LE(p + 20);
    let usize = cd.readUInt32LE(p + 24);
    const nameLen = cd.readUInt16LE(p + 28);
    const extraLen = cd.readUInt16LE(p + 30);
    const commentLen = cd.readUInt16LE(p + 32);
    let lho = cd.readUInt32LE(p + 42);
    const name = cd.toString('utf8', p + 46, p + 46 + nameLen);
    let x = p + 46 + nameLen;
    const xend = x + extraLen;
    while (x + 4 <= xend) {
      const id = cd.readUInt16LE(x);
      const len = cd.readUInt16LE(x + 2);
      if (id === 0x0001) {
        let q = x + 4;
        if (usize === 0xffffffff) (usize = Number(cd.readBigUInt64LE(q))), (q += 8);
        if (csize === 0xffffffff) (csize = Number(cd.readBigUInt64LE(q))), (q += 8);
        if (lho === 0xffffffff) (lho = Number(cd.readBigUInt64LE(q))), (q += 8);
      }
      x += 4 + len;
    }
    const lh = readRange(path, lho, 30);
    if (lh.readUInt32LE(0) !== 0x04034b50) throw new ArtifactFormatError(`${path}: bad local header for ${name} at byte ${lho}`);
    const dataOffset = lho + 30 + lh.readUInt16LE(26) + lh.readUInt16LE(28);
    if (method !== 0 && csize !== usize) throw new ArtifactFormatError(`${path}: record ${name} is compressed (method ${method}); only stored records are supported`);
    out.push({ name, crc32, size: usize, method, localHeaderOffset: lho, dataOffset });
    p = xend + commentLen;
  }
  return out;
}

// ---------------------------------------------------------------- data.pkl

/** A tensor found in data.pkl: where its bytes are and how to view them. */
export interface PtTensorRef {
  kind: 'tensor';
  dtype: DType;
  shape: number[];
  stride: number[];
  /** In elements of dtype. */
  storageOffset: number;
  storageKey: string;
  /** Storage length in elements (bytes for UntypedStorage). */
  storageNumel: number;
  location: string;
}

interface StorageRef {
  kind: 'storage';
  dtype: DType | null; // null: UntypedStorage (dtype comes with _rebuild_tensor_v3)
  key: string;
  location: string;
  numel: number;
}

type Marker = { kind: 'global'; module: string; name: string };
const MARK = Symbol('mark');

/** A Python tuple as read back (distinguishes tuples from lists). */
export class PyTupleValue extends Array<unknown> {}

function decodeLong(b: Buffer): number | bigint {
  if (b.length === 0) return 0;
  let v = 0n;
  for (let i = b.length - 1; i >= 0; i--) v = (v << 8n) | BigInt(b[i]);
  if (b[b.length - 1] & 0x80) v -= 1n << BigInt(8 * b.length);
  return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
}

/**
 * Unpickle a .pt data.pkl (protocol 2, the weights_only subset). Dicts come back as Map
 * (insertion order, any key type), tuples as PyTupleValue, tensors as PtTensorRef.
 */
export function unpicklePt(data: Buffer, where = 'data.pkl'): unknown {
  let i = 0;
  let stack: unknown[] = [];
  const metastack: unknown[][] = [];
  const memo = new Map<number, unknown>();
  const fail = (msg: string): never => {
    throw new ArtifactFormatError(`${where}: ${msg} at byte ${i}`);
  };
  const need = (n: number) => {
    if (i + n > data.length) fail('truncated pickle');
  };
  const line = (): string => {
    const end = data.indexOf(0x0a, i);
    if (end < 0) fail('unterminated GLOBAL');
    const s = data.toString('utf8', i, end);
    i = end + 1;
    return s;
  };
  const popMark = (): unknown[] => {
    const items = stack;
    const prev = metastack.pop();
    if (!prev) fail('MARK missing');
    stack = prev as unknown[];
    return items;
  };
  const pop = (): unknown => {
    if (stack.length === 0) fail('stack underflow');
    return stack.pop();
  };
  const isGlobal = (v: unknown, module: string, name?: string): v is Marker =>
    !!v && typeof v === 'object' && (v as Marker).kind === 'global' && (v as Marker).module === module && (name === undefined || (v as Marker).name === name);
  const tuple = (items: unknown[]) => PyTupleValue.from(items) as PyTupleValue;

  const rebuild = (fn: Marker, args: unknown[]): unknown => {
    if (fn.module === 'collections' && fn.name === 'OrderedDict') return new Map();
    if (fn.module === 'torch._utils' && (fn.name === '_rebuild_tensor_v2' || fn.name === '_rebuild_tensor_v3')) {
      const [storage, offset, size, stride] = args as [StorageRef, number, number[], number[]];
      if (!storage || storage.kind !== 'storage') fail(`${fn.name}: first argument is not a storage`);
      let dtype = storage.dtype;
      if (fn.name === '_rebuild_tensor_v3') {
        const d = args[6] as Marker;
        if (!isGlobal(d, 'torch')) fail('_rebuild_tensor_v3: 7th argument is not a torch dtype');
        dtype = dtypeFromTorchName(d.name);
        if (dtype === null) fail(`unsupported dtype torch.${d.name}`);
      }
      if (dtype === null) fail(`${fn.name}: storage without a dtype`);
      return {
        kind: 'tensor',
        dtype: dtype as DType,
        shape: [...size].map(Number),
        stride: [...stride].map(Number),
        storageOffset: Number(offset),
        storageKey: storage.key,
        storageNumel: storage.numel,
        location: storage.location,
      } satisfies PtTensorRef;
    }
    if (fn.module === 'torch' && fn.name === 'Size') return tuple([...((args[0] as unknown[]) ?? [])]);
    return fail(`call of unsupported global ${fn.module}.${fn.name}`);
  };

  for (;;) {
    need(1);
    const op = data[i++];
    switch (op) {
      case OP.PROTO:
        need(1);
        i++;
        break;
      case OP.GLOBAL: {
        const module = line();
        const name = line();
        stack.push({ kind: 'global', module, name } satisfies Marker);
        break;
      }
      case OP.BINPERSID: {
        const pid = pop() as unknown[];
        if (!Array.isArray(pid) || pid[0] !== 'storage' || pid.length !== 5) fail('persistent id is not a storage tuple');
        const [, cls, key, location, numel] = pid as [string, Marker, string, string, number];
        let dtype: DType | null;
        if (isGlobal(cls, 'torch.storage', 'UntypedStorage') || isGlobal(cls, 'torch', 'UntypedStorage')) dtype = null;
        else if (isGlobal(cls, 'torch')) {
          dtype = dtypeFromTorchStorage((cls as Marker).name);
          if (dtype === null) fail(`unsupported storage class torch.${(cls as Marker).name}`);
        } else return fail('persistent id has no storage class');
        stack.push({ kind: 'storage', dtype, key: String(key), location: String(location), numel: Number(numel) } satisfies StorageRef);
        break;
      }
      case OP.BINPUT:
        need(1);
        memo.set(data[i++], stack[stack.length - 1]);
        break;
      case OP.LONG_BINPUT:
        need(4);
        memo.set(data.readUInt32LE(i), stack[stack.length - 1]);
        i += 4;
        break;
      case OP.BINGET:
      case OP.LONG_BINGET: {
        let idx: number;
        if (op === OP.BINGET) (need(1), (idx = data[i++]));
        else (need(4), (idx = data.readUInt32LE(i)), (i += 4));
        if (!memo.has(idx)) fail(`memo ${idx} not set`);
        stack.push(memo.get(idx));
        break;
      }
      case OP.MARK:
        metastack.push(stack);
        stack = [];
        break;
      case OP.TUPLE: {
        const items = popMark(); // before naming `stack`: popMark replaces it
        stack.push(tuple(items));
        break;
      }
      case OP.TUPLE1:
        stack.push(tuple([pop()]));
        break;
      case OP.TUPLE2: {
        const b = pop();
        const a = pop();
        stack.push(tuple([a, b]));
        break;
      }
      case OP.TUPLE3: {
        const c = pop();
        const b = pop();
        const a = pop();
        stack.push(tuple([a, b, c]));
        break;
      }
      case OP.EMPTY_TUPLE:
        stack.push(tuple([]));
        break;
      case OP.EMPTY_LIST:
        stack.push([]);
        break;
      case OP.EMPTY_DICT:
        stack.push(new Map());
        break;
      case OP.APPEND: {
        const v = pop();
        const l = stack[stack.length - 1];
        if (!Array.isArray(l)) fail('APPEND to a non-list');
        (l as unknown[]).push(v);
        break;
      }
      case OP.APPENDS: {
        const items = popMark();
        const l = stack[stack.length - 1];
        if (!Array.isArray(l)) fail('APPENDS to a non-list');
        (l as unknown[]).push(...items);
        break;
      }
      case OP.SETITEM: {
        const v = pop();
        const k = pop();
        const d = stack[stack.length - 1];
        if (!(d instanceof Map)) fail('SETITEM on a non-dict');
        (d as Map<unknown, unknown>).set(k, v);
        break;
      }
      case OP.SETITEMS: {
        const items = popMark();
        const d = stack[stack.length - 1];
        if (!(d instanceof Map)) fail('SETITEMS on a non-dict');
        if (items.length % 2) fail('SETITEMS with an odd item count');
        for (let j = 0; j < items.length; j += 2) (d as Map<unknown, unknown>).set(items[j], items[j + 1]);
        break;
      }
      case OP.REDUCE: {
        const args = pop();
        const fn = pop();
        if (!Array.isArray(args)) fail('REDUCE arguments are not a tuple');
        if (!fn || (fn as Marker).kind !== 'global') fail('REDUCE of a non-global');
        stack.push(rebuild(fn as Marker, args as unknown[]));
        break;
      }
      case OP.BININT:
        need(4);
        stack.push(data.readInt32LE(i));
        i += 4;
        break;
      case OP.BININT1:
        need(1);
        stack.push(data[i++]);
        break;
      case OP.BININT2:
        need(2);
        stack.push(data.readUInt16LE(i));
        i += 2;
        break;
      case OP.LONG1: {
        need(1);
        const n = data[i++];
        need(n);
        stack.push(decodeLong(data.subarray(i, i + n)));
        i += n;
        break;
      }
      case OP.BINFLOAT:
        need(8);
        stack.push(data.readDoubleBE(i));
        i += 8;
        break;
      case OP.BINUNICODE: {
        need(4);
        const n = data.readUInt32LE(i);
        i += 4;
        need(n);
        stack.push(data.toString('utf8', i, i + n));
        i += n;
        break;
      }
      case 0x55: {
        // SHORT_BINSTRING (torch.save's location strings in old files)
        need(1);
        const n = data[i++];
        need(n);
        stack.push(data.toString('latin1', i, i + n));
        i += n;
        break;
      }
      case OP.NONE:
        stack.push(null);
        break;
      case OP.NEWTRUE:
        stack.push(true);
        break;
      case OP.NEWFALSE:
        stack.push(false);
        break;
      case OP.STOP:
        if (stack.length !== 1 || metastack.length !== 0) fail('STOP with an unbalanced stack');
        return stack[0];
      default:
        fail(`unsupported pickle opcode 0x${op.toString(16)}`);
    }
  }
}

/** Maps (with string keys) → plain objects and tuples → arrays, recursively, for display/JSON. */
export function toPlain(v: unknown): unknown {
  if (v instanceof Map) {
    const o: Record<string, unknown> = {};
    for (const [k, x] of v) o[String(k)] = toPlain(x);
    return o;
  }
  if (Array.isArray(v)) return Array.from(v, toPlain);
  return v;
}

export interface PtContents {
  archiveName: string;
  records: ZipRecord[];
  /** The unpickled value (see unpicklePt). */
  value: unknown;
  /** Every tensor met, in pickle order, with the file offset of its storage bytes. */
  tensors: (PtTensorRef & { dataOffset: number; nbytes: number })[];
}

/** Read a .pt archive: its records, the unpickled value, and where each tensor's bytes are. */
export function readPt(path: string): PtContents {
  const records = listZip(path);
  if (records.length === 0) throw new ArtifactFormatError(`${path}: empty zip archive`);
  const archiveName = records[0].name.split('/')[0];
  const byName = new Map(records.map((r) => [r.name, r]));
  const pkl = byName.get(`${archiveName}/data.pkl`);
  if (!pkl) throw new ArtifactFormatError(`${path}: no ${archiveName}/data.pkl record`);
  const value = unpicklePt(readRange(path, pkl.dataOffset, pkl.size), `${path}:${pkl.name}`);
  const tensors: PtContents['tensors'] = [];
  const walk = (v: unknown) => {
    if (v instanceof Map) for (const x of v.values()) walk(x);
    else if (Array.isArray(v)) v.forEach(walk);
    else if (v && typeof v === 'object' && (v as PtTensorRef).kind === 'tensor') {
      const t = v as PtTensorRef;
      const rec = byName.get(`${archiveName}/data/${t.storageKey}`);
      if (!rec) throw new ArtifactFormatError(`${path}: tensor storage ${archiveName}/data/${t.storageKey} is missing`);
      const isz = itemSize(t.dtype);
      const numel = t.shape.reduce((a, b) => a * b, 1);
      if ((t.storageOffset + numel) * isz > rec.size) {
        throw new ArtifactFormatError(`${path}: tensor ${t.dtype}${JSON.stringify(t.shape)} needs ${(t.storageOffset + numel) * isz} bytes, storage record has ${rec.size}`);
      }
      tensors.push({ ...t, dataOffset: rec.dataOffset + t.storageOffset * isz, nbytes: numel * isz });
    }
  };
  walk(value);
  return { archiveName, records, value, tensors };
}
