// The registry of tensor file formats: for each format its name, extension, writer and reader,
// the reader's answer in one shape. Every place that writes or reads a tensor file by its format
// or its extension (bundles, KV dumps, the snapshot loader, inspect, compare/assemble, the demo's
// checks) asks here, so a new format is its name in tensor-format.ts plus one entry below.
import { itemSize, type DType } from './dtype';
import { readNpyHeader } from './npy-reader';
import { writeNpy } from './npy';
import type { PyValue } from './pickle';
import { writePt } from './pt';
import { readPt } from './pt-reader';
import { writeSafetensors, type SafetensorsInput } from './safetensors';
import { readSafetensorsHeader } from './safetensors-reader';
import type { FileSink, WriteResult } from './sink';
import { Tensor } from './tensor';
import { tensorFileExtension, tensorFormatOfFile, type TensorFormat } from './tensor-format';

/** What a writer takes: a Tensor, or (where the format holds several) a dict of tensors and metadata. */
export type TensorFileValue = Tensor | PyValue | SafetensorsInput;

/** One tensor in a file, as every format's reader reports it. */
export interface FileTensor {
  /** Its name in the file (a dict key); undefined where the file does not name it. */
  name?: string;
  /** The dtype the file states, or null when the file alone cannot say (.npy |V1: either fp8). */
  dtype: DType | null;
  /** Every dtype the file's header allows (a hint from the JSON beside it picks one of these). */
  candidates: DType[];
  /** The file's own spelling of the dtype (npy descr, safetensors code, torch dtype). */
  code: string;
  shape: number[];
  /** File offset and length of its element bytes. */
  offset: number;
  nbytes: number;
  /** Why its bytes are not row-major and contiguous; undefined when they are. */
  notContiguous?: string;
}

export interface TensorFileContents {
  tensors: FileTensor[];
  /** The file holds one tensor and nothing else, as this format writes a lone Tensor. */
  lone: boolean;
}

export interface TensorFileFormat {
  name: TensorFormat;
  /** With its dot. */
  extension: string;
  /**
   * A KV dump's layer: one file holding k, v and the layer's metadata (the seed's .pt layout), or
   * one file for each of k and v.
   */
  kvInOneFile: boolean;
  /** Why `value` cannot be written in this format, or null when it can. */
  refuses(value: TensorFileValue): string | null;
  /** Write `value` into an open sink; the sink's size and checksum when done. */
  write(sink: FileSink, value: TensorFileValue): Promise<WriteResult>;
  /** Every tensor in `file`: where its bytes lie and what the header says of them. Throws on a malformed file. */
  read(file: string): TensorFileContents;
}

const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

function readNpy(file: string): TensorFileContents {
  const h = readNpyHeader(file);
  // Candidates of one descr share an item size (|V1: both fp8 kinds are one byte).
  const itemBytes = h.candidates.length > 0 ? itemSize(h.candidates[0]) : 0;
  return {
    lone: true,
    tensors: [{ dtype: h.dtype, candidates: h.candidates, code: h.descr, shape: h.shape, offset: h.dataOffset, nbytes: numel(h.shape) * itemBytes, notContiguous: h.fortranOrder ? 'fortran_order is True (column-major)' : undefined }],
  };
}

function readPtFile(file: string): TensorFileContents {
  const c = readPt(file);
  const lone = !!c.value && typeof c.value === 'object' && (c.value as { kind?: string }).kind === 'tensor';
  // A dict's tensors come in its order, as readPt walks it.
  const names = c.value instanceof Map ? [...c.value.entries()].filter(([, v]) => v && (v as { kind?: string }).kind === 'tensor').map(([k]) => String(k)) : [];
  return {
    lone,
    tensors: c.tensors.map((t, i) => ({ name: names[i], dtype: t.dtype, candidates: [t.dtype], code: t.dtype, shape: t.shape, offset: t.dataOffset, nbytes: t.nbytes, notContiguous: stridedWhy(t.shape, t.stride) })),
  };
}

function readSafetensors(file: string): TensorFileContents {
  const h = readSafetensorsHeader(file);
  return {
    lone: h.tensors.length === 1,
    tensors: h.tensors.map((t) => ({ name: t.name, dtype: t.dtype, candidates: t.dtype ? [t.dtype] : [], code: t.code, shape: t.shape, offset: h.dataOffset + t.begin, nbytes: t.end - t.begin })),
  };
}

/** Why a strided tensor's bytes are not row-major contiguous, or undefined. */
function stridedWhy(shape: readonly number[], stride: readonly number[]): string | undefined {
  let want = 1;
  for (let i = shape.length - 1; i >= 0; i--) {
    if (shape[i] !== 1 && stride[i] !== want) return `tensor is not contiguous (stride [${stride.join(', ')}] for shape [${shape.join(', ')}])`;
    want *= shape[i];
  }
  return undefined;
}

const REGISTRY: { readonly [F in TensorFormat]: TensorFileFormat } = {
  pt: {
    name: 'pt',
    extension: tensorFileExtension('pt'),
    kvInOneFile: true,
    refuses: () => null,
    write: (sink, value) => writePt(sink, value as PyValue),
    read: readPtFile,
  },
  npy: {
    name: 'npy',
    extension: tensorFileExtension('npy'),
    kvInOneFile: false,
    refuses: (value) => (value instanceof Tensor ? null : 'format npy holds exactly one Tensor'),
    write: (sink, value) => writeNpy(sink, value as Tensor),
    read: readNpy,
  },
  safetensors: {
    name: 'safetensors',
    extension: tensorFileExtension('safetensors'),
    kvInOneFile: false,
    refuses: () => null,
    write: (sink, value) => writeSafetensors(sink, value as SafetensorsInput),
    read: readSafetensors,
  },
};

/** The registry entry of `format`. */
export function tensorFile(format: TensorFormat): TensorFileFormat {
  return REGISTRY[format];
}

/** The registry entry a file name's extension names, or undefined when it is not a tensor file. */
export function tensorFileOf(fileName: string): TensorFileFormat | undefined {
  const f = tensorFormatOfFile(fileName);
  return f === undefined ? undefined : REGISTRY[f];
}

/** The file of a KV dump layer (`kv` names k or v where the format writes them apart). */
export function kvDumpFileName(layer: string, format: TensorFormat, kv: 'k' | 'v'): string {
  const f = REGISTRY[format];
  return f.kvInOneFile ? `${layer}${f.extension}` : `${layer}.${kv}${f.extension}`;
}

/** `hint` when the file's header allows it (the JSON beside a .npy saying which fp8), else what the file states. */
export function resolveDtype(t: FileTensor, hint?: string): DType | null {
  return hint !== undefined && (t.candidates as string[]).includes(hint) ? (hint as DType) : t.dtype;
}
