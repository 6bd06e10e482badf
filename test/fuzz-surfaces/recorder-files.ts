// The flight recorder's files as `wavebus report` and `wavebus trace` read them back (test/fuzz-surfaces.ts
// SURFACES; docs/fuzzing.md): a crash flush folder of two ranks, written by the agent's own code
// (flushRing: call<N>/meta.json and tensor0.npy per forward; writeCrash: crash-rank<g>.json with a
// forward too large, one that could not be written and a slot left out), then one file at a time
// replaced by garbage or a mutation and the tree read (collect.ts, recorder-section.ts, trace.ts).
import * as fs from 'fs';
import * as path from 'path';
import { flushRing, writeCrash } from '../../src/agent/recorder-flush';
import type { RingEntry, RingRead } from '../../src/agent/recorder-ring';
import { RecorderEntry, toPlain } from '../../src/proto';
import { collectTree } from '../../src/tools/report/collect';
import { recorderFlushes } from '../../src/tools/report/recorder-section';
import { verification } from '../../src/tools/report/verify';
import { buildTrace } from '../../src/tools/trace';
import { fileSurface, named, ReportRefusal, type Surface } from '../fuzz-surfaces';

const identity = (g: number) => ({ globalRank: g, tpRank: g, ppRank: 0, dpRank: 0, cpRank: 0, localRank: g }) as never;

function entry(forward: number, dtype: string, shape: number[], data: Buffer, tooLarge = false): RingEntry {
  return {
    slot: forward % 4, forward, tooLarge, data: tooLarge ? [] : [data],
    // As the agent reads it out of the ring (recorder-ring.ts): the proto decoded, defaults and all.
    entry: toPlain<Record<string, any>>(RecorderEntry, RecorderEntry.decode(RecorderEntry.encode(RecorderEntry.fromObject({
      context: { compilationHash: 'h0', globalStep: forward, isPrompt: false, reqIds: ['req-1'], positions: shape.length ? Array.from({ length: shape[0] }, (_, i) => i) : [], rowRequest: [] },
      inputs: [{ region: 'inputs', offset: 0, dtype, shape }], inputBytes: [data.length], forward, wave: 10 + forward, unixMs: 1796220000000 + forward,
    })).finish())),
  };
}

/** The tree: <dir>/recorder/crash-run/ as two agents write it after their engines died. Returns its files. */
async function writeFlushTree(dir: string): Promise<string[]> {
  for (const g of [0, 1]) {
    const read: RingRead = {
      entries: [
        entry(5, 'int32', [3], Buffer.from(new Int32Array([101, 102, 103 + g]).buffer)),
        entry(6, 'bfloat16', [3, 2], Buffer.alloc(12, 0x3f)),
        entry(7, 'int32', [2, 2], Buffer.alloc(16, 2), true),
        // Bytes that do not fit the shape: the flush refuses it by code (ERR_TENSOR_SIZE).
        entry(8, 'int64', [4], Buffer.alloc(12, 1)),
      ],
      torn: [{ slot: 1, forward: 9, why: 'being written (the commit word is odd)' }],
      forwards: 9, note: 'uncaught RuntimeError: boom', pid: 4000 + g,
    };
    const flush = await flushRing(read, dir, 'crash-run', 'engine_died', identity(g));
    if (flush.forwards.filter((f) => f.callDir).length !== 2 || !flush.forwards.some((f) => f.errorCode)) throw new Error(`the valid flush of rank ${g}: ${JSON.stringify(flush.forwards)}`);
    writeCrash(flush, { pid: read.pid, code: null, signal: 'SIGKILL', how: 'the engine process is gone (pid watch)' }, read, identity(g), 18);
  }
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) (e.isDirectory() ? walk : (p: string) => out.push(p))(path.join(rel, e.name));
  };
  walk('');
  return out.sort();
}

/**
 * The tree read as `wavebus report` reads it (collectTree: inspect --verify's checks and the
 * recorder files), its "Recorder flushes" section drawn and `wavebus trace`'s events made. What it
 * shows must be what is there: each crash summary is of the rank its file is named for, each
 * forward listed has its call<N> folder under that rank. A file it cannot use is listed (the refusal).
 */
function readFlushTree(dir: string): string {
  const tree = collectTree(dir);
  const html = recorderFlushes(tree, path.join(dir, '..'));
  buildTrace(tree);
  for (const f of tree.recorderFlushes) {
    for (const c of f.crashes) if (!c.file.endsWith(`/crash-rank${c.rank}.json`)) throw new Error(`a crash summary of rank ${c.rank} from ${c.file}`);
    for (const [g, ns] of f.forwards) {
      for (const n of ns) if (!fs.existsSync(path.join(dir, f.dir, 'h0', `rank${g}`, `call${n}`))) throw new Error(`rank ${g} forward ${n} listed, not in the tree`);
    }
  }
  if (!html.includes('id="recorder-flushes"')) throw new Error('no recorder section');
  const failures = verification(tree).failures;
  if (failures.length) throw new ReportRefusal(failures);
  const f = tree.recorderFlushes[0];
  return `recorder:${f?.crashes.length ?? 0}_crashes_${[...(f?.forwards.values() ?? [])].flat().length}_forwards`;
}

export const recorderFlushSurface: Surface = {
  name: 'recorder_flush',
  from: '`wavebus report` / `wavebus trace` on a flight recorder flush folder: crash-rank<g>.json, call<N>/meta.json and its tensor (collect.ts, recorder-section.ts)',
  // Made when opened: fuzz-surfaces.ts (fileSurface) imports this file.
  open: (dir) => fileSurface('recorder_flush', '', writeFlushTree, (d) => named(() => readFlushTree(d))).open(dir),
};
