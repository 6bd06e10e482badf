// The fuzzed surfaces that are parsers or files (test/fuzz-surfaces.test.ts; docs/fuzzing.md): each
// is fed garbage and mutations of valid inputs (bench/lib/fuzz-mutator.ts, seeded) straight into
// the code the process runs on them, and every input must come out accepted or refused with a
// named reason: a drop reason the coordinator counts, a control error code, a WavebusError's code,
// a file the report lists as unreadable. Anything else (a TypeError, a RangeError, a hang) is a
// problem. A new surface (the recorder ring's header, crash.json) is one more entry in SURFACES.
// The sockets of running processes: bench/fuzz.ts TARGETS (test/fuzz.test.ts).
import * as fs from 'fs';
import * as path from 'path';
import { Mutator } from '../bench/lib/fuzz-mutator';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { npyHeader } from '../src/artifacts/npy';
import { DEFAULT_MAX_FRAME_BYTES } from '../src/bus/constants';
import { Coordinator } from '../src/bus/coordinator';
import { DropCounter, encodeAgentMessage } from '../src/bus/frames';
import { ColumnScratch } from '../src/client/telemetry';
import { PROTOCOL_VERSION, VersionGate } from '../src/bus/protocol-version';
import { admitRouterMessage, openRouterMessage } from '../src/bus/router-inbox';
import { WavebusError } from '../src/errors';
import { Guard } from '../src/guard/guard';
import { parseStartupOptions } from '../src/guard/startup';
import { createLogger } from '../src/log';
import { bisect } from '../src/tools/bisect';
import { buildReport } from '../src/tools/report';
import { jsonSafe } from '../src/tools/compare';
import { generatedTree } from './report-trees';
import { renderStatus } from '../src/tools/status-table';
import type { WorldLayout } from '../src/layout';

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
function fileSurface(name: string, from: string, make: (dir: string) => string[] | Promise<string[]>, read: (dir: string) => Promise<Outcome> | Outcome): Surface {
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
class ReportRefusal extends Error {
  readonly reason: string;
  constructor(failures: string[]) {
    super(failures.join('; '));
    // Counted by the kind of the first failure the page lists.
    this.reason = `report:${/not a regular file|missing|checksum|unreadable|bytes, recorded|not a list|must be|expected|JSON/.exec(failures[0])?.[0].replace(/\W+/g, '_') ?? 'other'}`;
  }
}

async function named(f: () => Promise<string> | string): Promise<Outcome> {
  try {
    return { accepted: await f() };
  } catch (e) {
    const reason = e instanceof ReportRefusal ? e.reason : namedReason(e);
    if (reason === undefined) throw e;
    return { refused: reason, detail: (e as Error).message.slice(0, 2000) };
  }
}

// ---------------------------------------------------------------- control requests

const quiet = createLogger('fuzz-surfaces', 'silent');

/** Valid control requests of every kind, as `wavebus status / dump / capture` sends them. */
export function controlCorpus(): Buffer[] {
  const v = PROTOCOL_VERSION;
  return [
    { status: {} },
    { dump: { all: true } },
    { dump: { requestId: 'req-3', hasReplica: true, replica: 0 } },
    { capture: { requestIds: ['req-1', 'req-2'], format: 1, maxCaptures: 2 } },
    { capture: { tokenTargets: [25], tpRanks: [0, 1], withinWaves: 100 } },
    { capture: { next: true, format: 2 } },
    { capture: { callIndices: [3, 4], hasReplica: true, replica: 0 } },
    { query: { id: 'capture-1' } },
    { query: { id: 'dump-1' } },
  ].map((body, i) => encodeAgentMessage({ requestId: 10 + i, control: { protocolVersion: v, ...body } }));
}

/** A TP=2 coordinator with the runtime guard, not started (its control answers need no socket); what it logs as errors is kept. */
function guardedCoordinator(dir: string): { c: Coordinator; layout: WorldLayout; failures: string[] } {
  const layout = { worldSize: 2, tp: 2, pp: 1, dp: 1, cp: 1 };
  const startup = parseStartupOptions(JSON.stringify({ runtime_config: {} }), {}, dir);
  const guard = new Guard({ startup, layout, log: quiet });
  const log = createLogger('fuzz-coordinator', 'silent');
  const failures: string[] = [];
  log.error = ((o: unknown, msg?: string) => void failures.push(`${msg}: ${JSON.stringify(o).slice(0, 400)}`)) as typeof log.error;
  return { c: new Coordinator({ port: 1, layout, policy: guard, logger: log }), layout, failures };
}

/** A control request of a random kind with values drawn from the edges of each field's range. */
function craftControl(m: Mutator): Record<string, unknown> {
  const nat = () => m.pick([0, 1, 2, 3, 7, 64, 65, 1000, 1001, 2 ** 31, 2 ** 32 - 1, 2 ** 53 - 1]);
  const str = () => m.pick(['', ' ', 'req-1', 'capture-1', 'dump-1', 'x'.repeat(256), 'x'.repeat(257), '\u0000', 'ž'.repeat(300)]);
  const list = <T>(f: () => T) => Array.from({ length: m.pick([0, 1, 2, 64, 65, 200]) }, f);
  const replica = m.rand() < 0.5 ? { hasReplica: true, replica: nat() } : {};
  // format is an enum: other numbers do not encode (the byte mutations make them).
  const body = m.pick([
    () => ({ status: {} }),
    () => ({ dump: { requestId: m.rand() < 0.5 ? str() : '', all: m.rand() < 0.5, ...replica } }),
    () => ({ capture: { requestIds: list(str), tokenTargets: list(nat), callIndices: list(nat), next: m.rand() < 0.3, tpRanks: list(nat), format: m.pick([0, 1, 2, 3]), maxCaptures: nat(), withinWaves: nat(), flushRecorder: m.rand() < 0.1, ...replica } }),
    () => ({ query: { id: str() } }),
    () => ({}),
  ])();
  return { protocolVersion: m.rand() < 0.95 ? PROTOCOL_VERSION : nat(), ...body };
}

/**
 * The coordinator's ROUTER path for a control request, in process: the frame opened and admitted
 * as the ROUTER loop does (router-inbox.ts: drop reasons counted), then answered by a coordinator's
 * CoordinatorControl with the runtime guard (dumps and captures really armed). Each input is a new
 * connection, as each CLI run is. A handler that fails for a reason it does not name logs an error:
 * that is a problem here.
 */
const controlSurface: Surface = {
  name: 'control_request',
  from: 'the coordinator ROUTER: `wavebus status / dump / capture` (AgentMessage.control)',
  async open(dir) {
    const { c, layout, failures } = guardedCoordinator(dir);
    let dropped: string | undefined;
    const drops = new DropCounter(undefined, 'fuzz', (reason) => (dropped = reason));
    let replied = undefined as Record<string, any> | undefined;
    const admission = { drops, versions: new VersionGate(), worldSize: layout.worldSize, reply: (_r: Buffer, msg: Record<string, unknown>) => void (replied = msg) };
    const scratch = new ColumnScratch();
    let conn = 0;
    const feed = (input: Buffer): Outcome => {
      dropped = undefined;
      replied = undefined;
      const routingId = Buffer.alloc(5);
      routingId.writeUInt32BE(++conn, 1);
      const opened = openRouterMessage([routingId, input], DEFAULT_MAX_FRAME_BYTES, undefined, scratch, drops);
      if (opened && admitRouterMessage(opened, admission) !== undefined) {
        if (opened.msg.body !== 'control') return { accepted: `other_body:${opened.msg.body}` }; // another socket surface's input (bench/fuzz.ts)
        const before = failures.length;
        const r = c.control.answer(opened.msg);
        if (failures.length > before) throw new Error(`a control request failed without a named reason: ${failures[failures.length - 1]}`);
        // A refusal names the field it is about first ("capture.format = 9: ..."): counted by code and field.
        return r.error ? { refused: `control:${r.errorCode}:${/^[\w.\[\]]+/.exec(String(r.error))?.[0]}` } : { accepted: `control:${opened.msg.control?.request}` };
      }
      if ((replied as Record<string, any> | undefined)?.refused) return { refused: `refused:${dropped}` };
      if (dropped === undefined) throw new Error('a frame neither taken nor counted as dropped');
      return { refused: `drop:${dropped}` };
    };
    return {
      valid: controlCorpus(),
      craft: (m) => encodeAgentMessage({ requestId: m.int(1000), control: craftControl(m) }),
      feed,
      alive() {
        const o = feed(controlCorpus()[0]);
        if (!('accepted' in o) || o.accepted !== 'control:status') throw new Error(`a valid status request afterwards: ${JSON.stringify(o)}`);
      },
      close() {},
    };
  },
};

// ---------------------------------------------------------------- what `wavebus status` reads back

/** The status document a coordinator answers, from a real one with a capture and a dump armed. */
function statusDoc(dir: string): Record<string, unknown> {
  const { c } = guardedCoordinator(dir);
  c.control.answer({ body: 'control', control: { request: 'capture', capture: { requestIds: ['req-1'] } } } as never);
  c.control.answer({ body: 'control', control: { request: 'dump', dump: { all: true } } } as never);
  return c.control.status();
}

/** A coordinator of another build (or a hostile one) answers `wavebus status` with any JSON: the table is still drawn. */
const statusReplySurface: Surface = {
  name: 'status_reply',
  from: '`wavebus status`: the status document a coordinator answers (ControlReply.status_json)',
  async open(dir) {
    const doc = statusDoc(dir);
    if (!/capture-1/.test(JSON.stringify(doc))) throw new Error('the status document lists no capture');
    const valid = Buffer.from(JSON.stringify(doc));
    const feed = (input: Buffer, m: Mutator): Outcome => {
      let doc: unknown;
      const text = m.rand() < 0.7 ? mutateJson(m, valid.toString()) : input.toString('utf8');
      try {
        doc = JSON.parse(text);
      } catch {
        return { refused: 'status:not_json' }; // the command says the coordinator's answer is not JSON
      }
      const out = renderStatus(doc, 'tcp://127.0.0.1:29601');
      if (typeof out !== 'string' || out.split('\n').some((l) => l.length > 100)) throw new Error('the table is not text within 100 columns');
      return { accepted: 'table' };
    };
    return { valid: [valid], feed, alive: () => void renderStatus(doc, 'x'), close() {} };
  },
};

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
 * Every parser and file surface, in the order they run. One entry per surface; the flight
 * recorder's ring header and crash.json readers join here when they land.
 */
export const SURFACES: Surface[] = [controlSurface, statusReplySurface, probeSurface, reportSurface];

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
