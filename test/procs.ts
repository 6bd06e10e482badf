// The processes a test started, found by parentage in /proc: never by a command-line pattern
// alone, which can match a process of an earlier test still winding down (a port number is a
// substring of many command lines) and so signal a process that is not the test's.
import * as fs from 'fs';

/** Parent pid of every live process. */
function parents(): Map<number, number> {
  const parent = new Map<number, number>();
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      // The field after the command name, which may itself hold spaces and parentheses.
      parent.set(Number(d), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      /* gone */
    }
  }
  return parent;
}

/** Live children of `pid`. */
export function childrenOf(pid: number): number[] {
  return [...parents()].filter(([, pp]) => pp === pid).map(([c]) => c);
}

/** Live descendants of `pid`, at any depth. */
export function descendants(pid: number): number[] {
  const parent = parents();
  const out: number[] = [];
  const walk = (p: number) => {
    for (const [c, pp] of parent) if (pp === p) (out.push(c), walk(c));
  };
  walk(pid);
  return out;
}

/** The arguments of `pid` (empty once it is gone). */
export function argsOf(pid: number): string[] {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return [];
  }
}

/** The command line of `pid`, arguments joined by spaces ('' once it is gone). */
export const cmdline = (pid: number): string => argsOf(pid).join(' ');
