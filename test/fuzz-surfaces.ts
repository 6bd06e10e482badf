// The fuzzed surfaces that are parsers or files (test/fuzz-surfaces.test.ts; docs/fuzzing.md): each
// is fed garbage and mutations of valid inputs (bench/lib/fuzz-mutator.ts, seeded) straight into
// the code the process runs on them, and every input must come out accepted or refused with a
// named reason: a drop reason the coordinator counts, a control error code, a WavebusError's code,
// a file the report lists as unreadable. Anything else (a TypeError, a RangeError, a hang) is a
// problem. A new surface is one more entry in SURFACES (its group in test/fuzz-surfaces/<group>.ts).
// The sockets of running processes: bench/fuzz.ts TARGETS (test/fuzz.test.ts).
import * as fs from 'fs';
import * as path from 'path';
import { Mutator } from '../bench/lib/fuzz-mutator';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { npyHeader } from '../src/artifacts/npy';
import { WavebusError } from '../src/errors';
import { bisect } from '../src/tools/bisect';
import { buildReport } from '../src/tools/report';
import { jsonSafe } from '../src/tools/compare';
import { generatedTree } from './report-trees';
import { engineCrashSurface, fingerprintSurface } from './fuzz-surfaces/agent-reports';
import { controlSurface, statusReplySurface } from './fuzz-surfaces/control';
import { mailboxAttachSurface, recorderRingSurface } from './fuzz-surfaces/host-files';
import { recorderFlushSurface } from './fuzz-surfaces/recorder-files';
import { decisionRingSurface, rankDigestsSurface } from './fuzz-surfaces/rank-digests';
import { telemetryRingSurface } from './fuzz-surfaces/telemetry-ring';
import { replayRequestSurface } from './fuzz-surfaces/replay-request';

/** WAVEBUS_FUZZ_TRACE=FILE: each input is written there before it is fed (the one that killed a run). */
const TRACE = process.env.WAVEBUS_FUZZ_TRACE;

/** What one input came to: accepted (of a kind), or refused for a named reason. */
export type Outcome = { accepted: string } | { refused: string; detail?: string };

export interface SurfaceRun {
  /** Inputs that can be mutated into the next one. */
  valid: Buffer[];
  /** Feed one input; a throw is an unaccounted outcome (a problem). */
  feed(input: Buffer, m: Mutator): Promise<Outcome> | Outcome;
  /** A well-formed input with random field values (wrong ranges, sizes, combinations), where the surface has a schema to fill. */
  craft?(m: Mutator): Buffer;
  /** After the garbage: a valid input still works (throws if not). */
  alive(): Promise<void> | void;
  close(): Promise<void> | void;
}

export interface Surface {
  name: string;
  /** What a process reads it from, for the docs' table. */
  from: string;
  open(dir: string): Promise<SurfaceRun>;
}

/** A thrown error's named reason, or undefined when it is not one of ours (a bug). */
export function namedReason(e: unknown): string | undefined {
  return e instanceof WavebusError ? `${e.name}:${e.code}` : undefined;
}

// ---------------------------------------------------------------- mutations of JSON files

const WRONG: unknown[] = [null, true, -1, 0.5, 1e308, -1e308, 2 ** 53 + 2, '', 'x', 'ž\u0000', [], {}, [[[]]], { a: { b: {} } }, 'n'.repeat(5000), [1, 'a', null]];

/** One structure-aware edit of a JSON document: a value of the wrong type or size, a key gone or added. */
export function mutateJson(m: Mutator, text: string): string {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    return m.mutate(Buffer.from(text)).toString('latin1');
  }
  const nodes: Array<{ parent: any; key: string | number }> = [];
  const walk = (v: any, depth: number) => {
    if (depth > 12 || v === null || typeof v !== 'object') return;
    for (const k of Array.isArray(v) ? v.keys() : Object.keys(v)) {
      nodes.push({ parent: v, key: k });
      walk(v[k], depth + 1);
    }
  };
  walk(doc, 0);
  if (nodes.length === 0) return JSON.stringify(m.pick(WRONG));
  for (let edits = 1 + m.int(3); edits > 0; edits--) {
    const { parent, key } = m.pick(nodes);
    const r = m.rand();
    if (r < 0.6) parent[key] = structuredClone(m.pick(WRONG));
    else if (r < 0.75) Array.isArray(parent) ? parent.splice(Number(key), 1) : delete parent[key];
    else if (r < 0.85) parent[Array.isArray(parent) ? parent.length : `zz_${m.int(100)}`] = structuredClone(m.pick(WRONG));
    else if (r < 0.95 && typeof parent[key] === 'number') parent[key] = m.pick([parent[key] + 1, -parent[key], parent[key] * 1e6, 2 ** 31, 2 ** 32 + 1]);
    else if (Array.isArray(parent[key])) parent[key] = [...parent[key], ...parent[key]];
  }
  return JSON.stringify(doc, null, m.rand() < 0.5 ? 1 : undefined);
}

