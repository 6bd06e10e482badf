// Where the suite's torch 2.x venv is (made by `npm test`'s preflight, scripts/torch2-venv.js):
// the one place tests get its python and torchrun from. Tests on Debian's torch 1.13 keep using
// PYTHON from helpers.ts (docs/transformers.md, "Two torches").
import * as fs from 'fs';
import * as path from 'path';
import { ROOT } from './helpers';

export const TORCH2_VENV = process.env.WAVEBUS_TORCH2_VENV || path.join(ROOT, '.venv-torch2');

/** The venv's python and torchrun; throws naming the command that makes the venv when it is absent. */
export function torch2(): { python: string; torchrun: string } {
  const python = path.join(TORCH2_VENV, 'bin', 'python');
  const torchrun = path.join(TORCH2_VENV, 'bin', 'torchrun');
  if (!fs.existsSync(python) || !fs.existsSync(torchrun)) {
    throw new Error(`no torch 2.x venv at ${TORCH2_VENV}: npm test's preflight makes it (or run: node scripts/torch2-venv.js)`);
  }
  return { python, torchrun };
}
