// `bench overhead --syscalls`: one detectors-on run, not in the ratios (strace slows every process
// it traces), with strace -c attached to each process of the job for a window of its steady state;
// the system calls of each process divided by the waves rank 0 ended inside that window.
import * as fs from 'fs';
import * as path from 'path';
import { ENGINE_ROLES, straceJob, straceUsable } from './overhead-probes';

const LAUNCHER = 'launch';
/** From the engine ranks being up to the window: the bus's start-up and the sidecar's warm-up. */
const WARMUP_MS = 3000;

type Start = (stopFile: string, onSpawn: (pid: number) => void) => Promise<{ code: number }>;

export async function syscallsPerWave(ranks: number, seconds: number, dir: string, start: Start): Promise<Record<string, unknown>> {
  const unusable = straceUsable();
  if (unusable) return { skipped: unusable };
  fs.mkdirSync(dir, { recursive: true });
  const stopFile = path.join(dir, 'stop');
  let root: number | undefined;
  const done = start(stopFile, (pid) => (root = pid));
  let window;
  try {
    if (root === undefined) throw new Error('bench overhead --syscalls: the run did not start');
    window = await straceJob(root, ranks, ranks + 1, WARMUP_MS, seconds, dir);
  } finally {
    fs.writeFileSync(stopFile, '');
  }
  const { code } = await done;
  if (code !== 0) throw new Error(`bench overhead --syscalls: the traced run exited ${code}`);
  const r0 = JSON.parse(fs.readFileSync(path.join(dir, 'rank0.json'), 'utf8')) as { stepEndsAt?: number[] };
  const ends = r0.stepEndsAt ?? [];
  const waves = ends.filter((t) => t >= window.startedAt && t < window.endedAt).length;
  if (waves === 0) {
    const span = ends.length ? `rank 0 ended ${ends.length} steps from ${new Date(ends[0]).toISOString()} to ${new Date(ends[ends.length - 1]).toISOString()}` : 'rank 0 ended no step';
    return { skipped: `no wave ended inside the strace window (${new Date(window.startedAt).toISOString()} + ${seconds} s; ${span})`, window_s: seconds };
  }
  const perWave = (n: number | null) => (n === null ? null : Number((n / waves).toFixed(1)));
  const sum = (pick: (role: string) => boolean) =>
    perWave(Object.entries(window.calls).filter(([n]) => pick(n.split(' #')[0])).reduce((a, [, c]) => a + (c ?? 0), 0));
  return {
    window_s: seconds,
    waves,
    // Every process of the host but the engine ranks and the launcher: coordinator, agents (and
    // whatever a wave path adds), together: issue #34's "per host" figure.
    sidecar_per_wave: sum((r) => !ENGINE_ROLES.includes(r) && r !== LAUNCHER),
    engine_per_wave: sum((r) => ENGINE_ROLES.includes(r)),
    launcher_per_wave: sum((r) => r === LAUNCHER),
    by_process_per_wave: Object.fromEntries(Object.entries(window.calls).map(([n, c]) => [n, perWave(c)])),
  };
}
