// `wavebus bench dump --size-mb M --format npy|pt|safetensors|all --dir D [--runs N] --json`
//
// End-to-end dump throughput against a plain write in the same run and directory:
// - end-to-end: a POSIX shm segment of M MB (the "device" KV pool) is copied region → host
//   staging in 16 MB chunks (stall_ms: until the last chunk has landed, the only part the engine
//   waits for); the artifact writer starts on each chunk as soon as it has landed, computing the
//   checksums on the way, inside an atomic bundle that is then committed (fsync, rename).
// - raw: the same bytes written with fs.writeSync in the same 16 MB calls + fsync to a new file
//   in the same directory.
// Each is run `runs` times, alternating which goes first. Reported: medians (MBps, raw_MBps,
// stall_ms) and ratio = the median of the per-round ratios (end-to-end vs the raw write of the
// same round, so load that drifts across rounds cancels out); best_ratio = best vs best;
// phases_ms: when the last byte was handed to the kernel vs the total, for both paths.
import * as crypto from 'crypto';
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import { packageRoot } from '../src/paths';
import * as os from 'os';
import * as path from 'path';
import { DeviceRegion, ShmSegment, Staging } from '../src/memory';
import { Bundle, TensorFormat, TENSOR_FORMATS } from '../src/artifacts/bundle';
import { Tensor } from '../src/artifacts/tensor';
import { ConfigError } from '../src/errors';
import type { BenchArgs, BenchFlags } from './lib/flags';

const MB = 1024 * 1024;
/** Region → staging copy granularity: the writer starts once the first chunk has landed. */
const COPY_CHUNK = 16 * MB;
const round = (x: number, d = 1) => Math.round(x * 10 ** d) / 10 ** d;
const now = () => Number(process.hrtime.bigint()) / 1e6; // ms

interface Options {
  sizeMb: number;
  formats: TensorFormat[];
  dir: string;
  runs: number;
}

export const summary = 'End-to-end dump throughput (shm region -> staging -> committed bundle) of M MB, against a plain write + fsync of the same bytes in the same directory, in the same run.';
export const flags = {
  'size-mb': { type: 'int', default: 256, describe: 'tensor size in MB (whole 32 KiB blocks)' },
  format: { type: 'string', default: 'pt', choices: [...TENSOR_FORMATS, 'all'], describe: 'file format, or all of them in turn' },
  dir: { type: 'string', default: os.tmpdir(), describe: 'directory to write in (its file system is what is measured)' },
  runs: { type: 'int', default: 5, describe: 'runs of each path per format, alternating which goes first; medians are reported' },
} satisfies BenchFlags;

function parse(a: BenchArgs<typeof flags>): Options {
  const formats = a.format === 'all' ? [...TENSOR_FORMATS] : [a.format as TensorFormat];
  return { sizeMb: a['size-mb'], formats, dir: a.dir, runs: a.runs };
}

