// `wavebus capture`: an input snapshot armed on a running job, with the snapshot seed's selection
// rules (docs/control.md, docs/snapshots.md). Every rank gets it with the same wave head, so every
// rank selects the same forward.
import type { CommandModule } from 'yargs';
import { tensorFormatToProto } from '../artifacts/tensor-format';
import { ConfigError } from '../errors';
import { parseFormat, parseIndexList, parseMaxCaptures, parseRequestList, DEFAULT_MAX_CAPTURES } from '../snapshot/config';
import { pollUntil } from '../tools/control-client';
import { CONTROL_FLAGS, runControl } from './control-flags';
import { intFlag, lastOf } from './flags';

type Progress = { arm: Record<string, any>; results: Record<string, any>[]; ranks: number[]; doneRanks: number[]; expired: boolean; armed: boolean; unserved?: string; waiting?: string };

const raw = (argv: Record<string, unknown>, flag: string) => (argv[flag] === undefined ? undefined : { name: `--${flag}`, value: String(lastOf(argv[flag])) });

/** The command's flags as a CaptureRequest; each bad value names its flag. */
function captureRequest(argv: Record<string, unknown>): Record<string, unknown> {
  if (argv['flush-recorder']) return { flushRecorder: true };
  const req = raw(argv, 'request');
  const token = raw(argv, 'token');
  const atCall = raw(argv, 'at-call');
  const ranks = raw(argv, 'ranks');
  const format = raw(argv, 'format');
  const max = raw(argv, 'max-captures');
  if (atCall && argv.next) throw new ConfigError('--at-call / --next: give one of them, not both');
  const requestIds = req ? parseRequestList(req) : [];
  if (req && requestIds.length === 0) throw new ConfigError(`--request=${JSON.stringify(req.value)}: no request id in it`);
  const tokenTargets = token ? [...(parseIndexList(token, false) as Set<number>)] : [];
  const callIndices = atCall ? [...(parseIndexList(atCall, false) as Set<number>)] : [];
  if (!argv.next && requestIds.length + tokenTargets.length + callIndices.length === 0) throw new ConfigError('name what to capture: --request ID, --token N, --at-call N or --next');
  return {
    requestIds,
    tokenTargets,
    callIndices,
    next: Boolean(argv.next),
    // Unlike the seed's variable, a bad list is refused here: the user is there to fix it.
    tpRanks: ranks ? [...(parseIndexList(ranks, false) as Set<number>)] : [],
    format: format ? tensorFormatToProto(parseFormat(format)) : 0,
    maxCaptures: max ? parseMaxCaptures(max) : DEFAULT_MAX_CAPTURES,
    hasReplica: argv.replica !== undefined,
    replica: argv.replica === undefined ? 0 : intFlag(argv.replica, '--replica', 0),
    withinWaves: argv['within-waves'] === undefined ? 0 : intFlag(argv['within-waves'], '--within-waves', 1, 0xffffffff),
  };
}

export const command: CommandModule = {
  command: 'capture',
  describe: 'Arm an input snapshot on a running job (the snapshot rules: --request, --token, --at-call or --next)',
  builder: (y) =>
    y
      .options(CONTROL_FLAGS)
      .option('request', { type: 'string', describe: 'request ids, comma-separated, matched as vLLM does ("abc" also matches "abc-<suffix>")' })
      .option('token', { type: 'string', describe: 'target token positions, comma-separated (decode forwards only)' })
      .option('at-call', { type: 'string', describe: "call indices, comma-separated: each compiled graph's Nth forward (0-based) from the wave the capture takes effect" })
      .option('next', { type: 'boolean', default: false, describe: 'the next forward: the one of the wave the capture takes effect at' })
      .option('ranks', { type: 'string', describe: 'tp ranks that capture, comma-separated (default: every rank)' })
      .option('format', { type: 'string', describe: 'pt (default), npy or safetensors' })
      .option('max-captures', { type: 'string', describe: `captures per rank at most (default ${DEFAULT_MAX_CAPTURES})` })
      .option('replica', { type: 'string', describe: 'only this DP replica (default: every replica)' })
      .option('within-waves', { type: 'string', describe: 'the capture expires after this many waves (default 10000; --next: 1)' })
      .option('wait', { type: 'boolean', default: false, describe: "wait until every rank's capture is done and print the bundles' paths" })
      .option('flush-recorder', { type: 'boolean', default: false, describe: "write out every rank's flight recorder (its last K-1 forwards at the arm's wave; docs/recorder.md)" }),
  handler: (argv) =>
    runControl('capture', argv, () => captureRequest(argv), async (client, capture, deadline) => {
      const { id } = await client.request({ capture }, Math.max(1, deadline - Date.now()));
      process.stdout.write(`armed ${id}: takes effect at the next wave head of ${capture.hasReplica ? `replica ${capture.replica}` : 'every replica'}\n`);
      if (!argv.wait) return 0;
      // A replica that could not take it (no wave head after the wake) is finished too: said below.
      const finished = (ps: Progress[]) => ps.every((p) => Boolean(p.unserved) || (p.armed && (p.expired || p.ranks.every((g) => p.doneRanks.includes(g)))));
      const { value: ps, timedOut } = await pollUntil(client, async (t) => (await client.request({ query: { id } }, t)).capture as Progress[], finished, deadline, `waiting for ${id}`);
      let ok = !timedOut;
      for (const p of ps) {
        if (p.unserved) {
          ok = false;
          process.stderr.write(`wavebus capture: ${id} not served on replica ${p.arm.replica}: ${p.unserved}\n`);
          continue;
        }
        for (const r of p.results) {
          if (r.callDir) process.stdout.write(`rank ${r.globalRank} wave ${r.wave}: ${r.callDir}\n`);
          else process.stderr.write(`wavebus capture: rank ${r.globalRank} wave ${r.wave}: capture failed: ${r.error}\n`);
          if (r.error) ok = false;
        }
        const none = p.ranks.filter((g) => !p.results.some((r) => r.globalRank === g && r.callDir));
        if (none.length > 0) {
          ok = false;
          process.stderr.write(`wavebus capture: replica ${p.arm.replica}: no bundle from rank(s) ${none.join(',')}${p.armed ? ` (waves ${p.arm.wave}..${p.arm.untilWave}${p.expired ? ', expired' : ''})` : ' (not armed yet)'}\n`);
        }
      }
      if (timedOut) {
        process.stderr.write(`wavebus capture: --timeout ran out before ${id} was done on every rank\n`);
        for (const p of ps) if (p.waiting) process.stderr.write(`wavebus capture: ${id} waits on replica ${p.arm.replica}: ${p.waiting}\n`);
      }
      return ok ? 0 : 1;
    }),
};
