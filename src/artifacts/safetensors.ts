// .safetensors writer: u64 LE header length, JSON header (space-padded to a multiple of 8),
// then the tensors' bytes back to back, in the order given.
import { CaptureError } from '../errors';
import { dtypeInfo, formatRefusal } from './dtype';
import { Tensor } from './tensor';
import { FileSink, WriteResult, withSink } from './sink';

export type SafetensorsInput = Tensor | Record<string, unknown> | Map<string, unknown>;

export interface SafetensorsLayout {
  header: Buffer; // length prefix + JSON
  tensors: [string, Tensor][];
}

/**
 * Split a value into named tensors and `__metadata__` (str → str): a lone Tensor is named
 * "tensor"; in a dict, tensors are entries and everything else is metadata (non-strings as JSON).
 */
export function safetensorsLayout(value: SafetensorsInput, metadata: Record<string, string> = {}): SafetensorsLayout {
  const tensors: [string, Tensor][] = [];
  const meta: Record<string, string> = {};
  const entries: [string, unknown][] =
    value instanceof Tensor ? [['tensor', value]] : value instanceof Map ? [...value.entries()] : Object.entries(value);
  for (const [k, v] of entries) {
    if (typeof k !== 'string' || k.length === 0) throw new CaptureError(`safetensors: tensor names must be non-empty strings, got ${JSON.stringify(k)}`, 'ERR_SAFETENSORS');
    if (v instanceof Tensor) {
      if (k === '__metadata__') throw new CaptureError('safetensors: "__metadata__" is reserved and cannot name a tensor', 'ERR_SAFETENSORS');
      tensors.push([k, v]);
    } else if (v !== undefined) {
      meta[k] = typeof v === 'string' ? v : JSON.stringify(v, (_key, x) => (typeof x === 'bigint' ? x.toString() : x));
    }
  }
  for (const [k, v] of Object.entries(metadata)) {
    if (typeof v !== 'string') throw new CaptureError(`safetensors: __metadata__.${k} must be a string`, 'ERR_SAFETENSORS');
    meta[k] = v;
  }
  const json: Record<string, unknown> = {};
  if (Object.keys(meta).length > 0) json.__metadata__ = meta;
  let off = 0;
  for (const [k, t] of tensors) {
    const refused = formatRefusal(t.dtype, 'safetensors');
    if (refused) throw new CaptureError(`tensor ${JSON.stringify(k)}: ${refused}`, 'ERR_SAFETENSORS_DTYPE');
    json[k] = { dtype: dtypeInfo(t.dtype).safetensors, shape: [...t.shape], data_offsets: [off, off + t.nbytes] };
    off += t.nbytes;
  }
  const body = Buffer.from(JSON.stringify(json), 'utf8');
  const padded = Math.ceil(body.length / 8) * 8;
  const header = Buffer.alloc(8 + padded, 0x20);
  header.writeBigUInt64LE(BigInt(padded), 0);
  body.copy(header, 8);
  return { header, tensors };
}

export async function writeSafetensorsTo(sink: FileSink, value: SafetensorsInput, metadata?: Record<string, string>): Promise<void> {
  const { header, tensors } = safetensorsLayout(value, metadata);
  await sink.write(header);
  for (const [, t] of tensors) for await (const c of t.stream()) await sink.write(c);
}

/** Write a .safetensors file (new file) or into an open sink. Returns size and crc32c of the file. */
export async function writeSafetensors(target: string | FileSink, value: SafetensorsInput, metadata?: Record<string, string>): Promise<WriteResult> {
  if (target instanceof FileSink) {
    await writeSafetensorsTo(target, value, metadata);
    await target.flush();
    return target.result();
  }
  return withSink(target, (sink) => writeSafetensorsTo(sink, value, metadata));
}
