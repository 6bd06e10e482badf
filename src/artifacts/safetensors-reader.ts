// Reading a .safetensors header back: its JSON, with offsets checked contiguous and matching
// dtype × shape and the file's size.
import * as fs from 'fs';
import { DType, dtypeFromSafetensors, itemSize } from './dtype';
import { ArtifactFormatError } from '../errors';
import { readRange } from './read-range';

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
