// Runs the KV dump jobs armed for a wave on one rank: gathers the request's blocks from every
// registered KV layer into host staging (the engine waits only for this), then writes the
// dp<d>_tp<t>_pp<p>_cp<c>/ bundle (the seed's name) and acks the coordinator with its files.
import * as path from 'path';
import { DEFAULT_ARTIFACT_MODES, type ArtifactModes } from '../artifacts/artifact-mode';
import { Bundle } from '../artifacts/bundle';
import { itemSize } from '../artifacts/dtype';
import { CaptureError } from '../errors';
import { checkFreeSpace, writeDumpSkipped, type SkipReason } from '../artifacts/freespace';
import type { RankIdentity } from '../layout';
import type { Logger } from '../log';
import type { DumpJob, DumpResult, FileEntry } from '../messages';
import { kvRankDirName } from '../paths';
import { safeComponent } from '../artifacts/sanitize';
import { Tensor } from '../artifacts/tensor';
import type { TensorFormat } from '../artifacts/tensor-format';
import { kvDumpFileName, tensorFile } from '../artifacts/tensor-files';
import type { RegionTable, RegisteredRegion } from './regions';
import type { RootGate } from './roots';

export type DumpFormat = TensorFormat;

export interface DumpSettings {
  format: DumpFormat;
  freeHeadroomBytes: number;
  /** Host staging bound; a dump larger than this holds the engine while it streams to disk. */
  stagingBytes: number;
}

interface StagedLayer {
  layer: string;
  k?: { region: RegisteredRegion; data: Buffer };
  v?: { region: RegisteredRegion; data: Buffer };
}

interface StagedJob {
  job: DumpJob;
  layers: StagedLayer[];
  bytes: number;
  /** Wall time of the device → host copy of every region's blocks (all regions at once). */
  copySeconds: number;
}

function blockBytes(r: RegisteredRegion): number {
  const [, blockSize, heads, headDim] = r.shape;
  return blockSize * heads * headDim * itemSize(r.dtype);
}

export class DumpExecutor {
  constructor(
    private readonly identity: RankIdentity,
    private readonly regions: RegionTable,
    private readonly log: Logger,
    /** Every job's dump_dir is checked against the local dump root before anything is written. */
    private readonly gate: RootGate,
    /** --artifact-mode: dump files, rank folders and dump_skipped.json. */
    private readonly modes: ArtifactModes = DEFAULT_ARTIFACT_MODES,
  ) {}

  /** Bytes this rank would copy for `job`. */
  estimate(job: DumpJob): number {
    let total = 0;
    for (const l of this.regions.kvLayers()) {
      for (const r of [l.k, l.v]) if (r) total += blockBytes(r) * job.blockIds.length;
    }
    return total;
  }

  /**
   * Stage every job of the wave (device → host). Returns a writer to run after the engine is
   * released, plus results for jobs refused before any copy.
   */
  async stage(jobs: DumpJob[], settings: DumpSettings): Promise<{ staged: StagedJob[]; refused: DumpResult[] }> {
    const staged: StagedJob[] = [];
    const refused: DumpResult[] = [];
    for (const job of jobs) {
      let rankDir: string;
      try {
        rankDir = this.rankDir(job);
      } catch (e) {
        // Outside the local root: nothing is written anywhere (not even dump_skipped.json); the
        // ack is a failure naming this rank and the refused path, so the manifest says so.
        refused.push(this.result(job, [], 0, (e as Error).message, ''));
        continue;
      }
      const bytes = this.estimate(job);
      const refuse = (reason: SkipReason, error = ''): void => {
        writeDumpSkipped(rankDir, {
          reason,
          req_id: job.reqId,
          incident_type: job.incidentType,
          stage: 'drain',
          rank: this.identity.globalRank,
          wave: job.armWave,
          ts: Date.now() / 1000,
          ...(error ? { detail: { error } } : {}),
        }, this.modes);
        refused.push(this.result(job, [], 0, error, reason));
      };
      try {
        if (this.regions.kvLayers().length === 0) {
          refuse('no_dump_targets', 'this rank registered no KV pool regions');
          continue;
        }
        if (job.blockIds.length === 0) {
          refuse('empty_block_ids');
          continue;
        }
        const tp = this.identity.tp;
        const space = checkFreeSpace(path.dirname(rankDir), { estimatePerRankBytes: bytes, tpSize: tp, headroomBytes: settings.freeHeadroomBytes });
        if (!space.ok) {
          refuse('insufficient_free_space', `free ${space.freeBytes} < needed ${space.neededBytes} (estimate ${bytes} × tp_size ${tp} + headroom ${settings.freeHeadroomBytes})`);
          continue;
        }
        staged.push(await this.copy(job, bytes));
      } catch (e) {
        this.log.error({ err: e, job: job.jobId }, 'KV dump copy failed');
        try {
          refuse('d2h_failed', (e as Error).message);
        } catch (e2) {
          refused.push(this.result(job, [], 0, `${(e as Error).message}; and dump_skipped.json could not be written: ${(e2 as Error).message}`, 'd2h_failed'));
        }
      }
    }
    return { staged, refused };
  }

