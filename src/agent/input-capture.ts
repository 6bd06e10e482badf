// before_forward on the agent: a forward offered for an input snapshot. The capturer decides
// (selection rules, budget) and writes; this module checks the engine's deadlines and reads the
// inputs out of the registered regions.
import { itemSize, parseDType } from '../artifacts/dtype';
import { CaptureError, ConfigError } from '../errors';
import type { ArtifactModes } from '../artifacts/artifact-mode';
import type { RankIdentity } from '../layout';
import type { Logger } from '../log';
import { SnapshotCapturer } from '../snapshot/capture';
import type { SnapshotConfig } from '../snapshot/config';
import type { RegionTable } from './regions';

export interface BeforeForwardRequest {
  context: any;
  inputs: { region: string; offset: number; dtype: string; shape: number[] }[];
  acceptByUnixMs?: number | string;
  finishByUnixMs?: number | string;
  /** The engine's wave this forward belongs to (0: unknown). */
  wave?: number | string;
  /** What the client keeps in its mailbox's capture_waiting word while it waits (0: not said). */
  waitTicket?: number | string;
  /** The call index the client counted, plus one (0: not counted). */
  callIndexPlus1?: number | string;
  /** The engine could not stage this forward's inputs: why ('' or absent: staged). */
  stagingError?: string;
}

/** What an agent keeps of an engine's staging error (a log line and a capture result, not a file). */
const MAX_STAGING_ERROR = 1024;

/** The engine's reason it could not stage the forward's inputs, cut to a bound; undefined: staged. */
export function stagingError(bf: BeforeForwardRequest): string | undefined {
  const why = typeof bf.stagingError === 'string' ? bf.stagingError : '';
  if (why === '') return undefined;
  return why.length > MAX_STAGING_ERROR ? `${why.slice(0, MAX_STAGING_ERROR)}...` : why;
}

/** The engine client's capture_waiting word (MailboxWriter.captureWaiting), read after each copy. */
export type WaitingWord = () => number;

/** The rules a client pre-checks before offering a forward (proto SnapshotSelection). */
export function snapshotSelection(capturer: SnapshotCapturer): Record<string, unknown> {
  const c = capturer.config;
  const rule = c.callRule;
  return {
    callRule: { first: 0, all: 1, indices: 2, never: 3 }[rule.kind],
    callIndices: rule.kind === 'indices' ? [...rule.indices] : [],
    tokenTargets: [...c.tokenTargets],
    requestIds: [...c.requestIds],
    rankSelected: capturer.rankSelected,
  };
}

/** The agent's input-snapshot capturer: none unless snapshots are on (--snapshot). */
export function inputCapturer(snapshot: SnapshotConfig | undefined, identity: RankIdentity, log: Logger, artifactModes?: ArtifactModes): SnapshotCapturer | undefined {
  if (!snapshot?.enabled) return undefined;
  const { globalRank, tpRank, ppRank, dpRank, cpRank } = identity;
  return new SnapshotCapturer(snapshot, { globalRank, tpRank, ppRank, dpRank, cpRank }, {
    log: { info: (m: string) => log.info(m), warn: (m: string) => log.warn(m) },
    artifactModes,
  });
}

/**
 * The call index the client counted (BeforeForward.callIndexPlus1), when it counted one. The
 * client counts by the startup rules only (snapshot-precheck), so only the startup capturer takes it.
 */
export function countedCallIndex(bf: BeforeForwardRequest): number | undefined {
  const plus1 = Number(bf.callIndexPlus1 ?? 0);
  return plus1 > 0 && Number.isSafeInteger(plus1) ? plus1 - 1 : undefined;
}

/**
 * `interim`: tells the client the capture has begun; `written`: counts a written snapshot;
 * `waiting`: the client's capture_waiting word; `counted`: the forward's call index as the client
 * counted it (countedCallIndex), or undefined: the capturer counts the forwards it is offered.
 */
export async function captureInputs(
  capturer: SnapshotCapturer,
  regions: RegionTable,
  bf: BeforeForwardRequest,
  interim: () => void,
  written: () => void,
  waiting: WaitingWord,
  counted?: number,
): Promise<Record<string, unknown>> {
  const acceptBy = Number(bf.acceptByUnixMs ?? 0);
  const finishBy = Number(bf.finishByUnixMs ?? 0);
  const ticket = Number(bf.waitTicket ?? 0);
  // The engine gave up waiting if we are past its deadline (this agent was frozen): its inputs
  // may have changed since, so nothing is copied. Else it hears at once that we are alive and
  // waits for the decision and the capture (disk work may take longer than its call bound).
  if (acceptBy > 0 && Date.now() > acceptBy) throw new CaptureError(`the engine stopped waiting for this forward at ${new Date(acceptBy).toISOString()}; not captured`, 'ERR_CLIENT_GONE');
  interim();
  const inputs = bf.inputs.map((inp, i) => {
    const unreadable = regions.unreadable(inp.region);
    if (unreadable) return { dtype: inp.dtype, shape: inp.shape.map(Number), unreadable, read: async (): Promise<Buffer> => Buffer.alloc(0) };
    const r = regions.get(inp.region);
    if (!r) throw new ConfigError(`inputs[${i}].region '${inp.region}' is not registered`);
    return {
      dtype: inp.dtype,
      shape: inp.shape.map(Number),
      read: async (): Promise<Buffer> => {
        const numel = inp.shape.reduce((a, b) => a * Number(b), 1);
        const nbytes = numel * itemSize(parseDType(inp.dtype, `inputs[${i}].dtype`));
        const buf = Buffer.allocUnsafe(nbytes);
        await r.region.copyTo(buf, 0, inp.offset, nbytes);
        // Copied after the engine went on: the bytes may be the next forward's. Nothing is kept.
        if (finishBy > 0 && Date.now() > finishBy) throw new CaptureError(`inputs[${i}] copied after the engine stopped waiting; capture dropped`, 'ERR_CLIENT_GONE');
        // The deadlines cannot see a client that gave up before our "capturing" reached it (we were
        // descheduled past its margin): its word, cleared before the engine goes on, can.
        if (ticket > 0 && waiting() !== ticket) throw new CaptureError(`inputs[${i}]: the engine stopped waiting for this forward during the copy (its mailbox no longer holds ticket ${ticket}); capture dropped`, 'ERR_CLIENT_GONE');
        return buf;
      },
    };
  });
  const res = await capturer.capture(bf.context, inputs, counted);
  if (res.captured) written();
  return { captured: res.captured, callDir: res.callDir ?? '' };
}
