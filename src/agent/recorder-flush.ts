// Writing the flight recorder's ring out (docs/recorder.md): every whole forward it holds becomes
// a snapshot bundle (the snapshot layout, meta.json with selected_by ["recorder"] and the ring
// position), under <root>/recorder/<flush>/<hash>/rank<g>/call<forward>, so replay tools read it
// as any snapshot. A slot being written is left out and named. After an engine death the agent
// also writes crash-rank<g>.json beside them. Everything is 0600. Token-id inputs are kept as
// report.save_sensitive_info says at flush time (recorder-sensitive.ts): raw, hashed or withheld.
import * as path from 'path';
import { sensitiveModes, type ArtifactModes, DEFAULT_ARTIFACT_MODES } from '../artifacts/artifact-mode';
import { artifactWrite, writeJsonAtomic } from '../artifacts/atomic-write';
import { Bundle, removeStaleTemps } from '../artifacts/bundle';
import { formatRefusal, parseDType, type DType } from '../artifacts/dtype';
import { safeComponent } from '../artifacts/sanitize';
import { Tensor } from '../artifacts/tensor';
import type { RankIdentity } from '../layout';
import { rankDirName } from '../paths';
import { checkForwardContext } from '../snapshot/selector';
import { describeExit } from './engine-fault';
import { buildCallMeta, META_FILE, type MetaFile, type MetaInput, tensorFileName } from '../snapshot/meta';
import type { RingEntry, RingRead, TornSlot } from './recorder-ring';
import { DEFAULT_FLUSH_PRIVACY, keepInput, type FlushPrivacy, type HashedInput, type WithheldInput } from './recorder-sensitive';

export interface FlushedForward {
  forward: number;
  slot: number;
  wave: number;
  globalStep: number;
  /** The call dir written; empty when the forward was too large for its slot or could not be written. */
  callDir: string;
  tooLarge?: boolean;
  error?: string;
  /** The error's code (proto/errors.json) when it has one: a forward left out is accounted for by it. */
  errorCode?: string;
}

export interface FlushResult {
  /** <root>/recorder/<name>: this flush's folder. */
  dir: string;
  reason: string;
  forwards: FlushedForward[];
  torn: TornSlot[];
}

/** `<root>/recorder/<name>`: one flush's folder (the same name on every rank that flushes it). */
export function flushDir(root: string, name: string): string {
  return path.join(root, 'recorder', safeComponent(name, 'recorder flush name'));
}

/**
 * Write every whole forward of `read` as a bundle under flushDir(root, name). Never throws for one
 * bad entry. `privacy`: what is kept of token ids (default: withheld, known by name).
 */
export async function flushRing(read: RingRead, root: string, name: string, reason: string, identity: RankIdentity, modes: ArtifactModes = DEFAULT_ARTIFACT_MODES, privacy: FlushPrivacy = DEFAULT_FLUSH_PRIVACY): Promise<FlushResult> {
  const dir = flushDir(root, name);
  const out: FlushedForward[] = [];
  const m = sensitiveModes(modes);
  for (const e of read.entries) {
    const ctx = e.entry.context ?? {};
    const f: FlushedForward = { forward: e.forward, slot: e.slot, wave: Number(e.entry.wave ?? 0), globalStep: Number(ctx.globalStep ?? 0), callDir: '' };
    if (e.tooLarge) {
      f.tooLarge = true;
      out.push(f);
      continue;
    }
    try {
      f.callDir = await writeEntry(e, dir, reason, identity, m, privacy);
    } catch (err) {
      f.error = (err as Error).message;
      const code = (err as { code?: unknown }).code;
      if (typeof code === 'string') f.errorCode = code;
    }
    out.push(f);
  }
  return { dir, reason, forwards: out, torn: read.torn };
}

