// The per-forward capture decision and write, one capturer per agent (rank): selection, rank
// narrowing, budget, then the positional input tensors and meta.json as one atomic bundle.
// Capture fails loudly: any failure throws CaptureError (the caller aborts the forward) and leaves
// nothing under the call directory's final name.
import * as path from 'path';
import type { ArtifactModes } from '../artifacts/artifact-mode';
import { Bundle, removeStaleTemps } from '../artifacts/bundle';
import { DType, formatRefusal, itemSize, parseDType } from '../artifacts/dtype';
import { CaptureError, WavebusError } from '../errors';
import type { ForwardContext } from '../messages';
import { rankDirName } from '../paths';
import { safeComponent } from '../artifacts/sanitize';
import { Tensor } from '../artifacts/tensor';
import { CaptureBudget, processCaptureBudget } from './budget';
import type { SnapshotConfig, SnapshotFormat } from './config';
import { buildCallMeta, META_FILE, MetaFile, MetaInput, SnapshotRank, tensorFileName } from './meta';
import { CaptureSelector, checkForwardContext, Selection } from './selector';

/** One positional input of the forward: its dtype, shape, and a way to get its bytes to host. */
export interface CaptureInput {
  dtype: DType | string;
  shape: readonly number[];
  /** The input's row-major bytes (one buffer or chunks in order), e.g. DeviceRegion.copyTo. */
  read: () => Promise<Buffer | Buffer[]>;
  /** Set when this backend cannot read the input's memory (why): a selected capture is then a stated no-op. */
  unreadable?: string;
}

/** What regionInput needs of a memory region (src/memory.ts DeviceRegion fits). */
export interface ReadableRegion {
  readonly nbytes: number;
  copyTo(dst: Uint8Array, dstOffset?: number, srcOffset?: number, nbytes?: number): Promise<void>;
}

/**
 * A capture input backed by an engine buffer shared with the agent: `read()` copies the
 * dtype x shape bytes at `srcOffset` of the region to a fresh host buffer.
 */
export function regionInput(region: ReadableRegion, dtype: DType | string, shape: readonly number[], srcOffset = 0): CaptureInput {
  return {
    dtype,
    shape,
    read: async () => {
      const d = parseDType(dtype, 'region input dtype');
      const nbytes = shape.reduce((a, b) => a * b, 1) * itemSize(d);
      const buf = Buffer.allocUnsafe(nbytes);
      if (nbytes > 0) await region.copyTo(buf, 0, srcOffset, nbytes);
      return buf;
    },
  };
}

export type SkipReason = 'disabled' | 'not_selected' | 'warmup' | 'rank_not_selected' | 'budget_exhausted' | string;

export interface CaptureResult {
  captured: boolean;
  callDir?: string;
  reason?: SkipReason;
  selection?: Selection;
}

/** What the capturer has done so far (for logs, metrics and the agent's status). */
export interface CaptureStats {
  forwards: number;
  selected: number;
  captured: number;
  skippedRank: number;
  skippedBudget: number;
  noop: number;
  failed: number;
}

export interface CapturerLog {
  info(msg: string): void;
  warn(msg: string): void;
}

export interface CapturerOptions {
  /** Defaults to the process-global budget of config.maxCaptures. */
  budget?: CaptureBudget;
  log?: CapturerLog;
  /** Set when gating found capture cannot work here (checkSnapshotGating's reason): every selected forward is a stated no-op. */
  noopReason?: string;
  /** --artifact-mode of the snapshot files and folders (default: DEFAULT_ARTIFACT_MODES). */
  artifactModes?: ArtifactModes;
}

const stderrLog: CapturerLog = {
  info: (m) => process.stderr.write(`wavebus: ${m}\n`),
  warn: (m) => process.stderr.write(`wavebus: warning: ${m}\n`),
};

/** `<snapshotRoot>/<hash>/rank<g>`: this rank's snapshot dir for one compiled graph. */
export function snapshotRankDir(snapshotRoot: string, compilationHash: string, globalRank: number): string {
  return path.join(snapshotRoot, safeComponent(compilationHash, 'compilation hash'), rankDirName(globalRank));
}

