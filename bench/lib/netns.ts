// Two hosts on one machine: two network namespaces joined by a veth pair on a private /30 that
// exists only inside them (never the host's interfaces). Used by the netns tests (test/helpers.ts)
// and `bench aggregate --netns`. Needs root; nothing here tracks what it made: callers do.
import { spawnSync } from 'child_process';

/** Run a system command synchronously; throws with its stderr when it fails. */
export function sh(cmd: string, args: string[], opts: { timeout?: number } = {}): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: opts.timeout ?? 20000 });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status ?? r.signal}: ${(r.stderr || r.error?.message || '').trim()}`);
  return r.stdout;
}

export interface NetnsPair {
  a: string;
  b: string;
  vethA: string;
  vethB: string;
  addrA: string;
  addrB: string;
}

/**
 * Namespaces `<tag>a` and `<tag>b` (tag: at most 10 characters, interface names are ≤ 15), lo up
 * in each, veth `<tag>va` 10.213.<subnet>.1/30 in a and `<tag>vb` .2 in b. A leftover pair with the
 * same names (a killed run) is removed first; on a failure midway what was made is removed again.
 */
export function createNetnsPair(tag: string, subnet: number): NetnsPair {
  if (!/^[a-z0-9]{1,10}$/.test(tag)) throw new Error(`netns tag ${JSON.stringify(tag)}: 1-10 lowercase letters or digits`);
  if (!Number.isInteger(subnet) || subnet < 0 || subnet > 255) throw new Error(`netns subnet ${subnet}: an integer 0-255`);
  const p: NetnsPair = { a: `${tag}a`, b: `${tag}b`, vethA: `${tag}va`, vethB: `${tag}vb`, addrA: `10.213.${subnet}.1`, addrB: `10.213.${subnet}.2` };
  try {
    for (const ns of [p.a, p.b]) {
      removeNetns(ns);
      sh('ip', ['netns', 'add', ns]);
      sh('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
    }
    sh('ip', ['link', 'add', p.vethA, 'netns', p.a, 'type', 'veth', 'peer', 'name', p.vethB, 'netns', p.b]);
    sh('ip', ['-n', p.a, 'addr', 'add', `${p.addrA}/30`, 'dev', p.vethA]);
    sh('ip', ['-n', p.b, 'addr', 'add', `${p.addrB}/30`, 'dev', p.vethB]);
    sh('ip', ['-n', p.a, 'link', 'set', p.vethA, 'up']);
    sh('ip', ['-n', p.b, 'link', 'set', p.vethB, 'up']);
  } catch (e) {
    removeNetns(p.a);
    removeNetns(p.b);
    throw e;
  }
  return p;
}

/** Kill every process left in namespace `ns` (sidecars may sit in their own process groups), then delete it. */
export function removeNetns(ns: string): void {
  const r = spawnSync('ip', ['netns', 'pids', ns], { encoding: 'utf8' });
  for (const pid of (r.stdout ?? '').split(/\s+/).filter(Boolean)) {
    try {
      process.kill(Number(pid), 'SIGKILL');
    } catch {
      /* gone */
    }
  }
  spawnSync('ip', ['netns', 'del', ns]); // deleting it also removes its end of the veth pair, and so the pair
}

/** Whether namespace `ns` exists (`ip netns list`). */
export function netnsExists(ns: string): boolean {
  const r = spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' });
  return (r.stdout ?? '').split('\n').some((l) => l.split(' ')[0] === ns);
}
