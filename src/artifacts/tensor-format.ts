// The tensor file formats (pt, npy, safetensors): one name list for dumps, snapshots and bundles,
// and the mapping to the proto TensorFormat enum for wherever a format crosses processes.
import { ProtocolError } from '../errors';
import { enumValues } from '../proto';

export type TensorFormat = 'pt' | 'npy' | 'safetensors';
export const TENSOR_FORMATS: readonly TensorFormat[] = ['pt', 'npy', 'safetensors'];
export const DEFAULT_TENSOR_FORMAT: TensorFormat = 'pt';

const WIRE = enumValues('TensorFormat');
const UNSPECIFIED = WIRE.TENSOR_FORMAT_UNSPECIFIED;

export function isTensorFormat(v: unknown): v is TensorFormat {
  return typeof v === 'string' && (TENSOR_FORMATS as readonly string[]).includes(v);
}

/** The proto TensorFormat number of `format`. */
export function tensorFormatToProto(format: TensorFormat): number {
  const n = WIRE[`TENSOR_FORMAT_${format.toUpperCase()}`];
  if (n === undefined) throw new ProtocolError(`tensor format ${JSON.stringify(format)} has no proto TensorFormat value`);
  return n;
}

/**
 * The format a proto TensorFormat number names; TENSOR_FORMAT_UNSPECIFIED gives `dflt`. A number
 * this version does not know (a newer peer) is refused, naming `field`.
 */
export function tensorFormatFromProto(n: unknown, field: string, dflt: TensorFormat = DEFAULT_TENSOR_FORMAT): TensorFormat {
  if (n === UNSPECIFIED || n === undefined || n === null) return dflt;
  for (const f of TENSOR_FORMATS) if (WIRE[`TENSOR_FORMAT_${f.toUpperCase()}`] === n) return f;
  throw new ProtocolError(`${field}: unknown TensorFormat ${JSON.stringify(n)} (this side knows ${TENSOR_FORMATS.join(', ')})`);
}
