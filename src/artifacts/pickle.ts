// A minimal protocol-2 pickler for .pt data.pkl. It emits only opcodes that torch's
// weights_only unpickler accepts (docs/formats.md), so `torch.load(f, weights_only=True)` works.
// No memo (BINPUT) is needed: wavebus never pickles shared or recursive Python objects.
import { CaptureError } from '../errors';
import { dtypeInfo } from './dtype';
import { Tensor } from './tensor';

export const OP = {
  PROTO: 0x80,
  GLOBAL: 0x63, // c
  BINPERSID: 0x51, // Q
  BINPUT: 0x71, // q
  LONG_BINPUT: 0x72, // r
  BINGET: 0x68, // h
  LONG_BINGET: 0x6a, // j
  MARK: 0x28, // (
  TUPLE: 0x74, // t
  TUPLE1: 0x85,
  TUPLE2: 0x86,
  TUPLE3: 0x87,
  EMPTY_TUPLE: 0x29, // )
  EMPTY_DICT: 0x7d, // }
  EMPTY_LIST: 0x5d, // ]
  APPEND: 0x61, // a
  APPENDS: 0x65, // e
  SETITEM: 0x73, // s
  SETITEMS: 0x75, // u
  REDUCE: 0x52, // R
  BININT: 0x4a, // J
  BININT1: 0x4b, // K
  BININT2: 0x4d, // M
  LONG1: 0x8a,
  BINFLOAT: 0x47, // G
  BINUNICODE: 0x58, // X
  NONE: 0x4e, // N
  NEWTRUE: 0x88,
  NEWFALSE: 0x89,
  STOP: 0x2e, // .
} as const;

/** Forces a Python float for a JS number that happens to be an integer (e.g. pyFloat(1) → 1.0). */
export class PyFloat {
  constructor(readonly value: number) {}
}
export function pyFloat(x: number): PyFloat {
  return new PyFloat(x);
}

/** A Python tuple (JS arrays become lists). */
export class PyTuple {
  readonly items: readonly PyValue[];
  constructor(items: readonly PyValue[]) {
    this.items = items;
  }
}
export function pyTuple(...items: PyValue[]): PyTuple {
  return new PyTuple(items);
}

export type PyValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | PyFloat
  | PyTuple
  | Tensor
  | PyValue[]
  | Map<string | number, PyValue>
  | { [key: string]: PyValue };

/** Where a tensor's bytes go: the pickler asks for the storage key (`data/<key>` record). */
export type StorageKeyFor = (t: Tensor) => string;

/** Two's complement little-endian, minimal length (Python's pickle.encode_long). */
export function encodeLong(x: bigint): Buffer {
  if (x === 0n) return Buffer.alloc(0);
  const bytes: number[] = [];
  let v = x;
  for (;;) {
    const b = Number(v & 0xffn);
    bytes.push(b);
    v >>= 8n;
    if ((v === 0n && (b & 0x80) === 0) || (v === -1n && (b & 0x80) !== 0)) break;
  }
  return Buffer.from(bytes);
}

class Out {
  private parts: Buffer[] = [];
  private cur = Buffer.alloc(4096);
  private len = 0;
  byte(b: number): void {
    this.ensure(1);
    this.cur[this.len++] = b;
  }
  bytes(b: Uint8Array): void {
    if (b.length > 1024) {
      this.spill();
      this.parts.push(Buffer.from(b));
      return;
    }
    this.ensure(b.length);
    this.cur.set(b, this.len);
    this.len += b.length;
  }
  private ensure(n: number): void {
    if (this.len + n > this.cur.length) this.spill();
  }
  private spill(): void {
    if (this.len > 0) this.parts.push(Buffer.from(this.cur.subarray(0, this.len)));
    this.len = 0;
  }
  done(): Buffer {
    this.spill();
    return Buffer.concat(this.parts);
  }
}

export class Pickler {
  private out = new Out();
  private active = new Set<object>();

  constructor(private readonly storageKey: StorageKeyFor) {}

  /** Pickle one value (PROTO 2 … STOP). */
  dump(value: PyValue): Buffer {
    this.out.byte(OP.PROTO);
    this.out.byte(2);
    this.save(value, 'value');
    this.out.byte(OP.STOP);
    return this.out.done();
  }

  private global(module: string, name: string): void {
    this.out.byte(OP.GLOBAL);
    this.out.bytes(Buffer.from(`${module}\n${name}\n`, 'utf8'));
  }

  private str(s: string): void {
    const b = Buffer.from(s, 'utf8');
    const h = Buffer.alloc(5);
    h[0] = OP.BINUNICODE;
    h.writeUInt32LE(b.length, 1);
    this.out.bytes(h);
    this.out.bytes(b);
  }

  private int(x: bigint, where: string): void {
    if (x >= 0n && x <= 0xffn) {
      this.out.byte(OP.BININT1);
      this.out.byte(Number(x));
    } else if (x >= 0n && x <= 0xffffn) {
      const h = Buffer.alloc(3);
      h[0] = OP.BININT2;
      h.writeUInt16LE(Number(x), 1);
      this.out.bytes(h);
    } else if (x >= -0x80000000n && x <= 0x7fffffffn) {
      const h = Buffer.alloc(5);
      h[0] = OP.BININT;
      h.writeInt32LE(Number(x), 1);
      this.out.bytes(h);
    } else {
      const enc = encodeLong(x);
      if (enc.length > 255) throw new CaptureError(`${where}: integer too large to pickle (${enc.length} bytes)`, 'ERR_PICKLE');
      this.out.byte(OP.LONG1);
      this.out.byte(enc.length);
      this.out.bytes(enc);
    }
  }