/** The next content of `file`: garbage, a byte mutation, or (JSON) a structure-aware edit. */
function mutateFile(m: Mutator, file: string, valid: Buffer): Buffer {
  const r = m.rand();
  if (r < 0.05) return m.bytes(m.int(300));
  if (file.endsWith('.json') && r < 0.6) return Buffer.from(mutateJson(m, valid.toString('utf8')));
  return m.mutate(valid);
}

/**
 * A surface of files: a valid tree written once, then per input one of its files replaced by a
 * mutation (the input fed is the file's index, as one byte) and `read` run on the tree; the file
 * is restored afterwards. Reading really goes through the file system, links refused and all.
 */
export function fileSurface(name: string, from: string, make: (dir: string) => string[] | Promise<string[]>, read: (dir: string) => Promise<Outcome> | Outcome): Surface {
  return {
    name,
    from,
    async open(dir) {
      const files = await make(dir);
      const originals = files.map((f) => fs.readFileSync(path.join(dir, f)));
      const first = await read(dir);
      if (!('accepted' in first)) throw new Error(`${name}: the valid tree is refused: ${first.refused} (${first.detail ?? ''})`);
      return {
        valid: files.map((_, i) => Buffer.from([i])),
        async feed(input, m) {
          const i = input.length > 0 ? input[0] % files.length : m.int(files.length);
          const file = path.join(dir, files[i]);
          fs.writeFileSync(file, mutateFile(m, files[i], originals[i]));
          try {
            return await read(dir);
          } finally {
            fs.writeFileSync(file, originals[i]);
          }
        },
        async alive() {
          const o = await read(dir);
          if (!('accepted' in o)) throw new Error(`${name}: the restored tree is refused: ${o.refused}`);
        },
        close() {},
      };
    },
  };
}

/** A page that lists files it could not use (reported on the page, not thrown by `wavebus report`). */
export class ReportRefusal extends Error {
  readonly reason: string;
  constructor(failures: string[]) {
    super(failures.join('; '));
    // Counted by the kind of the first failure the page lists.
    this.reason = `report:${/not a regular file|missing|checksum|unreadable|bytes, recorded|not a list|must be|expected|JSON|does not match|not a crash record|not a call meta/.exec(failures[0])?.[0].replace(/\W+/g, '_') ?? 'other'}`;
  }
}

export async function named(f: () => Promise<string> | string): Promise<Outcome> {
  try {
    return { accepted: await f() };
  } catch (e) {
    const reason = e instanceof ReportRefusal ? e.reason : namedReason(e);
    if (reason === undefined) throw e;
    return { refused: reason, detail: (e as Error).message.slice(0, 2000) };
  }
}

// ---------------------------------------------------------------- probe bundles (`wavebus bisect`)

/** One probe bundle in the layout wavebus_client.probe writes (rank<g>/call<N>/: tensors, meta.json with "probe"). */
function writeProbeBundle(root: string, rank: number, tp: number, skew: number): string[] {
  const dir = path.join(root, `rank${rank}`, 'call2');
  fs.mkdirSync(dir, { recursive: true });
  const cols = 4 / tp;
  const tensors: Array<{ shape: number[]; split: 'column' | 'row' | 'replicated'; dim: number | null; module: string; io: 'output' | 'input' }> = [
    { shape: [3, 4], split: 'replicated', dim: null, module: 'model.embed', io: 'output' },
    { shape: [3, cols], split: 'column', dim: 1, module: 'model.layers.0.up', io: 'output' },
    { shape: [3, cols], split: 'column', dim: 1, module: 'model.layers.0.down', io: 'input' },
    { shape: [3, 4], split: 'replicated', dim: null, module: 'model.layers.0.down', io: 'output' },
  ];
  const files = tensors.map((t, i) => {
    const n = t.shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(n).map((_, j) => Math.sin(i * 7 + j + (t.split === 'column' ? rank * cols : 0)) + (i === 3 ? skew : 0));
    const buf = Buffer.concat([npyHeader('float32', t.shape), Buffer.from(data.buffer)]);
    fs.writeFileSync(path.join(dir, `tensor${i}.npy`), buf);
    return { name: `tensor${i}.npy`, bytes: buf.length, checksum: formatChecksum(crc32c(buf)) };
  });
  const meta = {
    schema: 1, hash: 'probe', format: 'npy', global_rank: rank, tp_rank: rank, pp_rank: 0, dp_rank: 0, cp_rank: 0, call_index: 2, selected_by: ['call_index'],
    inputs: tensors.map((t, i) => ({ index: i, dtype: 'float32', shape: t.shape })), files,
    global_step: 2, is_prompt: false, req_ids: ['req-1'], positions: [20, 21, 22], row_request: [0, 0, 0], num_speculative_tokens: 0, matches: [],
    probe: { tp_size: tp, pp_size: 1, records: tensors.map((t, i) => ({ index: i, module: t.module, call: 0, io: t.io, arg: 0, split: t.split, split_dim: t.dim })) },
  };
  fs.writeFileSync(path.join(dir, 'meta.json'), JSON.stringify(meta, null, 1));
  return ['meta.json', ...files.map((f) => f.name)].map((f) => path.relative(path.dirname(root), path.join(dir, f)));
}

