// Unpickling a .pt data.pkl: the protocol-2 subset our pickler emits (which is also what
// torch.save writes for plain tensors and dicts). Errors name the record and the byte position.
import { DType, dtypeFromTorchName, dtypeFromTorchStorage } from './dtype';
import { OP } from './pickle';
import { ArtifactFormatError } from '../errors';

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
