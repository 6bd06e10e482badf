// .npy writer (format 1.0; 2.0 for headers over 65535 bytes; 3.0 when the header is not latin-1).
// The data starts on a 64-byte boundary, as numpy itself writes it.
import { CaptureError } from '../errors';
import { DType, dtypeInfo, formatRefusal, isDType } from './dtype';
import { Tensor } from './tensor';
import { FileSink, WriteResult, withSink } from './sink';

const MAGIC = Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]); // \x93NUMPY
const ALIGN = 64;

/** numpy descr for a dtype; rejects anything numpy cannot represent, suggesting .pt. */
export function npyDescrFor(dtype: DType | string): string {
  if (!isDType(dtype)) {
    throw new CaptureError(`dtype ${JSON.stringify(dtype)} has no .npy representation; write it as format "pt" instead`, 'ERR_NPY_DTYPE');
  }
  const refused = formatRefusal(dtype, 'npy');
  if (refused) throw new CaptureError(refused, 'ERR_NPY_DTYPE');
  return dtypeInfo(dtype).npyDescr as string;
}

function pyShape(shape: readonly number[]): string {
  if (shape.length === 0) return '()';
  if (shape.length === 1) return `(${shape[0]},)`;
  return `(${shape.join(', ')})`;
}

function isLatin1(s: string): boolean {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0xff) return false;
  return true;
}

/** The full preamble (magic, version, length, padded header); its length is a multiple of 64. */
export function npyHeader(dtype: DType | string, shape: readonly number[]): Buffer {
  const descr = npyDescrFor(dtype);
  const dict = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${pyShape(shape)}, }`;
  const latin1 = isLatin1(dict);
  const encode = (s: string) => Buffer.from(s, latin1 ? 'latin1' : 'utf8');
  const build = (major: number, lenBytes: number): Buffer | null => {
    const fixed = MAGIC.length + 2 + lenBytes;
    const body = encode(dict);
    const total = Math.ceil((fixed + body.length + 1) / ALIGN) * ALIGN;
    const headerLen = total - fixed;
    if (lenBytes === 2 && headerLen > 0xffff) return null;
    const out = Buffer.alloc(total, 0x20);
    MAGIC.copy(out, 0);
    out[6] = major;
    out[7] = 0;
    if (lenBytes === 2) out.writeUInt16LE(headerLen, 8);
    else out.writeUInt32LE(headerLen, 8);
    body.copy(out, fixed);
    out[total - 1] = 0x0a;
    return out;
  };
  if (!latin1) return build(3, 4) as Buffer;
  return build(1, 2) ?? (build(2, 4) as Buffer);
}

/** Write the preamble and the tensor's bytes into an open sink. */
export async function writeNpyTo(sink: FileSink, tensor: Tensor): Promise<void> {
  await sink.write(npyHeader(tensor.dtype, tensor.shape));
  for await (const chunk of tensor.stream()) await sink.write(chunk);
}

/** Write a tensor as a .npy file (new file) or into an open sink. Returns size and crc32c of the file. */
export async function writeNpy(target: string | FileSink, tensor: Tensor): Promise<WriteResult> {
  if (target instanceof FileSink) {
    await writeNpyTo(target, tensor);
    await target.flush();
    return target.result();
  }
  return withSink(target, (sink) => writeNpyTo(sink, tensor));
}
