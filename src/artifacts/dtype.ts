// The element types wavebus can capture, and how each one is spelled by numpy, torch and safetensors.
import type { TensorFormat } from './tensor-format';
import { ConfigError } from '../errors';

export type DType =
  | 'float64'
  | 'float32'
  | 'float16'
  | 'bfloat16'
  | 'int64'
  | 'int32'
  | 'int16'
  | 'int8'
  | 'uint8'
  | 'bool'
  | 'float8_e4m3fn'
  | 'float8_e5m2'
  | 'float8_e4m3fnuz'
  | 'float8_e5m2fnuz'
  | 'uint16'
  | 'uint32'
  | 'uint64'
  | 'complex32'
  | 'complex64'
  | 'complex128';

export interface DTypeInfo {
  readonly name: DType;
  readonly itemSize: number;
  /**
   * numpy descr; bf16 and fp8 have no numpy type, so they travel as raw void items (`|V2`, `|V1`),
   * as the seed says. null: no numpy representation at all (.npy refuses it; .pt takes any dtype).
   */
  readonly npyDescr: string | null;
  /** Typed storage class for `_rebuild_tensor_v2`; null for dtypes that need `_rebuild_tensor_v3` (UntypedStorage). */
  readonly torchStorage: string | null;
  /** Attribute name of the dtype in the `torch` module (`torch.<name>`). */
  readonly torchName: string;
  /** null: safetensors has no code for it. */
  readonly safetensors: string | null;
}

const TABLE: Record<DType, DTypeInfo> = {
  float64: { name: 'float64', itemSize: 8, npyDescr: '<f8', torchStorage: 'DoubleStorage', torchName: 'float64', safetensors: 'F64' },
  float32: { name: 'float32', itemSize: 4, npyDescr: '<f4', torchStorage: 'FloatStorage', torchName: 'float32', safetensors: 'F32' },
  float16: { name: 'float16', itemSize: 2, npyDescr: '<f2', torchStorage: 'HalfStorage', torchName: 'float16', safetensors: 'F16' },
  bfloat16: { name: 'bfloat16', itemSize: 2, npyDescr: '|V2', torchStorage: 'BFloat16Storage', torchName: 'bfloat16', safetensors: 'BF16' },
  int64: { name: 'int64', itemSize: 8, npyDescr: '<i8', torchStorage: 'LongStorage', torchName: 'int64', safetensors: 'I64' },
  int32: { name: 'int32', itemSize: 4, npyDescr: '<i4', torchStorage: 'IntStorage', torchName: 'int32', safetensors: 'I32' },
  int16: { name: 'int16', itemSize: 2, npyDescr: '<i2', torchStorage: 'ShortStorage', torchName: 'int16', safetensors: 'I16' },
  int8: { name: 'int8', itemSize: 1, npyDescr: '|i1', torchStorage: 'CharStorage', torchName: 'int8', safetensors: 'I8' },
  uint8: { name: 'uint8', itemSize: 1, npyDescr: '|u1', torchStorage: 'ByteStorage', torchName: 'uint8', safetensors: 'U8' },
  bool: { name: 'bool', itemSize: 1, npyDescr: '|b1', torchStorage: 'BoolStorage', torchName: 'bool', safetensors: 'BOOL' },
  float8_e4m3fn: { name: 'float8_e4m3fn', itemSize: 1, npyDescr: '|V1', torchStorage: null, torchName: 'float8_e4m3fn', safetensors: 'F8_E4M3' },
  float8_e5m2: { name: 'float8_e5m2', itemSize: 1, npyDescr: '|V1', torchStorage: null, torchName: 'float8_e5m2', safetensors: 'F8_E5M2' },
  // The rest of torch's plain element types, so that .pt takes any dtype (the seed). Those without
  // a legacy typed storage go through _rebuild_tensor_v3 and load in a torch that has the dtype.
  float8_e4m3fnuz: { name: 'float8_e4m3fnuz', itemSize: 1, npyDescr: '|V1', torchStorage: null, torchName: 'float8_e4m3fnuz', safetensors: null },
  float8_e5m2fnuz: { name: 'float8_e5m2fnuz', itemSize: 1, npyDescr: '|V1', torchStorage: null, torchName: 'float8_e5m2fnuz', safetensors: null },
  uint16: { name: 'uint16', itemSize: 2, npyDescr: '<u2', torchStorage: null, torchName: 'uint16', safetensors: 'U16' },
  uint32: { name: 'uint32', itemSize: 4, npyDescr: '<u4', torchStorage: null, torchName: 'uint32', safetensors: 'U32' },
  uint64: { name: 'uint64', itemSize: 8, npyDescr: '<u8', torchStorage: null, torchName: 'uint64', safetensors: 'U64' },
  complex32: { name: 'complex32', itemSize: 4, npyDescr: null, torchStorage: null, torchName: 'complex32', safetensors: null },
  complex64: { name: 'complex64', itemSize: 8, npyDescr: '<c8', torchStorage: 'ComplexFloatStorage', torchName: 'complex64', safetensors: null },
  complex128: { name: 'complex128', itemSize: 16, npyDescr: '<c16', torchStorage: 'ComplexDoubleStorage', torchName: 'complex128', safetensors: null },
};

