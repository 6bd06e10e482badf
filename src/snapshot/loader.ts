// Replay loader: a captured call directory back into the positional input list, with the real
// dtypes (bf16/fp8 from meta.json where .npy can only say |V2 / |V1), every file checked against
// meta.json (count, size, checksum, dtype, shape). Errors name the file and what disagreed.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { crc32cOfFile } from '../artifacts/checksum';
import { CaptureError } from '../errors';
import { DType, isDType, itemSize } from '../artifacts/dtype';
import { readBytes } from '../artifacts/read-range';
import { tensorFile } from '../artifacts/tensor-files';
import { CallMeta, META_FILE, parseMeta, tensorFileName, withheldIndices } from './meta';

export interface LoadedTensor {
  index: number;
  dtype: DType;
  shape: number[];
  /** Row-major element bytes, little-endian. */
  data: Buffer;
}

export interface LoadedCall {
  meta: CallMeta;
  tensors: LoadedTensor[];
}

/** `~` / `~/x` as a shell (and Python's expanduser) would read it: docs show such paths. */
function expandHome(p: string): string {
  const home = process.env.HOME || os.homedir(); // HOME first, as Python's expanduser
  if (p === '~') return home;
  return p.startsWith('~/') ? path.join(home, p.slice(2)) : p;
}

function bad(file: string, what: string): CaptureError {
  return new CaptureError(`${file}: ${what}`, 'ERR_SNAPSHOT_LOAD');
}

const sameShape = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((d, i) => d === b[i]);
const fmtShape = (s: readonly number[]) => `[${s.join(', ')}]`;

/** Where one tensor file keeps its element bytes, with the dtype/shape the file itself states. */
interface Located {
  dtypes: DType[]; // every dtype the file's own header allows (|V1 allows both fp8 kinds)
  shape: number[];
  offset: number;
}

function locate(file: string, format: CallMeta['format']): Located {
  const { tensors, lone } = tensorFile(format).read(file);
  if (!lone) throw bad(file, `does not hold a single tensor (found ${tensors.length} tensors)`);
  const t = tensors[0];
  if (t.notContiguous) throw bad(file, `${t.notContiguous}; snapshots are row-major`);
  if (t.candidates.length === 0) throw bad(file, `dtype ${t.code} is not one wavebus writes`);
  return { dtypes: t.candidates, shape: t.shape, offset: t.offset };
}

/**
 * Load a call directory (`.../rank<g>/call<N>`). Throws CaptureError naming the file on any
 * mismatch between the directory, meta.json and the tensor files.
 */
export async function loadCallDir(callDir: string): Promise<LoadedCall> {
  const dir = expandHome(callDir);
  const metaPath = path.join(dir, META_FILE);
  let text: string;
  try {
    text = await fs.promises.readFile(metaPath, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw bad(metaPath, code === 'ENOENT' ? 'missing: not a complete snapshot call directory' : `cannot be read (${code})`);
  }
  const meta = parseMeta(text, metaPath);

  // Exactly tensor0..tensor<n-1> plus meta.json, each listed once in files (when there is a files
  // list: the seed's layout has none, and then only dtype and shape can be checked).
  // A withheld input (recorder, save_sensitive_info false) has no file: the others load.
  const withheld = withheldIndices(meta);
  const presentInputs = meta.inputs.filter((inp) => !withheld.has(inp.index));
  const expected = presentInputs.map((inp) => tensorFileName(inp.index, meta.format));
  const listed = meta.files?.map((f) => f.name);
  if (listed && (listed.length !== expected.length || !expected.every((n) => listed.includes(n)))) {
    throw bad(metaPath, `files lists [${listed.join(', ')}] but inputs need [${expected.join(', ')}]`);
  }
  const present = (await fs.promises.readdir(dir)).filter((n) => n !== META_FILE).sort();
  const missing = expected.filter((n) => !present.includes(n));
  const extra = present.filter((n) => !expected.includes(n));
  if (missing.length > 0) throw bad(path.join(dir, missing[0]), `missing (meta.json lists ${expected.length} input files)`);
  if (extra.length > 0) throw bad(path.join(dir, extra[0]), `not listed in meta.json (the directory holds ${present.length} files, meta.json lists ${expected.length})`);

  const tensors: LoadedTensor[] = [];
  for (const inp of presentInputs) {
    const name = tensorFileName(inp.index, meta.format);
    const file = path.join(dir, name);
    const entry = meta.files?.find((f) => f.name === name);
    if (!isDType(inp.dtype)) throw bad(metaPath, `inputs[${inp.index}].dtype ${JSON.stringify(inp.dtype)} is not a known dtype`);
    const dtype = inp.dtype;
    const size = (await fs.promises.stat(file)).size;
    if (entry) {
      if (size !== entry.bytes) throw bad(file, `has ${size} bytes, meta.json says ${entry.bytes}`);
      const checksum = crc32cOfFile(file).toString();
      if (checksum !== entry.checksum) throw bad(file, `checksum ${checksum} does not match meta.json (${entry.checksum})`);
    }
    let loc: Located;
    try {
      loc = locate(file, meta.format);
    } catch (e) {
      if (e instanceof CaptureError) throw e;
      throw bad(file, (e as Error).message);
    }
    if (!loc.dtypes.includes(dtype)) throw bad(file, `holds ${loc.dtypes.join(' or ') || 'an unknown dtype'}, meta.json says ${dtype}`);
    if (!sameShape(loc.shape, inp.shape)) throw bad(file, `has shape ${fmtShape(loc.shape)}, meta.json says ${fmtShape(inp.shape)}`);
    const nbytes = inp.shape.reduce((a, b) => a * b, 1) * itemSize(dtype);
    if (loc.offset + nbytes > size) throw bad(file, `data [${loc.offset}, +${nbytes}) runs past the end of the file (${size} bytes)`);
    const data = nbytes === 0 ? Buffer.alloc(0) : readBytes(file, loc.offset, nbytes);
    tensors.push({ index: inp.index, dtype, shape: [...inp.shape], data });
  }
  return { meta, tensors };
}