async function writeEntry(e: RingEntry, dir: string, reason: string, identity: RankIdentity, modes: ArtifactModes, privacy: FlushPrivacy): Promise<string> {
  const ctx = checkForwardContext(e.entry.context);
  const inputs: MetaInput[] = (e.entry.inputs ?? []).map((inp: any, index: number) => ({ index, dtype: parseDType(inp.dtype, `inputs[${index}].dtype`), shape: (inp.shape ?? []).map(Number) }));
  // Token ids: as recorded, hashed (another dtype: meta.json's inputs say the file's) or withheld.
  const kept = inputs.map((mi) => keepInput(mi.index, String(e.entry.inputs[mi.index].region ?? ''), mi.dtype as DType, e.data[mi.index], privacy));
  const withheld: WithheldInput[] = [];
  const hashed: HashedInput[] = [];
  for (const [i, k] of kept.entries()) {
    if (k.keep === 'withheld') withheld.push(k.note);
    if (k.keep === 'hashed') {
      hashed.push(k.note);
      inputs[i] = { ...inputs[i], dtype: k.dtype };
    }
  }
  const format = inputs.some((i) => formatRefusal(i.dtype as DType, 'npy')) ? 'pt' : 'npy';
  const callDir = path.join(dir, safeComponent(ctx.compilationHash, 'compilation hash'), rankDirName(identity.globalRank), `call${e.forward}`);
  // An agent killed mid-flush left its temp dir here (the crash flush of a restarted agent has the same name).
  removeStaleTemps(path.dirname(callDir));
  const bundle = Bundle.begin(callDir, { replace: true, modes });
  try {
    const files: MetaFile[] = [];
    for (const mi of inputs) {
      const k = kept[mi.index];
      if (k.keep === 'withheld') continue;
      const tensor = Tensor.fromBuffer(mi.dtype as DType, mi.shape, [k.keep === 'hashed' ? k.data : e.data[mi.index]]);
      const entry = await bundle.writeTensor(tensorFileName(mi.index, format), format, tensor);
      files.push({ name: entry.path, bytes: entry.bytes, checksum: entry.checksum });
    }
    const meta = buildCallMeta({
      hash: ctx.compilationHash, format, rank: identity, callIndex: e.forward, selectedBy: ['recorder'], inputs, ctx, matches: [], files,
    });
    const value = {
      ...meta,
      ...(withheld.length ? { withheld } : {}),
      ...(hashed.length ? { hashed } : {}),
      recorder: { forward: e.forward, slot: e.slot, wave: Number(e.entry.wave ?? 0), unix_ms: Number(e.entry.unixMs ?? 0), reason, save_sensitive_info: privacy.sensitive },
    };
    await bundle.commit({ name: META_FILE, value, sortKeys: true, indent: 2 });
    return callDir;
  } catch (err) {
    await bundle.abort();
    throw err;
  }
}

export interface EngineExit {
  pid: number;
  /** Exit code or signal when the agent could read them (/proc while a zombie), else null. */
  code: number | null;
  signal: string | null;
  /** How the agent learned of it: the pid gone, or its client's connection closed. */
  how: string;
  /** Where `signal` came from: "proc" (the zombie's status) or "faulthandler" (engine-fault.ts). */
  signalFrom?: string;
  /** The pid still alive when its connection closed; not visible to this agent (another pid namespace). */
  pidAlive?: boolean;
  pidVisible?: boolean;
  /** The engine's faulthandler traceback lines, capped (engine-fault.ts). */
  faultTraceback?: string[];
}

/**
 * The engine's note (an uncaught exception's "uncaught <Type>: <message>") as crash-rank<g>.json
 * keeps it: whole with report.save_sensitive_info true; else only its type (the message may hold a
 * prompt or token ids, and cannot be hashed per token id).
 */
export function crashNote(note: string, sensitive: boolean | 'hashed'): string {
  if (sensitive === true) return note;
  const m = /^uncaught ([\w.]+)/.exec(note);
  return m ? `uncaught ${m[1]}` : note ? '(withheld: report.save_sensitive_info is not true)' : '';
}

/** `crash-rank<g>.json`: the crash file's name. */
export function crashFileName(identity: RankIdentity): string {
  return `crash-${rankDirName(identity.globalRank)}.json`;
}

/** crash-rank<g>.json beside the flushed forwards (0600); `sensitive`: report.save_sensitive_info (crashNote). */
export function writeCrash(flush: FlushResult, exit: EngineExit, read: RingRead, identity: RankIdentity, lastWave: number, modes: ArtifactModes = DEFAULT_ARTIFACT_MODES, sensitive: boolean | 'hashed' = false): string {
  const last = read.entries[read.entries.length - 1];
  const ctx = last?.entry.context;
  const file = path.join(flush.dir, crashFileName(identity));
  writeJsonAtomic(file, {
    schema: 1,
    global_rank: identity.globalRank,
    tp_rank: identity.tpRank,
    pp_rank: identity.ppRank,
    dp_rank: identity.dpRank,
    engine_pid: exit.pid,
    exit_code: exit.code,
    signal: exit.signal,
    detected_by: exit.how,
    exit: describeExit(exit, read.note),
    signal_from: exit.signal ? exit.signalFrom ?? 'proc' : null,
    fault_traceback: exit.faultTraceback ?? [],
    note: crashNote(read.note, sensitive),
    time: new Date().toISOString(),
    last_wave: lastWave,
    forwards_recorded: read.forwards,
    last_forward: ctx ? { forward: last.forward, wave: Number(last.entry.wave ?? 0), compilation_hash: ctx.compilationHash, global_step: Number(ctx.globalStep ?? 0), is_prompt: Boolean(ctx.isPrompt), req_ids: ctx.reqIds ?? [], num_speculative_tokens: ctx.numSpeculativeTokens ?? 0 } : null,
    flushed: flush.forwards.map((f) => ({ forward: f.forward, slot: f.slot, wave: f.wave, global_step: f.globalStep, call_dir: f.callDir, ...(f.tooLarge ? { too_large: true } : {}), ...(f.error ? { error: f.error } : {}), ...(f.errorCode ? { error_code: f.errorCode } : {}) })),
    left_out: flush.torn.map((t) => ({ forward: t.forward, slot: t.slot, why: t.why })),
  }, artifactWrite(sensitiveModes(modes)));
  return file;
}