/**
 * `<snapshotRoot>/live/<arm id>-wave<W>`: the root of one capture armed on the running job
 * (`wavebus capture`), W the wave it takes effect at. An arm counts its calls from W, so each arm
 * writes under a root of its own: a second capture's call0 never replaces the first's. The name is
 * the same on every rank of the replica (the arm's id and wave come with the head); the wave keeps
 * it unique when a restarted coordinator numbers its captures from 1 again.
 */
export function liveCaptureRoot(snapshotRoot: string, armId: string, wave: number): string {
  return path.join(snapshotRoot, 'live', safeComponent(`${armId}-wave${wave}`, 'capture arm id'));
}

export function callDirName(callIndex: number): string {
  return `call${callIndex}`;
}

export class SnapshotCapturer {
  readonly selector: CaptureSelector;
  private readonly budget: CaptureBudget;
  private readonly log: CapturerLog;
  private readonly counts: CaptureStats = { forwards: 0, selected: 0, captured: 0, skippedRank: 0, skippedBudget: 0, noop: 0, failed: 0 };
  private noopAnnounced = false;

  constructor(
    readonly config: SnapshotConfig,
    readonly rank: SnapshotRank,
    private readonly opts: CapturerOptions = {},
  ) {
    this.selector = new CaptureSelector(config);
    this.budget = opts.budget ?? processCaptureBudget(config.maxCaptures);
    this.log = opts.log ?? stderrLog;
  }

  stats(): CaptureStats {
    return { ...this.counts };
  }

  /** Whether this rank captures at all (the rank filter is on the tp rank). */
  get rankSelected(): boolean {
    return this.config.ranks === null || this.config.ranks.has(this.rank.tpRank);
  }

  /**
   * Decide on one forward and, when it is selected, write its inputs. Call it before the plain
   * execute, on synchronized inputs. Throws CaptureError on any failure; nothing is left behind.
   */
  async capture(given: ForwardContext, inputs: readonly CaptureInput[], counted?: number): Promise<CaptureResult> {
    if (!this.config.enabled) return { captured: false, reason: 'disabled' };
    let selection: Selection;
    let ctx: ForwardContext;
    try {
      ctx = checkForwardContext(given); // rowRequest filled in, so meta.json records every row's request
      selection = this.selector.evaluate(ctx, counted);
    } catch (e) {
      this.counts.failed += 1;
      throw asCaptureError(e, 'evaluating the forward context');
    }
    if (selection.callIndex === null) return { captured: false, reason: 'warmup', selection };
    this.counts.forwards += 1;
    if (!selection.selected) return { captured: false, reason: 'not_selected', selection };
    this.counts.selected += 1;
    if (!this.rankSelected) {
      this.counts.skippedRank += 1;
      return { captured: false, reason: 'rank_not_selected', selection };
    }
    // The seed's no-op rule: a backend that cannot read the memory makes capture a stated no-op
    // (one log line, no error, no budget spent), never a failed forward.
    const unreadable = Array.isArray(inputs) ? inputs.find((i) => i && typeof i.unreadable === 'string') : undefined;
    const noop = this.opts.noopReason ?? (unreadable ? 'backend_without_memory_access' : undefined);
    if (noop) {
      this.counts.noop += 1;
      if (!this.noopAnnounced) {
        this.noopAnnounced = true;
        const why = this.opts.noopReason ?? unreadable?.unreadable;
        this.log.warn(`input snapshot selected (call ${selection.callIndex} of ${ctx.compilationHash}) but capture is a no-op here: ${why}`);
      }
      return { captured: false, reason: noop, selection };
    }

    let metaInputs: MetaInput[];
    try {
      metaInputs = describeInputs(inputs, this.config.format);
    } catch (e) {
      this.counts.failed += 1;
      throw asCaptureError(e, 'checking the forward inputs');
    }
    const callDir = path.join(snapshotRankDir(this.config.snapshotRoot, ctx.compilationHash, this.rank.globalRank), callDirName(selection.callIndex));
    if (!this.budget.tryConsume()) {
      this.counts.skippedBudget += 1;
      return { captured: false, reason: 'budget_exhausted', selection };
    }
    let replaced: boolean;
    try {
      replaced = await this.write(callDir, ctx, selection, inputs, metaInputs);
    } catch (e) {
      this.counts.failed += 1;
      throw asCaptureError(e, `capturing ${callDir}`);
    }
    this.counts.captured += 1;
    this.log.info(
      `input snapshot written: ${callDir} (selected by ${selection.selectedBy.join(', ')})` +
        (replaced ? '; it replaced an earlier capture of the same call (a rerun)' : ''),
    );
    return { captured: true, callDir, selection };
  }

