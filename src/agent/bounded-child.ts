// A CLI child the agent runs off the engine's path (verdict.auto's `wavebus verdict`, a relayed
// replay's `wavebus verdict --replay-request`): in its own process group, so stopping it stops
// what it started; killed when it outlives its bound or says more than the agent keeps.
import type { ChildProcess } from 'child_process';

export interface ChildResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** What `child` (spawned detached, stdout and stderr piped) printed once it closed, within the bounds. */
export function collectBounded(child: ChildProcess, boundMs: number, maxOutput: number): Promise<ChildResult> {
  return new Promise((resolve, reject) => {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let bytes = 0;
    const keep = (into: Buffer[]) => (b: Buffer) => {
      bytes += b.length;
      if (bytes <= maxOutput) into.push(b);
      else killGroup(child, 'SIGKILL'); // a CLI that says this much is not answering
    };
    child.stdout!.on('data', keep(out));
    child.stderr!.on('data', keep(err));
    const timer = setTimeout(() => killGroup(child, 'SIGKILL'), boundMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout: Buffer.concat(out).toString('utf8'), stderr: Buffer.concat(err).toString('utf8') });
    });
  });
}

/** `signal` to the child's whole process group (the child alone once the group is gone). */
export function killGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  try {
    if (child.pid !== undefined) process.kill(-child.pid, signal);
  } catch {
    child.kill(signal);
  }
}
