// What the engine could say of its own death (docs/recorder.md, "How it died"): Python's
// faulthandler, which the client points at engine-fault-local<r>.txt in the run dir while the
// recorder is on, writes the fatal signal's name and every thread's traceback there. The agent
// reads it after a death (bounded, no link followed, garbage tolerated) and words the exit plainly
// when nothing says how (SIGKILL and the OOM killer leave no word).
import * as fs from 'fs';
import * as path from 'path';
import { openBeneathSync } from '../artifacts/safe-fs';

/** The most of the file read (its tail: the last fatal error is the newest). */
export const FAULT_READ_MAX = 64 * 1024;
/** Traceback lines kept in crash-rank<g>.json, and the length of each. */
export const FAULT_LINES_MAX = 64;
export const FAULT_LINE_CHARS = 240;

/** faulthandler's words for the signals it handles (Modules/faulthandler.c), and their names. */
const FAULT_SIGNALS: Readonly<Record<string, string>> = {
  'Segmentation fault': 'SIGSEGV',
  Aborted: 'SIGABRT',
  'Floating-point exception': 'SIGFPE',
  'Floating point exception': 'SIGFPE',
  'Bus error': 'SIGBUS',
  'Illegal instruction': 'SIGILL',
};

export interface EngineFault {
  /** The signal faulthandler named (SIGSEGV...), or null when its words are not one of those. */
  signal: string | null;
  /** faulthandler's first line ("Fatal Python error: Segmentation fault"). */
  said: string;
  /** The traceback lines that follow ("Current thread ...", "  File "x.py", line 3 in f"), capped. */
  traceback: string[];
}

/** Printable ASCII only, capped: the file is the engine's, anything may be in it. */
function clean(line: string): string {
  return line.replace(/[^\x20-\x7e]/g, '?').slice(0, FAULT_LINE_CHARS);
}

/**
 * The last fatal error in `file` written since `sinceMs` (its mtime; an older file is a previous
 * engine's), or undefined: no file, a link, not a regular file, nothing fatal in it. Never throws.
 */
export function readEngineFault(file: string, sinceMs = 0): EngineFault | undefined {
  let opened: { fd: number; stat: fs.Stats };
  try {
    opened = openBeneathSync(path.dirname(file), path.basename(file), 'file');
  } catch {
    return undefined;
  }
  let text: string;
  try {
    const { fd, stat } = opened;
    if (stat.size === 0 || stat.mtimeMs < sinceMs) return undefined;
    const n = Math.min(stat.size, FAULT_READ_MAX);
    const buf = Buffer.alloc(n);
    const got = fs.readSync(fd, buf, 0, n, stat.size - n);
    text = buf.subarray(0, got).toString('latin1');
  } catch {
    return undefined;
  } finally {
    fs.closeSync(opened.fd);
  }
  return parseEngineFault(text);
}

/** faulthandler's output (the last "Fatal Python error: <what>" block) parsed; undefined without one. */
export function parseEngineFault(text: string): EngineFault | undefined {
  const lines = text.split(/\r?\n/);
  let at = -1;
  for (let i = lines.length - 1; i >= 0 && at < 0; i--) if (lines[i].startsWith('Fatal Python error: ')) at = i;
  if (at < 0) return undefined;
  const what = lines[at].slice('Fatal Python error: '.length).trim();
  const signal = FAULT_SIGNALS[what] ?? null;
  const traceback: string[] = [];
  for (const l of lines.slice(at + 1)) {
    if (traceback.length >= FAULT_LINES_MAX) break;
    // The threads and their frames; the module lists and blank lines are left out.
    if (/^(Current thread|Thread|Stack) /.test(l) || /^ {2}File /.test(l) || /^ {2}<no Python frame>/.test(l)) traceback.push(clean(l));
  }
  return { signal, said: clean(lines[at]), traceback };
}

/** How the engine ended, in words for crash-rank<g>.json's `exit` (never null: "unknown: ..." says why). */
export function describeExit(e: { code: number | null; signal: string | null; signalFrom?: string; pidAlive?: boolean; pidVisible?: boolean }, note: string): string {
  if (e.signal && e.signalFrom === 'faulthandler') return `killed by ${e.signal} (the engine's faulthandler said so)`;
  if (e.signal) return `killed by ${e.signal}`;
  if (e.code !== null) return `exit code ${e.code}`;
  if (e.pidAlive) return 'none: the engine process is still alive; its connection closed without goodbye';
  if (note.startsWith('uncaught ')) return 'unknown: the engine raised an uncaught exception (see note)';
  if (e.pidVisible === false) return "unknown: the engine's pid is not visible to this agent (another pid namespace) and it left no word";
  return 'unknown: no word from the engine (SIGKILL or the OOM killer leave none)';
}
