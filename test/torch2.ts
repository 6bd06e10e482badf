// Where the suite's torch 2.x venv is (made by `npm test`'s preflight, scripts/torch2-venv.js):
// the one place tests get its python and torchrun from, and the one place that decides how tests
// start torch ranks (torchRanks). Debian's torch 1.13 keeps one small compatibility run
// (docs/transformers.md, "Two torches").
import * as fs from 'fs';
import * as path from 'path';
import { PYTHON, ROOT } from './helpers';

export const TORCH2_VENV = process.env.WAVEBUS_TORCH2_VENV || path.join(ROOT, '.venv-torch2');

function venvPaths(): { python: string; torchrun: string } {
  return { python: path.join(TORCH2_VENV, 'bin', 'python'), torchrun: path.join(TORCH2_VENV, 'bin', 'torchrun') };
}

/** The venv's python and torchrun; throws naming the command that makes the venv when it is absent. */
export function torch2(): { python: string; torchrun: string } {
  const v = venvPaths();
  if (!fs.existsSync(v.python) || !fs.existsSync(v.torchrun)) {
    throw new Error(`no torch 2.x venv at ${TORCH2_VENV}: npm test's preflight makes it (or run: node scripts/torch2-venv.js)`);
  }
  return v;
}

/** Where the ranks of a job run: one host of `nproc` ranks, or one host of several (static rendezvous). */
export interface RankLayout {
  nproc: number;
  nnodes?: number;
  nodeRank?: number;
  masterAddr?: string;
  masterPort?: number;
}

export interface TorchRanks {
  /** 'torchrun': torch 2.x's own; 'stand-in': examples/torch-engine/torchrun_env.py on Debian's torch 1.13. */
  kind: 'torchrun' | 'stand-in';
  /** The python whose torch the ranks run on: replays and checks of their files use the same torch. */
  python: string;
  /** The command that starts `script`'s ranks (what follows `wavebus launch ... --`), before the script's own args. */
  command(script: string, layout: RankLayout): string[];
}

const STAND_IN = path.join(ROOT, 'examples', 'torch-engine', 'torchrun_env.py');

/**
 * How a test starts torch ranks. torch 2.x's torchrun when the venv is there; otherwise Debian's
 * torch 1.13 with the stand-in, said on the console. `compat` asks for the 1.13 stand-in on purpose
 * (the one compatibility run). The stand-in takes its layout from `wavebus launch`'s variables
 * (WAVEBUS_NPROC_PER_NODE, WAVEBUS_NNODES, WAVEBUS_NODE_RANK) and MASTER_ADDR/MASTER_PORT.
 */
export function torchRanks(opts: { compat?: boolean } = {}): TorchRanks {
  const v = venvPaths();
  const have2 = fs.existsSync(v.python) && fs.existsSync(v.torchrun);
  if (opts.compat || !have2) {
    if (!opts.compat) {
      // eslint-disable-next-line no-console
      console.log(`torch 2.x is absent (no venv at ${TORCH2_VENV}; node scripts/torch2-venv.js makes it): these ranks run on Debian's torch with the torchrun stand-in`);
    }
    return { kind: 'stand-in', python: PYTHON, command: (script) => [PYTHON, STAND_IN, script] };
  }
  return {
    kind: 'torchrun',
    python: v.python,
    command: (script, l) => {
      const nodes = l.nnodes ?? 1;
      // One host: --standalone, torchrun's rendezvous on a free port of its own (tests run side by side).
      if (nodes === 1) return [v.torchrun, '--standalone', '--nproc-per-node', String(l.nproc), script];
      if (l.nodeRank === undefined || !l.masterAddr || !l.masterPort) throw new Error('torchRanks: several hosts need nodeRank, masterAddr and masterPort');
      return [v.torchrun, '--nnodes', String(nodes), '--node-rank', String(l.nodeRank), '--nproc-per-node', String(l.nproc),
        '--master-addr', l.masterAddr, '--master-port', String(l.masterPort), script];
    },
  };
}
