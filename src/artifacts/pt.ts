// .pt writer: the zip archive torch.save produces, loadable with torch.load(f, weights_only=True).
// Records in torch's order: <a>/data.pkl, <a>/byteorder, <a>/data/0.., <a>/version.
// No .format_version / .storage_alignment records (see docs/formats.md).
import * as path from 'path';
import { Tensor } from './tensor';
import { PyValue, pickle } from './pickle';
import { ZipOptions, ZipWriter } from './zip';
import { FileSink, WriteResult, withSink } from './sink';

export interface PtOptions extends ZipOptions {
  /** Top folder inside the archive; default: the file's stem (torch's choice), else "archive". */
  archiveName?: string;
}

/** The archive folder torch would use for a path: its stem, without the extension. */
export function archiveNameFor(filePath: string): string {
  const base = path.basename(filePath);
  const dot = base.lastIndexOf('.');
  const stem = dot > 0 ? base.slice(0, dot) : base;
  return stem.length > 0 && !stem.includes('/') ? stem : 'archive';
}

/** Write `value` (a Tensor, or a dict/list holding tensors and plain metadata) into an open sink. */
export async function writePtTo(sink: FileSink, value: PyValue, opts: PtOptions = {}): Promise<void> {
  const a = opts.archiveName ?? archiveNameFor(sink.path);
  const keys = new Map<Tensor, string>();
  const data = pickle(value, (t) => {
    let k = keys.get(t);
    if (k === undefined) {
      k = String(keys.size);
      keys.set(t, k);
    }
    return k;
  });
  const zip = new ZipWriter(sink, opts);
  await zip.addBuffer(`${a}/data.pkl`, data);
  await zip.addBuffer(`${a}/byteorder`, Buffer.from('little'));
  for (const [t, k] of keys) await zip.addStream(`${a}/data/${k}`, t.nbytes, t.stream());
  await zip.addBuffer(`${a}/version`, Buffer.from('3\n'));
  await zip.finish();
}

/** Write a .pt file (new file) or into an open sink. Returns size and crc32c of the file. */
export async function writePt(target: string | FileSink, value: PyValue, opts: PtOptions = {}): Promise<WriteResult> {
  if (target instanceof FileSink) {
    await writePtTo(target, value, opts);
    await target.flush();
    return target.result();
  }
  return withSink(target, (sink) => writePtTo(sink, value, opts));
}
