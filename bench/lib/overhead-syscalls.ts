// `bench overhead --syscalls`: one detectors-on run, not in the ratios (strace slows every process
// it traces), with strace attached to each process of the job; the system calls of each process
// inside a window of the steady state, divided by the waves an engine rank stepped inside it.
import * as fs from 'fs';
import * as path from 'path';
import { ENGINE_ROLES, LAUNCHER, straceJob, straceUsable, type StraceWindow } from './overhead-probes';
/** Waves of the engine rank before the window opens: the sidecar's warm-up. */
const WARMUP_WAVES = 50;
const MAX_SECONDS = 180;

type Start = (stopFile: string, onSpawn: (pid: number) => void) => Promise<{ code: number }>;

export async function syscallsPerWave(ranks: number, waves: number, dir: string, start: Start): Promise<Record<string, unknown>> {
  const unusable = straceUsable();
  if (unusable) return { skipped: unusable };
  fs.mkdirSync(dir, { recursive: true });
  const stopFile = path.join(dir, 'stop');
  let root: number | undefined;
  const done = start(stopFile, (pid) => (root = pid));
  let window: StraceWindow | undefined;
  let failure: unknown;
  try {
    if (root === undefined) throw new Error('bench overhead --syscalls: the run did not start');
    window = await straceJob(root, { engineRanks: ranks, sidecarProcs: ranks + 1, stopFile, warmupWaves: WARMUP_WAVES, waves, maxSeconds: MAX_SECONDS, dir });
  } catch (e) {
    failure = e;
  }
  // The run ends at its next step either way; waited for, so it writes nothing after the bench
  // removed its work dir.
  fs.writeFileSync(stopFile, '');
  const { code } = await done;
  if (failure !== undefined || !window) throw failure ?? new Error('bench overhead --syscalls: no strace window');
  if (code !== 0) throw new Error(`bench overhead --syscalls: the traced run exited ${code}`);
  if (window.waves === 0) return { skipped: `the engine did not step ${WARMUP_WAVES + 1} times in ${MAX_SECONDS} s under strace` };
  const perWave = (n: number | null) => (n === null ? null : Number((n / window.waves).toFixed(1)));
  const sum = (pick: (role: string) => boolean) =>
    perWave(Object.entries(window.calls).filter(([n]) => pick(n.split(' #')[0])).reduce((a, [, c]) => a + (c ?? 0), 0));
  return {
    waves: window.waves,
    window_s: Number(window.seconds.toFixed(2)),
    // Every process of the host but the engine ranks and the launcher: coordinator, agents (and
    // whatever a wave path adds), together: issue #34's "per host" figure.
    sidecar_per_wave: sum((r) => !ENGINE_ROLES.includes(r) && r !== LAUNCHER),
    // The engine ranks' count includes one check of the stop file per step (the wave counter).
    engine_per_wave: sum((r) => ENGINE_ROLES.includes(r)),
    launcher_per_wave: sum((r) => r === LAUNCHER),
    by_process_per_wave: Object.fromEntries(Object.entries(window.calls).map(([n, c]) => [n, perWave(c)])),
  };
}