export const DTYPES: readonly DType[] = Object.keys(TABLE) as DType[];

/** torch's alternative spellings (torch.half is torch.float16, ...). Accepted with or without `torch.`. */
const TORCH_ALIASES: Record<string, DType> = {
  half: 'float16',
  float: 'float32',
  double: 'float64',
  long: 'int64',
  int: 'int32',
  short: 'int16',
  chalf: 'complex32',
  cfloat: 'complex64',
  cdouble: 'complex128',
};

export function isDType(name: unknown): name is DType {
  return typeof name === 'string' && Object.prototype.hasOwnProperty.call(TABLE, name);
}

/**
 * Parse a dtype name: the canonical names above, optionally prefixed `torch.`, plus torch's aliases
 * (half, float, double, long, int, short). `where` names the field or flag, for the error message.
 */
export function parseDType(name: unknown, where: string): DType {
  if (typeof name === 'string') {
    const bare = name.startsWith('torch.') ? name.slice('torch.'.length) : name;
    if (isDType(bare)) return bare;
    const alias = TORCH_ALIASES[bare];
    if (alias) return alias;
  }
  throw new ConfigError(
    `${where}: unknown dtype ${JSON.stringify(name)}; valid: ${DTYPES.join(', ')} (a "torch." prefix and torch aliases ${Object.keys(TORCH_ALIASES).join(', ')} are accepted)`,
  );
}

export function dtypeInfo(dtype: DType): DTypeInfo {
  const info = TABLE[dtype];
  if (!info) throw new ConfigError(`unknown dtype ${JSON.stringify(dtype)}; valid: ${DTYPES.join(', ')}`);
  return info;
}

export function itemSize(dtype: DType): number {
  return dtypeInfo(dtype).itemSize;
}

/** null: numpy cannot represent it (see formatRefusal). */
export function npyDescr(dtype: DType): string | null {
  return dtypeInfo(dtype).npyDescr;
}

export function torchStorageClass(dtype: DType): string | null {
  return dtypeInfo(dtype).torchStorage;
}

/**
 * Why `dtype` cannot be written as `format`, or null when it can. .pt takes any dtype; .npy refuses
 * one numpy cannot represent (the seed: re-run with pt rather than silently mix formats).
 */
export function formatRefusal(dtype: DType, format: TensorFormat): string | null {
  const info = dtypeInfo(dtype);
  if (format === 'npy' && info.npyDescr === null) return `dtype "${dtype}" has no .npy representation; re-run with format "pt" (pt takes any dtype)`;
  if (format === 'safetensors' && info.safetensors === null) return `dtype "${dtype}" has no safetensors code; re-run with format "pt" (pt takes any dtype)`;
  return null;
}

/** Reverse of safetensorsCode; null for codes wavebus does not know. */
export function dtypeFromSafetensors(code: string): DType | null {
  for (const d of DTYPES) if (TABLE[d].safetensors === code) return d;
  return null;
}

/** Reverse of torchStorageClass. */
export function dtypeFromTorchStorage(cls: string): DType | null {
  for (const d of DTYPES) if (TABLE[d].torchStorage === cls) return d;
  return null;
}

/** Reverse of the torch dtype attribute name (`torch.float8_e4m3fn` → float8_e4m3fn). */
export function dtypeFromTorchName(name: string): DType | null {
  for (const d of DTYPES) if (TABLE[d].torchName === name) return d;
  return null;
}