  /** Write the call dir; true when it replaced an earlier capture of the same call. */
  private async write(callDir: string, ctx: ForwardContext, selection: Selection, inputs: readonly CaptureInput[], metaInputs: MetaInput[]): Promise<boolean> {
    const format = this.config.format;
    try {
      // Temp dirs of killed earlier runs on this host would only confuse whoever lists the rank dir.
      removeStaleTemps(path.dirname(callDir));
    } catch {
      /* best effort */
    }
    // A rerun (same root, same compilation hash) selects the same call<N> again: the newer capture
    // replaces the old one whole, so a healthy job never aborts over it (docs/snapshots.md).
    const bundle = Bundle.begin(callDir, { replace: true, modes: this.opts.artifactModes });
    try {
      const files: MetaFile[] = [];
      for (const mi of metaInputs) {
        const data = await inputs[mi.index].read();
        const tensor = Tensor.fromBuffer(mi.dtype as DType, mi.shape, Array.isArray(data) ? data : [data]);
        const name = tensorFileName(mi.index, format);
        const entry = await bundle.writeTensor(name, format, tensor);
        files.push({ name: entry.path, bytes: entry.bytes, checksum: entry.checksum });
      }
      const meta = buildCallMeta({
        hash: ctx.compilationHash,
        format,
        rank: this.rank,
        callIndex: selection.callIndex as number,
        selectedBy: selection.selectedBy,
        inputs: metaInputs,
        ctx,
        matches: selection.matches,
        files,
      });
      // meta.json last, sorted keys, indent 2: the call dir appears only once it is whole.
      await bundle.commit({ name: META_FILE, value: meta, sortKeys: true, indent: 2 });
      return bundle.replaced;
    } catch (e) {
      await bundle.abort();
      throw e;
    }
  }
}

/** Check every input before touching the disk or the budget; errors name the input. */
function describeInputs(inputs: readonly CaptureInput[], format: SnapshotFormat): MetaInput[] {
  if (!Array.isArray(inputs)) throw new CaptureError('inputs must be a list', 'ERR_SNAPSHOT_INPUT');
  return inputs.map((inp, index) => {
    if (!inp || typeof inp.read !== 'function') throw new CaptureError(`inputs[${index}]: read() is missing`, 'ERR_SNAPSHOT_INPUT');
    const dtype = parseDType(inp.dtype, `inputs[${index}].dtype`);
    const refused = formatRefusal(dtype, format);
    if (refused) throw new CaptureError(`inputs[${index}]: ${refused}`, 'ERR_SNAPSHOT_DTYPE');
    if (!Array.isArray(inp.shape) || !inp.shape.every((d: unknown) => typeof d === 'number' && Number.isSafeInteger(d) && d >= 0)) {
      throw new CaptureError(`inputs[${index}].shape must be a list of non-negative integers, got ${JSON.stringify(inp.shape)}`, 'ERR_SNAPSHOT_INPUT');
    }
    return { index, dtype, shape: [...inp.shape] };
  });
}

function asCaptureError(e: unknown, what: string): CaptureError {
  if (e instanceof CaptureError) return e;
  if (e instanceof WavebusError) return new CaptureError(`${what}: ${e.message}`, e.code);
  return new CaptureError(`${what}: ${(e as Error)?.message ?? String(e)}`, 'ERR_CAPTURE');
}