/** A plain write + fsync; returns [total, write calls only] in ms. */
function rawWrite(file: string, data: Buffer): [number, number] {
  const t0 = now();
  let t1 = t0;
  const fd = fs.openSync(file, 'wx', 0o644);
  try {
    let off = 0;
    while (off < data.length) off += fs.writeSync(fd, data, off, Math.min(COPY_CHUNK, data.length - off));
    t1 = now();
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  return [now() - t0, t1 - t0];
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** The artifact value for a format: a KV-dump-like dict for pt, one tensor for npy, {k} for safetensors. */
function artifact(format: TensorFormat, t: Tensor): Parameters<Bundle['writeTensor']>[2] {
  if (format === 'npy') return t;
  if (format === 'pt') return { req_id: 'bench', block_ids: [0], layer: 0, tp_rank: 0, pp_rank: 0, cp_rank: 0, num_kv_heads: 8, wave: 1, k: t };
  return { k: t };
}

/**
 * Copy region → staging in chunks, one after another (the engine waits until the last one is
 * done: that is the stall), while the writer consumes each chunk as soon as it has landed.
 * Staging holds the whole dump, so the engine never waits for the disk.
 */
function stagedCopy(region: DeviceRegion, staging: Buffer, nbytes: number): { landed: Promise<void>[]; done: Promise<void> } {
  // All chunk copies are queued at once (native workers, in order), so a busy JS thread never
  // delays the copy the engine is waiting for.
  const landed: Promise<void>[] = [];
  for (let off = 0; off < nbytes; off += COPY_CHUNK) landed.push(region.copyTo(staging, off, off, Math.min(COPY_CHUNK, nbytes - off)));
  return { landed, done: Promise.all(landed).then(() => undefined) };
}

async function* chunksAsTheyLand(staging: Buffer, nbytes: number, landed: Promise<void>[]): AsyncGenerator<Buffer> {
  for (let i = 0; i < landed.length; i++) {
    await landed[i];
    yield staging.subarray(i * COPY_CHUNK, Math.min(nbytes, (i + 1) * COPY_CHUNK));
  }
}

async function endToEnd(format: TensorFormat, region: DeviceRegion, staging: Staging, nbytes: number, shape: number[], dir: string, tag: string) {
  const t0 = now();
  const copy = stagedCopy(region, staging.buffer, nbytes);
  let stall = 0;
  const stalled = copy.done.then(() => (stall = now() - t0)); // when end_of_wave would return
  const b = Bundle.begin(path.join(dir, `bench-dump-${tag}`));
  const t = Tensor.fromChunks('bfloat16', shape, chunksAsTheyLand(staging.buffer, nbytes, copy.landed), nbytes);
  await b.writeTensor('0', format, artifact(format, t));
  const written = now() - t0; // every byte handed to the kernel; its fsync is running
  await b.commit();
  await stalled;
  const total = now() - t0;
  fs.rmSync(path.join(dir, `bench-dump-${tag}`), { recursive: true, force: true });
  return { stall, total, written };
}

export async function run(args: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  const o = parse(args);
  fs.mkdirSync(o.dir, { recursive: true });
  const nbytes = o.sizeMb * MB;
  // KV layout [n_blocks, block_size=16, heads=8, head_dim=128] in bf16: 32 KiB per block.
  const blockBytes = 16 * 8 * 128 * 2;
  if (nbytes % blockBytes !== 0) throw new ConfigError(`--size-mb must make whole 32 KiB blocks`);
  const shape = [nbytes / blockBytes, 16, 8, 128];
  const shmName = `/wavebus-bench-dump-${process.pid}-${crypto.randomBytes(3).toString('hex')}`;
  const seg = ShmSegment.create(shmName, nbytes);
  const results: Record<string, unknown>[] = [];
  try {
    crypto.randomFillSync(seg.buffer());
    const region = DeviceRegion.open({ kind: 'shm', shmName, offset: 0, nbytes });
    const staging = new Staging(nbytes);
    const scratch = fs.mkdtempSync(path.join(o.dir, 'wavebus-bench-dump-'));
    try {
      await region.copyTo(staging.buffer, 0, 0, nbytes); // fault the staging pages in once
      for (const format of o.formats) {
        const raw: number[] = [];
        const rawWriteMs: number[] = [];
        const total: number[] = [];
        const stall: number[] = [];
        const written: number[] = [];
        for (let i = 0; i < o.runs; i++) {
          const rawFile = path.join(scratch, `raw-${i}`);
          const rawRun = () => {
            const [t, w] = rawWrite(rawFile, staging.buffer);
            raw.push(t);
            rawWriteMs.push(w);
            fs.rmSync(rawFile);
          };
          if (i % 2 === 0) rawRun();
          const r = await endToEnd(format, region, staging, nbytes, shape, scratch, `${format}-${i}`);
          total.push(r.total);
          stall.push(r.stall);
          written.push(r.written);
          if (i % 2 === 1) rawRun();
        }
        const MBps = o.sizeMb / (median(total) / 1000);
        const rawMBps = o.sizeMb / (median(raw) / 1000);
        results.push({
          format,
          size_mb: o.sizeMb,
          MBps: round(MBps),
          stall_ms: round(median(stall), 2),
          raw_MBps: round(rawMBps),
          ratio: round(median(raw.map((r, i) => r / total[i])), 3),
          best_ratio: round(Math.min(...raw) / Math.min(...total), 3),
          runs: o.runs,
          // Where the time goes (medians, ms): end-to-end until the last byte was handed to the
          // kernel / in total; raw write calls / raw in total (the rest of each is its fsync).
          phases_ms: {
            written: round(median(written)),
            total: round(median(total)),
            raw_write: round(median(rawWriteMs)),
            raw_total: round(median(raw)),
          },
        });
      }
    } finally {
      fs.rmSync(scratch, { recursive: true, force: true });
      region.close();
    }
  } finally {
    seg.close();
    ShmSegment.unlink(shmName);
  }
  const loadAvg = Math.round(os.loadavg()[0] * 100) / 100; // before the Python baselines add their own load
  const baseline = pythonBaselines(o.sizeMb, o.dir, o.runs);
  for (const r of results) Object.assign(r, baseline, { load_avg_1m: loadAvg });
  return results.length === 1 ? results[0] : { size_mb: o.sizeMb, results };
}

/** numpy.save and torch.save of the same bytes, same directory, same run (Debian's python3). */
function pythonBaselines(sizeMb: number, dir: string, runs: number): Record<string, number | string> {
  const py = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
  const scratch = fs.mkdtempSync(path.join(dir, 'wavebus-bench-py-'));
  try {
    const r = spawnSync(py, [path.join(packageRoot(), 'bench', 'save_baseline.py'), String(sizeMb), scratch, String(runs)], { encoding: 'utf8', timeout: 600000 });
    if (r.status !== 0) return { python_baseline: `unavailable: ${(r.stderr || r.error?.message || '').trim().split('\n').pop()}` };
    const j = JSON.parse(r.stdout.trim().split('\n').pop() as string) as { numpy_save_ms: number[]; torch_save_ms: number[] };
    return { numpy_save_MBps: round(sizeMb / (median(j.numpy_save_ms) / 1000)), torch_save_MBps: round(sizeMb / (median(j.torch_save_ms) / 1000)) };
  } finally {
    fs.rmSync(scratch, { recursive: true, force: true });
  }
}