  private async copy(job: DumpJob, bytes: number): Promise<StagedJob> {
    const layers: StagedLayer[] = [];
    const gathers: (() => Promise<void>)[] = [];
    // Every block id is checked before anything is copied.
    for (const l of this.regions.kvLayers()) {
      const entry: StagedLayer = { layer: l.layer };
      for (const kv of ['k', 'v'] as const) {
        const r = l[kv];
        if (!r) continue;
        const bb = blockBytes(r);
        const numBlocks = r.shape[0];
        for (const b of job.blockIds) {
          if (b >= numBlocks) throw new CaptureError(`block id ${b} of request '${job.reqId}' is outside layer '${l.layer}' (${numBlocks} blocks)`, 'ERR_BLOCK_ID');
        }
        const data = Buffer.allocUnsafe(bb * job.blockIds.length);
        gathers.push(() =>
          r.region.gatherTo(data, 0, job.blockIds, bb, 0, r.blockStride || bb).catch((e: Error & { code?: string }) => {
            // The ack is all the coordinator sees: it must say which rank and region, and why.
            throw new CaptureError(`rank ${this.identity.globalRank}: copy of region '${r.name}' (${r.region.describe}) failed: ${e.message}`, e.code ?? 'ERR_CAPTURE');
          }),
        );
        entry[kv] = { region: r, data };
      }
      layers.push(entry);
    }
    // All layers at once: the copies run on every libuv pool thread instead of one after another
    // with a JS round trip between them (the engine waits for all of them). 256 MB over 32
    // regions on the 2-core dev VM: 31-33 ms one by one, 18-22 ms together (pre-faulted staging).
    const t0 = process.hrtime.bigint();
    const settled = await Promise.allSettled(gathers.map((g) => g()));
    const copySeconds = Number(process.hrtime.bigint() - t0) / 1e9;
    const failed = settled.find((x): x is PromiseRejectedResult => x.status === 'rejected');
    if (failed) throw failed.reason;
    return { job, layers, bytes, copySeconds };
  }