  private float(x: number): void {
    const h = Buffer.alloc(9);
    h[0] = OP.BINFLOAT;
    h.writeDoubleBE(x, 1);
    this.out.bytes(h);
  }

  private tupleOf(items: readonly PyValue[], where: string): void {
    if (items.length === 0) {
      this.out.byte(OP.EMPTY_TUPLE);
      return;
    }
    if (items.length > 3) this.out.byte(OP.MARK);
    items.forEach((v, i) => this.save(v, `${where}[${i}]`));
    if (items.length === 1) this.out.byte(OP.TUPLE1);
    else if (items.length === 2) this.out.byte(OP.TUPLE2);
    else if (items.length === 3) this.out.byte(OP.TUPLE3);
    else this.out.byte(OP.TUPLE);
  }

  private emptyOrderedDict(): void {
    this.global('collections', 'OrderedDict');
    this.out.byte(OP.EMPTY_TUPLE);
    this.out.byte(OP.REDUCE);
  }

  private tensor(t: Tensor): void {
    const info = dtypeInfo(t.dtype);
    const key = this.storageKey(t);
    const v3 = info.torchStorage === null;
    this.global('torch._utils', v3 ? '_rebuild_tensor_v3' : '_rebuild_tensor_v2');
    this.out.byte(OP.MARK); // args tuple
    // Persistent id: ('storage', <storage class>, key, 'cpu', numel); UntypedStorage counts bytes.
    this.out.byte(OP.MARK);
    this.str('storage');
    if (v3) this.global('torch.storage', 'UntypedStorage');
    else this.global('torch', info.torchStorage as string);
    this.str(key);
    this.str('cpu');
    this.int(BigInt(v3 ? t.nbytes : t.numel), 'storage numel');
    this.out.byte(OP.TUPLE);
    this.out.byte(OP.BINPERSID);
    this.int(0n, 'storage offset');
    this.tupleOf(t.shape, 'shape');
    this.tupleOf(t.strides(), 'stride');
    this.out.byte(OP.NEWFALSE); // requires_grad
    this.emptyOrderedDict(); // backward_hooks
    if (v3) this.global('torch', info.torchName); // dtype
    this.out.byte(OP.TUPLE);
    this.out.byte(OP.REDUCE);
  }

  private enter(o: object, where: string): void {
    if (this.active.has(o)) throw new CaptureError(`${where}: value contains a reference cycle`, 'ERR_PICKLE');
    this.active.add(o);
  }

  private save(v: PyValue, where: string): void {
    if (v === null) {
      this.out.byte(OP.NONE);
      return;
    }
    switch (typeof v) {
      case 'boolean':
        this.out.byte(v ? OP.NEWTRUE : OP.NEWFALSE);
        return;
      case 'number':
        if (Number.isInteger(v)) this.int(BigInt(v), where);
        else this.float(v); // non-integers, NaN, ±Infinity
        return;
      case 'bigint':
        this.int(v, where);
        return;
      case 'string':
        this.str(v);
        return;
      case 'object':
        break;
      default:
        throw new CaptureError(`${where}: cannot pickle a value of type ${typeof v}`, 'ERR_PICKLE');
    }
    if (v instanceof PyFloat) {
      this.float(v.value);
      return;
    }
    if (v instanceof Tensor) {
      this.tensor(v);
      return;
    }
    this.enter(v, where);
    try {
      if (v instanceof PyTuple) {
        this.tupleOf(v.items, where);
      } else if (Array.isArray(v)) {
        this.out.byte(OP.EMPTY_LIST);
        if (v.length > 0) {
          this.out.byte(OP.MARK);
          v.forEach((x, i) => this.save(x, `${where}[${i}]`));
          this.out.byte(OP.APPENDS);
        }
      } else if (v instanceof Map) {
        this.dict([...v.entries()], where);
      } else if (Object.getPrototypeOf(v) === Object.prototype || Object.getPrototypeOf(v) === null) {
        this.dict(Object.entries(v as Record<string, PyValue>), where);
      } else {
        throw new CaptureError(`${where}: cannot pickle an object of class ${(v as object).constructor?.name ?? 'unknown'}`, 'ERR_PICKLE');
      }
    } finally {
      this.active.delete(v);
    }
  }

  /** collections.OrderedDict in insertion order. */
  private dict(entries: [string | number, PyValue][], where: string): void {
    this.emptyOrderedDict();
    if (entries.length === 0) return;
    this.out.byte(OP.MARK);
    for (const [k, val] of entries) {
      if (typeof k === 'string') this.str(k);
      else if (typeof k === 'number' && Number.isInteger(k)) this.int(BigInt(k), `${where} key`);
      else throw new CaptureError(`${where}: dict keys must be strings or integers, got ${typeof k}`, 'ERR_PICKLE');
      if (val === undefined) throw new CaptureError(`${where}.${String(k)}: value is undefined`, 'ERR_PICKLE');
      this.save(val, `${where}.${String(k)}`);
    }
    this.out.byte(OP.SETITEMS);
  }
}

/** Pickle `value`, asking `storageKey` for the record key of each tensor met. */
export function pickle(value: PyValue, storageKey: StorageKeyFor): Buffer {
  return new Pickler(storageKey).dump(value);
}
