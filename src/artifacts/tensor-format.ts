// The tensor file formats (pt, npy, safetensors): one name list for dumps, snapshots and bundles,
// each name's file extension, and the mapping to the proto TensorFormat enum for wherever a format
// crosses processes. Light on purpose (the config and the engine client read it); how each format
// is written and read is the registry in tensor-files.ts, which must have an entry for every name
// here (the compiler checks).
import { ProtocolError } from '../errors';
import { enumValues } from '../proto';

/** Every format's name (as config, flags and manifests spell it) and its file extension. */
const EXTENSIONS = { pt: '.pt', npy: '.npy', safetensors: '.safetensors' } as const;

export type TensorFormat = keyof typeof EXTENSIONS;
export const TENSOR_FORMATS: readonly TensorFormat[] = Object.keys(EXTENSIONS) as TensorFormat[];
export const DEFAULT_TENSOR_FORMAT: TensorFormat = 'pt';

/** The file extension of `format`, with its dot. */
export function tensorFileExtension(format: TensorFormat): string {
  return EXTENSIONS[format];
}

/** The format a file name's extension names, or undefined when it names none. */
export function tensorFormatOfFile(fileName: string): TensorFormat | undefined {
  return TENSOR_FORMATS.find((f) => fileName.endsWith(EXTENSIONS[f]));
}

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
