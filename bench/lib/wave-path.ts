// How wave vectors reach the engine's mailboxes, as the benches pass it to the sidecar processes.
// The ONE place a wave-path mode becomes sidecar flags: `bench overhead`, `bench bus` and `bench
// soak` take `--wave-path <mode>` (WAVE_PATH_FLAG) and hand every process they start the flags
// wavePathArgs() returns for its role, so a new path design needs one row here and nothing else.
// Two paths (src/agent/host-receiver.ts): 'per-rank', each agent subscribes to the coordinator and
// writes its own rank's mailbox (no flag), and 'host', one receiver per host and replica writes
// every local mailbox (docs/bus.md). `bench bus` starts its own agent stand-ins and passes them
// the mode positionally.
import type { BenchFlag } from './flags';
import { WAVE_PATHS, type WavePath } from '../../src/agent/host-receiver';

export { WAVE_PATHS, type WavePath };

/** The processes a bench starts that a wave-path mode may configure. */
export type SidecarRole = 'coordinator' | 'agent' | 'launch';

export const WAVE_PATH_FLAG: BenchFlag = {
  type: 'string',
  default: 'per-rank',
  choices: WAVE_PATHS,
  describe: "how wave vectors reach the mailboxes: per-rank (each rank's agent subscribes and writes its own mailbox) or host (one receiver per host writes every local mailbox)",
};

/** The command-line flags of `role` for wave-path `mode` (none for the per-rank path). */
export function wavePathArgs(mode: WavePath, role: SidecarRole): string[] {
  switch (mode) {
    case 'per-rank':
      return [];
    case 'host':
      // Only the agents take it (launch passes it on as --agent-arg=--wave-path=host).
      return role === 'agent' ? ['--wave-path=host'] : [];
  }
  // Unreachable while WAVE_PATHS and the switch agree; a stray string from a caller is refused.
  throw new Error(`wave path ${JSON.stringify(mode)} has no ${role} flags (bench/lib/wave-path.ts)`);
}

/** launch's pass-through form: `--coordinator-arg=` / `--agent-arg=` for each flag. */
export function wavePathLaunchArgs(mode: WavePath): string[] {
  return [
    ...wavePathArgs(mode, 'launch'),
    ...wavePathArgs(mode, 'coordinator').map((f) => `--coordinator-arg=${f}`),
    ...wavePathArgs(mode, 'agent').map((f) => `--agent-arg=${f}`),
  ];
}