  /** Write the staged jobs' bundles; one DumpResult per job, failures included. */
  async write(staged: StagedJob[], format: DumpFormat): Promise<DumpResult[]> {
    const out: DumpResult[] = [];
    for (const s of staged) {
      const rankDir = this.rankDir(s.job);
      let bundle: Bundle | undefined;
      try {
        bundle = Bundle.begin(rankDir, { modes: this.modes });
        const files: FileEntry[] = [];
        const id = this.identity;
        // The rank coordinates every per-layer .pt dict and dump.json's identity both carry.
        const ranks = {
          global_rank: id.globalRank,
          tp_rank: id.tpRank,
          pp_rank: id.ppRank,
          dp_rank: id.dpRank,
          cp_rank: id.cpRank,
          tp_size: id.tp,
        };
        for (const l of s.layers) {
          const name = safeComponent(l.layer, 'layer name');
          const meta = {
            req_id: s.job.reqId,
            block_ids: s.job.blockIds,
            layer: l.layer,
            incident_type: s.job.incidentType,
            wave: s.job.armWave,
            ...ranks,
            num_kv_heads: (l.k ?? l.v)!.region.shape[2],
            head_dim: (l.k ?? l.v)!.region.shape[3],
            block_size: (l.k ?? l.v)!.region.shape[1],
            layout: 'n_blocks,block_size,num_kv_heads,head_dim',
            request_finished_at_dump: s.job.requestFinishedAtDump,
          };
          const tensors: Record<string, Tensor> = {};
          for (const kv of ['k', 'v'] as const) {
            const part = l[kv];
            if (!part) continue;
            const [, bs, h, d] = part.region.shape;
            tensors[kv] = Tensor.fromBuffer(part.region.dtype, [s.job.blockIds.length, bs, h, d], part.data);
          }
          if (tensorFile(format).kvInOneFile) {
            files.push(await bundle.writeTensor(kvDumpFileName(name, format, 'k'), format, { ...meta, ...tensors }));
          } else {
            for (const [kv, t] of Object.entries(tensors) as ['k' | 'v', Tensor][]) {
              files.push(await bundle.writeTensor(kvDumpFileName(name, format, kv), format, t));
            }
          }
        }
        const committed = await bundle.commit({
          name: 'dump.json',
          value: {
            schema: 1,
            job_id: s.job.jobId,
            req_id: s.job.reqId,
            incident_type: s.job.incidentType,
            arm_wave: s.job.armWave,
            detect_wave: s.job.detectWave,
            block_ids: s.job.blockIds,
            format,
            request_finished_at_dump: s.job.requestFinishedAtDump,
            dp_rank: s.job.replica ?? id.dpRank,
            identity: {
              ...ranks,
              pp_size: id.pp,
              dp_size: id.dp,
              cp_size: id.cp,
              host: id.host,
            },
            layers: s.layers.map((l) => ({
              layer: l.layer,
              dtype: (l.k ?? l.v)!.region.dtype,
              shape: [s.job.blockIds.length, ...(l.k ?? l.v)!.region.shape.slice(1)],
            })),
            // What the engine waited for: device → host memory, before any file was written
            // (scripts/gpu-check.sh compares it with cudaMemcpy of the same bytes).
            copy: { bytes: s.bytes, seconds: s.copySeconds },
            files,
          },
        });
        const rel = committed.map((f) => ({ ...f, path: path.posix.join(kvRankDirName(id), f.path) }));
        out.push({ ...this.result(s.job, rel, rel.reduce((n, f) => n + f.bytes, 0), '', ''), layers: s.layers.map((l) => l.layer) });
      } catch (e) {
        bundle?.abort();
        this.log.error({ err: e, job: s.job.jobId }, 'KV dump write failed');
        try {
          writeDumpSkipped(rankDir, {
            reason: 'write_failed',
            req_id: s.job.reqId,
            incident_type: s.job.incidentType,
            stage: 'drain',
            rank: this.identity.globalRank,
            wave: s.job.armWave,
            ts: Date.now() / 1000,
            detail: { error: (e as Error).message },
          }, this.modes);
        } catch {
          /* the dump root itself is unwritable: the ack carries the error */
        }
        out.push(this.result(s.job, [], 0, (e as Error).message, 'write_failed'));
      }
    }
    return out;
  }

  /** `<dump_dir>/dp<d>_tp<t>_pp<p>_cp<c>`, with dump_dir checked against the local dump root (throws RootRefusedError). */
  rankDir(job: DumpJob): string {
    return path.join(this.gate.dumpDir(job.dumpDir, 'DumpJob.dump_dir'), kvRankDirName(this.identity));
  }

  result(job: DumpJob, files: FileEntry[], bytes: number, error: string, skippedReason: string): DumpResult {
    return { globalRank: this.identity.globalRank, jobId: job.jobId, wave: job.armWave, files, bytes, error, skippedReason };
  }
}
