// Reading a .pt archive back: its zip records, the unpickled data.pkl, and where each tensor's
// bytes lie in the file (checked against its storage record).
import { itemSize } from './dtype';
import { ArtifactFormatError } from '../errors';
import { readRange } from './read-range';
import { unpicklePt, type PtTensorRef } from './unpickle';
import { listZip, type ZipRecord } from './zip-reader';

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