const probeSurface = fileSurface(
  'probe_bundle',
  '`wavebus bisect A B`: the probe trees (meta.json with its probe section, tensor files)',
  (dir) => [...writeProbeBundle(path.join(dir, 'a'), 0, 2, 0.5), ...writeProbeBundle(path.join(dir, 'a'), 1, 2, 0.5), ...writeProbeBundle(path.join(dir, 'b'), 0, 1, 0)],
  (dir) => named(async () => ((await bisect(path.join(dir, 'a'), path.join(dir, 'b'))).first ? 'divergent' : 'within_tolerance')),
);

// ---------------------------------------------------------------- report inputs (`wavebus report`)

/** Every regular file under dir, relative to it. */
function filesUnder(dir: string, rel = ''): string[] {
  return fs.readdirSync(path.join(dir, rel), { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? filesUnder(dir, path.join(rel, e.name)) : e.isFile() ? [path.join(rel, e.name)] : []));
}

/**
 * A tree in the layout the guard and agents write (test/report-trees.ts generatedTree: reports, KV
 * dumps with manifests, timelines, config) and a bisect result saved as `wavebus bisect --out`
 * saves it (a real run on the probe trees above).
 */
async function writeReportTree(dir: string): Promise<string[]> {
  generatedTree(dir, { tp: 2, dp: 1, incidents: 1, hosts: 1 });
  const probes = path.join(dir, '..', 'probes');
  writeProbeBundle(path.join(probes, 'a'), 0, 2, 0.5);
  writeProbeBundle(path.join(probes, 'a'), 1, 2, 0.5);
  writeProbeBundle(path.join(probes, 'b'), 0, 1, 0);
  const r = await bisect(path.join(probes, 'a'), path.join(probes, 'b'));
  fs.mkdirSync(path.join(dir, 'bisect'));
  fs.writeFileSync(path.join(dir, 'bisect', 'tp2-vs-tp1.json'), `${JSON.stringify(jsonSafe(r), null, 2)}\n`);
  return filesUnder(dir);
}

const reportSurface = fileSurface(
  'report_tree',
  '`wavebus report DIR` (and `wavebus trace`, which reads the same tree): reports, dumps and manifests, timelines, layout, config, saved bisects',
  writeReportTree,
  (dir) =>
    named(() => {
      const r = buildReport(dir, { out: path.join(dir, '..', 'page.html') });
      if (!r.html.startsWith('<!doctype html>') && !r.html.startsWith('<!DOCTYPE html>')) throw new Error('the page is not HTML');
      if (r.failures.length === 0) return 'page';
      // The page shows what it could not use, each named by file: the kinds of that, as the refusal.
      throw new ReportRefusal(r.failures);
    }),
);

/**
 * Every parser and file surface, in the order they run, one entry per surface; the groups of
 * test/fuzz-surfaces/ (control requests, host files, agent reports) and the file trees here.
 */
export const SURFACES: Surface[] = [controlSurface, statusReplySurface, probeSurface, reportSurface, recorderRingSurface, mailboxAttachSurface, engineCrashSurface, fingerprintSurface, recorderFlushSurface, telemetryRingSurface, replayRequestSurface, decisionRingSurface, rankDigestsSurface];

export interface SurfaceResult {
  surface: string;
  inputs: number;
  accepted: Record<string, number>;
  refused: Record<string, number>;
  /** Inputs that came to neither (an exception of no named kind), with the first few messages. */
  unaccounted: number;
  problems: string[];
  alive: boolean;
  seconds: number;
}

/** Feed `inputs` inputs to a surface: a fifth crafted (where it can), a fifth garbage, the rest mutations of valid ones (some mutated twice). */
export async function fuzzSurface(s: Surface, dir: string, inputs: number, seed: number): Promise<SurfaceResult> {
  const t0 = Date.now();
  const m = new Mutator(seed);
  const run = await s.open(dir);
  const res: SurfaceResult = { surface: s.name, inputs, accepted: {}, refused: {}, unaccounted: 0, problems: [], alive: false, seconds: 0 };
  try {
    for (let i = 0; i < inputs; i++) {
      const r = m.rand();
      const input = run.craft && r < 0.2 ? run.craft(m) : r < 0.4 ? m.bytes(m.int(256)) : r < 0.85 ? m.mutate(m.pick(run.valid)) : m.mutate(m.mutate(m.pick(run.valid)));
      if (TRACE) fs.writeFileSync(TRACE, JSON.stringify({ surface: s.name, seed, input: i, hex: input.toString('hex') }));
      try {
        const o = await run.feed(input, m);
        if ('accepted' in o) res.accepted[o.accepted] = (res.accepted[o.accepted] ?? 0) + 1;
        else res.refused[o.refused] = (res.refused[o.refused] ?? 0) + 1;
      } catch (e) {
        res.unaccounted++;
        if (res.problems.length < 5) res.problems.push(`input ${i} (${input.toString('hex').slice(0, 80)}): ${(e as Error)?.stack ?? e}`);
      }
    }
    await run.alive();
    res.alive = true;
  } finally {
    await run.close();
    res.seconds = (Date.now() - t0) / 1000;
  }
  return res;
}
